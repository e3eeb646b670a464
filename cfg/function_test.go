package cfg

import (
	"errors"
	"testing"
)

// A function shaped like a kernel function on this config: the ftrace nop,
// a prologue, a compare and branch, a loop back into the entry block's
// tail, and a return thunk jump.
var fnCode = []byte{
	0x0f, 0x1f, 0x44, 0x00, 0x00, // 0x00 nopl 0x0(%rax,%rax,1)   ftrace site
	0x55,             // 0x05 push %rbp
	0x48, 0x89, 0xe5, // 0x06 mov %rsp,%rbp
	0x48, 0x8b, 0x47, 0x10, // 0x09 mov 0x10(%rdi),%rax
	0x48, 0x8d, 0x88, 0x00, 0x01, 0x00, 0x00, // 0x0d lea 0x100(%rax),%rcx
	0x48, 0x85, 0xc0, // 0x14 test %rax,%rax
	0x74, 0x02, // 0x17 je 0x1b
	0xeb, 0xf2, // 0x19 jmp 0x0d  (back into the entry block)
	0x5d,                         // 0x1b pop %rbp
	0xe9, 0x00, 0x00, 0x00, 0x00, // 0x1c jmp (return thunk)
}

const fnAddr = 0xffffffff81200000

func decodeFixture(t *testing.T) *Function {
	t.Helper()
	f, err := Decode("f", "", fnAddr, fnCode)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestDecodeBoundaries(t *testing.T) {
	f := decodeFixture(t)
	want := []uint64{0x00, 0x05, 0x06, 0x09, 0x0d, 0x14, 0x17, 0x19, 0x1b, 0x1c}
	if len(f.Insns) != len(want) {
		t.Fatalf("%d instructions, want %d", len(f.Insns), len(want))
	}
	for i, off := range want {
		if f.Insns[i].Addr != fnAddr+off {
			t.Errorf("insn %d at +%#x, want +%#x", i, f.Insns[i].Addr-fnAddr, off)
		}
		if j, err := f.Index(fnAddr + off); err != nil || j != i {
			t.Errorf("Index(+%#x) = %d, %v", off, j, err)
		}
	}
	_, err := f.Index(fnAddr + 0x0e)
	var nb *NotBoundaryError
	if !errors.Is(err, ErrNotBoundary) || !errors.As(err, &nb) || nb.Insn != fnAddr+0x0d || nb.InsnLen != 7 {
		t.Errorf("Index(+0xe) = %v", err)
	}
	if _, err := f.Index(fnAddr + 0x100); err == nil {
		t.Error("Index outside the function: no error")
	}
}

func TestEntryBlockAndFtrace(t *testing.T) {
	f := decodeFixture(t)
	if !f.IsFtraceSite(0) || f.IsFtraceSite(3) {
		t.Error("ftrace site misidentified")
	}
	// The jmp at 0x19 lands on 0x0d: the entry block must stop before it.
	if n := f.EntryBlock(); n != 4 {
		t.Errorf("EntryBlock = %d instructions, want 4 (up to the loop target at +0xd)", n)
	}
	tg := f.BranchTargets()
	if !tg[fnAddr+0x0d] || !tg[fnAddr+0x1b] || len(tg) != 2 {
		t.Errorf("BranchTargets = %v", tg)
	}
}

func TestFlagsLive(t *testing.T) {
	f := decodeFixture(t)
	for _, tc := range []struct {
		off  uint64
		live bool
	}{
		{0x05, false}, // push, mov, mov, lea, then test writes all flags
		{0x0d, false}, // lea then test
		{0x17, true},  // je reads ZF
		{0x1b, true},  // pop then a jmp: the scan gives up
	} {
		i, err := f.Index(fnAddr + tc.off)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.FlagsLive(i); got != tc.live {
			t.Errorf("FlagsLive(+%#x) = %v, want %v", tc.off, got, tc.live)
		}
	}
	// adc reads CF before anything writes it.
	g, _ := Decode("g", "", fnAddr, []byte{0x48, 0x11, 0xc8, 0x48, 0x85, 0xc0}) // adc %rcx,%rax; test
	if !g.FlagsLive(0) {
		t.Error("adc: flags must be live")
	}
	// inc leaves CF pending; a following cmp kills everything.
	h, _ := Decode("h", "", fnAddr, []byte{0x48, 0xff, 0xc0, 0x48, 0x39, 0xc8}) // inc %rax; cmp %rcx,%rax
	if h.FlagsLive(0) {
		t.Error("inc; cmp: flags dead")
	}
	k, _ := Decode("k", "", fnAddr, []byte{0x48, 0xff, 0xc0, 0x48, 0x83, 0xd0, 0x00}) // inc; adc $0,%rax
	if !k.FlagsLive(0) {
		t.Error("inc; adc: CF live")
	}
}

func TestEntryBlockSpansCalls(t *testing.T) {
	// With ftrace in use the site is a call; the block goes on past it.
	f, err := Decode("f", "", fnAddr, []byte{
		0xe8, 0x00, 0x00, 0x00, 0x00, // call (ftrace trampoline)
		0x48, 0x8b, 0x47, 0x10, // mov 0x10(%rdi),%rax
		0xc3, // ret
	})
	if err != nil {
		t.Fatal(err)
	}
	if !f.IsFtraceSite(0) || f.EntryBlock() != 3 {
		t.Errorf("IsFtraceSite(0)=%v EntryBlock=%d, want true, 3", f.IsFtraceSite(0), f.EntryBlock())
	}
}

func TestFlagsLiveIn(t *testing.T) {
	// cmp writes everything; je reads ZF: live before je is exactly ZF.
	f, _ := Decode("f", "", fnAddr, []byte{0x48, 0x39, 0xc8, 0x74, 0x00}) // cmp %rcx,%rax; je
	if got := f.FlagsLiveIn(0); got != 0 {
		t.Errorf("before cmp: %v, want none", got.Names())
	}
	// inc; adc: CF comes from before inc, the rest is written by inc.
	k, _ := Decode("k", "", fnAddr, []byte{0x48, 0xff, 0xc0, 0x48, 0x83, 0xd0, 0x00, 0x48, 0x39, 0xc8})
	if got := k.FlagsLiveIn(0); got != CF {
		t.Errorf("inc; adc; cmp: %v, want [CF]", got.Names())
	}
	if n := AllFlags.Names(); len(n) != 6 || n[0] != "CF" || n[5] != "OF" {
		t.Errorf("Names = %v", n)
	}
}

func TestJumpIntoAnInstruction(t *testing.T) {
	// jmp +1 lands inside the mov: the analysis must not invent an edge.
	f, err := Decode("f", "", fnAddr, []byte{0xeb, 0x01, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3})
	if err != nil {
		t.Fatal(err)
	}
	b := f.Blocks(nil)
	if b[0].Exit != IndirectJump || len(b[0].Succs) != 0 {
		t.Errorf("block 0: exit %v succs %v; want an unresolved jump", b[0].Exit, b[0].Succs)
	}
	if lv := f.Live(b, nil, nil); lv.LiveOut[0] != allLive {
		t.Errorf("live out of the unresolved jump: %v, want everything", lv.LiveOut[0])
	}
}
