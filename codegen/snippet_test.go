package codegen

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

const testBase = 0xffffffffc0a00000 // a module-area address

// TestAsmEncodings assembles every encoder and checks objdump's reading
// of the bytes (an independent decoder) against the intended instruction.
func TestAsmEncodings(t *testing.T) {
	if _, err := exec.LookPath("objdump"); err != nil {
		t.Skip("objdump not installed")
	}
	target := uint64(testBase + 0x1000)
	cases := []struct {
		emit func(a *Asm)
		want string // objdump text; %T is target's address as objdump prints it
	}{
		{func(a *Asm) { a.LockIncq(target) }, "lock incq %T(%rip)"},
		{func(a *Asm) { a.LockDecq(target) }, "lock decq %T(%rip)"},
		{func(a *Asm) { a.LockAddq(target, RAX) }, "lock add %rax,%T(%rip)"},
		{func(a *Asm) { a.LockAddq(target, R9) }, "lock add %r9,%T(%rip)"},
		{func(a *Asm) { a.LockSubq(target, RDX) }, "lock sub %rdx,%T(%rip)"},
		{func(a *Asm) { a.LockSubq(target, R15) }, "lock sub %r15,%T(%rip)"},
		{func(a *Asm) { a.MovqLoad(R11, target) }, "mov %T(%rip),%r11"},
		{func(a *Asm) { a.MovqStore(target, RCX) }, "mov %rcx,%T(%rip)"},
		{func(a *Asm) { a.CmpqImm8RIP(target, -1) }, "cmpq $0xffffffffffffffff,%T(%rip)"},
		{func(a *Asm) { a.MovbImmRIP(target, 1) }, "movb $0x1,%T(%rip)"},
		{func(a *Asm) { a.MovqGS(RAX, 0x32d00) }, "mov %gs:0x32d00,%rax"},
		{func(a *Asm) { a.MovqGS(R10, 0x32d00) }, "mov %gs:0x32d00,%r10"},
		{func(a *Asm) { a.MovqLoadMem(RSI, RAX, 0x5c8) }, "mov 0x5c8(%rax),%rsi"},
		{func(a *Asm) { a.MovqLoadMem(R8, R12, 0x10) }, "mov 0x10(%r12),%r8"},
		{func(a *Asm) { a.CmplImm(RAX, 0x5c8, 1234) }, "cmpl $0x4d2,0x5c8(%rax)"},
		{func(a *Asm) { a.CmplImm(R13, -8, 7) }, "cmpl $0x7,-0x8(%r13)"},
		{func(a *Asm) { a.CmplImm(RSP, 8, 7) }, "cmpl $0x7,0x8(%rsp)"},
		{func(a *Asm) { a.MovqReg(RBX, R14) }, "mov %r14,%rbx"},
		{func(a *Asm) { a.OrqReg(RAX, RDX) }, "or %rdx,%rax"},
		{func(a *Asm) { a.ShlqImm(RDX, 32) }, "shl $0x20,%rdx"},
		{func(a *Asm) { a.ShlqImm(R8, 3) }, "shl $0x3,%r8"},
		{func(a *Asm) { a.Rdtsc() }, "rdtsc"},
		{func(a *Asm) { a.Push(RBX) }, "push %rbx"},
		{func(a *Asm) { a.Push(R12) }, "push %r12"},
		{func(a *Asm) { a.Pop(R12) }, "pop %r12"},
		{func(a *Asm) { a.Pushfq() }, "pushf"},
		{func(a *Asm) { a.Popfq() }, "popf"},
	}
	for _, c := range cases {
		a := NewAsm(testBase)
		c.emit(a)
		if a.Err() != nil {
			t.Fatal(a.Err())
		}
		got := objdump(t, a.Bytes(), testBase)
		if len(got) != 1 {
			t.Errorf("% x: objdump sees %d instructions", a.Bytes(), len(got))
			continue
		}
		want := strings.ReplaceAll(c.want, "%T(%rip)", "0x[0-9a-f]+\\(%rip\\)")
		text := strings.ReplaceAll(got[0].text, "    ", " ")
		if !matchWild(text, c.want) {
			t.Errorf("% x: objdump %q, want %q", a.Bytes(), got[0].text, c.want)
		}
		if strings.Contains(c.want, "%T") && hex64(strings.Fields(got[0].comment)[0]) != target {
			t.Errorf("% x: addresses %s, want %#x", a.Bytes(), got[0].comment, target)
		}
		_ = want
	}
}

