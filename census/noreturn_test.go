package census

import (
	"testing"

	"github.com/kinst/kinst/cfg"
)

func TestNoReturnFunctions(t *testing.T) {
	blk := func(exit cfg.ExitKind, calls []uint64, succs ...int) summaryBlock {
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
		panicFn: {blocks: []summaryBlock{blk(cfg.Trap, nil)}},
		die:     {blocks: []summaryBlock{blk(cfg.NoExit, []uint64{panicFn}, 1), blk(cfg.Return, nil)}},
		maybe:   {blocks: []summaryBlock{blk(cfg.NoExit, nil, 1, 2), blk(cfg.Return, []uint64{die}), blk(cfg.Return, nil)}},
		loop:    {blocks: []summaryBlock{blk(cfg.NoExit, nil, 0)}},
		tail:    {blocks: []summaryBlock{{exit: cfg.TailCall, tail: die}}},
		tailOut: {blocks: []summaryBlock{{exit: cfg.TailCall, tail: 0xdead}}},
		rec:     {blocks: []summaryBlock{blk(cfg.NoExit, nil, 1, 2), blk(cfg.Return, []uint64{rec}), blk(cfg.Return, nil)}},
		calls:   {blocks: []summaryBlock{blk(cfg.Return, []uint64{maybe, 0xbeef})}},
	}
	nr := noReturnFunctions(sums)
	want := map[uint64]bool{panicFn: true, die: true, loop: true, tail: true}
	for a := range sums {
		if nr[a] != want[a] {
			t.Errorf("%#x: noreturn=%v, want %v", a, nr[a], want[a])
		}
	}
}

func TestCallGraph(t *testing.T) {
	sums := map[uint64]*summary{
		0x10: {blocks: []summaryBlock{{calls: []uint64{0x20, 0x30}, callSites: []uint64{0x11, 0x15}, exit: cfg.TailCall, tail: 0x40, tailSite: 0x19}}},
		0x20: {blocks: []summaryBlock{{calls: []uint64{0x30}, callSites: []uint64{0x21}, exit: cfg.Return}}},
	}
	g := callGraph(sums)
	if len(g.Callees[0x10]) != 3 || len(g.Callers[0x30]) != 2 || len(g.Callers[0x40]) != 1 || !g.Callers[0x40][0].Tail {
		t.Errorf("graph: callees %v callers %v", g.Callees, g.Callers)
	}
	if e := g.Callers[0x20][0]; e.Caller != 0x10 || e.Site != 0x11 || e.Tail {
		t.Errorf("edge %+v", e)
	}
}
