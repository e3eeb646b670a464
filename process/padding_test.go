package process

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/kinst/kinst/springboard"
)

// TestCoverIntoPadding: blocks too short for a jmp that end in a ret or
// jmp with nops after them (testdata/padret.c: "pop %rbx; ret", two lone
// rets, a lone jmp rel8, before 3- to 5-byte nops) take covering splices
// whose jmps overwrite the nops, not traps or puns; a lone ret with 2
// bytes of nop, a jmp's 2 bytes short, takes a punned jmp that owns
// them (3 bytes of its own, not 1). Each counts exactly the calls the
// program says ran its block, with threads running, the program's
// results unchanged, and detaching restores every byte, the nops'
// included. The 5-byte nop is room for a springboard slot too: the lone
// jmp after it, planned later, must not be given a slot there.
func TestCoverIntoPadding(t *testing.T) {
	needPtrace(t)
	w := start(t, compile(t, "gcc", "testdata/padret.c", "-pthread"))
	want := w.round(t)
	pid := w.cmd.Process.Pid
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	tg.SetPuns(true)
	tails := []struct {
		off  uint64
		name string
		pad  int // nop bytes the jmp overwrites
	}{{0xa, "tail0", 3}, {0x1a, "tail1", 4}, {0x29, "tail2", 4}, {0x39, "tail3", 3}, {0x4c, "tail4", 2}}
	var specs []string
	for _, tl := range tails {
		specs = append(specs, fmt.Sprintf("padret+%#x", tl.off))
	}
	sites, classes := resolveAll(t, tg, specs)
	orig := textOf(t, pid, sites[0].Fn)
	// The lone jmp (2 bytes) may take a springboard, cheaper, where a slot
	// is in reach: not in the nops the others' jmps overwrite.
	cover := func(i int) bool { return i < 3 || i == 3 && sites[i].Class == springboard.Cover }
	for i, s := range sites {
		if got := len(s.Padding()); cover(i) && (s.Class != springboard.Cover || got != tails[i].pad) {
			t.Errorf("%s (%s): planned %s with %d bytes of padding, want a covering splice over %d", s.Where(), tails[i].name, classes[i], got, tails[i].pad)
		}
	}
	if s := sites[4]; s.Class != springboard.Trap || len(s.TrapPadding()) != tails[4].pad {
		t.Errorf("%s (tail4): planned %s with %x of padding, want a trap splice (a pun) owning %d bytes", s.Where(), s.Class, s.TrapPadding(), tails[4].pad)
	}
	reqs, err := tg.Count("test", sites)
	if err != nil {
		t.Fatal(err)
	}
	fn := sites[0].Fn.Addr
	for i, q := range reqs {
		in := tg.Installed(q)
		want := springboard.Springboard
		switch {
		case cover(i):
			want = springboard.Cover
		case i == 4:
			want = springboard.Pun
			if p := tg.owner[q].dev.puns[sites[i].Addr()]; p == nil || len(p.code) != 3 {
				t.Errorf("%s: pun %+v, want one of 3 bytes (the ret and its nops)", sites[i].Where(), p)
			}
		}
		if in.Class != want {
			t.Errorf("%s: installed as %s, want %s", sites[i].Where(), in.Class, want)
		}
		if in.Springboard != 0 {
			t.Logf("%s: springboard slot at padret+%#x", sites[i].Where(), in.Springboard-fn)
			for k, tl := range tails[:3] {
				lo := sites[k].Addr() + uint64(len(sites[k].Bytes()))
				for _, c := range sites[k].Covered() {
					lo += uint64(len(c.Bytes()))
				}
				if in.Springboard < lo+uint64(tl.pad) && lo < in.Springboard+springboard.SlotLen {
					t.Errorf("%s: its slot at %#x overlaps the nops %s's jmp overwrites", sites[i].Where(), in.Springboard, tl.name)
				}
			}
		}
	}
	got := w.round(t)
	if got != want {
		t.Fatalf("output with the splices %q, without %q", got, want)
	}
	for i, tl := range tails {
		var n uint64
		if _, err := fmt.Sscanf(got[strings.Index(got, tl.name):], tl.name+" %d", &n); err != nil {
			t.Fatalf("%q: %v", got, err)
		}
		if c := tg.Counter(reqs[i], 0); c != n {
			t.Errorf("%s (%s): counted %d, the program says %d", sites[i].Where(), tl.name, c, n)
		}
	}
	if err := tg.Close(); err != nil {
		t.Fatal(err)
	}
	if now := textOf(t, pid, sites[0].Fn); !bytes.Equal(now, orig) {
		t.Errorf("after detach: %x, want %x", now, orig)
	}
	if again := w.round(t); again != want {
		t.Errorf("after detach: %q, want %q", again, want)
	}
}
