package codegen

import (
	"encoding/binary"
	"fmt"
)

// Reg is a 64-bit general-purpose register in encoding order, the same
// order (and bit numbers) as cfg.LiveSet.
type Reg uint8

const (
	RAX Reg = iota
	RCX
	RDX
	RBX
	RSP
	RBP
	RSI
	RDI
	R8
	R9
	R10
	R11
	R12
	R13
	R14
	R15
)

var regNames = [16]string{"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
	"r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"}

func (r Reg) String() string {
	if int(r) < len(regNames) {
		return "%" + regNames[r]
	}
	return fmt.Sprintf("Reg(%d)", uint8(r))
}

// Bit is r's bit in a register mask (cfg.LiveSet's low 16 bits).
func (r Reg) Bit() uint16 { return 1 << r }

// Condition codes: the low nibble of jcc/setcc/cmovcc.
const (
	CondO  byte = 0x0
	CondNO byte = 0x1
	CondB  byte = 0x2
	CondAE byte = 0x3
	CondE  byte = 0x4
	CondNE byte = 0x5
	CondBE byte = 0x6
	CondA  byte = 0x7
	CondS  byte = 0x8
	CondNS byte = 0x9
	CondL  byte = 0xc
	CondGE byte = 0xd
	CondLE byte = 0xe
	CondG  byte = 0xf
)

// Asm appends x86-64 machine code that will run at a known address, so
// RIP-relative operands and branches are encoded exactly. Encoding errors
// (a target out of rel32 reach) are sticky: the first is kept and returned
// by Err, so snippets can emit a sequence and check once.
//
// Only the encodings instrumentation needs are here; each is decoded back
// by the unit tests and by VerifyPatch.
type Asm struct {
	base uint64
	code []byte
	err  error
}

// NewAsm returns an assembler whose first byte will sit at base.
func NewAsm(base uint64) *Asm { return &Asm{base: base} }

// PC is the address of the next byte emitted.
func (a *Asm) PC() uint64 { return a.base + uint64(len(a.code)) }

// Len is the number of bytes emitted so far.
func (a *Asm) Len() int { return len(a.code) }

// Bytes is the code emitted so far.
func (a *Asm) Bytes() []byte { return a.code }

// Err is the first encoding error, if any.
func (a *Asm) Err() error { return a.err }

func (a *Asm) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// Raw appends bytes as they are (for encodings not covered here; VerifyPatch
// still decodes them).
func (a *Asm) Raw(b ...byte) { a.code = append(a.code, b...) }

// rex emits a REX prefix when any bit is needed (w: 64-bit operand; r, b:
// extensions of ModRM.reg and ModRM.rm).
func (a *Asm) rex(w bool, r, b Reg) {
	v := byte(0x40)
	if w {
		v |= 8
	}
	if r >= 8 {
		v |= 4
	}
	if b >= 8 {
		v |= 1
	}
	if v != 0x40 {
		a.code = append(a.code, v)
	}
}

// ripOp appends opcode bytes op, a ModRM with reg field reg and a
// RIP-relative disp32 addressing target; tail bytes (an immediate) follow
// the displacement and count for the RIP base.
func (a *Asm) ripOp(prefix []byte, op []byte, reg byte, target uint64, tail []byte) {
	a.code = append(a.code, prefix...)
	a.code = append(a.code, op...)
	a.code = append(a.code, reg&7<<3|5)
	d, err := rel32(a.PC()+4+uint64(len(tail)), target)
	if err != nil {
		a.fail(err)
	}
	a.code = appendLE32(a.code, d)
	a.code = append(a.code, tail...)
}

// LockIncq: lock incq target(%rip). Writes flags (not CF).
func (a *Asm) LockIncq(target uint64) { a.ripOp([]byte{0xf0, 0x48}, []byte{0xff}, 0, target, nil) }

// LockDecq: lock decq target(%rip). Writes flags (not CF).
func (a *Asm) LockDecq(target uint64) { a.ripOp([]byte{0xf0, 0x48}, []byte{0xff}, 1, target, nil) }

// LockAddq: lock addq %r, target(%rip). Writes flags.
func (a *Asm) LockAddq(target uint64, r Reg) {
	a.ripOp([]byte{0xf0, rexW(r, 0)}, []byte{0x01}, byte(r), target, nil)
}

// LockSubq: lock subq %r, target(%rip). Writes flags.
func (a *Asm) LockSubq(target uint64, r Reg) {
	a.ripOp([]byte{0xf0, rexW(r, 0)}, []byte{0x29}, byte(r), target, nil)
}

// MovqLoad: movq target(%rip), %r.
func (a *Asm) MovqLoad(r Reg, target uint64) {
	a.ripOp([]byte{rexW(r, 0)}, []byte{0x8b}, byte(r), target, nil)
}

// MovqStore: movq %r, target(%rip).
func (a *Asm) MovqStore(target uint64, r Reg) {
	a.ripOp([]byte{rexW(r, 0)}, []byte{0x89}, byte(r), target, nil)
}

