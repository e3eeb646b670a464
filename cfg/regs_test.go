package cfg

import (
	"testing"

	"github.com/kinst/kinst/kernel"
)

func TestLiveness(t *testing.T) {
	fn, names := assembleFunction(t, "live")
	blocks := fn.Blocks(names)
	lv := fn.Live(blocks, names, nil)
	before := func(off uint64) LiveSet {
		t.Helper()
		i, err := fn.Index(off)
		if err != nil {
			t.Fatal(err)
		}
		for bi, b := range blocks {
			if i >= b.First && i < b.First+b.N {
				return lv.Before(bi, i)
			}
		}
		t.Fatalf("+%#x in no block", off)
		return 0
	}
	for _, tc := range []struct {
		off        uint64
		live, dead LiveSet
	}{
		// Entry: the arguments the function reads, callee-saved rbx.
		{0x5, regRDI | regRSI | regRBX | regRSP, regRAX | FlagBits},
		// After mov %rdi,%rbx: rbx live; rdi stays live only because
		// the call below is assumed to read every argument register
		// (no prototype known).
		{0x9, regRBX | regRSI | regRDI, regRAX},
		// Before cmp: flags dead (cmp writes them).
		{0xb, regRSI, FlagBits},
		// Between cmp and jne: flags live (the splice-point case).
		{0xe, FlagBits, regRCX},
		// Before the call: rax live (added after it? no: the call
		// clobbers it), so rax dead here; rbx live across the call.
		{0x15, regRBX | regRSP, regRAX},
		// Before add: rax (return value of g) and rbx live.
		{0x1a, regRAX | regRBX, regRCX},
	} {
		got := before(tc.off)
		if got&tc.live != tc.live {
			t.Errorf("+%#x: live %v, missing %v", tc.off, got, tc.live&^got)
		}
		if got&tc.dead != 0 {
			t.Errorf("+%#x: live %v, but %v should be dead", tc.off, got, got&tc.dead)
		}
	}
	// At the return: return value and callee-saved registers.
	last := len(blocks) - 1
	if out := lv.LiveOut[last]; out&(regRAX|regRBX|regRBP|regR12) != regRAX|regRBX|regRBP|regR12 {
		t.Errorf("live out of the return block: %v", out)
	}
}

func TestUseDefUnknownIsConservative(t *testing.T) {
	f, _ := Decode("f", "", 0, []byte{0x0f, 0xa2}) // cpuid
	u, d := useDef(&f.Insns[0], nil, nil, nil)
	if u != allLive || d != 0 {
		t.Errorf("cpuid: use %v def %v; unknown semantics must read everything", u, d)
	}
}

func TestClobbers(t *testing.T) {
	for _, tc := range []struct {
		name string
		code []byte
		want LiveSet
	}{
		{"pushfq; lock incq; popfq", []byte{0x9c, 0xf0, 0x48, 0xff, 0x05, 0, 0, 0, 0, 0x9d}, 0},
		{"lock incq", []byte{0xf0, 0x48, 0xff, 0x05, 0, 0, 0, 0}, flags(AllFlags &^ CF)},
		{"push rax; mov $1,%eax; pop rax", []byte{0x50, 0xb8, 1, 0, 0, 0, 0x58}, 0},
		{"mov $1,%eax", []byte{0xb8, 1, 0, 0, 0}, regRAX},
		{"mov $1,%al", []byte{0xb0, 1}, regRAX},
		{"cpuid", []byte{0x0f, 0xa2}, allLive},
		{"rdtsc", []byte{0x0f, 0x31}, regRAX | regRDX},
		{"rdtscp", []byte{0x0f, 0x01, 0xf9}, regRAX | regRDX | regRCX},
		// A timer step as codegen emits it with RAX and RDX live:
		// pushfq; push rax; push rdx; rdtsc; shl; or; mov %rax,%rcx;
		// lock add %rcx,sum(%rip); pop rdx; pop rax; popfq.
		{"spilled rdtsc step", []byte{0x9c, 0x50, 0x52, 0x0f, 0x31, 0x48, 0xc1, 0xe2, 0x20, 0x48, 0x09, 0xd0,
			0x48, 0x89, 0xc1, 0xf0, 0x48, 0x01, 0x0d, 0, 0, 0, 0, 0x5a, 0x58, 0x9d}, regRCX},
	} {
		got, err := Clobbers(tc.code, 0xffffffffc0000000)
		if err != nil || got != tc.want {
			t.Errorf("%s: clobbers %v (%v), want %v", tc.name, got, err, tc.want)
		}
	}
}

func TestCalleeReads(t *testing.T) {
	fn, names := assembleFunction(t, "live")
	var g uint64
	for i := range fn.Insns {
		if tg, ok := BranchTarget(&fn.Insns[i]); ok && fn.Insns[i].Inst.Op.String() == "CALL" {
			g = tg
		}
	}
	blocks := fn.Blocks(names)
	at := func(lv *Liveness, off uint64) LiveSet {
		i, _ := fn.Index(off)
		return lv.Before(0, i)
	}
	// Without a summary the call reads every argument register.
	if l := at(fn.Live(blocks, names, nil), 0x9); l&regR8 == 0 {
		t.Fatalf("without a summary R8 should be live before the call: %v", l)
	}
	// g reads only RDI: R8 is dead, RDI stays live.
	l := at(fn.LiveWith(blocks, names, nil, CalleeReads{g: regRDI | regRSP}), 0x9)
	if l&regR8 != 0 || l&regRDI == 0 {
		t.Errorf("with g reading only RDI: %v", l)
	}
	// A prototype still counts: a tracer at g's entry may read its
	// arguments.
	l = at(fn.LiveWith(blocks, names, kernel.Prototypes{"g": {ArgRegs: 5, RetRegs: 1}}, CalleeReads{g: regRDI | regRSP}), 0x9)
	if l&regR8 == 0 {
		t.Errorf("g's prototype has 5 arguments, R8 must stay live: %v", l)
	}
}

// xor and sub of a register with itself zero it without reading it, but
// an 8- or 16-bit one zeroes only part: the rest of the register is kept,
// so whatever was live after stays live before.
func TestZeroIdiomPartialRegister(t *testing.T) {
	for _, tc := range []struct {
		code     []byte
		text     string
		use, def LiveSet
	}{
		{[]byte{0x31, 0xc0}, "xor %eax,%eax", 0, regRAX},
		{[]byte{0x48, 0x29, 0xd2}, "sub %rdx,%rdx", 0, regRDX},
		{[]byte{0x30, 0xc9}, "xor %cl,%cl", regRCX, 0},
		{[]byte{0x66, 0x31, 0xd2}, "xor %dx,%dx", regRDX, 0},
		{[]byte{0x45, 0x30, 0xc0}, "xor %r8b,%r8b", regR8, 0},
		{[]byte{0x28, 0xdb}, "sub %bl,%bl", regRBX, 0},
	} {
		fn, err := Decode("z", "", 0x1000, tc.code)
		if err != nil {
			t.Fatal(err)
		}
		use, def := useDef(&fn.Insns[0], nil, nil, nil)
		if use&allRegs != tc.use || def&allRegs&^use != tc.def {
			t.Errorf("%s: use %v def %v, want use %v, a full write of %v", tc.text, use&allRegs, def&allRegs, tc.use, tc.def)
		}
		// Live after: everything. Live before must keep the register
		// unless the write was a full one.
		if before := use | (allRegs &^ def); before&(tc.use|tc.def) != tc.use {
			t.Errorf("%s: live before %v", tc.text, before)
		}
	}
}
