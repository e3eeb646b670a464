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
//   - B dominates every successor: each runs only after B, even where it
//     has other predecessors (the join of an if without an else). The
//     dominators are computed from every way into the function: its
//     entry, a fixup's landing, another symbol's start, and, where a
//     block leaves by an unresolved indirect jump (a computed goto), every
//     block;
//   - every successor is probed, or inferred in turn.
//
// Each block is inferred only from blocks it dominates, decided first (a
// postorder), so a chain of inferences always ends at probed blocks. A
// block no way into the function reaches keeps its probe.
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
	enteredElsewhere := func(b int) bool { // other than through the function's CFG
		if blocks[b].Padding || blocks[b].N == 0 {
			return false
		}
		start := blocks[b].Start(f.Fn)
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
	// Roots: the entry, and every block entered otherwise. An unresolved
	// indirect jump (a computed goto: the BPF interpreter's, an
	// interpreter's in a process) may enter any block.
	computedGoto := slices.ContainsFunc(blocks, func(b cfg.Block) bool { return b.Exit == cfg.IndirectJump })
	entries := []int{0}
	for b := 1; b < len(blocks); b++ {
		if computedGoto || enteredElsewhere(b) {
			entries = append(entries, b)
		}
	}
	idom, post := cfg.Dominators(blocks, entries)
	out := map[int][]int{}
	for _, b := range post { // successors it dominates first
		blk := &blocks[b]
		if !quiet(blk) {
			continue
		}
		var from []int
		for _, e := range blk.Succs {
			s := e.To
			if _, inferred := out[s]; idom[s] != b || !inferred && !probed(s) {
				from = nil
				break
			}
			if !slices.Contains(from, s) {
				from = append(from, s)
			}
		}
		if from != nil {
			out[b] = from
		}
	}
	return out
}
