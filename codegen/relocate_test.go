package codegen

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

const next = 0 // marks the fall-through address in relocCase.exits

// relocCase is an original instruction, in a kernel-style encoding, and
// what its relocation must do wherever it is placed.
type relocCase struct {
	name  string
	code  []byte
	ops   []x86asm.Op // operations of the relocated code, in order
	exits []uint64    // absolute targets of branches that leave the code, in order; next: the fall-through
	mem   uint64      // absolute address of the RIP-relative operand; 0: none
	push  bool        // pushes the original return address first
}

var (
	opsPlain = []x86asm.Op{x86asm.MOV, x86asm.JMP}
	back     = []uint64{next}
)

var relocCases = []relocCase{
	// Copied verbatim.
	{name: "mov %rsp,%rbp", code: []byte{0x48, 0x89, 0xe5}, ops: opsPlain, exits: back},
	{name: "nopl 0x0(%rax,%rax,1)", code: []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}, ops: []x86asm.Op{x86asm.NOP, x86asm.JMP}, exits: back},
	{name: "mov %gs:0x1ad00,%rax (absolute)", code: cat([]byte{0x65, 0x48, 0x8b, 0x04, 0x25}, i32(0x1ad00)), ops: opsPlain, exits: back},
	{name: "call *table(,%rax,8) (absolute)", code: cat([]byte{0xff, 0x14, 0xc5}, i32(-0x7e000000)), push: true, ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}},
	{name: "lock cmpxchg %rdx,(%rdi)", code: []byte{0xf0, 0x48, 0x0f, 0xb1, 0x17}, ops: []x86asm.Op{x86asm.CMPXCHG, x86asm.JMP}, exits: back},
	{name: "mov $0x1d,%ecx", code: cat([]byte{0xb9}, i32(0x1d)), ops: opsPlain, exits: back},
	// No ModRM: x86asm takes the next byte for one when there is one.
	{name: "vzeroupper", code: []byte{0xc5, 0xf8, 0x77}, ops: []x86asm.Op{x86asm.VZEROUPPER, x86asm.JMP}, exits: back},

	// RIP-relative: displacement recomputed.
	{name: "mov disp(%rip),%rax", code: cat([]byte{0x48, 0x8b, 0x05}, i32(0x1000)),
		ops: opsPlain, exits: back, mem: siteAddr + 7 + 0x1000},
	{name: "mov %rax,disp(%rip)", code: cat([]byte{0x48, 0x89, 0x05}, i32(-0x123456)),
		ops: opsPlain, exits: back, mem: siteAddr + 7 - 0x123456},
	{name: "cmpl $0x0,disp(%rip)", code: cat([]byte{0x83, 0x3d}, i32(-0x2000), []byte{0x00}),
		ops: []x86asm.Op{x86asm.CMP, x86asm.JMP}, exits: back, mem: siteAddr + 7 - 0x2000},
	{name: "cmpb $0x1,disp(%rip)", code: cat([]byte{0x80, 0x3d}, i32(0x7000000), []byte{0x01}),
		ops: []x86asm.Op{x86asm.CMP, x86asm.JMP}, exits: back, mem: siteAddr + 7 + 0x7000000},
	{name: "cmpw $0x1234,disp(%rip)", code: cat([]byte{0x66, 0x81, 0x3d}, i32(0x40), []byte{0x34, 0x12}),
		ops: []x86asm.Op{x86asm.CMP, x86asm.JMP}, exits: back, mem: siteAddr + 9 + 0x40},
	{name: "movl $imm32,disp(%rip)", code: cat([]byte{0xc7, 0x05}, i32(0x300), i32(0x12345678)),
		ops: opsPlain, exits: back, mem: siteAddr + 10 + 0x300},
	{name: "movq $imm32,disp(%rip)", code: cat([]byte{0x48, 0xc7, 0x05}, i32(0x300), i32(-1)),
		ops: opsPlain, exits: back, mem: siteAddr + 11 + 0x300},
	{name: "lea disp(%rip),%rdi", code: cat([]byte{0x48, 0x8d, 0x3d}, i32(0x55)),
		ops: []x86asm.Op{x86asm.LEA, x86asm.JMP}, exits: back, mem: siteAddr + 7 + 0x55},
	{name: "mov %gs:disp(%rip),%rax", code: cat([]byte{0x65, 0x48, 0x8b, 0x05}, i32(-0x1000000)),
		ops: opsPlain, exits: back, mem: siteAddr + 8 - 0x1000000},
	{name: "lock cmpxchg %rdx,disp(%rip)", code: cat([]byte{0xf0, 0x48, 0x0f, 0xb1, 0x15}, i32(0x99)),
		ops: []x86asm.Op{x86asm.CMPXCHG, x86asm.JMP}, exits: back, mem: siteAddr + 9 + 0x99},
	{name: "pushq disp(%rip)", code: cat([]byte{0xff, 0x35}, i32(0x10)),
		ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}, exits: back, mem: siteAddr + 6 + 0x10},
	// x86asm shows VEX/EVEX RIP-relative operands as absolute ones.
	{name: "vmovdqa disp(%rip),%ymm0 (VEX)", code: cat([]byte{0xc5, 0xfd, 0x6f, 0x05}, i32(0x1000)),
		ops: []x86asm.Op{x86asm.VMOVDQA, x86asm.JMP}, exits: back, mem: siteAddr + 8 + 0x1000},
	{name: "vpbroadcastd disp(%rip),%ymm1 (VEX3)", code: cat([]byte{0xc4, 0xe2, 0x7d, 0x58, 0x0d}, i32(-0x40)),
		ops: []x86asm.Op{x86asm.VPBROADCASTD, x86asm.JMP}, exits: back, mem: siteAddr + 9 - 0x40},
	{name: "vmovdqu64 disp(%rip),%zmm0 (EVEX)", code: cat([]byte{0x62, 0xf1, 0xfe, 0x48, 0x6f, 0x05}, i32(0x2000)),
		ops: []x86asm.Op{x86asm.VMOVDQU64, x86asm.JMP}, exits: back, mem: siteAddr + 10 + 0x2000},

	// Direct branches.
	{name: "call rel32", code: cat([]byte{0xe8}, i32(0x1000)), push: true,
		ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}, exits: []uint64{siteAddr + 5 + 0x1000}},
	{name: "call __x86_indirect_thunk_rax", code: cat([]byte{0xe8}, i32(0x00abcdef)), push: true,
		ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}, exits: []uint64{siteAddr + 5 + 0x00abcdef}},
	{name: "call to the next instruction", code: cat([]byte{0xe8}, i32(0)), push: true,
		ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}, exits: []uint64{siteAddr + 5}},
	{name: "jmp __x86_return_thunk", code: cat([]byte{0xe9}, i32(-0x5000)),
		ops: []x86asm.Op{x86asm.JMP}, exits: []uint64{siteAddr + 5 - 0x5000}},
	{name: "jmp rel8", code: []byte{0xeb, 0x10}, ops: []x86asm.Op{x86asm.JMP}, exits: []uint64{siteAddr + 2 + 0x10}},
	{name: "jmp to itself", code: []byte{0xeb, 0xfe}, ops: []x86asm.Op{x86asm.JMP}, exits: []uint64{siteAddr}},
	{name: "je rel8 back", code: []byte{0x74, 0xf0},
		ops: []x86asm.Op{x86asm.JE, x86asm.JMP}, exits: []uint64{siteAddr + 2 - 0x10, next}},
	{name: "js rel8 with branch hint", code: []byte{0x3e, 0x78, 0x10},
		ops: []x86asm.Op{x86asm.JS, x86asm.JMP}, exits: []uint64{siteAddr + 3 + 0x10, next}},
	{name: "jne rel32", code: cat([]byte{0x0f, 0x85}, i32(0x200)),
		ops: []x86asm.Op{x86asm.JNE, x86asm.JMP}, exits: []uint64{siteAddr + 6 + 0x200, next}},
	{name: "jrcxz", code: []byte{0xe3, 0x20},
		ops: []x86asm.Op{x86asm.JRCXZ, x86asm.JMP, x86asm.JMP, x86asm.JMP}, exits: []uint64{siteAddr + 2 + 0x20, next}},
	{name: "jecxz", code: []byte{0x67, 0xe3, 0x20},
		ops: []x86asm.Op{x86asm.JECXZ, x86asm.JMP, x86asm.JMP, x86asm.JMP}, exits: []uint64{siteAddr + 3 + 0x20, next}},
	{name: "loop", code: []byte{0xe2, 0xfe},
		ops: []x86asm.Op{x86asm.LOOP, x86asm.JMP, x86asm.JMP, x86asm.JMP}, exits: []uint64{siteAddr, next}},
	{name: "loope", code: []byte{0xe1, 0x80},
		ops: []x86asm.Op{x86asm.LOOPE, x86asm.JMP, x86asm.JMP, x86asm.JMP}, exits: []uint64{siteAddr + 2 - 0x80, next}},
	{name: "loopne", code: []byte{0xe0, 0x7f},
		ops: []x86asm.Op{x86asm.LOOPNE, x86asm.JMP, x86asm.JMP, x86asm.JMP}, exits: []uint64{siteAddr + 2 + 0x7f, next}},

	// Indirect branches and returns.
	{name: "call *disp(%rip)", code: cat([]byte{0xff, 0x15}, i32(0x40)), push: true,
		ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}, mem: siteAddr + 6 + 0x40},
	{name: "call *%rax", code: []byte{0xff, 0xd0}, push: true, ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}},
	{name: "call *%r11", code: []byte{0x41, 0xff, 0xd3}, push: true, ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}},
	{name: "call *0x8(%rax)", code: []byte{0xff, 0x50, 0x08}, push: true, ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}},
	{name: "jmp *disp(%rip)", code: cat([]byte{0xff, 0x25}, i32(0x80)), ops: []x86asm.Op{x86asm.JMP}, mem: siteAddr + 6 + 0x80},
	{name: "jmp *%rax", code: []byte{0xff, 0xe0}, ops: []x86asm.Op{x86asm.JMP}},
	{name: "notrack jmp *%rax", code: []byte{0x3e, 0xff, 0xe0}, ops: []x86asm.Op{x86asm.JMP}},
	{name: "jmp *0x8(%rsp)", code: []byte{0xff, 0x64, 0x24, 0x08}, ops: []x86asm.Op{x86asm.JMP}},
	{name: "ret", code: []byte{0xc3}, ops: []x86asm.Op{x86asm.RET}},
	{name: "ret $0x8", code: []byte{0xc2, 0x08, 0x00}, ops: []x86asm.Op{x86asm.RET}},
	{name: "rep ret", code: []byte{0xf3, 0xc3}, ops: []x86asm.Op{x86asm.RET}},
}