// matchWild compares objdump text with want, where %T matches any hex
// displacement.
func matchWild(got, want string) bool {
	parts := strings.Split(want, "%T")
	if len(parts) == 1 {
		return got == want
	}
	if !strings.HasPrefix(got, parts[0]) || !strings.HasSuffix(got, parts[1]) {
		return false
	}
	mid := got[len(parts[0]) : len(got)-len(parts[1])]
	return strings.HasPrefix(mid, "0x") || strings.HasPrefix(mid, "-0x")
}

func TestAsmOutOfReach(t *testing.T) {
	a := NewAsm(testBase)
	a.LockIncq(0xffff888000001000) // the direct map, terabytes away
	if !errors.Is(a.Err(), ErrOutOfReach) {
		t.Fatalf("err = %v, want ErrOutOfReach", a.Err())
	}
}

// tsc is a test snippet in the shape of an AOT/timer step: rdtsc, combine
// to 64 bits in a scratch register, add to a sum.
type tsc struct{ sum uint64 }

func (s tsc) Needs() Needs { return Needs{Regs: 1, Fixed: RAX.Bit() | RDX.Bit(), Flags: true} }
func (s tsc) Emit(a *Asm, scratch []Reg) {
	a.Rdtsc()
	a.ShlqImm(RDX, 32)
	a.OrqReg(RAX, RDX)
	a.MovqReg(scratch[0], RAX)
	a.LockAddq(s.sum, scratch[0])
}

var movSite = Site{Addr: 0xffffffff81234560, Bytes: []byte{0x48, 0x8b, 0x47, 0x10}} // mov 0x10(%rdi),%rax

func gnuText(t *testing.T, code []byte, base uint64) []string {
	t.Helper()
	ds, err := decodeAll(code, base)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range ds {
		out = append(out, x86asm.GNUSyntax(d.inst, d.pc, nil))
	}
	return out
}

func TestBuildPatchScratchAndSpills(t *testing.T) {
	counter := uint64(testBase + 0x8000)
	cases := []struct {
		name        string
		live        Live
		snippets    []Snippet
		scratch     []Reg
		spilled     []Reg
		flags       bool
		wantPrefix  []string
		wantSnippet int
	}{
		{
			name: "counter, flags dead", live: Live{Regs: 0xffff},
			snippets: []Snippet{Counter{counter}},
		},
		{
			name: "counter, flags live", live: AllLive,
			snippets: []Snippet{Counter{counter}}, flags: true,
		},
		{
			name: "tsc, rax rdx rcx dead", live: Live{Regs: 0xffff &^ (RAX.Bit() | RDX.Bit() | RCX.Bit())},
			snippets: []Snippet{tsc{counter}}, scratch: []Reg{RCX},
		},
		{
			name: "tsc, all live", live: AllLive,
			snippets: []Snippet{tsc{counter}}, scratch: []Reg{RCX}, spilled: []Reg{RAX, RCX, RDX}, flags: true,
		},
		{
			name: "tsc, only r11 dead", live: Live{Regs: 0xffff &^ R11.Bit()},
			snippets: []Snippet{tsc{counter}}, scratch: []Reg{R11}, spilled: []Reg{RAX, RDX},
		},
		{
			name: "several snippets share one patch", live: Live{Regs: 0xffff &^ RSI.Bit(), Flags: true},
			snippets: []Snippet{Counter{counter}, tsc{counter + 8}, Counter{counter + 16}},
			scratch:  []Reg{RSI}, spilled: []Reg{RAX, RDX}, flags: true,
		},
		{
			name: "guarded group", live: Live{Regs: RDI.Bit() | RBX.Bit(), Flags: true},
			snippets: []Snippet{Guard{If: TaskField32{CurrentTask: 0x32d00, Offset: 0x5c8, Value: 42},
				Then: []Snippet{Counter{counter}, Counter{counter + 8}}}},
			scratch: []Reg{RAX}, flags: true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := PatchSpec{Site: movSite, Live: c.live, Snippets: c.snippets}
			p, err := BuildPatch(testBase, spec)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(p.Scratch) != fmt.Sprint(c.scratch) && !(len(p.Scratch) == 0 && len(c.scratch) == 0) {
				t.Errorf("scratch %v, want %v", p.Scratch, c.scratch)
			}
			if fmt.Sprint(p.Spilled) != fmt.Sprint(c.spilled) && !(len(p.Spilled) == 0 && len(c.spilled) == 0) {
				t.Errorf("spilled %v, want %v", p.Spilled, c.spilled)
			}
			if p.SavedFlags != c.flags {
				t.Errorf("saved flags %v, want %v", p.SavedFlags, c.flags)
			}
			if err := VerifyPatch(p, spec); err != nil {
				t.Fatalf("VerifyPatch: %v\n%s", err, strings.Join(gnuText(t, p.Code, p.Addr), "\n"))
			}
			// No scratch or fixed register that is live escapes a spill.
			for _, r := range append(append([]Reg{}, p.Scratch...), RAX, RDX) {
				if c.live.Regs&r.Bit() != 0 && (regIn(r, p.Scratch) || r == RAX || r == RDX) && !regIn(r, p.Spilled) {
					if usesReg(spec.Snippets, r) {
						t.Errorf("%v is live and written but not spilled", r)
					}
				}
			}
			// The tail is the relocated mov and the jump back.
			tail := gnuText(t, p.Code[p.Instr:], p.Addr+uint64(p.Instr))
			if len(tail) != 2 || tail[0] != "mov 0x10(%rdi),%rax" || !strings.HasPrefix(tail[1], "jmp") {
				t.Errorf("tail %q", tail)
			}
		})
	}
}

