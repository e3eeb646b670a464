package engine

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

func hitFlag(c []uint64) codegen.Snippet { return codegen.HitFlag{Addr: c[0]} }

// blockSites plans a probe at every block of fn that can take one.
func (h *harness) blockSites(fn string) []*splice.Site {
	h.t.Helper()
	f, _, err := h.p.Func(fn)
	if err != nil {
		h.t.Fatal(err)
	}
	var sites []*splice.Site
	for b := range f.Blocks {
		if f.Blocks[b].Padding {
			continue
		}
		spec := fmt.Sprintf("%s:%d", fn, b)
		pt, err := splice.ParsePoint(spec)
		if err != nil {
			h.t.Fatal(err)
		}
		s, err := f.Resolve(pt)
		if err != nil {
			h.t.Logf("%s: %v", spec, err)
			continue
		}
		sites = append(sites, s)
	}
	if len(sites) < 2 {
		h.t.Fatalf("%s: %d blocks take a probe; the test wants several", fn, len(sites))
	}
	return sites
}

// Coverage probes: one hit flag per block, armed in one batch; a probe's
// flag is set only when its block runs; the hit ones are removed in one
// batch (their bytes back, the others still spliced), then the rest; in
// the end every byte is back and, after reclaim, no patch or slot is
// left.
func TestCoverProbesRemoveThemselves(t *testing.T) {
	h := newHarness(t)
	sites := h.blockSites("filename_lookup")
	reqs, errs := h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: hitFlag})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", sites[i].Point().Spec, err)
		}
	}
	if st := h.e.State(); st.Splices != len(sites) {
		t.Fatalf("%d splices for %d probes", st.Splices, len(sites))
	}
	for _, r := range reqs {
		if h.e.Hit(r) {
			t.Fatalf("%s hit before it ran", r.Site().Point().Spec)
		}
	}
	// The first block and the last run; the others do not.
	ran := map[*Request]bool{reqs[0]: true, reqs[len(reqs)-1]: true}
	for r := range ran {
		if err := h.k.Count(h.e.Installed(r).Site.Addr(), 1); err != nil {
			t.Fatal(err)
		}
		if err := h.k.Count(h.e.Installed(r).Site.Addr(), 1); err != nil { // a second hit changes nothing
			t.Fatal(err)
		}
	}
	var hit, live []*Request
	for _, r := range reqs {
		if h.e.Hit(r) != ran[r] {
			t.Errorf("%s: hit %v, ran %v", r.Site().Point().Spec, h.e.Hit(r), ran[r])
		}
		if h.e.Counter(r.Counter()) > 1 {
			t.Errorf("%s: flag %#x, want 1", r.Site().Point().Spec, h.e.Counter(r.Counter()))
		}
		if ran[r] {
			hit = append(hit, r)
		} else {
			live = append(live, r)
		}
	}
	for i, err := range h.e.RemoveEach(hit) {
		if err != nil {
			t.Fatalf("%s: %v", hit[i].Site().Point().Spec, err)
		}
	}
	now := h.k.TextNow()
	for _, r := range hit {
		in := r.Site().Insn()
		off := in.Addr - textAddr
		if !bytes.Equal(now[off:off+uint64(in.Len())], in.Bytes) {
			t.Errorf("%s: % x after removal, want % x", r.Site().Where(), now[off:off+uint64(in.Len())], in.Bytes)
		}
	}
	if st := h.e.State(); st.Splices != len(live) {
		t.Errorf("%d splices after removing the hit probes, want %d", st.Splices, len(live))
	}
	for _, r := range live {
		if err := h.k.Count(h.e.Installed(r).Site.Addr(), 1); err != nil {
			t.Errorf("%s no longer spliced: %v", r.Site().Point().Spec, err)
		}
	}
	for i, err := range h.e.RemoveEach(live) {
		if err != nil {
			t.Fatalf("%s: %v", live[i].Site().Point().Spec, err)
		}
	}
	if !bytes.Equal(h.k.TextNow(), text) {
		t.Errorf("text not restored:\n% x\nwant\n% x", h.k.TextNow(), text)
	}
	h.e.Reclaim()
	if st := h.e.State(); st.Splices != 0 || st.Points != 0 || st.Counters != 0 || st.Retired != 0 || st.Springboards != 0 {
		t.Errorf("left installed: %+v", st)
	}
	if a := h.k.AllocsNow(); len(a) != 0 {
		t.Errorf("patches left: %v", a)
	}
	// Removing again fails for each, and changes nothing.
	for _, err := range h.e.RemoveEach(hit) {
		if err == nil {
			t.Error("a removed probe removed twice")
		}
	}
}

