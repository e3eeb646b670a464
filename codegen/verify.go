package codegen

import (
	"bytes"
	"fmt"

	"golang.org/x/arch/x86/x86asm"
)

// patchReader walks a patch instruction by instruction.
type patchReader struct {
	code []byte
	base uint64
	off  int
}

func (r *patchReader) fail(format string, args ...any) error {
	return &VerifyError{Offset: r.off, Reason: fmt.Sprintf(format, args...)}
}

func (r *patchReader) next() (x86asm.Inst, uint64, error) {
	return r.nextN(len(r.code) - r.off)
}

// nextN decodes the next instruction from at most n bytes, so that what
// follows cannot change how it decodes.
func (r *patchReader) nextN(n int) (x86asm.Inst, uint64, error) {
	if r.off >= len(r.code) {
		return x86asm.Inst{}, 0, r.fail("patch ends early")
	}
	inst, err := x86asm.Decode(r.code[r.off:min(r.off+n, len(r.code))], 64)
	if err != nil {
		return inst, 0, r.fail("undecodable: %v", err)
	}
	pc := r.base + uint64(r.off)
	r.off += inst.Len
	return inst, pc, nil
}

// byte consumes one expected byte.
func (r *patchReader) byte(want byte, what string) error {
	if r.off >= len(r.code) || r.code[r.off] != want {
		return r.fail("want %s", what)
	}
	r.off++
	return nil
}

// jmpTo consumes a jmp rel32 that must land on target.
func (r *patchReader) jmpTo(target uint64, what string) error {
	start := r.off
	inst, pc, err := r.next()
	if err != nil {
		return err
	}
	if inst.Op != x86asm.JMP || inst.Len != lenJmp32 {
		r.off = start
		return r.fail("want jmp rel32 %s, got %s", what, gnu(inst, pc))
	}
	if got := pc + uint64(inst.Len) + uint64(int64(inst.Args[0].(x86asm.Rel))); got != target {
		r.off = start
		return r.fail("jmp %s lands on %#x, want %#x", what, got, target)
	}
	return nil
}

// ripDisp is a RIP-relative displacement, sign-extended: x86asm keeps
// the 32 bits as decoded.
func ripDisp(m x86asm.Mem) uint64 { return uint64(int64(int32(m.Disp))) }

// absMem returns the absolute address of a RIP-relative operand.
func absMem(inst x86asm.Inst, pc uint64) (uint64, bool) {
	for _, a := range inst.Args {
		if m, ok := a.(x86asm.Mem); ok && m.Base == x86asm.RIP {
			return pc + uint64(inst.Len) + ripDisp(m), true
		}
	}
	return 0, false
}

// Verify decodes a patch built by CounterPatch and checks it: the counter
// increment addresses counter, the relocated instruction does what the
// original did (same operation and operands, every absolute branch target
// and RIP-relative address unchanged), control returns to the instruction
// after the site, and nothing follows. kerninstd calls it before every
// splice.
func Verify(patch []byte, patchAddr uint64, site Site, counter uint64, saveFlags bool) error {
	r := &patchReader{code: patch, base: patchAddr}
	if saveFlags {
		if err := r.byte(opPushfq, "pushfq"); err != nil {
			return err
		}
	}
	inst, pc, err := r.next()
	if err != nil {
		return err
	}
	if inst.Len != lenLockInc || !bytes.Equal(r.code[r.off-inst.Len:r.off-4], lockIncOpcode) || inst.Op != x86asm.INC || inst.MemBytes != 8 || !hasLock(inst) {
		return r.fail("want lock incq, got %s", gnu(inst, pc))
	}
	if a, ok := absMem(inst, pc); !ok || a != counter {
		return r.fail("increment addresses %#x, want counter %#x", a, counter)
	}
	if saveFlags {
		if err := r.byte(opPopfq, "popfq"); err != nil {
			return err
		}
	}
	if err := verifyRelocated(r, site); err != nil {
		return err
	}
	if r.off != len(patch) {
		return r.fail("%d unexpected trailing bytes", len(patch)-r.off)
	}
	return nil
}

// VerifyRelocation checks code produced by Relocate(addr, site).
func VerifyRelocation(code []byte, addr uint64, site Site) error {
	r := &patchReader{code: code, base: addr}
	if err := verifyRelocated(r, site); err != nil {
		return err
	}
	if r.off != len(code) {
		return r.fail("%d unexpected trailing bytes", len(code)-r.off)
	}
	return nil
}

