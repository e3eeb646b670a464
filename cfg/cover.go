package cfg

import "github.com/kinst/kinst/kernel"

// CoverRun finds the run of whole instructions a covering splice at
// instruction i of fn would overwrite: i and the instructions after it in
// its basic block, until they hold at least need bytes (a jmp rel32's 5).
// It returns how many instructions that is (two or more), or false when
// the run would leave the block, the function has an indirect jump not
// resolved to a table (it could land anywhere, between two of them), code
// may be entered after i other than by a decoded branch (a symbol starts
// there, or owned names it a landing: an exception fixup, a static key's
// target; syms and owned may be nil), or usable refuses one of them.
// usable(j, last) decides what the CFG cannot see: whether the
// instruction may be spliced and the patch can reproduce it, and -- for
// every one but the last -- that it falls through without a branch or
// call (a call would return into the overwritten bytes).
//
// Within one basic block no decoded branch lands after i; that is what
// makes the run safe to overwrite at once, given the driver's wait for
// tasks stopped inside it.
func CoverRun(fn *Function, blocks []Block, i, need int, syms *kernel.Symbols, owned *kernel.OwnedSites, usable func(j int, last bool) bool) (int, bool) {
	if i < 0 || i >= len(fn.Insns) {
		return 0, false
	}
	if hasUnresolvedJump(blocks) {
		return 0, false
	}
	for k := range blocks {
		if b := &blocks[k]; i >= b.First && i < b.First+b.N {
			return coverInBlock(fn, b, i, need, syms, owned, usable)
		}
	}
	return 0, false
}

// hasUnresolvedJump: some indirect jump of the function was not resolved
// to a table, so it could land anywhere in it.
func hasUnresolvedJump(blocks []Block) bool {
	for k := range blocks {
		if b := &blocks[k]; b.Exit == IndirectJump && b.JumpTable == nil && !b.Padding {
			return true
		}
	}
	return false
}

// coverInBlock is CoverRun with i's block known and the function checked.
func coverInBlock(fn *Function, blk *Block, i, need int, syms *kernel.Symbols, owned *kernel.OwnedSites, usable func(j int, last bool) bool) (int, bool) {
	if blk.Padding {
		return 0, false
	}
	size := 0
	for j := i; j < blk.First+blk.N; j++ {
		size += fn.Insns[j].Len()
		last := size >= need
		if j > i && (owned.Landing(fn.Insns[j].Addr) || symbolAt(syms, fn.Insns[j].Addr)) {
			return 0, false
		}
		if !usable(j, last) {
			return 0, false
		}
		if last {
			if j == i {
				return 0, false // long enough alone: a direct splice
			}
			return j - i + 1, true
		}
	}
	return 0, false
}

// symbolAt: a symbol starts at addr (code may be entered there).
func symbolAt(syms *kernel.Symbols, addr uint64) bool {
	if syms == nil {
		return false
	}
	_, off, ok := syms.At(addr)
	return ok && off == 0
}
