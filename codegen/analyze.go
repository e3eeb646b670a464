package codegen

import (
	"bytes"
	"fmt"
	"sync"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/att"
	"github.com/kinst/kinst/internal/x86dec"
)

// Site is the one original instruction being replaced.
type Site struct {
	Addr  uint64 // kernel address of the instruction
	Bytes []byte // exactly the instruction's bytes (1..15)
}

// next is the address of the instruction after the site: where the patch
// returns to.
func (s Site) next() uint64 { return s.Addr + uint64(len(s.Bytes)) }

// kind is how an instruction is carried over into a patch.
type kind int

const (
	kindPlain        kind = iota // copied (RIP-relative disp32 fixed up), then jmp back
	kindRet                      // copied; a function exit, nothing follows
	kindIndirectJmp              // copied (RIP-relative disp32 fixed up); nothing follows
	kindIndirectCall             // push return address; jmp through the same operand
	kindJcc                      // jcc rel32 target; jmp back
	kindJmp                      // jmp rel32 target
	kindCall                     // push return address; jmp rel32 target
	kindRCX                      // loop*/jrcxz: op +2; jmp +5; jmp target; jmp back
)

// fallsThrough reports whether execution may continue at the next
// instruction once this one completes (for a call: when the callee
// returns).
func (k kind) fallsThrough() bool {
	switch k {
	case kindRet, kindIndirectJmp, kindJmp:
		return false
	}
	return true
}

// jumpsBack reports whether the relocated code ends with a jmp back to the
// next instruction: not after an unconditional transfer, and not after a
// call, which returns to the original code by itself.
func (k kind) jumpsBack() bool {
	switch k {
	case kindPlain, kindJcc, kindRCX:
		return true
	}
	return false
}

// insn is a site decoded and classified: everything Relocate and Verify
// need to know about the original instruction.
type insn struct {
	site Site
	inst x86asm.Inst
	l    layout
	kind kind
}

func (in *insn) next() uint64 { return in.site.next() }

// target is the absolute destination of a relative branch.
func (in *insn) target() uint64 {
	rel, _ := in.inst.Args[0].(x86asm.Rel)
	return in.next() + uint64(int64(rel))
}

// ripTarget is the absolute address named by the RIP-relative operand.
func (in *insn) ripTarget() uint64 {
	return in.next() + uint64(int64(le32(in.site.Bytes, in.l.rip)))
}

func (in *insn) refuse(format string, args ...any) error {
	return &UnsupportedError{Addr: in.site.Addr, Inst: gnu(in.inst, in.site.Addr), Reason: fmt.Sprintf(format, args...)}
}

func gnu(inst x86asm.Inst, pc uint64) string { return att.Syntax(inst, pc, nil) }

var (
	endbr64 = []byte{0xf3, 0x0f, 0x1e, 0xfa}
	endbr32 = []byte{0xf3, 0x0f, 0x1e, 0xfb}
)

// analyze decodes the site and decides how to relocate it, or why not.
// Building one patch asks about its site four or five times (PatchLen,
// BuildPatch, the relocation, VerifyPatch), and each answer decodes the
// instruction with trailers too: recent answers are kept (analysis is a
// function of the address and bytes alone, and an insn is not changed
// once made). A batch of splices sizes every patch first and builds them
// later, on every CPU, so the cache holds a batch's sites, not the last
// one: a single kept answer missed every time and analysed each site
// three times.
func analyze(s Site) (*insn, error) {
	if in := analyses.get(s); in != nil {
		return in, nil
	}
	in, err := analyzeSite(s)
	if err == nil {
		analyses.put(in)
	}
	return in, err
}

// analyses are analyze's recent answers.
var analyses analysisCache

// analysisSlots is the cache's size: more than a driver batch (4,096).
const analysisSlots = 1 << 13

// analysisCache keeps analyses by address, direct mapped, each with a
// copy of its site's bytes.
type analysisCache struct {
	mu   sync.Mutex
	slot [analysisSlots]*insn
}

func analysisSlot(addr uint64) uint64 { return (addr ^ addr>>13) % analysisSlots }

// get is the kept analysis of s, or nil.
func (c *analysisCache) get(s Site) *insn {
	c.mu.Lock()
	in := c.slot[analysisSlot(s.Addr)]
	c.mu.Unlock()
	if in != nil && in.site.Addr == s.Addr && bytes.Equal(in.site.Bytes, s.Bytes) {
		return in
	}
	return nil
}

// put keeps in, its site's bytes copied first: the caller's may change.
// An analysis is not changed once made, so in itself is shared.
func (c *analysisCache) put(in *insn) {
	in.site.Bytes = bytes.Clone(in.site.Bytes)
	c.mu.Lock()
	c.slot[analysisSlot(in.site.Addr)] = in
	c.mu.Unlock()
}

