package codegen

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/arch/x86/x86asm"
)

// Site is the one original instruction being replaced.
type Site struct {
	Addr  uint64 // kernel address of the instruction
	Bytes []byte // exactly the instruction's bytes (1..15)
}

func (s Site) next() uint64 { return s.Addr + uint64(len(s.Bytes)) }

// decodeSite decodes the site and checks it is exactly one instruction.
func decodeSite(s Site) (x86asm.Inst, error) {
	inst, err := x86asm.Decode(s.Bytes, 64)
	if err == nil && inst.Op == 0 {
		err = fmt.Errorf("truncated or invalid encoding")
	}
	if err != nil {
		return inst, &UnsupportedError{Addr: s.Addr, Inst: fmt.Sprintf("% x", s.Bytes), Reason: "cannot decode: " + err.Error()}
	}
	if inst.Len != len(s.Bytes) {
		return inst, &UnsupportedError{Addr: s.Addr, Inst: gnu(inst, s.Addr),
			Reason: fmt.Sprintf("site has %d bytes but the instruction is %d", len(s.Bytes), inst.Len)}
	}
	return inst, nil
}

func gnu(inst x86asm.Inst, pc uint64) string { return x86asm.GNUSyntax(inst, pc, nil) }

// kind is how an instruction is relocated.
type kind int

const (
	kindPlain        kind = iota // verbatim, RIP-relative operand fixed up, then jmp back
	kindExit                     // verbatim, no jmp back (ret)
	kindJcc                      // jcc rel32 target; jmp back
	kindJmp                      // jmp rel32 target
	kindCall                     // push next; jmp rel32 target
	kindShortOnly                // loop*/jrcxz: op +2; jmp +5; jmp target; jmp back
	kindIndirectCall             // push next; same operand as jmp
	kindIndirectJmp              // verbatim with fix-up, no jmp back
)

var jccOps = map[x86asm.Op]bool{
	x86asm.JA: true, x86asm.JAE: true, x86asm.JB: true, x86asm.JBE: true, x86asm.JE: true,
	x86asm.JNE: true, x86asm.JG: true, x86asm.JGE: true, x86asm.JL: true, x86asm.JLE: true,
	x86asm.JO: true, x86asm.JNO: true, x86asm.JP: true, x86asm.JNP: true, x86asm.JS: true, x86asm.JNS: true,
}

var shortOnlyOps = map[x86asm.Op]bool{
	x86asm.LOOP: true, x86asm.LOOPE: true, x86asm.LOOPNE: true,
	x86asm.JCXZ: true, x86asm.JECXZ: true, x86asm.JRCXZ: true,
}

// refused lists operations whose meaning depends on where they run or that
// trap: relocating them would change what they do.
var refused = map[x86asm.Op]string{
	x86asm.INT:      "a software interrupt",
	x86asm.INTO:     "a software interrupt",
	x86asm.UD1:      "an invalid-opcode trap (BUG/WARN site)",
	x86asm.UD2:      "an invalid-opcode trap (BUG/WARN site)",
	x86asm.HLT:      "halts the CPU",
	x86asm.SYSCALL:  "changes privilege level",
	x86asm.SYSRET:   "changes privilege level",
	x86asm.SYSENTER: "changes privilege level",
	x86asm.SYSEXIT:  "changes privilege level",
	x86asm.IRET:     "an interrupt return",
	x86asm.IRETD:    "an interrupt return",
	x86asm.IRETQ:    "an interrupt return",
	x86asm.LCALL:    "a far call",
	x86asm.LJMP:     "a far jump",
	x86asm.LRET:     "a far return",
}

func classify(inst x86asm.Inst, s Site) (kind, error) {
	if len(s.Bytes) == 1 && s.Bytes[0] == 0xcc {
		return 0, &UnsupportedError{Addr: s.Addr, Inst: "int3", Reason: "an int3: another tool owns this byte"}
	}
	if why, ok := refused[inst.Op]; ok {
		return 0, &UnsupportedError{Addr: s.Addr, Inst: gnu(inst, s.Addr), Reason: why}
	}
	_, isRel := inst.Args[0].(x86asm.Rel)
	switch {
	case jccOps[inst.Op] && isRel:
		return kindJcc, nil
	case shortOnlyOps[inst.Op]:
		return kindShortOnly, nil
	case inst.Op == x86asm.JMP && isRel:
		return kindJmp, nil
	case inst.Op == x86asm.CALL && isRel:
		return kindCall, nil
	case inst.Op == x86asm.CALL:
		return kindIndirectCall, nil
	case inst.Op == x86asm.JMP:
		return kindIndirectJmp, nil
	case inst.Op == x86asm.RET:
		return kindExit, nil
	case isRel:
		return 0, &UnsupportedError{Addr: s.Addr, Inst: gnu(inst, s.Addr), Reason: "unknown relative branch"}
	}
	return kindPlain, nil
}