// AddEach: a site that cannot be spliced gets its error; nothing is left
// of it, and the batch's other sites are unaffected.
func TestAddEachFailsAlone(t *testing.T) {
	h := newHarness(t)
	sites := h.blockSites("filename_lookup")
	h.k.Mu.Lock()
	h.k.FailSplice = true
	h.k.Mu.Unlock()
	reqs, errs := h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: hitFlag})
	for i := range sites {
		if errs[i] == nil || reqs[i] != nil {
			t.Errorf("%s: request %v, error %v; want none and an error", sites[i].Point().Spec, reqs[i], errs[i])
		}
	}
	h.e.Reclaim()
	if st := h.e.State(); st.Splices != 0 || st.Counters != 0 {
		t.Errorf("left after failed batch: %+v", st)
	}
	h.k.Mu.Lock()
	h.k.FailSplice = false
	h.k.Mu.Unlock()
	reqs, errs = h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: hitFlag})
	for i := range sites {
		if errs[i] != nil {
			t.Fatalf("%s: %v", sites[i].Point().Spec, errs[i])
		}
	}
	h.e.RemoveEach(reqs)
	if !bytes.Equal(h.k.TextNow(), text) {
		t.Error("text not restored")
	}
}

// A removed request's counter slot is not handed out again before the
// grace period that frees its patch (a task still in the old patch may
// write it); reclaim gives it back, and so does running out of slots.
func TestCounterSlotsWaitForReclaim(t *testing.T) {
	h := newHarness(t)
	r := h.count("a", nil, "filename_lookup+0xb")[0]
	old := r.Counter()
	h.remove(r)
	if st := h.e.State(); st.Counters != 1 {
		t.Errorf("%d counter slots in use right after removal, want 1 (waiting for reclaim)", st.Counters)
	}
	r2 := h.count("b", nil, "filename_lookup+0xb")[0]
	if r2.Counter() == old {
		t.Errorf("slot %d handed out again before reclaim", old)
	}
	h.remove(r2)
	h.e.Reclaim()
	if st := h.e.State(); st.Counters != 0 {
		t.Errorf("%d counter slots in use after reclaim", st.Counters)
	}
	// Every slot taken, then one request removed: the next request
	// reclaims at once rather than failing.
	n := len(h.k.Counters)
	base, err := h.e.ReserveCounters(n - 1)
	if err != nil {
		t.Fatal(err)
	}
	r3 := h.count("c", nil, "filename_lookup+0xb")[0]
	h.remove(r3)
	r4 := h.count("d", nil, "filename_lookup+0xb")[0]
	if r4.Counter() != r3.Counter() {
		t.Errorf("got slot %d, want the reclaimed %d", r4.Counter(), r3.Counter())
	}
	h.remove(r4)
	h.e.ReleaseCounters(base, n-1)
}

// AddEach stops trying once the driver is full: the sites of the batch
// that do not fit and every site after it get ENOSPC, those after it
// without a patch written, and what was installed stays.
func TestAddEachStopsWhenFull(t *testing.T) {
	h := newHarness(t)
	sites := h.blockSites("filename_lookup")
	h.k.Mu.Lock()
	h.k.MaxSplices = 1
	h.k.Mu.Unlock()
	reqs, errs := h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: hitFlag})
	if errs[0] != nil || reqs[0] == nil {
		t.Fatalf("first site: %v", errs[0])
	}
	for i := 1; i < len(sites); i++ {
		if !errors.Is(errs[i], syscall.ENOSPC) || reqs[i] != nil {
			t.Errorf("%s: %v, want ENOSPC", sites[i].Point().Spec, errs[i])
		}
	}
	h.e.RemoveEach(reqs[:1])
	h.e.Reclaim()
	if !bytes.Equal(h.k.TextNow(), text) || len(h.k.AllocsNow()) != 0 {
		t.Error("not restored")
	}
}

