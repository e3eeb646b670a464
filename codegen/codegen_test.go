package codegen

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"golang.org/x/arch/x86/x86asm"
)

const (
	siteAddr  = 0xffffffff81234560
	patchAddr = 0xffffffffc0a00000 // module area, ~0.9 GiB above text
	counter   = 0xffffffffc0b00008
)

func le32(v int32) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// Each case: the original instruction, and what its relocation must do.
var relocCases = []struct {
	name  string
	code  []byte
	ops   []x86asm.Op // operations in the relocated code, in order
	jumps []uint64    // absolute targets of the branches in it, in order
	mem   uint64      // absolute RIP-relative address it must keep (0: none)
	push  bool        // pushes the original return address
}{
	{name: "plain mov", code: []byte{0x48, 0x89, 0xe5}, ops: []x86asm.Op{x86asm.MOV, x86asm.JMP}, jumps: []uint64{siteAddr + 3}},
	{name: "rip load", code: cat([]byte{0x48, 0x8b, 0x05}, le32(0x1000)),
		ops: []x86asm.Op{x86asm.MOV, x86asm.JMP}, jumps: []uint64{siteAddr + 7}, mem: siteAddr + 7 + 0x1000},
	{name: "rip cmp imm8", code: cat([]byte{0x83, 0x3d}, le32(-0x2000), []byte{0x00}),
		ops: []x86asm.Op{x86asm.CMP, x86asm.JMP}, jumps: []uint64{siteAddr + 7}, mem: siteAddr + 7 - 0x2000},
	{name: "rip store imm32", code: cat([]byte{0xc7, 0x05}, le32(0x300), le32(0x12345678)),
		ops: []x86asm.Op{x86asm.MOV, x86asm.JMP}, jumps: []uint64{siteAddr + 10}, mem: siteAddr + 10 + 0x300},
	{name: "rip lea", code: cat([]byte{0x48, 0x8d, 0x3d}, le32(0x55)),
		ops: []x86asm.Op{x86asm.LEA, x86asm.JMP}, jumps: []uint64{siteAddr + 7}, mem: siteAddr + 7 + 0x55},
	{name: "gs load", code: cat([]byte{0x65, 0x48, 0x8b, 0x04, 0x25}, le32(0x1ad00)),
		ops: []x86asm.Op{x86asm.MOV, x86asm.JMP}, jumps: []uint64{siteAddr + 9}},
	{name: "lock cmpxchg", code: []byte{0xf0, 0x48, 0x0f, 0xb1, 0x17},
		ops: []x86asm.Op{x86asm.CMPXCHG, x86asm.JMP}, jumps: []uint64{siteAddr + 5}},
	{name: "call rel32", code: cat([]byte{0xe8}, le32(0x1000)), push: true,
		ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}, jumps: []uint64{siteAddr + 5 + 0x1000}},
	{name: "jmp rel32 (return thunk)", code: cat([]byte{0xe9}, le32(-0x5000)),
		ops: []x86asm.Op{x86asm.JMP}, jumps: []uint64{siteAddr + 5 - 0x5000}},
	{name: "jmp rel8", code: []byte{0xeb, 0x10}, ops: []x86asm.Op{x86asm.JMP}, jumps: []uint64{siteAddr + 2 + 0x10}},
	{name: "je rel8", code: []byte{0x74, 0xf0},
		ops: []x86asm.Op{x86asm.JE, x86asm.JMP}, jumps: []uint64{siteAddr + 2 - 0x10, siteAddr + 2}},
	{name: "jne rel32", code: cat([]byte{0x0f, 0x85}, le32(0x200)),
		ops: []x86asm.Op{x86asm.JNE, x86asm.JMP}, jumps: []uint64{siteAddr + 6 + 0x200, siteAddr + 6}},
	{name: "jrcxz", code: []byte{0xe3, 0x20},
		ops: []x86asm.Op{x86asm.JRCXZ, x86asm.JMP, x86asm.JMP, x86asm.JMP}, jumps: []uint64{0, 0, siteAddr + 2 + 0x20, siteAddr + 2}},
	{name: "loop", code: []byte{0xe2, 0xfe},
		ops: []x86asm.Op{x86asm.LOOP, x86asm.JMP, x86asm.JMP, x86asm.JMP}, jumps: []uint64{0, 0, siteAddr, siteAddr + 2}},
	{name: "call *rip", code: cat([]byte{0xff, 0x15}, le32(0x40)), push: true,
		ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}, mem: siteAddr + 6 + 0x40},
	{name: "call *rax", code: []byte{0xff, 0xd0}, push: true, ops: []x86asm.Op{x86asm.PUSH, x86asm.JMP}},
	{name: "jmp *rip", code: cat([]byte{0xff, 0x25}, le32(0x80)), ops: []x86asm.Op{x86asm.JMP}, mem: siteAddr + 6 + 0x80},
	{name: "ret", code: []byte{0xc3}, ops: []x86asm.Op{x86asm.RET}},
}