// keep enters in again, an analysis put before (whose bytes are already
// its own): in is shared and not changed.
func (c *analysisCache) keep(in *insn) {
	c.mu.Lock()
	c.slot[analysisSlot(in.site.Addr)] = in
	c.mu.Unlock()
}

// analyzeSite is analyze, always afresh.
func analyzeSite(s Site) (*insn, error) {
	hex := func() string { return fmt.Sprintf("% x", s.Bytes) }
	if len(s.Bytes) == 0 || len(s.Bytes) > 15 {
		return nil, &UnsupportedError{Addr: s.Addr, Inst: hex(), Reason: fmt.Sprintf("%d bytes is not an x86-64 instruction length", len(s.Bytes))}
	}
	if bytes.Equal(s.Bytes, endbr64) || bytes.Equal(s.Bytes, endbr32) {
		// Under IBT an indirect branch must land on it; the splice
		// would put a jmp there instead.
		return nil, &UnsupportedError{Addr: s.Addr, Inst: "endbr64", Reason: "an indirect-branch landing pad (endbr) must stay in place"}
	}
	inst, err := x86dec.Decode(s.Bytes)
	if err == nil && inst.Op == 0 {
		err = errInvalid
	}
	if err != nil {
		return nil, &UnsupportedError{Addr: s.Addr, Inst: hex(), Reason: "x86asm cannot decode it: " + err.Error()}
	}
	return analyzeDecoded(s, inst, true)
}