// facts decodes relocated code and collects what the table states.
func facts(t *testing.T, code []byte, addr uint64) (ops []x86asm.Op, exits []uint64, mem uint64, pushed uint64) {
	t.Helper()
	out, err := decodeAll(code, addr)
	if err != nil {
		t.Fatal(err)
	}
	end := addr + uint64(len(code))
	for i, d := range out {
		ops = append(ops, d.inst.Op)
		if to, ok := d.target(); ok && (to < addr || to >= end) {
			exits = append(exits, to)
		}
		for _, a := range d.inst.Args {
			if m, ok := a.(x86asm.Mem); ok && m.Base == x86asm.RIP {
				mem = d.pc + uint64(d.inst.Len) + uint64(int64(int32(m.Disp)))
			}
		}
		if imm, ok := d.inst.Args[0].(x86asm.Imm); ok && i == 0 && d.inst.Op == x86asm.PUSH {
			pushed = uint64(int64(imm))
		}
	}
	return
}

func TestRelocate(t *testing.T) {
	for _, tc := range relocCases {
		for _, addr := range patchAddrs {
			t.Run(fmt.Sprintf("%s@%#x", tc.name, addr), func(t *testing.T) {
				site := Site{Addr: siteAddr, Bytes: tc.code}
				code, err := Relocate(addr, site)
				if err != nil {
					t.Fatal(err)
				}
				nextAddr := siteAddr + uint64(len(tc.code))
				ops, exits, mem, pushed := facts(t, code, addr)
				want := slices.Clone(tc.exits)
				for i, e := range want {
					if e == next {
						want[i] = nextAddr
					}
				}
				if !slices.Equal(ops, tc.ops) {
					t.Errorf("ops %v, want %v", ops, tc.ops)
				}
				if !slices.Equal(exits, want) {
					t.Errorf("leaves to %#x, want %#x", exits, want)
				}
				// x86asm does not see RIP-relative VEX operands; the
				// objdump test checks those.
				if x, _ := x86dec.Decode(tc.code); x.Prefix[0]&0xff != 0xc5 && x.Prefix[0]&0xff != 0xc4 && x.Prefix[0]&0xff != 0x62 && mem != tc.mem {
					t.Errorf("RIP-relative operand at %#x, want %#x", mem, tc.mem)
				}
				if wantPush := map[bool]uint64{true: nextAddr}[tc.push]; pushed != wantPush {
					t.Errorf("pushes %#x, want %#x", pushed, wantPush)
				}
				if err := checkSemantics(site, addr, code); err != nil {
					t.Errorf("semantics: %v", err)
				}
				if err := VerifyRelocation(code, addr, site); err != nil {
					t.Errorf("VerifyRelocation: %v", err)
				}
				// Continues at the next instruction: by the jmp back, or
				// by the callee's return to the pushed address.
				wantFT := tc.push || slices.Contains(tc.exits, next)
				if ft, err := FallsThrough(site); err != nil || ft != wantFT {
					t.Errorf("FallsThrough = %v, %v; want %v", ft, err, wantFT)
				}
			})
		}
	}
}