func hasLock(inst x86asm.Inst) bool {
	for _, p := range inst.Prefix {
		if p&0xff == x86asm.PrefixLOCK {
			return true
		}
	}
	return false
}

func verifyRelocated(r *patchReader, site Site) error {
	orig, err := decodeSite(site)
	if err != nil {
		return err
	}
	k, err := classify(orig, site)
	if err != nil {
		return err
	}
	next := site.next()
	switch k {
	case kindJcc:
		inst, pc, err := r.next()
		if err != nil {
			return err
		}
		if inst.Op != orig.Op || inst.Len != 6 {
			return r.fail("want %v rel32, got %s", orig.Op, gnu(inst, pc))
		}
		if got := pc + 6 + uint64(int64(inst.Args[0].(x86asm.Rel))); got != branchTarget(orig, site) {
			return r.fail("%v lands on %#x, want %#x", orig.Op, got, branchTarget(orig, site))
		}
		return r.jmpTo(next, "back")
	case kindJmp:
		return r.jmpTo(branchTarget(orig, site), "to the original target")
	case kindCall:
		if err := verifyPush(r, next); err != nil {
			return err
		}
		return r.jmpTo(branchTarget(orig, site), "to the callee")
	case kindShortOnly:
		inst, pc, err := r.next()
		if err != nil {
			return err
		}
		if inst.Op != orig.Op || inst.Args[0] != x86asm.Rel(2) {
			return r.fail("want %v +2, got %s", orig.Op, gnu(inst, pc))
		}
		if err := r.byte(opJmpRel8, "jmp +5"); err != nil {
			return err
		}
		if err := r.byte(lenJmp32, "jmp +5"); err != nil {
			return err
		}
		if err := r.jmpTo(branchTarget(orig, site), "to the original target"); err != nil {
			return err
		}
		return r.jmpTo(next, "back")
	case kindIndirectCall:
		if err := verifyPush(r, next); err != nil {
			return err
		}
		inst, pc, err := r.next()
		if err != nil {
			return err
		}
		if inst.Op != x86asm.JMP {
			return r.fail("want jmp through the call's operand, got %s", gnu(inst, pc))
		}
		return sameOperands(r, inst, pc, orig, site)
	}
	inst, pc, err := r.nextN(len(site.Bytes))
	if err != nil {
		return err
	}
	if inst.Op != orig.Op {
		return r.fail("relocated %s, original %s", gnu(inst, pc), gnu(orig, site.Addr))
	}
	if err := sameOperands(r, inst, pc, orig, site); err != nil {
		return err
	}
	// Same encoding too, but for the displacement the move rewrote.
	got := r.code[r.off-inst.Len : r.off]
	for i := range got {
		inDisp := hasRIPMem(orig) && i >= orig.PCRelOff && i < orig.PCRelOff+orig.PCRel
		if !inDisp && got[i] != site.Bytes[i] {
			return r.fail("relocated encoding % x differs from the original % x", got, site.Bytes)
		}
	}
	if k == kindExit || k == kindIndirectJmp {
		return nil
	}
	return r.jmpTo(next, "back")
}

func verifyPush(r *patchReader, ret uint64) error {
	inst, pc, err := r.next()
	if err != nil {
		return err
	}
	if inst.Op != x86asm.PUSH || inst.Len != lenPush32 || uint64(int64(inst.Args[0].(x86asm.Imm))) != ret {
		return r.fail("want push of return address %#x, got %s", ret, gnu(inst, pc))
	}
	return nil
}

// sameOperands compares operands, with RIP-relative memory compared by the
// absolute address it names.
func sameOperands(r *patchReader, inst x86asm.Inst, pc uint64, orig x86asm.Inst, site Site) error {
	for i := range inst.Args {
		a, b := inst.Args[i], orig.Args[i]
		ma, okA := a.(x86asm.Mem)
		mb, okB := b.(x86asm.Mem)
		if okA && okB && ma.Base == x86asm.RIP && mb.Base == x86asm.RIP {
			got := pc + uint64(inst.Len) + ripDisp(ma)
			want := site.next() + ripDisp(mb)
			ma.Disp, mb.Disp = 0, 0
			if ma != mb || got != want {
				return r.fail("operand %d addresses %#x, want %#x", i, got, want)
			}
			continue
		}
		if a != b {
			return r.fail("operand %d is %v, want %v", i, a, b)
		}
	}
	if inst.MemBytes != orig.MemBytes || inst.DataSize != orig.DataSize {
		return r.fail("operand size changed")
	}
	return nil
}
