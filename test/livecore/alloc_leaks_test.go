package livecore

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// (In a file named to sort before core_test.go: TestCore ends by
// panicking the guest.)

// leakCache is kinst_leak.ko's cache.
const leakCache = "kinst_leak"

// TestFindLeaksKnown: kinst_leak.ko (built beside the driver) leaks ten
// objects of its own cache and holds fifteen, five each from a global
// array, a global list and its kernel thread's stack, and logs every
// address. findleaks on a dump lists each leaked one in that cache, and
// none held; the guest records the cache's owners (slub_debug=U), so the
// ten are one group, leak_some's allocating stack from the stack depot.
// Of its two vmalloc'd areas, the dropped one is a leak allocated by
// vleak_some, the one a global holds is not.
func TestFindLeaksKnown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := gsh(t, ctx, `insmod /lib/modules/kinst_leak.ko && for i in $(seq 100); do dmesg | grep -q 'kinst_leak: ready' && break; sleep 0.2; done; dmesg | grep 'kinst_leak: '`)
	leaked, vleaked, held := map[uint64]bool{}, map[uint64]bool{}, map[uint64]string{}
	for _, line := range strings.Split(out, "\n") {
		_, rest, _ := strings.Cut(line, "kinst_leak: ")
		f := strings.Fields(rest)
		if len(f) != 2 {
			continue
		}
		a, err := strconv.ParseUint(f[1], 16, 64)
		if err != nil {
			t.Fatalf("kernel log: %q", line)
		}
		switch f[0] {
		case "leaked":
			leaked[a] = true
		case "vleaked":
			vleaked[a] = true
		default:
			held[a] = f[0]
		}
	}
	if len(leaked) != 10 || len(vleaked) != 1 || len(held) != 16 {
		t.Fatalf("kinst_leak logged %d leaked objects, %d leaked areas and %d held, want 10, 1 and 16:\n%s", len(leaked), len(vleaked), len(held), out)
	}
	path := dumpGuest(t, "leaks.elf", "elf")
	var r leaksJSON
	if err := json.Unmarshal(kinst(t, "core", path, "findleaks", "--json", "--verbose"), &r); err != nil {
		t.Fatal(err)
	}
	found := map[uint64]bool{}
	for _, g := range r.Groups {
		if g.Cache == leakCache {
			// slub_debug=U: the leaks are grouped by allocating stack,
			// leak_some's (through the allocator's frames).
			if !slices.ContainsFunc(g.AllocFrames, func(f string) bool { return strings.HasPrefix(f, "leak_some+") }) {
				t.Errorf("%d leaks of %s allocated at %q: want leak_some's stack", g.Count, g.Cache, g.AllocFrames)
			} else if g.Count != len(leaked) {
				t.Errorf("leak_some's stack groups %d leaks, want %d", g.Count, len(leaked))
			}
			t.Logf("%d leaks allocated at %s", g.Count, strings.Join(g.AllocFrames, " ← "))
		}
		for _, l := range g.Leaks {
			if how, ok := held[l.Addr]; ok {
				t.Errorf("findleaks lists %#x, held from the module's %s", l.Addr, how)
			}
			if leaked[l.Addr] {
				found[l.Addr] = true
				if l.Cache != leakCache {
					t.Errorf("leak %#x in cache %s, want kinst_leak", l.Addr, l.Cache)
				}
			}
			if vleaked[l.Addr] {
				found[l.Addr] = true
				if l.Cache != "vmalloc" || !strings.HasPrefix(g.AllocFunction, "vleak_some+") || l.Size < 3*4096 {
					t.Errorf("leaked area %#x: %s of %d bytes allocated by %q; want vmalloc, 3 pages or more, vleak_some", l.Addr, l.Cache, l.Size, g.AllocFunction)
				}
			}
		}
	}
	for a := range leaked {
		if !found[a] {
			t.Errorf("leaked object %#x not listed", a)
		}
	}
	for a := range vleaked {
		if !found[a] {
			t.Errorf("leaked vmalloc area %#x not listed", a)
		}
	}
	if r.Regions < 10 {
		t.Errorf("%d vmalloc'd areas judged; want the guest's (modules' memory among them)", r.Regions)
	}
	t.Logf("findleaks: %d of %d leaks listed (%d objects, %d vmalloc'd area), none of the %d held; %d leaks in all",
		len(found), len(leaked)+len(vleaked), len(leaked), len(vleaked), len(held), r.Leaks)
	checkSearch(t, path, held)
}

// checkSearch: kinst core search finds each held object where the module
// holds it, as its log says: in the module's memory (the global array),
// on its thread's stack, or in a neighbour on the global list (whose head
// is in the module too).
func checkSearch(t *testing.T, path string, held map[uint64]string) {
	args := []string{"core", path, "search", "--json"}
	for a, how := range held {
		if how != "vheld" {
			args = append(args, strconv.FormatUint(a, 16))
		}
	}
	var rep struct {
		Hits []struct {
			Value, Address, Seen string
			What                 struct {
				Kind  string
				Cache *string
				Task  *struct{ Comm string }
			}
		}
	}
	if err := json.Unmarshal(kinst(t, args...), &rep); err != nil {
		t.Fatal(err)
	}
	where := map[uint64][]string{}
	for _, h := range rep.Hits {
		v, _ := strconv.ParseUint(strings.TrimPrefix(h.Value, "0x"), 16, 64)
		w := h.Seen
		switch {
		case h.What.Kind == "task stack" && h.What.Task != nil:
			w = "stack of " + h.What.Task.Comm
		case h.What.Kind == "slab object" && h.What.Cache != nil:
			w = "object of " + *h.What.Cache
		}
		where[v] = append(where[v], w)
	}
	for a, how := range held {
		var want []string
		switch how {
		case "array":
			want = []string{"module kinst_leak"}
		case "stack":
			want = []string{"stack of kinst_leak"}
		case "list":
			want = []string{"object of " + leakCache, "module kinst_leak"}
		default:
			continue
		}
		if !slices.ContainsFunc(where[a], func(w string) bool { return slices.Contains(want, w) }) {
			t.Errorf("search %#x (held from the %s): found at %q, want one of %q", a, how, where[a], want)
		}
	}
	t.Logf("search: %d hits for the %d held objects", len(rep.Hits), len(held)-1)
}
