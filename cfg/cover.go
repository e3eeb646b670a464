package cfg

import "golang.org/x/arch/x86/x86asm"

// CoverRun finds the run of whole instructions a covering splice at
// instruction i of fn would overwrite: i and the instructions after it in
// its basic block blk, until they hold at least need bytes (a jmp
// rel32's 5). It returns how many instructions that is (two or more), or
// false when blk is padding, the run would leave the block, or usable
// refuses one of them. usable(j, last) decides what the block structure
// cannot see: whether code may be entered at instruction j other than by
// a decoded branch (a symbol, an exception fixup or a static key's
// target), whether it may be spliced and the patch can reproduce it, and
// -- for every one but the last -- that it falls through without a branch
// or call (a call would return into the overwritten bytes).
//
// Within one basic block no decoded branch lands after i; that is what
// makes the run safe to overwrite at once, given the driver's wait for
// tasks stopped inside it. It is so only if every indirect jump of the
// function was resolved to a table: the caller checks HasUnresolvedJump
// first.
func CoverRun(fn *Function, blk *Block, i, need int, usable func(j int, last bool) bool) (int, bool) {
	if blk.Padding || i < blk.First || i >= blk.First+blk.N {
		return 0, false
	}
	size := 0
	for j := i; j < blk.First+blk.N; j++ {
		size += fn.Insns[j].Len()
		last := size >= need
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

// HasUnresolvedJump reports whether some indirect jump of the function
// was not resolved to a table, so that it could land anywhere in it.
func HasUnresolvedJump(blocks []Block) bool {
	for k := range blocks {
		if b := &blocks[k]; b.Exit == IndirectJump && b.JumpTable == nil && !b.Padding {
			return true
		}
	}
	return false
}

// BlockOf returns the block of blocks (in address order, as BlocksOpt
// returns them) that holds instruction i, or nil.
func BlockOf(blocks []Block, i int) *Block {
	lo, hi := 0, len(blocks)
	for lo < hi {
		m := (lo + hi) / 2
		if blocks[m].First+blocks[m].N <= i {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(blocks) && i >= blocks[lo].First && i < blocks[lo].First+blocks[lo].N {
		return &blocks[lo]
	}
	return nil
}

// CoverRunIntoPadding finds a covering run that ends in padding: from
// instruction i to the end of its block blk, which ends in a ret or jmp,
// and then the nop padding right after it (padding blocks: never
// executed, so never a way in), until the bytes hold need. The jmp then
// overwrites the short tail of a block that no jmp fits ("pop %rbx;
// ret", a lone ret before the alignment nops of the next label), and the
// patch runs the block's instructions alone. It returns the number of
// the block's instructions in the run, i first, and of padding bytes the
// jmp overwrites; false when the run fits in blk (CoverRun's), blk does
// not end so, no nop padding follows, or usable refuses one of blk's
// instructions: usable(j, last) as for CoverRun, last true for the ret
// or jmp. Whether the padding holds a springboard slot is the caller's to
// say.
func CoverRunIntoPadding(fn *Function, blocks []Block, blk *Block, i, need int, usable func(j int, last bool) bool) (n, pad int, ok bool) {
	if blk.Padding || i < blk.First || i >= blk.First+blk.N {
		return 0, 0, false
	}
	end := blk.First + blk.N // the first instruction after the block
	size := 0
	for j := i; j < end; j++ {
		size += fn.Insns[j].Len()
		last := j == end-1
		if size >= need || !usable(j, last) {
			return 0, 0, false // long enough within the block: CoverRun's
		}
	}
	if pad = need - size; PaddingAfter(fn, blocks, end-1) < pad {
		return 0, 0, false // not a ret or jmp, or too few nops after it
	}
	return end - i, pad, true
}

// PaddingAfter is how many bytes of nop padding (padding blocks: never
// executed) follow instruction j, when j ends its block with a ret or
// jmp; 0 otherwise.
func PaddingAfter(fn *Function, blocks []Block, j int) int {
	b := BlockOf(blocks, j)
	if b == nil || b.Padding || j != b.First+b.N-1 {
		return 0
	}
	if op := fn.Insns[j].Inst.Op; op != x86asm.RET && op != x86asm.JMP {
		return 0
	}
	n := 0
	for k := j + 1; k < len(fn.Insns); k++ {
		if pb := BlockOf(blocks, k); pb == nil || !pb.Padding || fn.Insns[k].Inst.Op != x86asm.NOP {
			break
		}
		n += fn.Insns[k].Len()
	}
	return n
}

// CoverRunIntoNext finds a covering run for block b that starts in the
// block before it: b is entered only by falling through from that block
// (its one predecessor, by a fallthrough edge alone: a jcc not taken, no
// branch or table lands on it), so the run may go from instruction i of
// the predecessor over the rest of it, the jcc included (its patch part
// falls through when not taken), into b, up to and including b's first
// instruction and on within b until the bytes hold need. The splice then
// reaches b's requests at its first instruction's part of the patch. It
// returns the run's length in instructions; false when b is not so
// entered, i is not in its predecessor, or usable(j, last) refuses an
// instruction (as for CoverRun; the jcc is not last). Whether the
// function has unresolved indirect jumps is the caller's to check.
func CoverRunIntoNext(fn *Function, blocks []Block, b, i, need int, usable func(j int, last bool) bool) (int, bool) {
	if b < 1 || b >= len(blocks) {
		return 0, false
	}
	blk, pred := &blocks[b], &blocks[b-1]
	if blk.Padding || pred.Padding || blk.N == 0 || i < pred.First || i >= pred.First+pred.N {
		return 0, false
	}
	if len(blk.Preds) != 1 || blk.Preds[0] != b-1 {
		return 0, false
	}
	edges := 0
	for _, e := range pred.Succs {
		if e.To == b {
			if e.Kind != Fallthrough {
				return 0, false
			}
			edges++
		}
	}
	if edges != 1 {
		return 0, false
	}
	size := 0
	for j := i; j < blk.First+blk.N; j++ {
		size += fn.Insns[j].Len()
		last := size >= need && j >= blk.First
		if !usable(j, last) {
			return 0, false
		}
		if last {
			return j - i + 1, true
		}
	}
	return 0, false
}
