package codegen

import (
	"bytes"
	"encoding/binary"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

// Relocate returns code equivalent to site's instruction when placed at
// addr, including the jump back to site.Addr+len(site.Bytes) where the
// original continues there (see FallsThrough):
//
//	plain instruction      copied; a RIP-relative disp32 recomputed; jmp back
//	jcc rel8/rel32         jcc rel32 target; jmp back
//	jmp rel8/rel32         jmp rel32 target
//	call rel32             push $return; jmp rel32 target
//	call *r/m              push $return; jmp *r/m (RIP-relative fixed up)
//	jmp *r/m, ret          copied (RIP-relative fixed up)
//	loop*, jrcxz, jecxz    op +2; jmp +5; jmp rel32 target; jmp back
//
// Calls push the original return address rather than calling from the
// patch: the callee returns into the original code, so stacks stay
// readable and the patch is not on any stack. The expansions of jcc,
// loop and jrcxz do not touch flags or registers beyond what the original
// does. Errors are *UnsupportedError (the instruction cannot be moved)
// and *ReachError (a displacement does not fit 32 bits).
func Relocate(addr uint64, site Site) ([]byte, error) {
	in, err := analyze(site)
	if err != nil {
		return nil, err
	}
	return in.relocateBack(nil, addr, true)
}

// relocateBack appends the relocated instruction, placed at addr, to dst;
// with back, the jmp back to the next instruction where the kind needs it.
func (in *insn) relocateBack(dst []byte, addr uint64, back bool) ([]byte, error) {
	start := len(dst)
	code := dst
	here := func() uint64 { return addr + uint64(len(code)-start) }
	b := in.site.Bytes
	var err error
	switch in.kind {
	case kindJcc:
		code, err = appendJcc(code, b[in.l.opcode]&0xf, here(), in.target())
	case kindJmp:
		code, err = appendJmp(code, here(), in.target())
	case kindCall:
		if code, err = in.appendPushRet(code); err == nil {
			code, err = appendJmp(code, here(), in.target())
		}
	case kindRCX:
		// The same instruction, taken to +2: over the short jmp that
		// skips the rel32 jump to the original target.
		code = append(code, b[:len(b)-1]...)
		code = append(code, 2, opJmpRel8, lenJmp32)
		code, err = appendJmp(code, here(), in.target())
	case kindIndirectCall:
		jmp := bytes.Clone(b)
		jmp[in.l.modrm] = jmp[in.l.modrm]&^0x38 | 4<<3 // ff /2 → ff /4
		if code, err = in.appendPushRet(code); err == nil {
			code, err = in.appendCopy(code, here(), jmp, x86asm.JMP)
		}
	default:
		code, err = in.appendCopy(code, here(), b, in.inst.Op)
	}
	if err != nil {
		return nil, err
	}
	if !back || !in.kind.jumpsBack() {
		return code, nil
	}
	return appendJmp(code, here(), in.next())
}

// appendCopy appends enc, the site's encoding or a variant of it with the
// same layout, placed at address at, with its RIP-relative displacement
// (if any) recomputed so it names the same absolute address. The result
// is decoded back and must be operation op with the original's operands.
func (in *insn) appendCopy(dst []byte, at uint64, enc []byte, op x86asm.Op) ([]byte, error) {
	c := bytes.Clone(enc)
	if in.l.rip < 0 {
		return append(dst, c...), nil
	}
	d, err := rel32(at+uint64(len(c)), in.ripTarget())
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint32(c[in.l.rip:], uint32(d))
	got, err := x86dec.Decode(c)
	if err != nil || got.Op != op || got.Len != len(c) || !sameOperands(got, in.inst) {
		return nil, in.refuse("with its displacement recomputed it decodes as %q", gnu(got, at))
	}
	return append(dst, c...), nil
}

// sameOperands compares operands and sizes, ignoring the displacement of
// a memory operand with no base and index or a RIP base: those are the
// RIP-relative ones, whose displacement depends on where they are.
func sameOperands(a, b x86asm.Inst) bool {
	for i := range a.Args {
		ma, okA := a.Args[i].(x86asm.Mem)
		mb, okB := b.Args[i].(x86asm.Mem)
		if okA && okB && ma.Base == mb.Base && (ma.Base == x86asm.RIP || ma.Base == 0 && ma.Index == 0) {
			ma.Disp, mb.Disp = 0, 0
			if ma != mb {
				return false
			}
			continue
		}
		if a.Args[i] != b.Args[i] {
			return false
		}
	}
	return a.MemBytes == b.MemBytes && a.DataSize == b.DataSize && a.AddrSize == b.AddrSize
}