// A patch heap that fills in the middle of a batch: the sites whose
// patch was allocated are spliced, the first without room and every site
// after it get ENOSPC without a patch, and removing what was installed
// leaves the text and the heap as they were. (Patches are sized on every
// CPU, then allocated in site order.)
func TestAddEachHeapFull(t *testing.T) {
	h := newHarness(t)
	sites := h.blockSites("filename_lookup")
	if len(sites) < 3 {
		t.Fatalf("%d sites, want 3 or more", len(sites))
	}
	h.k.Mu.Lock()
	h.k.MaxAllocs = 2
	h.k.Mu.Unlock()
	reqs, errs := h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: hitFlag})
	var armed []*Request
	for i := range sites {
		if i < 2 {
			if errs[i] != nil || reqs[i] == nil {
				t.Errorf("%s: %v, want armed", sites[i].Point().Spec, errs[i])
			}
			armed = append(armed, reqs[i])
			continue
		}
		if !errors.Is(errs[i], syscall.ENOSPC) || reqs[i] != nil {
			t.Errorf("%s: %v, want ENOSPC", sites[i].Point().Spec, errs[i])
		}
	}
	if n := len(h.k.AllocsNow()); n != 2 {
		t.Errorf("%d patches allocated, want 2", n)
	}
	h.e.RemoveEach(armed)
	h.e.Reclaim()
	if !bytes.Equal(h.k.TextNow(), text) || len(h.k.AllocsNow()) != 0 {
		t.Error("not restored")
	}
}

// Batching: AddEach splices new points MaxBatch at a time, one driver
// batch each, and RemoveEach unsplices them the same way; the bytes are
// the original ones afterwards.
func TestAddEachBatches(t *testing.T) {
	h := newHarness(t)
	sites := h.blockSites("filename_lookup")
	h.k.Mu.Lock()
	h.k.MaxBatch = 2
	h.k.Mu.Unlock()
	reqs, springboards := h.coverAll(sites)
	h.k.Mu.Lock()
	batches, calls := h.k.Batches, h.k.SpliceCalls
	h.k.Mu.Unlock()
	// The first pass splices every point (springboards: their slots), the
	// second the springboards' jmp rel8s.
	half := func(n int) int { return (n + 1) / 2 }
	if want := half(len(sites)) + half(springboards); batches != want {
		t.Errorf("%d driver batches for %d probes (%d springboard) in batches of 2, want %d", batches, len(sites), springboards, want)
	}
	if calls != len(sites)+springboards {
		t.Errorf("%d splices for %d probes (%d springboard: slot and jmp)", calls, len(sites), springboards)
	}
	for i, err := range h.e.RemoveEach(reqs) {
		if err != nil {
			t.Fatalf("%s: %v", sites[i].Point().Spec, err)
		}
	}
	h.k.Mu.Lock()
	if want := 2 * (half(len(sites)) + half(springboards)); h.k.Batches != want {
		t.Errorf("%d driver batches after removal, want %d", h.k.Batches, want)
	}
	h.k.Mu.Unlock()
	if !bytes.Equal(h.k.TextNow(), text) {
		t.Error("text not restored")
	}
}

// A site whose bytes changed under the analysis is refused by the
// driver; the batch is tried again without it, and only it fails.
func TestAddEachRefusedOpFailsAlone(t *testing.T) {
	h := newHarness(t)
	sites := h.blockSites("filename_lookup")
	bad := sites[len(sites)/2]
	h.k.Mu.Lock()
	h.k.Poke(bad.Addr(), 0x90^bad.Insn().Bytes[0])
	h.k.Mu.Unlock()
	reqs, errs := h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: hitFlag})
	var ok []*Request
	for i, err := range errs {
		if sites[i] == bad {
			if err == nil || reqs[i] != nil {
				t.Errorf("%s: stale site installed", bad.Point().Spec)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", sites[i].Point().Spec, err)
			continue
		}
		ok = append(ok, reqs[i])
	}
	if st := h.e.State(); st.Splices != len(ok) {
		t.Errorf("%d splices, want %d", st.Splices, len(ok))
	}
	h.e.RemoveEach(ok)
	h.e.Reclaim()
	if st := h.e.State(); st.Splices != 0 || st.Points != 0 || st.Counters != 0 {
		t.Errorf("left installed: %+v", st)
	}
	if len(h.k.AllocsNow()) != 0 {
		t.Error("patches left")
	}
}