// trailers are byte sequences that can follow an instruction in a patch
// or in kernel text.
var trailers = [][]byte{
	{0xe9, 0x51, 0x45, 0x83, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
	{0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc},
	{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
}

// stableDecode reports whether the decoding of b is the same whatever
// follows it, as it is for any instruction a CPU would execute: x86asm
// accepts a few malformed VEX encodings whose length then depends on the
// next bytes, and those would change meaning when copied into a patch.
// Other encodings are checked against the jmp that follows in a patch
// only, which keeps the whole-kernel census cheap.
func stableDecode(b []byte, inst x86asm.Inst, vex bool) bool {
	buf := make([]byte, 0, len(b)+15)
	ts := trailers
	if !vex {
		ts = ts[:1]
	}
	for _, t := range ts {
		got, err := x86asm.Decode(append(append(buf[:0], b...), t...), 64)
		if err != nil || got.Op != inst.Op || got.Len != inst.Len || got.Args != inst.Args {
			return false
		}
	}
	return true
}

// refusedOps are operations whose effect depends on where they execute,
// that trap on purpose, or that transfer control in ways a patch cannot
// reproduce.
var refusedOps = map[x86asm.Op]string{
	x86asm.INTO:     "a conditional trap: the handler would see the patch's address",
	x86asm.ICEBP:    "int1, a debug trap: the handler would see the patch's address",
	x86asm.UD0:      "traps on purpose: the kernel looks a BUG/WARN's address up in its bug table, and a program's abort would report the patch's",
	x86asm.UD1:      "traps on purpose: the kernel looks a BUG/WARN's address up in its bug table, and a program's abort would report the patch's",
	x86asm.UD2:      "traps on purpose: the kernel looks a BUG/WARN's address up in its bug table, and a program's abort would report the patch's",
	x86asm.HLT:      "waits for an interrupt (\"sti; hlt\" relies on the sti shadow covering it); in a process, faults on purpose (an abort)",
	x86asm.MWAIT:    "waits for an interrupt: \"sti; mwait\" relies on the sti shadow covering it",
	x86asm.STI:      "its interrupt shadow would cover the jump back, not the next instruction",
	x86asm.SYSCALL:  "a system call: saves the address of the next instruction",
	x86asm.SYSRET:   "returns to user mode",
	x86asm.SYSENTER: "a system call",
	x86asm.SYSEXIT:  "returns to user mode",
	x86asm.IRET:     "an interrupt return",
	x86asm.IRETD:    "an interrupt return",
	x86asm.IRETQ:    "an interrupt return",
	x86asm.RSM:      "leaves system-management mode",
	x86asm.LCALL:    "a far call",
	x86asm.LJMP:     "a far jump",
	x86asm.LRET:     "a far return",
}

var jccOps = map[x86asm.Op]bool{
	x86asm.JA: true, x86asm.JAE: true, x86asm.JB: true, x86asm.JBE: true, x86asm.JE: true,
	x86asm.JNE: true, x86asm.JG: true, x86asm.JGE: true, x86asm.JL: true, x86asm.JLE: true,
	x86asm.JO: true, x86asm.JNO: true, x86asm.JP: true, x86asm.JNP: true, x86asm.JS: true, x86asm.JNS: true,
}

// rcxOps exist only with a rel8 and test rcx (or ecx): they are expanded.
var rcxOps = map[x86asm.Op]bool{
	x86asm.LOOP: true, x86asm.LOOPE: true, x86asm.LOOPNE: true,
	x86asm.JCXZ: true, x86asm.JECXZ: true, x86asm.JRCXZ: true,
}

// analyzeDecoded classifies inst, the decoding of s.Bytes. strict also
// re-decodes legacy (non-VEX) encodings with a trailer; the census skips
// that (no legacy encoding is known to need it), the splice path never
// does.
func analyzeDecoded(s Site, inst x86asm.Inst, strict bool) (*insn, error) {
	in := &insn{site: s, inst: inst}
	if err := in.analyze(strict); err != nil {
		return nil, err
	}
	return in, nil
}

// analyze fills in the layout and kind of in's site and inst, or refuses
// them: analyzeDecoded into memory of the caller's (the census and the
// planner's per-instruction checks keep nothing of it).
func (in *insn) analyze(strict bool) error {
	s, inst := in.site, in.inst
	if inst.Len != len(s.Bytes) {
		return in.refuse("the site has %d bytes but the instruction is %d", len(s.Bytes), inst.Len)
	}
	if inst.Op == x86asm.INT {
		if len(s.Bytes) == 1 && s.Bytes[0] == 0xcc {
			// Most common by far (padding between functions): no
			// formatting.
			return &UnsupportedError{Addr: s.Addr, Inst: "int3", Reason: "a breakpoint, maybe another tool's (kprobe, debugger)"}
		}
		return in.refuse("a software interrupt: the handler would see the patch's address")
	}
	if why, ok := refusedOps[inst.Op]; ok {
		return in.refuse("%s", why)
	}
	if inst.Op == x86asm.MOV && inst.Args[0] == x86asm.SS {
		return in.refuse("a load of ss: its interrupt shadow would cover the jump back")
	}
	nrel := 0
	for i, a := range inst.Args {
		switch a := a.(type) {
		case x86asm.Reg:
			if a == x86asm.RIP || a == x86asm.EIP || a == x86asm.IP {
				return in.refuse("uses the instruction pointer as a register")
			}
		case x86asm.Mem:
			if a.Index == x86asm.RIP || a.Index == x86asm.EIP {
				return in.refuse("uses the instruction pointer as an index")
			}
		case x86asm.Rel:
			if i != 0 {
				return in.refuse("a relative operand of unknown meaning")
			}
			nrel++
		}
	}
	l, err := parseLayout(s.Bytes)
	if err != nil {
		return in.refuse("cannot locate its operands: %v", err)
	}
	in.l = l
	if (strict || l.vex) && x86dec.VzeroLen(s.Bytes) != len(s.Bytes) && !stableDecode(s.Bytes, inst, l.vex) {
		return in.refuse("x86asm decodes it differently when other bytes follow: not a well-formed instruction")
	}
	if err := in.checkRIP(); err != nil {
		return err
	}
	in.kind, err = in.classify(nrel > 0)
	return err
}

// checkRIP cross-checks our own ModRM walk against x86asm about the
// RIP-relative operand. They agree on every legacy encoding; on VEX,
// x86asm's decoder shows "disp32(%rip)" as an absolute "disp32", which the
// walk recognises. Any other disagreement is refused: one of the two is
// wrong and a copied displacement would address the wrong byte.
func (in *insn) checkRIP() error {
	x86rip, eip := -1, false
	var abs x86asm.Mem // a copy, not a pointer: this runs on every kernel instruction
	hasAbs := false
	for _, a := range in.inst.Args {
		m, ok := a.(x86asm.Mem)
		if !ok {
			continue
		}
		switch m.Base {
		case x86asm.RIP:
			if in.inst.PCRel == 4 {
				x86rip = in.inst.PCRelOff
			}
		case x86asm.EIP:
			eip = true
		case 0:
			if m.Index == 0 {
				abs, hasAbs = m, true
			}
		}
	}
	switch {
	case eip || in.l.rip >= 0 && in.l.addr32:
		return in.refuse("an EIP-relative operand (address-size prefix): the address wraps at 4 GiB")
	case in.l.rip == x86rip:
		return nil
	case x86rip < 0 && in.l.vex && hasAbs && int32(abs.Disp) == le32(in.site.Bytes, in.l.rip):
		return nil
	}
	return in.refuse("decoders disagree about a RIP-relative operand (x86asm: offset %d, ModRM walk: %d)", x86rip, in.l.rip)
}

func (in *insn) hasLegacyPrefix(p byte) bool {
	return bytes.IndexByte(in.site.Bytes[:in.l.prefixes], p) >= 0
}

// classify picks the relocation of an instruction already known not to be
// refused outright.
func (in *insn) classify(relative bool) (kind, error) {
	op, b, l := in.inst.Op, in.site.Bytes, in.l
	if (relative || op == x86asm.CALL) && in.hasLegacyPrefix(0x66) {
		// Intel ignores it; AMD truncates the target to 16 bits.
		return 0, in.refuse("an operand-size prefix on a branch: Intel and AMD disagree on its meaning")
	}
	switch {
	case relative && jccOps[op]:
		if !(l.opmap == 0 && b[l.opcode]&0xf0 == 0x70 || l.opmap == 1 && b[l.opcode]&0xf0 == 0x80) {
			return 0, in.refuse("unexpected encoding of a conditional jump")
		}
		return kindJcc, nil
	case relative && rcxOps[op]:
		if l.opmap != 0 || in.inst.PCRel != 1 || in.inst.PCRelOff != len(b)-1 || l.opcode != len(b)-2 {
			return 0, in.refuse("unexpected encoding of %v", op)
		}
		return kindRCX, nil
	case relative && op == x86asm.JMP:
		return kindJmp, nil
	case relative && op == x86asm.CALL:
		return kindCall, nil
	case relative && op == x86asm.XBEGIN:
		return 0, in.refuse("its abort address is relative, and the transaction would span the patch")
	case relative:
		return 0, in.refuse("a relative operand of unknown meaning")
	case op == x86asm.CALL:
		if l.vex || l.opmap != 0 || b[l.opcode] != 0xff || l.modrm < 0 || b[l.modrm]>>3&7 != 2 {
			return 0, in.refuse("an indirect call not encoded as ff /2")
		}
		if usesRSP(in.inst.Args[0]) {
			// The operand is read before the call pushes; in the patch
			// it would be read after the push of the return address.
			return 0, in.refuse("an indirect call through %%rsp: pushing the return address first would move its operand")
		}
		return kindIndirectCall, nil
	case op == x86asm.JMP:
		return kindIndirectJmp, nil
	case op == x86asm.RET:
		return kindRet, nil
	}
	return kindPlain, nil
}

func usesRSP(a x86asm.Arg) bool {
	isSP := func(r x86asm.Reg) bool { return r == x86asm.RSP || r == x86asm.ESP || r == x86asm.SP }
	switch a := a.(type) {
	case x86asm.Reg:
		return isSP(a)
	case x86asm.Mem:
		return isSP(a.Base) || isSP(a.Index)
	}
	return false
}

// CheckRelocatable reports whether Relocate would accept the decoded
// instruction inst with encoding b, without generating anything: the cheap
// test that analysis runs over every instruction of the kernel. Reach is
// not checked: it depends on where the patch goes.
func CheckRelocatable(addr uint64, inst x86asm.Inst, b []byte) error {
	_, err := checkInst(addr, inst, b)
	return err
}

// checkInst analyses an instruction already decoded (inst), decoding it
// again only where x86asm's first answer is not trusted, and returns its
// kind. Nothing of the analysis escapes: this runs on every instruction
// of the kernel.
func checkInst(addr uint64, inst x86asm.Inst, b []byte) (kind, error) {
	s := Site{Addr: addr, Bytes: b}
	if inst.Op == 0 || len(b) == 0 || len(b) > 15 || bytes.Equal(b, endbr64) || bytes.Equal(b, endbr32) {
		in, err := analyze(s)
		if err != nil {
			return 0, err
		}
		return in.kind, nil
	}
	in := insn{site: s, inst: inst}
	if err := in.analyze(false); err != nil {
		return 0, err
	}
	return in.kind, nil
}

// FallsThrough reports whether execution may continue at
// site.Addr+len(site.Bytes) once site's instruction completes: true for
// ordinary instructions, conditional branches, loop and jrcxz (their
// relocation ends with a jmp back) and calls (the callee returns there
// directly); false for jmp, indirect jmp and ret.
func FallsThrough(site Site) (bool, error) {
	in, err := analyze(site)
	if err != nil {
		return false, err
	}
	return in.kind.fallsThrough(), nil
}

// CanFallThrough reports whether site can be relocated to fall through to
// the code placed after it (PatchSpec.FallThrough): it neither calls nor
// jumps but conditionally (a jcc not taken goes on as the original goes
// on to the next instruction; taken, it leaves for its own target).
func CanFallThrough(site Site) bool {
	in, err := analyze(site)
	return err == nil && in.kind.canFallThrough()
}

// CanFallThroughInst is CanFallThrough for an instruction already decoded
// (the whole-kernel census's cheap form, like CheckRelocatable).
func CanFallThroughInst(addr uint64, inst x86asm.Inst, b []byte) bool {
	k, err := checkInst(addr, inst, b)
	return err == nil && k.canFallThrough()
}

// canFallThrough: the kind's relocation may be followed by the next
// instruction's patch instead of a jmp back (PatchSpec.FallThrough).
func (k kind) canFallThrough() bool { return k == kindPlain || k == kindJcc }