// TestRelocateEveryJcc covers the sixteen conditions in both encodings:
// the condition must survive the rel8 → rel32 rewrite.
func TestRelocateEveryJcc(t *testing.T) {
	for cc := byte(0); cc < 16; cc++ {
		for _, code := range [][]byte{{0x70 | cc, 0x42}, cat([]byte{0x0f, 0x80 | cc}, i32(-0x4242))} {
			site := Site{Addr: siteAddr, Bytes: code}
			orig, _ := x86dec.Decode(code)
			out, err := Relocate(patchAddrs[0], site)
			if err != nil {
				t.Fatalf("% x: %v", code, err)
			}
			got, _ := x86dec.Decode(out)
			if got.Op != orig.Op {
				t.Errorf("% x: %v relocated as %v", code, orig.Op, got.Op)
			}
			if err := checkSemantics(site, patchAddrs[0], out); err != nil {
				t.Errorf("% x: %v", code, err)
			}
		}
	}
}

func TestFallsThrough(t *testing.T) {
	for _, tc := range []struct {
		code []byte
		want bool
	}{
		{[]byte{0x48, 0x89, 0xe5}, true},
		{[]byte{0x74, 0x10}, true},
		{[]byte{0xe2, 0x10}, true},
		{cat([]byte{0xe8}, i32(0)), true},
		{[]byte{0xff, 0xd0}, true},
		{[]byte{0xeb, 0x10}, false},
		{cat([]byte{0xe9}, i32(0)), false},
		{[]byte{0xff, 0xe0}, false},
		{[]byte{0xc3}, false},
		{[]byte{0xc2, 0x10, 0x00}, false},
	} {
		got, err := FallsThrough(Site{Addr: siteAddr, Bytes: tc.code})
		if err != nil || got != tc.want {
			t.Errorf("% x: FallsThrough = %v, %v; want %v", tc.code, got, err, tc.want)
		}
	}
}

