package cover

import (
	"slices"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
)

// Inferable returns the blocks of f whose coverage follows from their
// successors', so they need no probe, each with the successors it is
// inferred from (cfg block indices); probed(b) says whether block b will
// have a probe of its own.
//
// bcov (ESEC/FSE 2020) probes only the blocks that dominator and
// post-dominator facts cannot account for, on binaries whose runs end
// before coverage is read. A running kernel's coverage is read while
// tasks are still inside functions, asleep in a callee or preempted, so
// kinst infers only what holds at any instant: a block B is covered
// exactly when one of its successors is if
//
//   - B runs no call, int3 or ud* (nothing that sleeps, or leaves without
//     going on to a successor), holds no instruction a kernel table names
//     (an exception-table entry sends a fault elsewhere, a jump label
//     changes B's successors), and ends in a branch or falls through into
//     the function: once B starts, a successor starts a few instructions
//     later, without a call;
//   - every successor has B as its only predecessor and is entered no
//     other way (not the function's entry, a fixup's landing, or another
//     symbol's start), so it runs only after B;
//   - every successor is probed, or inferred in turn.
//
// Blocks are decided after their successors (a postorder from the entry),
// so a chain of inferences always ends at probed blocks. A block no path
// from the entry reaches keeps its probe.
func Inferable(f *splice.Func, probed func(b int) bool) map[int][]int {
	blocks := f.Blocks
	if len(blocks) == 0 {
		return nil
	}
	var owned interface {
		Reason(uint64) string
		Landing(uint64) bool
	}
	var syms *kernel.Symbols
	if k := f.Facts(); k != nil {
		if k.Owned != nil {
			owned = k.Owned
		}
		syms = k.Symbols
	}
	entered := func(s int) bool { // entered otherwise than from its predecessor
		if s == 0 || blocks[s].Padding || blocks[s].N == 0 {
			return true
		}
		preds := 0
		for _, p := range blocks[s].Preds {
			if !blocks[p].Padding { // padding never runs into it
				preds++
			}
		}
		if preds != 1 {
			return true
		}
		start := blocks[s].Start(f.Fn)
		if owned != nil && owned.Landing(start) {
			return true
		}
		return syms != nil && len(syms.FunctionsAt(start)) > 0
	}
	quiet := func(b *cfg.Block) bool { // runs on into a successor, whatever happens
		if b.Exit != cfg.NoExit || b.JumpTable != nil || len(b.Succs) == 0 || b.Padding {
			return false
		}
		for i := b.First; i < b.First+b.N; i++ {
			in := &f.Fn.Insns[i]
			switch in.Inst.Op {
			case x86asm.CALL, x86asm.INT, x86asm.UD0, x86asm.UD1, x86asm.UD2, x86asm.SYSCALL, x86asm.HLT:
				return false
			}
			if in.Bytes[0] == 0xcc || owned != nil && owned.Reason(in.Addr) != "" {
				return false
			}
		}
		return true
	}
	out := map[int][]int{}
	seen := make([]bool, len(blocks))
	var visit func(b int)
	visit = func(b int) {
		seen[b] = true
		for _, e := range blocks[b].Succs {
			if !seen[e.To] {
				visit(e.To)
			}
		}
		blk := &blocks[b]
		if !quiet(blk) {
			return
		}
		var from []int
		for _, e := range blk.Succs {
			s := e.To
			if _, inferred := out[s]; entered(s) || !inferred && !probed(s) {
				return
			}
			if !slices.Contains(from, s) {
				from = append(from, s)
			}
		}
		out[b] = from
	}
	visit(0)
	return out
}
