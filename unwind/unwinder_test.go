package unwind

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

// fakeMem is memory of 8-byte words at 8-aligned addresses.
type fakeMem map[uint64]uint64

func (m fakeMem) ReadMemory(addr uint64, p []byte) error {
	for i := range p {
		a := addr + uint64(i)
		v, ok := m[a&^7]
		if !ok {
			return errors.New("unmapped")
		}
		p[i] = byte(v >> (8 * (a & 7)))
	}
	return nil
}

// setBytes stores b at addr.
func (m fakeMem) setBytes(addr uint64, b []byte) {
	for i, c := range b {
		a := addr + uint64(i)
		w := m[a&^7]
		shift := 8 * (a & 7)
		m[a&^7] = w&^(0xff<<shift) | uint64(c)<<shift
	}
}

// fakeRows gives a row per 0x1000-byte function.
type fakeRows map[uint64]Row

func (f fakeRows) FindRow(pc uint64) (Row, error) {
	if r, ok := f[pc&^0xfff]; ok {
		return r, nil
	}
	return Row{}, &NoFDEError{PC: pc}
}

func (f fakeRows) FuncStart(pc uint64) (uint64, error) {
	if _, ok := f[pc&^0xfff]; ok {
		return pc &^ 0xfff, nil
	}
	return 0, &NoFDEError{PC: pc}
}

var (
	cfaRSP = func(off int64) CFA { return CFA{Kind: CFARegOffset, Reg: RegRSP, Offset: off} }
	cfaRBP = func(off int64) CFA { return CFA{Kind: CFARegOffset, Reg: RegRBP, Offset: off} }
	at     = func(off int64) Rule { return Rule{Kind: RuleOffset, Offset: off} }
)

func TestStack(t *testing.T) {
	rows := fakeRows{
		0x1000: {CFA: cfaRSP(16), RA: at(-8)},                                  // A: sub rsp, 8
		0x2000: {CFA: cfaRBP(16), RBP: at(-16), RA: at(-8)},                    // B: push rbp; mov rbp, rsp
		0x3000: {CFA: CFA{Kind: CFAPLT, Offset: 8, Threshold: 11}, RA: at(-8)}, // a .plt entry
		0x5000: {CFA: cfaRSP(8), RA: Rule{Kind: RuleUndefined}},                // _start
		0x6000: {CFA: CFA{Kind: CFAExpression}, RA: at(-8)},                    // unsupported: frame pointers
		0x7000: {CFA: cfaRSP(0), RA: at(0)},                                    // a CFA that does not move up
		// A signal trampoline: CFA, rbp and pc saved in a context at rsp.
		0x8000: {CFA: CFA{Kind: CFADeref, Reg: RegRSP, Offset: 16}, RBP: Rule{Kind: RuleAtSP, Offset: 32}, RA: Rule{Kind: RuleAtSP, Offset: 24}},
	}
	mem := fakeMem{
		0x7008: 0x2005,                 // A's return address, into B
		0x7100: 0x7200, 0x7108: 0x3004, // B's saved rbp and return address, into the PLT
		0x7110: 0x4003,                 // PLT (before the push): return address into D, which has no FDE
		0x7118: 0x4007,                 // PLT after the push
		0x7200: 0x7300, 0x7208: 0x5001, // D's frame record (frame pointers)
		0x7300: 0, 0x7308: 0,
		0x7410: 0x7500, 0x7418: 0x1000, 0x7420: 0x7100, // the context: rsp, pc (A's first byte), rbp
		0x7508: 0x5001, // A's return address
	}
	for _, tc := range []struct {
		name    string
		regs    Regs
		pcs     []uint64
		methods []Method
	}{
		{"cfi, plt, frame pointer, outermost", Regs{PC: 0x1000, SP: 0x7000, BP: 0x7100},
			[]uint64{0x1000, 0x2005, 0x3004, 0x4003, 0x5001}, []Method{ByCFI, ByCFI, ByCFI, ByFramePointer}},
		{"plt after the push", Regs{PC: 0x300b, SP: 0x7108, BP: 0x7200}, // rsp+8+8
			[]uint64{0x300b, 0x4003, 0x5001}, []Method{ByCFI, ByFramePointer}},
		{"rbp unknown and no frame record to scan for", Regs{PC: 0x1000, SP: 0x7000},
			[]uint64{0x1000, 0x2005}, []Method{ByCFI}},
		{"unsupported expression falls back to frame pointers", Regs{PC: 0x6000, SP: 0x7100, BP: 0x7200},
			[]uint64{0x6000, 0x5001}, []Method{ByFramePointer}},
		{"a frame that does not move up ends the stack", Regs{PC: 0x7000, SP: 0x7008},
			[]uint64{0x7000}, nil},
		{"no pc", Regs{SP: 0x7000}, nil, nil},
		// The pc from a context is exact: A's row, not the byte before A.
		{"signal frame", Regs{PC: 0x8001, SP: 0x7400},
			[]uint64{0x8001, 0x1000, 0x5001}, []Method{ByCFI, ByCFI}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pcs, methods := StackMethods(tc.regs, mem, rows, 0)
			if !slices.Equal(pcs, tc.pcs) || !slices.Equal(methods, tc.methods) {
				t.Errorf("got %#x %v, want %#x %v", pcs, methods, tc.pcs, tc.methods)
			}
		})
	}
	if pcs := Stack(Regs{PC: 0x1000, SP: 0x7000, BP: 0x7100}, mem, rows, 2); len(pcs) != 2 {
		t.Errorf("max 2 frames: got %#x", pcs)
	}
}