// usesReg: a snippet list writes r (by Needs: fixed, or as scratch).
func usesReg(ss []Snippet, r Reg) bool {
	for _, s := range ss {
		if s.Needs().Fixed&r.Bit() != 0 {
			return true
		}
	}
	return r != RAX && r != RDX
}

// TestGuardSkipsBody checks the guard's branch lands right after its
// body, by decoding.
func TestGuardSkipsBody(t *testing.T) {
	counter := uint64(testBase + 0x8000)
	g := Guard{If: TaskField32{CurrentTask: 0x32d00, Offset: 0x5c8, Value: 42},
		Then: []Snippet{Counter{counter}, Counter{counter + 8}}}
	spec := PatchSpec{Site: movSite, Live: Live{}, Snippets: []Snippet{Counter{counter + 16}, g}}
	p, err := BuildPatch(testBase, spec)
	if err != nil {
		t.Fatal(err)
	}
	got := gnuText(t, p.Code[:p.Instr], p.Addr)
	want := []string{"lock incq", "mov %gs:0x32d00,%rax", "cmpl $0x2a,0x5c8(%rax)", "jne ", "lock incq", "lock incq"}
	if len(got) != len(want) {
		t.Fatalf("instrumentation %q", got)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("insn %d: %q, want %q…", i, got[i], want[i])
		}
	}
	ds, err := decodeAll(p.Code[:p.Instr], p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	jne := ds[3]
	if end := int(jne.pc-p.Addr) + jne.inst.Len + int(jne.inst.Args[0].(x86asm.Rel)); end != p.Spans[1].End {
		t.Errorf("jne lands at +%d, the group ends at +%d", end, p.Spans[1].End)
	}
}

// badSnippet emits what it is given, to feed VerifyPatch wrong code.
type badSnippet struct{ code []byte }

func (b badSnippet) Needs() Needs         { return Needs{Flags: true} }
func (b badSnippet) Emit(a *Asm, _ []Reg) { a.Raw(b.code...) }