func TestRelocate(t *testing.T) {
	for _, tc := range relocCases {
		t.Run(tc.name, func(t *testing.T) {
			site := Site{Addr: siteAddr, Bytes: tc.code}
			code, err := Relocate(patchAddr, site)
			if err != nil {
				t.Fatal(err)
			}
			if err := VerifyRelocation(code, patchAddr, site); err != nil {
				t.Errorf("VerifyRelocation: %v", err)
			}
			var ops []x86asm.Op
			var mem uint64
			ji := 0
			for off := 0; off < len(code); {
				inst, err := x86asm.Decode(code[off:], 64)
				if err != nil {
					t.Fatalf("+%d: %v", off, err)
				}
				pc := uint64(patchAddr) + uint64(off)
				ops = append(ops, inst.Op)
				if rel, ok := inst.Args[0].(x86asm.Rel); ok {
					if ji < len(tc.jumps) && tc.jumps[ji] != 0 {
						if got := pc + uint64(inst.Len) + uint64(int64(rel)); got != tc.jumps[ji] {
							t.Errorf("branch %d lands on %#x, want %#x", ji, got, tc.jumps[ji])
						}
					}
					ji++
				}
				if a, ok := absMem(inst, pc); ok {
					mem = a
				}
				if inst.Op == x86asm.PUSH {
					if imm, ok := inst.Args[0].(x86asm.Imm); !ok || uint64(int64(imm)) != siteAddr+uint64(len(tc.code)) {
						t.Errorf("push %v, want the return address %#x", inst.Args[0], siteAddr+uint64(len(tc.code)))
					}
				}
				off += inst.Len
			}
			if fmt.Sprint(ops) != fmt.Sprint(tc.ops) {
				t.Errorf("ops %v, want %v", ops, tc.ops)
			}
			if mem != tc.mem {
				t.Errorf("RIP-relative address %#x, want %#x", mem, tc.mem)
			}
			if tc.push != (ops[0] == x86asm.PUSH) {
				t.Errorf("push = %v, want %v", ops[0] == x86asm.PUSH, tc.push)
			}
		})
	}
}

func TestRelocateRefuses(t *testing.T) {
	for name, code := range map[string][]byte{
		"int3":    {0xcc},
		"ud2":     {0x0f, 0x0b},
		"syscall": {0x0f, 0x05},
		"iretq":   {0x48, 0xcf},
		"hlt":     {0xf4},
		"garbage": {0x0f, 0xff},
		"partial": {0x48, 0x8b},
		"two":     {0x90, 0x90},
	} {
		_, err := Relocate(patchAddr, Site{Addr: siteAddr, Bytes: code})
		var ue *UnsupportedError
		if !errors.Is(err, ErrUnsupported) || !errors.As(err, &ue) || ue.Reason == "" {
			t.Errorf("%s: err = %v, want UnsupportedError", name, err)
		}
	}
}

func TestOutOfReach(t *testing.T) {
	far := uint64(siteAddr - 0x100000000)
	for _, code := range [][]byte{
		cat([]byte{0x48, 0x8b, 0x05}, le32(0)),
		cat([]byte{0xe8}, le32(0)),
		{0x74, 0x00},
	} {
		_, err := Relocate(far, Site{Addr: siteAddr, Bytes: code})
		var re *ReachError
		if !errors.Is(err, ErrOutOfReach) || !errors.As(err, &re) {
			t.Errorf("% x at %#x: err = %v, want ReachError", code, far, err)
		}
	}
	if _, err := JmpRel32(siteAddr, far); !errors.Is(err, ErrOutOfReach) {
		t.Errorf("JmpRel32 out of reach: %v", err)
	}
	if _, err := CounterPatch(patchAddr, Site{Addr: siteAddr, Bytes: []byte{0x90}}, far, false); !errors.Is(err, ErrOutOfReach) {
		t.Errorf("counter out of reach: %v", err)
	}
}

