package splice

import (
	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/springboard"
)

// SpringboardSpace returns the bytes of fn that are safe to overwrite
// with springboard slots: padding blocks (unreachable from the entry,
// only nops and int3s) that follow, in address order, a jmp or ret. Not a
// call, whose callee might return after all; not ud2, which is also WARN
// (execution resumes after it); not a lone int3, which may be a kprobe
// over a live instruction (the int3 that straight-line-speculation
// hardening puts after a jmp or ret is a padding block itself, merged with
// what follows). A jump the kernel rewrites at run time (a static key or
// static call site, owned reports it) does not count: flipped to a nop,
// it would fall into the padding. A function with an indirect jump that was
// not resolved to a table yields nothing: such a jump could land anywhere
// in it. Adjacent padding blocks are merged.
func SpringboardSpace(fn *cfg.Function, blocks []cfg.Block, owned func(addr uint64) bool) []springboard.Range {
	if cfg.HasUnresolvedJump(blocks) {
		return nil
	}
	var out []springboard.Range
	for _, b := range blocks {
		if !b.Padding || b.First == 0 {
			continue
		}
		start := fn.Insns[b.First].Addr
		end := fn.Insns[b.First+b.N-1].End()
		if n := len(out); n > 0 && out[n-1].End == start {
			out[n-1].End = end
			continue
		}
		prev := &fn.Insns[b.First-1]
		if !unconditional(prev) || owned != nil && owned(prev.Addr) {
			continue
		}
		out = append(out, springboard.Range{Start: start, End: end})
	}
	return out
}

// unconditional: execution never continues at the next instruction.
func unconditional(in *cfg.Instruction) bool {
	return in.Inst.Op == x86asm.JMP || in.Inst.Op == x86asm.RET
}
