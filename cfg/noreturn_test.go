package cfg

import (
	"strings"
	"testing"

	"github.com/kinst/kinst/kernel"
)

func TestNoReturnFunctions(t *testing.T) {
	blk := func(exit ExitKind, calls []uint64, succs ...int) summaryBlock {
		return summaryBlock{exit: exit, calls: calls, succs: succs}
	}
	const (
		panicFn = 0x100 + iota
		die
		maybe
		loop
		tail
		tailOut
		rec
		calls
	)
	sums := map[uint64]*summary{
		panicFn: {blocks: []summaryBlock{blk(Trap, nil)}},
		die:     {blocks: []summaryBlock{blk(NoExit, []uint64{panicFn}, 1), blk(Return, nil)}},
		maybe:   {blocks: []summaryBlock{blk(NoExit, nil, 1, 2), blk(Return, []uint64{die}), blk(Return, nil)}},
		loop:    {blocks: []summaryBlock{blk(NoExit, nil, 0)}},
		tail:    {blocks: []summaryBlock{{exit: TailCall, tail: die}}},
		tailOut: {blocks: []summaryBlock{{exit: TailCall, tail: 0xdead}}},
		rec:     {blocks: []summaryBlock{blk(NoExit, nil, 1, 2), blk(Return, []uint64{rec}), blk(Return, nil)}},
		calls:   {blocks: []summaryBlock{blk(Return, []uint64{maybe, 0xbeef})}},
	}
	nr := noReturnFunctions(sums)
	want := map[uint64]bool{panicFn: true, die: true, loop: true, tail: true}
	for a := range sums {
		if nr[a] != want[a] {
			t.Errorf("%#x: noreturn=%v, want %v", a, nr[a], want[a])
		}
	}
}

func TestBlocksEndAtNoReturnCalls(t *testing.T) {
	fn, names := assembleFunction(t, "live")
	// Pretend g never returns: the block with "call g" ends there.
	g := uint64(0)
	for _, in := range fn.Insns {
		if t, ok := BranchTarget(&in); ok && in.Inst.Op.String() == "CALL" {
			g = t
		}
	}
	blocks := fn.BlocksWith(names, func(a uint64) bool { return a == g })
	found := false
	for _, b := range blocks {
		if b.Exit == NoReturnCall {
			found = true
			if len(b.Succs) != 0 || b.Last(fn).Inst.Op.String() != "CALL" {
				t.Errorf("noreturn block: %+v", b)
			}
		}
	}
	if !found {
		t.Fatal("no block ends at the noreturn call")
	}
	lv := fn.Live(blocks, names, nil)
	for bi, b := range blocks {
		if b.Exit == NoReturnCall && lv.LiveOut[bi] != 0 {
			t.Errorf("live after a noreturn call: %v", lv.LiveOut[bi])
		}
	}
}

func TestPortableNames(t *testing.T) {
	s, err := kernel.ParseKallsyms(strings.NewReader(kallsymsFixture))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"filename_lookup", "modfn"} {
		sym, _, _ := s.Lookup(name)
		p, ok := s.Portable(sym.Addr)
		if !ok {
			t.Fatalf("%s: no portable name", name)
		}
		if a, ok := s.FromPortable(p); !ok || a != sym.Addr {
			t.Errorf("%s → %q → %#x, %v", name, p, a, ok)
		}
	}
	if _, ok := s.Portable(0xffffffff81001041); ok {
		t.Error("mid-function address got a portable name")
	}
}

func TestCallGraph(t *testing.T) {
	sums := map[uint64]*summary{
		0x10: {blocks: []summaryBlock{{calls: []uint64{0x20, 0x30}, callSites: []uint64{0x11, 0x15}, exit: TailCall, tail: 0x40, tailSite: 0x19}}},
		0x20: {blocks: []summaryBlock{{calls: []uint64{0x30}, callSites: []uint64{0x21}, exit: Return}}},
	}
	g := callGraph(sums)
	if len(g.Callees[0x10]) != 3 || len(g.Callers[0x30]) != 2 || len(g.Callers[0x40]) != 1 || !g.Callers[0x40][0].Tail {
		t.Errorf("graph: callees %v callers %v", g.Callees, g.Callers)
	}
	if e := g.Callers[0x20][0]; e.Caller != 0x10 || e.Site != 0x11 || e.Tail {
		t.Errorf("edge %+v", e)
	}
}