// The text view puts the original bytes back under every splice, with
// many splices (the lookup path) as with few.
func TestTextViewManySplices(t *testing.T) {
	var o overlay
	orig := map[uint64][]byte{}
	for a := uint64(0x1000); a < 0x1000+4000; a += 7 {
		orig[a] = []byte{byte(a), byte(a >> 8), 3, 4, 5}
	}
	for a, b := range orig {
		o.spliced(a, b, func() error { return nil })
	}
	mem := map[uint64]byte{}
	dev := readerFunc(func(addr uint64, b []byte) error {
		for i := range b {
			b[i] = 0xcc
			if v, ok := mem[addr+uint64(i)]; ok {
				b[i] = v
			}
		}
		return nil
	})
	v := textView{dev: dev, ov: &o}
	for _, r := range [][2]uint64{{0x1000, 16}, {0x1003, 9}, {0x0ff0, 40}, {0x1500, 3000}, {0x1000 + 3990, 40}} {
		got := make([]byte, r[1])
		if err := v.Read(r[0], got); err != nil {
			t.Fatal(err)
		}
		want := bytes.Repeat([]byte{0xcc}, int(r[1]))
		for a, b := range orig {
			for i, x := range b {
				if p := a + uint64(i); p >= r[0] && p < r[0]+r[1] {
					want[p-r[0]] = x
				}
			}
		}
		if !bytes.Equal(got, want) {
			t.Errorf("read %#x+%d:\n% x\nwant\n% x", r[0], r[1], got, want)
		}
	}
}

type readerFunc func(uint64, []byte) error

func (f readerFunc) Read(a uint64, b []byte) error { return f(a, b) }

// BenchmarkAddEach: arming and removing one block probe, batched, through
// the in-memory driver: the engine's own cost per probe (patch build,
// verification, bookkeeping), without the kernel's.
func BenchmarkAddEach(b *testing.B) {
	h := newHarness(b)
	sites := h.blockSites("filename_lookup")
	b.ResetTimer()
	for n := 0; n < b.N; n += len(sites) {
		reqs, errs := h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: hitFlag})
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		h.e.RemoveEach(reqs)
		h.e.Reclaim()
	}
}

// Springboard points in one AddEach: the slots go in the first driver
// batch and the jmp rel8s to them in the second; the third point, which
// finds no slot left, gets a trap splice in the first. RemoveEach takes
// the jmps out, then the slots; every byte is back.
func TestAddEachSpringboards(t *testing.T) {
	h := newHarness(t)
	var sites []*splice.Site
	for _, pt := range []string{"filename_lookup+0x9", "filename_lookup+0x12", "filename_lookup+0x1c"} {
		s, err := h.p.Resolve(pt)
		if err != nil {
			t.Fatal(err)
		}
		sites = append(sites, s)
	}
	reqs, errs := h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: hitFlag})
	want := []string{"springboard", "springboard", "trap"}
	for i, r := range reqs {
		if errs[i] != nil {
			t.Fatalf("%s: %v", sites[i].Point().Spec, errs[i])
		}
		in := h.e.Installed(r)
		if in.Class.String() != want[i] {
			t.Errorf("%s: class %s, want %s", sites[i].Point().Spec, in.Class, want[i])
		}
		if in.Class.String() == "springboard" {
			so := in.Springboard - textAddr
			if jmp, _ := codegen.JmpRel32(in.Springboard, in.Patch); !bytes.Equal(h.k.TextNow()[so:so+5], jmp) {
				t.Errorf("%s: slot %#x does not jump to the patch", sites[i].Point().Spec, in.Springboard)
			}
		}
		if err := h.k.Count(sites[i].Addr(), 1); err != nil || !h.e.Hit(r) {
			t.Errorf("%s: not hit through its splice (%v)", sites[i].Point().Spec, err)
		}
	}
	h.k.Mu.Lock()
	if h.k.Batches != 2 || h.k.SpliceCalls != 5 {
		t.Errorf("%d batches, %d splices; want 2 batches of 5 splices (2 slots, 2 jmp rel8, 1 int3)", h.k.Batches, h.k.SpliceCalls)
	}
	h.k.Mu.Unlock()
	for i, err := range h.e.RemoveEach(reqs) {
		if err != nil {
			t.Fatalf("%s: %v", sites[i].Point().Spec, err)
		}
	}
	h.e.Reclaim()
	if !bytes.Equal(h.k.TextNow(), text) {
		t.Error("text not restored")
	}
	if st := h.e.State(); st.Splices != 0 || st.Points != 0 || st.Springboards != 0 || st.Retired != 0 {
		t.Errorf("left installed: %+v", st)
	}
}