func TestCounterPatchVerify(t *testing.T) {
	site := Site{Addr: siteAddr, Bytes: cat([]byte{0x48, 0x8b, 0x05}, le32(0x1000))}
	for _, saveFlags := range []bool{false, true} {
		code, err := CounterPatch(patchAddr, site, counter, saveFlags)
		if err != nil {
			t.Fatal(err)
		}
		if err := Verify(code, patchAddr, site, counter, saveFlags); err != nil {
			t.Fatalf("saveFlags=%v: %v", saveFlags, err)
		}
		if (code[0] == opPushfq) != saveFlags {
			t.Errorf("saveFlags=%v but first byte %#x", saveFlags, code[0])
		}
		// Any single corrupted byte must be caught: in the counter
		// displacement, the relocated instruction, or the jump back.
		for i := range code {
			bad := bytes.Clone(code)
			bad[i] ^= 0x01
			if Verify(bad, patchAddr, site, counter, saveFlags) == nil {
				t.Errorf("saveFlags=%v: corrupting byte %d (% x) went unnoticed", saveFlags, i, bad)
			}
		}
		if err := Verify(append(bytes.Clone(code), 0x90), patchAddr, site, counter, saveFlags); !errors.Is(err, ErrVerify) {
			t.Errorf("trailing byte: %v", err)
		}
		if err := Verify(code, patchAddr, site, counter+8, saveFlags); !errors.Is(err, ErrVerify) {
			t.Errorf("wrong counter: %v", err)
		}
		if err := Verify(code, patchAddr, site, counter, !saveFlags); err == nil {
			t.Error("flags mismatch went unnoticed")
		}
	}
}

func TestJmpRel32(t *testing.T) {
	b, err := JmpRel32(siteAddr, patchAddr)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := x86asm.Decode(b, 64)
	if err != nil || inst.Op != x86asm.JMP || len(b) != 5 ||
		siteAddr+5+uint64(int64(inst.Args[0].(x86asm.Rel))) != patchAddr {
		t.Errorf("JmpRel32 = % x (%v)", b, err)
	}
}

var objdumpTarget = regexp.MustCompile(`^\s*([0-9a-f]+):\s+(\S+)\s+(?:0x)?([0-9a-f]+)`)
var objdumpRIP = regexp.MustCompile(`#\s*(?:0x)?([0-9a-f]+)`)

// TestObjdumpAgrees disassembles every relocation with objdump, an
// independent decoder, and checks the branch targets and RIP-relative
// addresses it prints.
func TestObjdumpAgrees(t *testing.T) {
	if _, err := exec.LookPath("objdump"); err != nil {
		t.Skip("objdump not installed")
	}
	for _, tc := range relocCases {
		site := Site{Addr: siteAddr, Bytes: tc.code}
		code, err := CounterPatch(patchAddr, site, counter, true)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), "patch.bin")
		os.WriteFile(f, code, 0o600)
		out, err := exec.Command("objdump", "-D", "-b", "binary", "-mi386:x86-64", "-w", "--no-show-raw-insn",
			fmt.Sprintf("--adjust-vma=%#x", uint64(patchAddr)), f).Output()
		if err != nil {
			t.Fatalf("objdump: %v", err)
		}
		var targets []uint64
		var rips []uint64
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			line := sc.Text()
			if m := objdumpRIP.FindStringSubmatch(line); m != nil {
				v, _ := strconv.ParseUint(m[1], 16, 64)
				rips = append(rips, v)
			}
			if m := objdumpTarget.FindStringSubmatch(line); m != nil && (m[2][0] == 'j' || m[2] == "loop" || m[2] == "jrcxz") {
				v, _ := strconv.ParseUint(m[3], 16, 64)
				targets = append(targets, v)
			}
		}
		if len(rips) == 0 || rips[0] != counter {
			t.Errorf("%s: objdump sees the increment at %x, want %#x\n%s", tc.name, rips, uint64(counter), out)
		}
		if tc.mem != 0 && (len(rips) < 2 || rips[1] != tc.mem) {
			t.Errorf("%s: objdump sees RIP-relative %x, want %#x\n%s", tc.name, rips, tc.mem, out)
		}
		var want []uint64
		for _, j := range tc.jumps {
			if j != 0 {
				want = append(want, j)
			}
		}
		var got []uint64
		for _, a := range targets {
			if a < patchAddr || a >= patchAddr+uint64(len(code)) { // leaves the patch
				got = append(got, a)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: objdump branch targets leaving the patch %x, want %x\n%s", tc.name, got, want, out)
		}
	}
}

// FuzzRelocate: any decodable instruction either is refused or relocates
// into code that verifies.
func FuzzRelocate(f *testing.F) {
	for _, tc := range relocCases {
		f.Add(tc.code)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		inst, err := x86asm.Decode(b, 64)
		if err != nil {
			return
		}
		site := Site{Addr: siteAddr, Bytes: b[:inst.Len]}
		code, err := Relocate(patchAddr, site)
		if err != nil {
			return
		}
		if err := VerifyRelocation(code, patchAddr, site); err != nil {
			t.Errorf("% x: relocated to % x which does not verify: %v", site.Bytes, code, err)
		}
	})
}