// TestScan recovers an unknown rbp for a function whose CFA is
// rbp-based: only a frame record whose return address follows a call to
// that function counts: a direct call, a call through a pc-relative
// pointer (a GOT slot), or a call to a wrapper that jumps to it.
func TestScan(t *testing.T) {
	rows := fakeRows{
		0x1000: {CFA: cfaRBP(16), RBP: at(-16), RA: at(-8)},     // F keeps a frame pointer
		0x2000: {CFA: cfaRSP(8), RA: Rule{Kind: RuleUndefined}}, // G, outermost
		0x3000: {CFA: cfaRSP(8), RA: at(-8)},                    // W: a wrapper, "jmp F" at 0x3006
		0x4000: {CFA: cfaRSP(8), RA: at(-8)},                    // V: "jmp G" at 0x4006
	}
	call := func(from, to uint64) []byte { // e8 rel32 ending at from
		return append([]byte{0xe8}, binary.LittleEndian.AppendUint32(nil, uint32(to-from))...)
	}
	callGOT := func(from, slot uint64) []byte { // ff 15 rel32 ending at from
		return append([]byte{0xff, 0x15}, binary.LittleEndian.AppendUint32(nil, uint32(slot-from))...)
	}
	jmp := func(from, to uint64) []byte { // e9 rel32 ending at from
		return append([]byte{0xe9}, binary.LittleEndian.AppendUint32(nil, uint32(to-from))...)
	}
	const slot = 0x9000 // a GOT slot
	for _, tc := range []struct {
		name    string
		site    []byte // the instruction ending at 0x2030
		slot    uint64 // the function the GOT slot holds
		pcs     []uint64
		methods []Method
	}{
		{"a direct call to F", call(0x2030, 0x1000), 0, []uint64{0x1010, 0x2030}, []Method{ByScan}},
		{"a call to another function", call(0x2030, 0x2400), 0, []uint64{0x1010}, nil},
		{"a call to F through a GOT slot", callGOT(0x2030, slot), 0x1000, []uint64{0x1010, 0x2030}, []Method{ByScan}},
		{"a call to another function through a GOT slot", callGOT(0x2030, slot), 0x2400, []uint64{0x1010}, nil},
		{"a call to a wrapper that jumps to F", call(0x2030, 0x3000), 0, []uint64{0x1010, 0x2030}, []Method{ByScan}},
		{"a call to a wrapper of F through a GOT slot", callGOT(0x2030, slot), 0x3000, []uint64{0x1010, 0x2030}, []Method{ByScan}},
		{"a call to a wrapper that jumps elsewhere", call(0x2030, 0x4000), 0, []uint64{0x1010}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := fakeMem{
				0x7000: 0x7100, 0x7008: 0x2010, // an indirect call (ff d0) before 0x2010: no
				0x7010: 0x7004, 0x7018: 0x2020, // a direct call to another function: no
				0x7020: 0, 0x7028: 0x2030, // the frame record
				slot: tc.slot,
			}
			mem.setBytes(0x2008, []byte{0, 0, 0, 0, 0, 0, 0xff, 0xd0})
			mem.setBytes(0x201a, []byte{0})
			mem.setBytes(0x201b, call(0x2020, 0x2800))
			mem.setBytes(0x2030-uint64(len(tc.site))-2, []byte{0, 0})
			mem.setBytes(0x2030-uint64(len(tc.site)), tc.site)
			mem[0x2030] = 0
			// W: mov (%rdi),%rdi; add $8,%rdi; jmp F; int3 padding.
			mem.setBytes(0x3000, append(append([]byte{0x48, 0x8b, 0x3f, 0x48, 0x83, 0xc7}, jmp(0x300b, 0x1000)...), make([]byte, 32)...))
			mem.setBytes(0x4000, append(append([]byte{0x48, 0x8b, 0x3f, 0x48, 0x83, 0xc7}, jmp(0x400b, 0x2000)...), make([]byte, 32)...))
			pcs, methods := StackMethods(Regs{PC: 0x1010, SP: 0x7000}, mem, rows, 0)
			if !slices.Equal(pcs, tc.pcs) || !slices.Equal(methods, tc.methods) {
				t.Errorf("got %#x %v, want %#x %v", pcs, methods, tc.pcs, tc.methods)
			}
		})
	}
}