// Relocate returns code equivalent to site's instruction when placed at
// addr, including the jump back to the fall-through where the original can
// fall through.
func Relocate(addr uint64, site Site) ([]byte, error) {
	inst, err := decodeSite(site)
	if err != nil {
		return nil, err
	}
	k, err := classify(inst, site)
	if err != nil {
		return nil, err
	}
	next := site.next()
	var b []byte
	switch k {
	case kindJcc:
		cc, err := jccCondition(site.Bytes, inst)
		if err != nil {
			return nil, err
		}
		d, err := rel32(addr+6, branchTarget(inst, site))
		if err != nil {
			return nil, err
		}
		b = appendLE32([]byte{0x0f, 0x80 | cc}, d)
		return appendJmp(b, addr+6, next)
	case kindJmp:
		return appendJmp(nil, addr, branchTarget(inst, site))
	case kindCall:
		if b, err = appendPushImm32(nil, next, site.Addr, gnu(inst, site.Addr)); err != nil {
			return nil, err
		}
		return appendJmp(b, addr+lenPush32, branchTarget(inst, site))
	case kindShortOnly:
		// Same condition, rel8 +2 over a short jmp that skips the far
		// jump to the target: flags and rcx behave exactly as before.
		b = append([]byte(nil), site.Bytes[:len(site.Bytes)-1]...)
		b = append(b, 2, opJmpRel8, lenJmp32)
		if b, err = appendJmp(b, addr+uint64(len(b)), branchTarget(inst, site)); err != nil {
			return nil, err
		}
		return appendJmp(b, addr+uint64(len(b)), next)
	case kindIndirectCall:
		if b, err = appendPushImm32(nil, next, site.Addr, gnu(inst, site.Addr)); err != nil {
			return nil, err
		}
		jmp, err := callToJmp(site.Bytes, site.Addr, inst)
		if err != nil {
			return nil, err
		}
		jmp, err = fixRIP(jmp, inst, site.next(), addr+uint64(len(b)))
		if err != nil {
			return nil, err
		}
		return append(b, jmp...), nil
	case kindExit, kindIndirectJmp:
		return fixRIP(append([]byte(nil), site.Bytes...), inst, next, addr)
	}
	if b, err = fixRIP(append([]byte(nil), site.Bytes...), inst, next, addr); err != nil {
		return nil, err
	}
	return appendJmp(b, addr+uint64(len(b)), next)
}

// branchTarget is the absolute target of a relative branch at site.
func branchTarget(inst x86asm.Inst, s Site) uint64 {
	return s.next() + uint64(int64(inst.Args[0].(x86asm.Rel)))
}

// jccCondition extracts the condition nibble from a jcc rel8 (7x) or
// rel32 (0f 8x) encoding.
func jccCondition(b []byte, inst x86asm.Inst) (byte, error) {
	off := inst.PCRelOff
	switch {
	case inst.PCRel == 1 && off >= 1 && b[off-1]&0xf0 == 0x70:
		return b[off-1] & 0x0f, nil
	case inst.PCRel == 4 && off >= 2 && b[off-2] == 0x0f && b[off-1]&0xf0 == 0x80:
		return b[off-1] & 0x0f, nil
	}
	return 0, fmt.Errorf("%w: unexpected jcc encoding % x", ErrUnsupported, b)
}

// fixRIP rewrites the RIP-relative displacement of code (an instruction
// that was at origEnd-len and will be at addr) so it addresses the same
// byte. Code without a RIP-relative operand is returned unchanged.
func fixRIP(code []byte, inst x86asm.Inst, origEnd, addr uint64) ([]byte, error) {
	if !hasRIPMem(inst) {
		return code, nil
	}
	if inst.PCRel != 4 {
		return nil, fmt.Errorf("%w: RIP-relative displacement of %d bytes", ErrUnsupported, inst.PCRel)
	}
	disp := int32(binary.LittleEndian.Uint32(code[inst.PCRelOff:]))
	abs := origEnd + uint64(int64(disp))
	d, err := rel32(addr+uint64(len(code)), abs)
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint32(code[inst.PCRelOff:], uint32(d))
	return code, nil
}

func hasRIPMem(inst x86asm.Inst) bool {
	for _, a := range inst.Args {
		if m, ok := a.(x86asm.Mem); ok && m.Base == x86asm.RIP {
			return true
		}
	}
	return false
}

// callToJmp turns "call r/m64" (ff /2) into "jmp r/m64" (ff /4) by
// rewriting the reg field of its ModRM byte.
func callToJmp(b []byte, addr uint64, inst x86asm.Inst) ([]byte, error) {
	i := 0
	for i < len(b) && isPrefix(b[i]) {
		i++
	}
	if i+1 >= len(b) || b[i] != 0xff || (b[i+1]>>3)&7 != 2 {
		return nil, &UnsupportedError{Addr: addr, Inst: gnu(inst, addr), Reason: "indirect call not encoded as ff /2"}
	}
	out := append([]byte(nil), b...)
	out[i+1] = out[i+1]&^0x38 | 4<<3
	return out, nil
}

// isPrefix reports legacy prefixes and REX.
func isPrefix(c byte) bool {
	switch c {
	case 0xf0, 0xf2, 0xf3, 0x2e, 0x36, 0x3e, 0x26, 0x64, 0x65, 0x66, 0x67:
		return true
	}
	return c&0xf0 == 0x40
}

// CheckRelocatable reports whether Relocate would accept the decoded
// instruction inst with encoding b, without generating anything: the
// cheap test analysis runs over every instruction of the kernel.
func CheckRelocatable(addr uint64, inst x86asm.Inst, b []byte) error {
	_, err := classify(inst, Site{Addr: addr, Bytes: b})
	return err
}