func TestVerifyPatchRefuses(t *testing.T) {
	cases := []struct {
		name string
		code []byte
		want string
	}{
		{"call", []byte{0xe8, 0, 0, 0, 0}, "no place"},
		{"ret", []byte{0xc3}, "no place"},
		{"unbalanced push", []byte{0x50}, "stack depth 1"},
		{"pop first", []byte{0x58}, "pops more"},
		{"rsp arithmetic", []byte{0x48, 0x83, 0xec, 0x08}, "touches %rsp"},
		{"backward branch", []byte{0x90, 0xeb, 0xfd}, "forward"},
		{"branch out", []byte{0xeb, 0x10}, "forward"},
		{"indirect jump", []byte{0xff, 0xe0}, "indirect"},
		{"branch into an instruction", []byte{0xeb, 0x01, 0x48, 0x89, 0xc0}, "inside an instruction"},
		{"push on one path only", []byte{0x74, 0x01, 0x50, 0x58}, "stack depth"},
		{"undecodable", []byte{0x0f, 0x0b}, "no place"},
	}
	for _, c := range cases {
		spec := PatchSpec{Site: movSite, Live: AllLive, Snippets: []Snippet{badSnippet{c.code}}}
		p, err := BuildPatch(testBase, spec)
		if err != nil {
			t.Fatal(err)
		}
		err = VerifyPatch(p, spec)
		if !errors.Is(err, ErrVerify) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want a VerifyError with %q", c.name, err, c.want)
		}
	}
	// A counter snippet whose bytes were changed after emission.
	spec := PatchSpec{Site: movSite, Live: AllLive, Snippets: []Snippet{Counter{testBase + 0x8000}}}
	p, err := BuildPatch(testBase, spec)
	if err != nil {
		t.Fatal(err)
	}
	p.Code[1+4]++ // the displacement of lock incq, after pushfq
	if err := VerifyPatch(p, spec); !errors.Is(err, ErrVerify) {
		t.Errorf("corrupted counter displacement: err = %v", err)
	}
}

// TestCounterPatchIsBuildPatch: the old single-counter entry point and the
// snippet model generate the same bytes (the golden files cover both).
func TestCounterPatchIsBuildPatch(t *testing.T) {
	for _, flags := range []bool{false, true} {
		old, err := CounterPatch(testBase, movSite, testBase+0x8000, flags)
		if err != nil {
			t.Fatal(err)
		}
		if err := Verify(old, testBase, movSite, testBase+0x8000, flags); err != nil {
			t.Fatal(err)
		}
		if len(old) != CounterPrefixLen(flags)+4+5 {
			t.Errorf("flags %v: %d bytes", flags, len(old))
		}
	}
}