func TestFramePointers(t *testing.T) {
	mem := fakeMem{
		0x7100: 0x7200, 0x7108: 0x2000,
		0x7200: 0x7300, 0x7208: 0x3000,
		0x7300: 0x7150, 0x7308: 0x4000, // a saved rbp below the frame: stop
	}
	got := FramePointers(Regs{PC: 0x1000, SP: 0x7000, BP: 0x7100}, mem, 0)
	if want := []uint64{0x1000, 0x2000, 0x3000, 0x4000}; !slices.Equal(got, want) {
		t.Errorf("got %#x, want %#x", got, want)
	}
	if got := FramePointers(Regs{PC: 0x1000, SP: 0x7000, BP: 0x7101}, mem, 0); len(got) != 1 {
		t.Errorf("misaligned rbp: got %#x", got)
	}
}

func TestParseSyscall(t *testing.T) {
	for _, tc := range []struct {
		in   string
		regs Regs
		nr   int
		err  error
	}{
		{"0 0x0 0x7ffc8a1b5e40 0x40 0x0 0x0 0x0 0x7ffc8a1b5e28 0x7f3c1a2d4a5d", Regs{PC: 0x7f3c1a2d4a5d, SP: 0x7ffc8a1b5e28}, 0, nil},
		{"-1 0x7ffc8a1b5e28 0x401000", Regs{PC: 0x401000, SP: 0x7ffc8a1b5e28}, -1, nil},
		{"running", Regs{}, 0, ErrNotBlocked},
		{"running\n", Regs{}, 0, ErrNotBlocked},
		{"230 0x0 0x0 0x7ffe37a2e8b0 0x7ffe37a2e8f0 0x0 0x0 0x7ffe37a2e898 0x7fb52b6da503\n", Regs{PC: 0x7fb52b6da503, SP: 0x7ffe37a2e898}, 230, nil},
		{"-1 0x7ffe00 0x401000\n", Regs{PC: 0x401000, SP: 0x7ffe00}, -1, nil},
	} {
		regs, nr, err := ParseSyscall([]byte(tc.in))
		if regs != tc.regs || nr != tc.nr || !errors.Is(err, tc.err) {
			t.Errorf("%q: %+v %d %v, want %+v %d %v", tc.in, regs, nr, err, tc.regs, tc.nr, tc.err)
		}
	}
	for _, in := range []string{"0 0x1", "x 0x1 0x2", "1 0x1 0xzz", "1"} {
		if _, _, err := ParseSyscall([]byte(in)); err == nil {
			t.Errorf("%q parsed", in)
		}
	}
}