// A module unloaded under probes: the driver puts its splices' bytes back
// itself and forgets their ids (ENOENT), and the engine then takes their
// removal as done (the bytes went with the module): RemoveEach and Remove
// report no error, the points and their original bytes are forgotten,
// and the other probes are removed as usual.
func TestRemoveAfterModuleUnload(t *testing.T) {
	h := newHarness(t)
	rs := h.count("a", nil, "filename_lookup+0x9", "filename_lookup+0x12", "filename_lookup+0x1c")
	single := h.count("b", nil, "next_fn")
	at := rs[0].Site().Addr()
	if n := h.k.Unload(at, at+1); n != 1 {
		t.Fatalf("unloaded %d splices, want 1", n)
	}
	nf := single[0].Site().Addr()
	if n := h.k.Unload(nf, nf+1); n != 1 {
		t.Fatalf("unloaded %d splices at next_fn, want 1", n)
	}
	for i, err := range h.e.RemoveEach(rs) {
		if err != nil {
			t.Errorf("%s: %v", rs[i].Site().Where(), err)
		}
	}
	if err := h.e.Remove(single[0]); err != nil {
		t.Errorf("remove next_fn: %v", err)
	}
	h.e.Reclaim()
	view := make([]byte, len(text))
	if err := h.e.Text().Read(textAddr, view); err != nil {
		t.Fatal(err)
	}
	if st := h.e.State(); st.Points != 0 || st.Overlay != 0 || len(h.k.Splices) != 0 || !bytes.Equal(h.k.TextNow(), text) || !bytes.Equal(view, text) {
		t.Errorf("after removal: %+v, %d splices, text % x, engine's view % x", st, len(h.k.Splices), h.k.TextNow(), view)
	}
}

// A module unloaded and loaded again at the same address while a session
// holds points in it: the driver put the bytes back and forgot the
// splices. A later request at one of those points gets a new point (it
// failed with "re-point …: no such file or directory"); the old session's
// request is still removed cleanly and does not disturb the new one. Both
// a springboard point (+0x9) and a direct one (next_fn) are tried.
func TestAddAfterModuleReload(t *testing.T) {
	h := newHarness(t)
	old := h.count("a", nil, "filename_lookup+0x9", "next_fn")
	for _, r := range old {
		at := r.Site().Addr()
		h.k.Unload(at, at+1)
	}
	h.k.Unload(textAddr, textAddr+0x30) // the springboard's slot, in the padding
	if len(h.k.Splices) != 0 {
		t.Fatalf("splices left after the unload: %v", h.k.Splices)
	}
	// The module is back, its text as before: new requests at the same
	// points.
	fresh := h.count("b", nil, "filename_lookup+0x9", "next_fn")
	if len(h.k.Splices) == 0 {
		t.Fatal("the new requests spliced nothing")
	}
	for i, r := range fresh {
		if in := h.e.Installed(r); in.Patch == 0 || in.Patch == h.e.Installed(old[i]).Patch {
			t.Errorf("%s: installed %+v, want a new patch", r.Site().Where(), in)
		}
		if err := h.k.Count(r.Site().Addr(), 3); err != nil {
			t.Fatal(err)
		}
		if n := h.k.Counter(r.Counter()); n != 3 {
			t.Errorf("%s: new request counted %d, want 3", r.Site().Where(), n)
		}
		if n := h.k.Counter(old[i].Counter()); n != 0 {
			t.Errorf("%s: the gone request counted %d", r.Site().Where(), n)
		}
	}
	splices := len(h.k.Splices)
	h.remove(old...)
	if len(h.k.Splices) != splices {
		t.Errorf("removing the gone requests changed the driver's splices: %d → %d", splices, len(h.k.Splices))
	}
	for _, r := range fresh {
		if err := h.k.Count(r.Site().Addr(), 1); err != nil || h.k.Counter(r.Counter()) != 4 {
			t.Errorf("%s: after the old session's removal the new request counts %d (%v), want 4", r.Site().Where(), h.k.Counter(r.Counter()), err)
		}
	}
	h.remove(fresh...)
	h.restored()
}