// TestFallThroughPatches: a covering splice's patch is the patches of its
// instructions end to end, all but the last without the jmp back. Decoded
// back (objdump's view via x86asm), the sequence is each instruction's
// counter and copy in order, then one jmp to the end of the run; a call,
// jmp or ret may not fall through, a jcc may (not taken, it goes on into
// the next part: a run into the block a jcc falls through to); and a
// fall-through patch does not verify as an ordinary one (the jmp back is
// missing).
func TestFallThroughPatches(t *testing.T) {
	const at, patch uint64 = 0xffffffff81000000, 0xffffffffc0000000
	run := []Site{
		{Addr: at, Bytes: []byte{0x55}},                 // push %rbp
		{Addr: at + 1, Bytes: []byte{0x48, 0x89, 0xe5}}, // mov %rsp,%rbp
		{Addr: at + 4, Bytes: []byte{0x41, 0x54}},       // push %r12
		{Addr: at + 6, Bytes: []byte{0x48, 0x85, 0xc0}}, // test %rax,%rax
		{Addr: at + 9, Bytes: []byte{0x74, 0x05}},       // je +5
		{Addr: at + 11, Bytes: []byte{0xeb, 0xf3}},      // jmp -13 (to at)
	}
	var code []byte
	for i, s := range run {
		spec := PatchSpec{Site: s, Live: AllLive, FallThrough: i < len(run)-1}
		if i%2 == 0 {
			spec.Snippets = []Snippet{Counter{Addr: 0xffffffffc1000000 + uint64(i)*8}}
		}
		p, err := BuildPatch(patch+uint64(len(code)), spec)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if err := VerifyPatch(p, spec); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if spec.FallThrough {
			if err := VerifyPatch(p, PatchSpec{Site: s, Live: AllLive, Snippets: spec.Snippets}); err == nil {
				t.Errorf("%d: a patch without its jmp back verified as an ordinary one", i)
			}
		}
		code = append(code, p.Code...)
	}
	var ops []string
	var last, je x86asm.Inst
	jeEnd := 0
	for off := 0; off < len(code); {
		inst, err := x86dec.Decode(code[off:])
		if err != nil {
			t.Fatalf("+%d: %v", off, err)
		}
		ops = append(ops, inst.Op.String())
		last, off = inst, off+inst.Len
		if inst.Op == x86asm.JE {
			je, jeEnd = inst, off
		}
	}
	want := "PUSHFQ INC POPFQ PUSH MOV PUSHFQ INC POPFQ PUSH TEST PUSHFQ INC POPFQ JE JMP"
	if got := strings.Join(ops, " "); got != want {
		t.Errorf("ops %s\nwant %s", got, want)
	}
	// The je goes to its own target; not taken, it runs into the jmp's
	// part, which leaves for the jmp's target: no jmp back to the end of
	// the run is left.
	if rel, ok := je.Args[0].(x86asm.Rel); !ok || patch+uint64(jeEnd)+uint64(int64(rel)) != at+16 {
		t.Errorf("je %v, want to the original target %#x", je, at+16)
	}
	if rel, ok := last.Args[0].(x86asm.Rel); !ok || patch+uint64(len(code))+uint64(int64(rel)) != at {
		t.Errorf("last jmp %v, want to the jmp's target %#x", last, at)
	}
	for _, b := range [][]byte{{0xeb, 0x05}, {0xe8, 0, 0, 0, 0}, {0xc3}, {0xe2, 0xfe}} {
		if _, err := BuildPatch(patch, PatchSpec{Site: Site{Addr: at, Bytes: b}, FallThrough: true}); err == nil {
			t.Errorf("% x falls through", b)
		}
	}
	// The census's form (on an instruction already decoded) agrees.
	for _, b := range [][]byte{{0x74, 0x05}, {0xe8, 0, 0, 0, 0}, {0xc3}, {0x55}, {0x48, 0x8b, 0x05, 1, 2, 3, 4}, {0xff, 0xd0}, {0xe2, 0xfe}} {
		inst, err := x86dec.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		site := Site{Addr: at, Bytes: b}
		if CanFallThroughInst(at, inst, b) != CanFallThrough(site) {
			t.Errorf("% x: CanFallThroughInst %v, CanFallThrough %v", b, CanFallThroughInst(at, inst, b), CanFallThrough(site))
		}
		if want := len(b) == 1 && b[0] == 0x55 || b[0] == 0x48 || b[0] == 0x74; CanFallThrough(site) != want {
			t.Errorf("% x: CanFallThrough %v, want %v", b, !want, want)
		}
	}
}

// A spec analysed once (Analyze) is built from that analysis even after
// the shared cache let it go, and the build enters it again for the
// checks that follow; a spec whose site changed since is analysed afresh.
func TestAnalyzeKeptWithSpec(t *testing.T) {
	spec := PatchSpec{Site: movSite, Snippets: []Snippet{Counter{testBase + 0x8000}}}
	if err := spec.Analyze(); err != nil {
		t.Fatal(err)
	}
	kept := spec.in
	want, err := BuildPatch(testBase, spec)
	if err != nil {
		t.Fatal(err)
	}
	analyses.mu.Lock()
	analyses.slot = [analysisSlots]*insn{}
	analyses.mu.Unlock()
	p, err := BuildPatch(testBase, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.Code, want.Code) {
		t.Errorf("built from the kept analysis: % x, want % x", p.Code, want.Code)
	}
	if got := analyses.get(spec.Site); got != kept {
		t.Errorf("cache after the build holds %p, want the kept analysis %p", got, kept)
	}
	other := spec
	other.Site.Addr += 0x100
	if in, err := other.analysis(); err != nil || in == kept || in.site.Addr != other.Site.Addr {
		t.Errorf("a moved site: analysis %p (%v) at %#x, want a fresh one", in, err, in.site.Addr)
	}
}