// refusedCases must never be relocated; each has a reason.
var refusedCases = map[string][]byte{
	"int3":                          {0xcc},
	"int $0x80":                     {0xcd, 0x80},
	"int1":                          {0xf1},
	"ud2":                           {0x0f, 0x0b},
	"ud1 %eax,%eax":                 {0x0f, 0xb9, 0xc0},
	"ud0 (%rax),%eax":               {0x0f, 0xff, 0x00},
	"syscall":                       {0x0f, 0x05},
	"sysretq":                       {0x48, 0x0f, 0x07},
	"sysenter":                      {0x0f, 0x34},
	"iretq":                         {0x48, 0xcf},
	"iret":                          {0xcf},
	"hlt":                           {0xf4},
	"sti":                           {0xfb},
	"mwait":                         {0x0f, 0x01, 0xc9},
	"mov %eax,%ss":                  {0x8e, 0xd0},
	"lret":                          {0xcb},
	"ljmp *(%rsp)":                  {0xff, 0x2c, 0x24},
	"lcall *(%rax)":                 {0xff, 0x18},
	"endbr64":                       {0xf3, 0x0f, 0x1e, 0xfa},
	"xbegin":                        cat([]byte{0xc7, 0xf8}, i32(0x10)),
	"EIP-relative load":             cat([]byte{0x67, 0x8b, 0x05}, i32(0x10)),
	"67-prefixed VEX (undecodable)": cat([]byte{0x67, 0xc5, 0xfd, 0x6f, 0x05}, i32(0x10)),
	"data16 jmp rel32":              cat([]byte{0x66, 0xe9}, i32(0x10)),
	"data16 call rel32":             cat([]byte{0x66, 0xe8}, i32(0x10)),
	"data16 jrcxz":                  {0x66, 0xe3, 0x10},
	"call *%rsp":                    {0xff, 0xd4},
	"call *0x8(%rsp)":               {0xff, 0x54, 0x24, 0x08},
	"undecodable":                   {0x0f, 0x04},
	"truncated":                     {0x48, 0x8b},
	"two instructions":              {0x90, 0x90},
	"empty":                         {},
	"sixteen bytes":                 {0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x90},
	"call rel32 from low memory":    nil, // see TestPushNeedsTopTwoGiB
}

