package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// fakeMem is memory of 8-byte words.
type fakeMem map[uint64]uint64

func (m fakeMem) ReadMemory(addr uint64, p []byte) error {
	if len(p) != 8 {
		return fmt.Errorf("read of %d bytes", len(p))
	}
	v, ok := m[addr]
	if !ok {
		return errors.New("unmapped")
	}
	binary.LittleEndian.PutUint64(p, v)
	return nil
}

// fakeRows gives a row per 0x1000-byte function.
type fakeRows map[uint64]Row

func (f fakeRows) FindRow(pc uint64) (Row, error) {
	if r, ok := f[pc&^0xfff]; ok {
		return r, nil
	}
	return Row{}, &NoFDEError{PC: pc}
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
	}
	mem := fakeMem{
		0x7008: 0x2005,                 // A's return address, into B
		0x7100: 0x7200, 0x7108: 0x3004, // B's saved rbp and return address, into the PLT
		0x7110: 0x4003,                 // PLT (before the push): return address into D, which has no FDE
		0x7118: 0x4007,                 // PLT after the push
		0x7200: 0x7300, 0x7208: 0x5001, // D's frame record (frame pointers)
		0x7300: 0, 0x7308: 0,
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
		{"rbp unknown stops at an rbp-based CFA", Regs{PC: 0x1000, SP: 0x7000},
			[]uint64{0x1000, 0x2005}, []Method{ByCFI}},
		{"unsupported expression falls back to frame pointers", Regs{PC: 0x6000, SP: 0x7100, BP: 0x7200},
			[]uint64{0x6000, 0x5001}, []Method{ByFramePointer}},
		{"a frame that does not move up ends the stack", Regs{PC: 0x7000, SP: 0x7008},
			[]uint64{0x7000}, nil},
		{"no pc", Regs{SP: 0x7000}, nil, nil},
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
	} {
		regs, nr, err := parseSyscall(tc.in)
		if regs != tc.regs || nr != tc.nr || !errors.Is(err, tc.err) {
			t.Errorf("%q: %+v %d %v, want %+v %d %v", tc.in, regs, nr, err, tc.regs, tc.nr, tc.err)
		}
	}
	if _, _, err := parseSyscall("0 0x1"); err == nil {
		t.Error("a short line parsed")
	}
}
