package splice

import (
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
)

// Verdicts remembers codegen's answers for recently seen encodings:
// whether a patch can reproduce an instruction, and whether its copy can
// fall through to the next one. The kernel repeats most of its
// instructions byte for byte (push %rbp, mov %rdi,%rbx, ret...) and each
// check costs an allocation, so a pass over the whole kernel asks once per
// encoding. The answers depend on the bytes only. One goroutine uses a
// Verdicts at a time.
type Verdicts struct {
	reloc verdictCache // codegen.CheckRelocatable == nil
	plain verdictCache // codegen.CanFallThroughInst
}

// NewVerdicts returns an empty cache (about half a megabyte).
func NewVerdicts() *Verdicts { return new(Verdicts) }

// verdictCache is direct mapped and small, so it stays in the CPU's
// cache: a large map was slower than the check itself.
type verdictCache [verdictSlots]verdictEntry

type verdictEntry struct {
	key [15]byte
	n   uint8 // encoding length; 0: empty
	ok  bool
}

const verdictSlots = 1 << 14

func (v *Verdicts) relocatable(in *cfg.Instruction) bool {
	e, ok, hit := v.reloc.lookup(in.Bytes)
	if !hit {
		ok = codegen.CheckRelocatable(in.Addr, in.Inst, in.Bytes) == nil
		e.store(in.Bytes, ok)
	}
	return ok
}

func (v *Verdicts) fallsThrough(in *cfg.Instruction) bool {
	e, ok, hit := v.plain.lookup(in.Bytes)
	if !hit {
		ok = codegen.CanFallThroughInst(in.Addr, in.Inst, in.Bytes)
		e.store(in.Bytes, ok)
	}
	return ok
}

// lookup finds b's slot and, if it holds b, the verdict remembered. (No
// callback: a closure per instruction would cost the allocation the cache
// saves.) Encodings over 15 bytes have no slot.
func (c *verdictCache) lookup(b []byte) (e *verdictEntry, ok, hit bool) {
	if len(b) > 15 {
		return nil, false, false
	}
	h := uint32(2166136261) // FNV-1a
	for _, x := range b {
		h = (h ^ uint32(x)) * 16777619
	}
	e = &c[h%verdictSlots]
	if int(e.n) == len(b) && string(e.key[:e.n]) == string(b) {
		return e, e.ok, true
	}
	return e, false, false
}

// store remembers ok for b in slot e (nil: nothing).
func (e *verdictEntry) store(b []byte, ok bool) {
	if e != nil {
		e.n, e.ok = uint8(copy(e.key[:], b)), ok
	}
}
