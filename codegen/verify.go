package codegen

import (
	"bytes"
	"fmt"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

// Verify decodes a patch built by CounterPatch back and checks it before it
// is ever spliced: the expected sequence of instructions; the increment
// addresses counter; the relocated instruction has the original's
// operation and operands, with every branch target and RIP-relative
// address equal to the original's; control returns to
// site.Addr+len(site.Bytes) where the original falls through; nothing
// follows. A bad patch gives a *VerifyError (errors.Is ErrVerify); a site
// that cannot be relocated at all gives its *UnsupportedError.
func Verify(patch []byte, patchAddr uint64, site Site, counter uint64, saveFlags bool) error {
	in, err := analyze(site)
	if err != nil {
		return err
	}
	r := &reader{code: patch, base: patchAddr}
	if saveFlags {
		if err := r.expect([]byte{opPushfq}, "pushfq"); err != nil {
			return err
		}
	}
	if err := r.lockIncq(counter); err != nil {
		return err
	}
	if saveFlags {
		if err := r.expect([]byte{opPopfq}, "popfq"); err != nil {
			return err
		}
	}
	if err := r.relocated(in); err != nil {
		return err
	}
	return r.end()
}

// VerifyRelocation checks code produced by Relocate(addr, site) the way
// Verify checks the relocated part of a patch.
func VerifyRelocation(code []byte, addr uint64, site Site) error {
	return verifyRelocation(code, addr, site, true)
}

// verifyRelocation is VerifyRelocation; without back, no jmp back may
// follow (a PatchSpec.FallThrough instruction).
func verifyRelocation(code []byte, addr uint64, site Site, back bool) error {
	in, err := analyze(site)
	if err != nil {
		return err
	}
	r := &reader{code: code, base: addr, noBack: !back}
	if err := r.relocated(in); err != nil {
		return err
	}
	return r.end()
}

// reader walks a patch instruction by instruction. Its checks never
// trust the patch: any byte sequence gives an error, not a panic.
type reader struct {
	code []byte
	base uint64
	off  int
	// noBack: the relocated instruction falls through to the code after
	// the patch; no jmp back follows it.
	noBack bool
}

func (r *reader) pc() uint64 { return r.base + uint64(r.off) }

func (r *reader) fail(format string, args ...any) error {
	return &VerifyError{Offset: r.off, Reason: fmt.Sprintf(format, args...)}
}

// decode decodes the next instruction from at most n bytes, so that what
// follows cannot change how it decodes, and returns it with its address
// and encoding without consuming it.
func (r *reader) decode(n int) (x86asm.Inst, []byte, error) {
	if r.off >= len(r.code) {
		return x86asm.Inst{}, nil, r.fail("patch ends early")
	}
	inst, err := x86dec.Decode(r.code[r.off:min(r.off+n, len(r.code))])
	if err == nil && inst.Op == 0 {
		err = errInvalid
	}
	if err != nil {
		return inst, nil, r.fail("undecodable: %v", err)
	}
	return inst, r.code[r.off : r.off+inst.Len], nil
}

func (r *reader) end() error {
	if r.off != len(r.code) {
		return r.fail("%d unexpected trailing bytes", len(r.code)-r.off)
	}
	return nil
}

// expect consumes exactly the bytes want.
func (r *reader) expect(want []byte, what string) error {
	if !bytes.HasPrefix(r.code[r.off:], want) {
		return r.fail("want %s", what)
	}
	r.off += len(want)
	return nil
}

// branch consumes a relative branch of operation op and length n that
// must land on target.
func (r *reader) branch(op x86asm.Op, n int, target uint64, what string) error {
	if op == x86asm.JMP && n == lenJmp32 && r.off+n <= len(r.code) && r.code[r.off] == 0xe9 {
		// jmp rel32 has one encoding, read as the decoder reads it
		// (each patch ends in one: decoding them was a sixth of
		// verifying a coverage session's patches).
		if got := r.pc() + uint64(n) + uint64(int64(le32(r.code[r.off:], 1))); got != target {
			return r.fail("%v %s lands on %#x, want %#x", op, what, got, target)
		}
		r.off += n
		return nil
	}
	inst, _, err := r.decode(n)
	if err != nil {
		return err
	}
	rel, ok := inst.Args[0].(x86asm.Rel)
	if inst.Op != op || inst.Len != n || !ok {
		return r.fail("want %v (%d bytes) %s, got %q", op, n, what, gnu(inst, r.pc()))
	}
	if got := r.pc() + uint64(n) + uint64(int64(rel)); got != target {
		return r.fail("%v %s lands on %#x, want %#x", op, what, got, target)
	}
	r.off += n
	return nil
}

func (r *reader) jmpTo(target uint64, what string) error {
	return r.branch(x86asm.JMP, lenJmp32, target, what)
}

// lockIncq consumes "lock incq counter(%rip)".
func (r *reader) lockIncq(counter uint64) error {
	inst, enc, err := r.decode(lenLockIncq)
	if err != nil {
		return err
	}
	m, ok := inst.Args[0].(x86asm.Mem)
	if inst.Op != x86asm.INC || inst.Len != lenLockIncq || !bytes.HasPrefix(enc, lockIncq) ||
		!ok || m.Base != x86asm.RIP || inst.MemBytes != 8 {
		return r.fail("want lock incq disp32(%%rip), got %q", gnu(inst, r.pc()))
	}
	if got := r.pc() + lenLockIncq + uint64(int64(le32(enc, 4))); got != counter {
		return r.fail("increment addresses %#x, want counter %#x", got, counter)
	}
	r.off += inst.Len
	return nil
}

// pushRet consumes the push of return address ret: "push $ret", or for
// an address above the sign-extended 32 bits "push $low" and "movl $high,
// 4(%rsp)".
func (r *reader) pushRet(ret uint64) error {
	inst, enc, err := r.decode(lenPush32)
	if err != nil {
		return err
	}
	imm, ok := inst.Args[0].(x86asm.Imm)
	if inst.Op != x86asm.PUSH || inst.Len != lenPush32 || enc[0] != opPushImm || !ok || uint32(imm) != uint32(ret) {
		return r.fail("want push of return address %#x, got %q", ret, gnu(inst, r.pc()))
	}
	r.off += inst.Len
	if uint64(int64(imm)) == ret {
		return nil
	}
	n := len(movlHighToStack) + 4
	inst, enc, err = r.decode(n)
	if err != nil {
		return err
	}
	if inst.Op != x86asm.MOV || inst.Len != n || !bytes.HasPrefix(enc, movlHighToStack) || le32(enc, 4) != int32(uint32(ret>>32)) {
		return r.fail("want movl of return address %#x's high half to 4(%%rsp), got %q", ret, gnu(inst, r.pc()))
	}
	r.off += inst.Len
	return nil
}

// relocated consumes the relocation of in.
func (r *reader) relocated(in *insn) error {
	next := in.next()
	switch in.kind {
	case kindJcc:
		if err := r.branch(in.inst.Op, lenJcc32, in.target(), "to the original target"); err != nil {
			return err
		}
	case kindJmp:
		return r.jmpTo(in.target(), "to the original target")
	case kindCall:
		if err := r.pushRet(next); err != nil {
			return err
		}
		return r.jmpTo(in.target(), "to the callee")
	case kindRCX:
		b := in.site.Bytes
		if !bytes.HasPrefix(r.code[r.off:], b[:len(b)-1]) {
			return r.fail("want %v encoded as the original", in.inst.Op)
		}
		start := r.pc()
		if err := r.branch(in.inst.Op, len(b), start+uint64(len(b))+2, "over the short jmp"); err != nil {
			return err
		}
		if err := r.expect([]byte{opJmpRel8, lenJmp32}, "jmp +5 over the jump to the target"); err != nil {
			return err
		}
		if err := r.jmpTo(in.target(), "to the original target"); err != nil {
			return err
		}
	case kindIndirectCall:
		if err := r.pushRet(next); err != nil {
			return err
		}
		jmp := bytes.Clone(in.site.Bytes)
		jmp[in.l.modrm] = jmp[in.l.modrm]&^0x38 | 4<<3
		if err := r.copyOf(in, jmp, x86asm.JMP); err != nil {
			return err
		}
	default:
		if err := r.copyOf(in, in.site.Bytes, in.inst.Op); err != nil {
			return err
		}
	}
	if !in.kind.jumpsBack() || r.noBack {
		return nil
	}
	return r.jmpTo(next, "back")
}

// copyOf consumes enc (the site's encoding or a same-layout variant) as
// relocated: byte for byte the same but for the RIP-relative displacement,
// which must name the original's absolute address, and decoding to op
// with the original's operands.
func (r *reader) copyOf(in *insn, enc []byte, op x86asm.Op) error {
	inst, got, err := r.decode(len(enc))
	if err != nil {
		return err
	}
	if inst.Op != op || inst.Len != len(enc) || !sameOperands(inst, in.inst) {
		return r.fail("relocated as %q, original %q", gnu(inst, r.pc()), gnu(in.inst, in.site.Addr))
	}
	for i := range got {
		inDisp := in.l.rip >= 0 && i >= in.l.rip && i < in.l.rip+4
		if !inDisp && got[i] != enc[i] {
			return r.fail("relocated encoding % x differs from % x at byte %d", got, enc, i)
		}
	}
	if in.l.rip >= 0 {
		want := in.ripTarget()
		if abs := r.pc() + uint64(len(got)) + uint64(int64(le32(got, in.l.rip))); abs != want {
			return r.fail("RIP-relative operand addresses %#x, want %#x", abs, want)
		}
		// Where x86asm reports RIP-relative, its view must agree.
		for _, a := range inst.Args {
			if m, ok := a.(x86asm.Mem); ok && m.Base == x86asm.RIP {
				if abs := r.pc() + uint64(len(got)) + uint64(int64(int32(m.Disp))); abs != want {
					return r.fail("x86asm sees the operand at %#x, want %#x", abs, want)
				}
			}
		}
	}
	r.off += len(got)
	return nil
}
