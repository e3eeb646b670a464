package codegen

import (
	"bytes"
	"fmt"

	"golang.org/x/arch/x86/x86asm"
)

// movbImmRIP is "movb $imm8, disp32(%rip)" up to its displacement.
var movbImmRIP = []byte{0xc6, 0x05}

// lenMovbImmRIP is the length of "movb $imm8, disp32(%rip)".
const lenMovbImmRIP = 7

// MovbImmRIP: movb $imm, target(%rip). Writes no register and no flag.
func (a *Asm) MovbImmRIP(target uint64, imm byte) {
	a.ripOp(nil, []byte{0xc6}, 0, target, []byte{imm})
}

// HitFlag records that the point ran at least once: movb $1, Addr(%rip),
// a byte of a counter slot. A plain store, not locked: every CPU writes
// the same value, so racing hits lose nothing. It needs no scratch
// register and leaves the flags alone, so a probe's patch saves nothing
// around it (unless a predicate guards it). Coverage probes use it: the
// daemon sees the byte set through its mapping of the counter heap and
// removes the probe.
type HitFlag struct{ Addr uint64 }

func (h HitFlag) Needs() Needs         { return Needs{} }
func (h HitFlag) Emit(a *Asm, _ []Reg) { a.MovbImmRIP(h.Addr, 1) }
func (h HitFlag) String() string       { return fmt.Sprintf("hit flag %#x", h.Addr) }

// Check accepts exactly "movb $1, Addr(%rip)".
func (h HitFlag) Check(code []byte, at uint64) error {
	r := &reader{code: code, base: at}
	inst, enc, err := r.decode(lenMovbImmRIP)
	if err != nil {
		return err
	}
	m, ok := inst.Args[0].(x86asm.Mem)
	imm, iok := inst.Args[1].(x86asm.Imm)
	if inst.Op != x86asm.MOV || inst.Len != lenMovbImmRIP || !bytes.HasPrefix(enc, movbImmRIP) ||
		!ok || m.Base != x86asm.RIP || inst.MemBytes != 1 || !iok || imm != 1 {
		return r.fail("want movb $1, disp32(%%rip), got %q", gnu(inst, r.pc()))
	}
	if got := r.pc() + lenMovbImmRIP + uint64(int64(le32(enc, 2))); got != h.Addr {
		return r.fail("store addresses %#x, want flag %#x", got, h.Addr)
	}
	r.off += inst.Len
	return r.end()
}