func TestRelocateRefuses(t *testing.T) {
	for name, code := range refusedCases {
		if code == nil {
			continue
		}
		site := Site{Addr: siteAddr, Bytes: code}
		_, err := Relocate(patchAddrs[0], site)
		var ue *UnsupportedError
		if !errors.Is(err, ErrUnsupported) || !errors.As(err, &ue) || ue.Reason == "" || ue.Addr != siteAddr {
			t.Errorf("%s: Relocate err = %v, want an UnsupportedError with a reason", name, err)
			continue
		}
		t.Logf("%-20s %v", name, err)
		if _, err := CounterPatch(patchAddrs[0], site, counter, true); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: CounterPatch err = %v", name, err)
		}
		if _, err := FallsThrough(site); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: FallsThrough err = %v", name, err)
		}
		inst, _ := x86dec.Decode(code)
		if err := CheckRelocatable(siteAddr, inst, code); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: CheckRelocatable err = %v", name, err)
		}
	}
}

// TestPushReturnAboveTwoGiB: a call relocated from user text (below the
// top 2 GiB) pushes its 64-bit return address in two halves, push imm32
// then movl to 4(%rsp), and jumps on; the verifier reads both back.
func TestPushReturnAboveTwoGiB(t *testing.T) {
	low := uint64(0x7f0012345000)
	patch := low + 0x1000
	for _, tc := range []struct {
		code []byte
		tail string // after the push and the movl
	}{
		{cat([]byte{0xe8}, i32(0x10)), "jmp"},
		{[]byte{0xff, 0xd0}, "jmp"},
	} {
		got, err := Relocate(patch, Site{Addr: low, Bytes: tc.code})
		if err != nil {
			t.Fatalf("% x at %#x: %v", tc.code, low, err)
		}
		ret := low + uint64(len(tc.code))
		want := cat([]byte{0x68}, i32(int32(uint32(ret))), []byte{0xc7, 0x44, 0x24, 0x04}, i32(int32(uint32(ret>>32))))
		if !bytes.HasPrefix(got, want) {
			t.Errorf("% x: relocated to % x, want a prefix % x", tc.code, got, want)
		}
		inst, err := x86dec.Decode(got[len(want):])
		if err != nil || !strings.HasPrefix(strings.ToLower(inst.Op.String()), tc.tail) {
			t.Errorf("% x: after the push, %v (%v), want %s", tc.code, inst, err, tc.tail)
		}
		in, _ := x86dec.Decode(tc.code)
		if err := CheckRelocatable(low, in, tc.code); err != nil {
			t.Errorf("% x: CheckRelocatable: %v", tc.code, err)
		}
	}
}