// ForgetText, told that a module went (the planner saw it leave the
// module list): its points and their original bytes are dropped at once,
// before any request there is changed; the sessions' requests are still
// removed cleanly, and points outside the range stay.
func TestForgetText(t *testing.T) {
	h := newHarness(t)
	in := h.count("a", nil, "filename_lookup+0x9", "filename_lookup+0x12")
	out := h.count("b", nil, "next_fn")
	h.k.Unload(textAddr, textAddr+0x30)
	if n := h.e.ForgetText(textAddr, textAddr+0x30); n != 2 {
		t.Errorf("forgot %d points, want 2", n)
	}
	if st := h.e.State(); st.Points != 1 || st.Overlay != 1 {
		t.Errorf("after ForgetText: %+v, want next_fn's point and its bytes alone", st)
	}
	view := make([]byte, 0x30)
	if err := h.e.Text().Read(textAddr, view); err != nil || !bytes.Equal(view, text[:0x30]) {
		t.Errorf("the engine's view of the gone text: % x (%v)", view, err)
	}
	h.remove(in...)
	h.remove(out...)
	h.restored()
}

// Where traps are refused (a process), a springboard point whose slot is
// gone falls back on the covering splice its site was planned with, not
// on a trap splice (which would be refused): in AddEach and in Add.
func TestNoSlotCoversWhereTrapsRefused(t *testing.T) {
	for _, batched := range []bool{true, false} {
		t.Run(fmt.Sprint("batched=", batched), func(t *testing.T) {
			h := newHarness(t)
			const why = "traps refused in this test"
			h.e.SetNoTrap(why)
			g, _, err := h.p.Func("filename_lookup")
			if err != nil {
				t.Fatal(err)
			}
			k := *h.p.Facts()
			k.NoTrap = why
			f := k.Func(g.Fn, nil)
			f.UseSpringboards(h.e.Springboards())
			var sites []*splice.Site
			for _, off := range []uint64{0x9, 0x12, 0x1c} {
				i := slices.IndexFunc(f.Fn.Insns, func(in cfg.Instruction) bool { return in.Addr == textAddr+off })
				s, err := f.At(i)
				if err != nil {
					t.Fatal(err)
				}
				sites = append(sites, s)
			}
			if sites[2].Class != springboard.Springboard || len(sites[2].Covered()) == 0 {
				t.Fatalf("+0x1c planned %s with %d covered: the test wants a springboard site with a covering run", sites[2].Class, len(sites[2].Covered()))
			}
			sp := Spec{Owner: "cover", Slots: 1, Snippet: hitFlag}
			reqs, errs := make([]*Request, len(sites)), make([]error, len(sites))
			if batched {
				reqs, errs = h.e.AddEach(sites, sp)
			} else {
				for i, s := range sites {
					reqs[i], errs[i] = h.e.Add(s, sp)
				}
			}
			for i, want := range []springboard.Class{springboard.Springboard, springboard.Springboard, springboard.Cover} {
				if errs[i] != nil {
					t.Fatalf("%s: %v", sites[i].Where(), errs[i])
				}
				if in := h.e.Installed(reqs[i]); in.Class != want {
					t.Errorf("%s: class %s, want %s", sites[i].Where(), in.Class, want)
				}
				if err := h.k.Count(sites[i].Addr(), 1); err != nil || !h.e.Hit(reqs[i]) {
					t.Errorf("%s: not hit through its splice (%v)", sites[i].Where(), err)
				}
			}
			for i, err := range h.e.RemoveEach(reqs) {
				if err != nil {
					t.Fatalf("%s: %v", sites[i].Where(), err)
				}
			}
			h.restored()
		})
	}
}