// CmpqImm8RIP: cmpq $imm8, target(%rip). Writes flags.
func (a *Asm) CmpqImm8RIP(target uint64, imm int8) {
	a.ripOp([]byte{0x48}, []byte{0x83}, 7, target, []byte{byte(imm)})
}

func rexW(r, b Reg) byte {
	v := byte(0x48)
	if r >= 8 {
		v |= 4
	}
	if b >= 8 {
		v |= 1
	}
	return v
}

// MovqGS: movq %gs:off, %r -- a per-CPU variable (e.g. current_task) by
// its per-CPU offset, absolute disp32 through a SIB byte with no base.
func (a *Asm) MovqGS(r Reg, off int32) {
	a.code = append(a.code, 0x65, rexW(r, 0), 0x8b, byte(r)&7<<3|4, 0x25)
	a.code = appendLE32(a.code, off)
}

// memOp appends ModRM (+SIB) and disp32 for disp(%base) with reg field reg.
func (a *Asm) memOp(reg byte, base Reg, disp int32) {
	a.code = append(a.code, 0x80|reg&7<<3|byte(base)&7)
	if base&7 == 4 { // rsp and r12 need a SIB
		a.code = append(a.code, 0x24)
	}
	a.code = appendLE32(a.code, disp)
}

// MovqLoadMem: movq disp(%base), %r.
func (a *Asm) MovqLoadMem(r, base Reg, disp int32) {
	a.code = append(a.code, rexW(r, base), 0x8b)
	a.memOp(byte(r), base, disp)
}

// CmplImm: cmpl $imm, disp(%base). Writes flags.
func (a *Asm) CmplImm(base Reg, disp int32, imm int32) {
	a.rex(false, 0, base)
	a.code = append(a.code, 0x81)
	a.memOp(7, base, disp)
	a.code = appendLE32(a.code, imm)
}

// MovqReg: movq %src, %dst.
func (a *Asm) MovqReg(dst, src Reg) {
	a.code = append(a.code, rexW(src, dst), 0x89, 0xc0|byte(src)&7<<3|byte(dst)&7)
}

// OrqReg: orq %src, %dst. Writes flags.
func (a *Asm) OrqReg(dst, src Reg) {
	a.code = append(a.code, rexW(src, dst), 0x09, 0xc0|byte(src)&7<<3|byte(dst)&7)
}

// ShlqImm: shlq $n, %r. Writes flags.
func (a *Asm) ShlqImm(r Reg, n uint8) {
	a.code = append(a.code, rexW(0, r), 0xc1, 0xe0|byte(r)&7, n)
}

// Rdtsc: the time-stamp counter into %edx:%eax (writes RAX and RDX).
func (a *Asm) Rdtsc() { a.code = append(a.code, 0x0f, 0x31) }

// Push: pushq %r.
func (a *Asm) Push(r Reg) {
	a.rex(false, 0, r)
	a.code = append(a.code, 0x50+byte(r)&7)
}

// Pop: popq %r.
func (a *Asm) Pop(r Reg) {
	a.rex(false, 0, r)
	a.code = append(a.code, 0x58+byte(r)&7)
}

// Pushfq saves RFLAGS on the stack (the kernel has no red zone).
func (a *Asm) Pushfq() { a.code = append(a.code, opPushfq) }

// LeaRSP moves %rsp by d without touching the flags: lea d(%rsp),%rsp.
func (a *Asm) LeaRSP(d int32) { a.code = append(a.code, leaRSP(d)...) }

// leaRSP encodes lea d(%rsp),%rsp: REX.W 8D, ModRM with %rsp as both
// register and base (through a SIB byte), disp8 when d fits, else disp32.
func leaRSP(d int32) []byte {
	if d == int32(int8(d)) {
		return []byte{0x48, 0x8d, 0x64, 0x24, byte(int8(d))}
	}
	return []byte{0x48, 0x8d, 0xa4, 0x24, byte(d), byte(d >> 8), byte(d >> 16), byte(d >> 24)}
}

// Popfq restores RFLAGS.
func (a *Asm) Popfq() { a.code = append(a.code, opPopfq) }

// Label is a forward branch whose target is bound later.
type Label struct {
	at int // offset of the rel32 field
}

// JccForward emits "jcc rel32" with condition cc to a target bound later
// with Bind.
func (a *Asm) JccForward(cc byte) Label {
	a.code = append(a.code, 0x0f, 0x80|cc&0xf, 0, 0, 0, 0)
	return Label{at: len(a.code) - 4}
}

// JmpForward emits "jmp rel32" to a target bound later with Bind.
func (a *Asm) JmpForward() Label {
	a.code = append(a.code, opJmpRel32, 0, 0, 0, 0)
	return Label{at: len(a.code) - 4}
}

// Bind points the forward branch l at the current position.
func (a *Asm) Bind(l Label) {
	binary.LittleEndian.PutUint32(a.code[l.at:], uint32(int32(len(a.code)-(l.at+4))))
}