// TestCheckRelocatable: the cheap check agrees with Relocate.
func TestCheckRelocatable(t *testing.T) {
	for _, tc := range relocCases {
		inst, err := x86dec.Decode(tc.code)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckRelocatable(siteAddr, inst, tc.code); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestOutOfReach(t *testing.T) {
	far := uint64(siteAddr - 0x100000000) // 4 GiB below
	for _, code := range [][]byte{
		cat([]byte{0x48, 0x8b, 0x05}, i32(0)),
		cat([]byte{0xc5, 0xfd, 0x6f, 0x05}, i32(0)),
		cat([]byte{0xff, 0x15}, i32(0)),
		cat([]byte{0xe8}, i32(0)),
		cat([]byte{0xe9}, i32(0)),
		{0x74, 0x00},
		{0xe2, 0x00},
		{0x48, 0x89, 0xe5}, // the jump back
	} {
		_, err := Relocate(far, Site{Addr: siteAddr, Bytes: code})
		var re *ReachError
		if !errors.Is(err, ErrOutOfReach) || !errors.As(err, &re) || re.From == 0 || re.To == 0 {
			t.Errorf("% x at %#x: err = %v, want ReachError", code, far, err)
		}
	}
	nop := Site{Addr: siteAddr, Bytes: []byte{0x90}}
	if _, err := CounterPatch(patchAddrs[0], nop, patchAddrs[0]+0x90000000, false); !errors.Is(err, ErrOutOfReach) {
		t.Errorf("counter out of reach: %v", err)
	}
}

// TestJmpRel32Boundaries pins the reach to exactly ±2 GiB from the end of
// the jump.
func TestJmpRel32Boundaries(t *testing.T) {
	const from = uint64(0xffffffff20000000)
	for _, tc := range []struct {
		to uint64
		ok bool
	}{
		{from + 5 + 0x7fffffff, true},
		{from + 5 + 0x80000000, false},
		{from + 5 - 0x80000000, true},
		{from + 5 - 0x80000001, false},
		{from, true},
		{siteAddr, true},
	} {
		b, err := JmpRel32(from, tc.to)
		if !tc.ok {
			var re *ReachError
			if !errors.As(err, &re) || !errors.Is(err, ErrOutOfReach) || re.To != tc.to {
				t.Errorf("%#x → %#x: err = %v, want ReachError", from, tc.to, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%#x → %#x: %v", from, tc.to, err)
			continue
		}
		inst, err := x86dec.Decode(b)
		rel, _ := inst.Args[0].(x86asm.Rel)
		if err != nil || len(b) != 5 || b[0] != 0xe9 || inst.Op != x86asm.JMP || from+5+uint64(int64(rel)) != tc.to {
			t.Errorf("JmpRel32(%#x, %#x) = % x", from, tc.to, b)
		}
	}
}