// Reclaim frees the retired patches of a removal in one batched call
// where the device has one, and every allocation is gone after it.
func TestReclaimFreesInOneCall(t *testing.T) {
	h := newHarness(t)
	reqs := h.count("a", nil, "filename_lookup+0x9", "filename_lookup+0x12", "filename_lookup+0x1c")
	if len(h.k.AllocsNow()) == 0 {
		t.Fatal("no patch allocated")
	}
	for _, err := range h.e.RemoveEach(reqs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	h.e.Reclaim()
	h.k.Mu.Lock()
	calls := h.k.FreeManyCalls
	h.k.Mu.Unlock()
	if calls != 1 || len(h.k.AllocsNow()) != 0 {
		t.Errorf("%d batched frees, allocations left %v; want 1 and none", calls, h.k.AllocsNow())
	}
}

// clobberRAX says it overwrites nothing and zeroes %eax (and the flags):
// the clobber check, which runs when AddEach builds its batch's patches
// (on every CPU), refuses it wherever %rax or the flags are live.
type clobberRAX struct{}

func (clobberRAX) Needs() codegen.Needs                 { return codegen.Needs{} }
func (clobberRAX) Emit(a *codegen.Asm, _ []codegen.Reg) { a.Raw(0x31, 0xc0) } // xor %eax,%eax

// A patch that fails its checks when the batch is built fails its site
// alone: the others are armed, and the failed ones leave no point,
// patch or slot behind.
func TestAddEachBuildFailsAlone(t *testing.T) {
	h := newHarness(t)
	var sites []*splice.Site
	for _, fn := range []string{"filename_lookup"} {
		sites = append(sites, h.blockSites(fn)...)
	}
	reqs, errs := h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: func([]uint64) codegen.Snippet { return clobberRAX{} }})
	var armed []*Request
	for i, s := range sites {
		live := s.Live&(cfg.LiveSet(1)<<codegen.RAX) != 0 || s.FlagsLive()
		switch {
		case errs[i] != nil && !errors.Is(errs[i], ErrClobber):
			t.Errorf("%s: %v; want a clobber refusal or none", s.Where(), errs[i])
		case live != (errs[i] != nil):
			t.Errorf("%s: %%rax or flags live %v, error %v", s.Where(), live, errs[i])
		case errs[i] == nil:
			armed = append(armed, reqs[i])
		}
	}
	if len(armed) == 0 || len(armed) == len(sites) {
		t.Fatalf("%d of %d armed; the test wants some of each", len(armed), len(sites))
	}
	if st := h.e.State(); st.Splices != len(armed) || st.Counters != len(armed) {
		t.Errorf("%d armed, engine holds %+v", len(armed), st)
	}
	for _, err := range h.e.RemoveEach(armed) {
		if err != nil {
			t.Fatal(err)
		}
	}
	h.e.Reclaim()
	if st := h.e.State(); st != (State{}) {
		t.Errorf("left after removal: %+v", st)
	}
	if !bytes.Equal(h.k.TextNow(), text) {
		t.Error("text not restored")
	}
}

// coverAll adds a hit-flag request at every site in one AddEach, failing
// the test on any error, and counts the springboard points among them.
func (h *harness) coverAll(sites []*splice.Site) (reqs []*Request, springboards int) {
	h.t.Helper()
	reqs, errs := h.e.AddEach(sites, Spec{Owner: "cover", Slots: 1, Snippet: hitFlag})
	for i, err := range errs {
		if err != nil {
			h.t.Fatalf("%s: %v", sites[i].Point().Spec, err)
		}
		if pt, _ := h.e.points.get(sites[i].Addr()); pt.class == springboard.Springboard {
			springboards++
		}
	}
	return reqs, springboards
}

// RemoveEach unsplices in chunks of removeChunk driver batches (so a
// whole-kernel session's removal holds a chunk's bookkeeping, not the
// session's): with chunks of one batch of one splice, every point is
// removed, one driver batch per splice, and every byte is back.
func TestRemoveEachInChunks(t *testing.T) {
	h := newHarness(t)
	sites := h.blockSites("filename_lookup")
	defer func(c int) { removeChunk = c }(removeChunk)
	removeChunk = 1
	reqs, springboards := h.coverAll(sites)
	h.k.Mu.Lock()
	h.k.MaxBatch = 1
	before := h.k.Batches
	h.k.Mu.Unlock()
	for i, err := range h.e.RemoveEach(reqs) {
		if err != nil {
			t.Fatalf("%s: %v", sites[i].Point().Spec, err)
		}
	}
	h.e.Reclaim()
	h.k.Mu.Lock()
	if got, want := h.k.Batches-before, len(sites)+springboards; got != want {
		t.Errorf("%d driver batches to remove %d probes (%d springboard) one at a time, want %d", got, len(sites), springboards, want)
	}
	h.k.Mu.Unlock()
	if !bytes.Equal(h.k.TextNow(), text) {
		t.Error("text not restored")
	}
	if st := h.e.State(); st.Splices != 0 || st.Points != 0 || st.Retired != 0 {
		t.Errorf("left installed: %+v", st)
	}
}

// Counter slots go back to the allocator zeroed, after the grace period,
// so a free slot that is not zero was written by a patch that outlived
// its request: DirtyFreeCounters finds it, and handing it out again
// counts a stale write and gives the new owner a zero. RetireCounters
// (a virtual timer's block) waits for the grace period as a request's
// own slots do.
func TestFreeCountersStayZero(t *testing.T) {
	h := newHarness(t)
	set := func(slot int, v uint64) {
		h.k.Mu.Lock()
		h.k.Counters[slot] = v
		h.k.Mu.Unlock()
	}
	r := h.count("a", nil, "filename_lookup+0xb")[0]
	set(r.Counter(), 41) // hits
	base, err := h.e.ReserveCounters(4)
	if err != nil {
		t.Fatal(err)
	}
	set(base+2, 1<<16|1) // a timer word with a thread inside
	h.remove(r)
	h.e.RetireCounters(base, 4)
	if st := h.e.State(); st.Counters != 5 {
		t.Errorf("%d slots in use before reclaim, want 5 (retired ones wait)", st.Counters)
	}
	h.e.Reclaim()
	if st, stale := h.e.State(), h.e.StaleCounterWrites(); st.Counters != 0 || stale != 0 {
		t.Errorf("after reclaim: %d slots in use, %d stale writes; want 0, 0", st.Counters, stale)
	}
	if n, first := h.e.DirtyFreeCounters(); n != 0 {
		t.Errorf("%d free slots not zero after reclaim (first %v)", n, first)
	}
	// Something writes every free slot: each is found, and the next
	// request's slot, handed out dirty, is counted and cleared.
	for s := range h.k.Counters {
		set(s, 1)
	}
	if n, _ := h.e.DirtyFreeCounters(); n != len(h.k.Counters) {
		t.Errorf("DirtyFreeCounters found %d of %d written free slots", n, len(h.k.Counters))
	}
	r2 := h.count("b", nil, "filename_lookup+0xb")[0]
	if v := h.k.Counter(r2.Counter()); v != 0 {
		t.Errorf("new request's slot reads %d, want 0", v)
	}
	if stale := h.e.StaleCounterWrites(); stale != 1 {
		t.Errorf("%d stale writes counted, want 1", stale)
	}
	if n, _ := h.e.DirtyFreeCounters(); n != len(h.k.Counters)-1 {
		t.Errorf("DirtyFreeCounters %d, want %d (the taken slot is not free)", n, len(h.k.Counters)-1)
	}
	h.remove(r2)
	h.e.Reclaim()
	h.restored()
}
