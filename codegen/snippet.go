package codegen

import (
	"bytes"
	"errors"
	"fmt"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

// Snippet is one request's instrumentation at a point: a counter, an AOT
// or timer entry/exit step, a group guarded by a predicate. Several
// snippets at one point share one patch (BuildPatch); each runs in order,
// before the relocated original instruction.
//
// A snippet declares what it overwrites (Needs) and emits code that writes
// nothing else. BuildPatch gives it scratch registers that are dead at the
// point (or spilled around the whole patch when too few are dead), saves
// RFLAGS when any snippet writes flags that are live, and saves fixed
// registers (rdtsc's RAX and RDX) that are live. A snippet must not touch
// %rsp (beyond balanced push/pop), must not call, return or jump out of its
// own code, and must fall through at its end; VerifyPatch checks all of it
// on the decoded bytes.
type Snippet interface {
	// Needs is what the snippet overwrites.
	Needs() Needs
	// Emit appends the snippet's code to a. scratch holds Needs().Regs
	// distinct registers (never RSP or RBP, never one of Needs().Fixed)
	// that it may overwrite. Encoding errors are left in a.Err().
	Emit(a *Asm, scratch []Reg)
}

// Checker is implemented by snippets that can check their own emitted
// bytes independently of how they were emitted (decoding them back):
// VerifyPatch calls it on the snippet's span.
type Checker interface {
	Check(code []byte, at uint64) error
}

// Needs is what a snippet (or predicate) overwrites.
type Needs struct {
	Regs  int    // scratch registers, any
	Fixed uint16 // particular registers it writes (mask of Reg.Bit), e.g. RAX|RDX for rdtsc
	Flags bool   // writes arithmetic flags
}

func (n Needs) union(m Needs) Needs {
	return Needs{Regs: max(n.Regs, m.Regs), Fixed: n.Fixed | m.Fixed, Flags: n.Flags || m.Flags}
}

// Live is what is live just before the point's instruction: the patch
// must leave these as they were.
type Live struct {
	Regs  uint16 // mask of Reg.Bit (cfg.LiveSet's low 16 bits)
	Flags bool   // any arithmetic flag
}

// AllLive assumes every register and flag is live: the safe default.
var AllLive = Live{Regs: 0xffff, Flags: true}

// PatchSpec is everything that goes into one point's patch.
type PatchSpec struct {
	Site     Site
	Live     Live
	Snippets []Snippet // run in this order
	// FallThrough leaves out the jmp back after the relocated instruction:
	// the code placed right after the patch runs next. A covering splice's
	// patch is the patches of its instructions laid end to end, each but
	// the last falling through. Only an instruction that neither calls
	// nor jumps but conditionally may (a call would return into the
	// covered bytes; a jcc not taken goes on into the next part, taken to
	// its target: CanFallThrough).
	FallThrough bool
	// RedZone is how many bytes below %rsp the interrupted code may use
	// without moving %rsp: 128 in user space under the SysV ABI, 0 in the
	// kernel (built with -mno-red-zone). A patch that pushes anything
	// first moves %rsp below it (lea -RedZone(%rsp),%rsp) and back after;
	// lea leaves the flags alone.
	RedZone int32

	// in is Site's analysis, made by Analyze and kept with the spec so
	// that sizing a patch and building it, possibly far apart, analyse
	// the instruction once (the shared cache may have let it go).
	in *insn
}

// Analyze analyses the spec's instruction now and keeps the answer with
// the spec, for PatchLen and BuildPatch; it returns the error they would.
func (spec *PatchSpec) Analyze() error {
	in, err := analyze(spec.Site)
	if err == nil {
		spec.in = in
	}
	return err
}

// analysis is the spec's instruction analysed: the one Analyze kept
// (entered in the shared cache again, for the checks after the build),
// or the cache's.
func (spec *PatchSpec) analysis() (*insn, error) {
	if in := spec.in; in != nil && in.site.Addr == spec.Site.Addr && bytes.Equal(in.site.Bytes, spec.Site.Bytes) {
		analyses.keep(in)
		return in, nil
	}
	return analyze(spec.Site)
}

// Patch is generated code for one point:
//
//	[pushfq]                   flags live and some snippet writes flags
//	[push %r …]                live registers the snippets need
//	snippet 1 … snippet n
//	[pop %r …] [popfq]
//	<the site's instruction, relocated>
//	jmp site.Addr+len          omitted after an unconditional transfer,
//	                           and with FallThrough
type Patch struct {
	Addr       uint64
	Code       []byte
	Instr      int    // bytes of instrumentation before the relocated instruction
	Spans      []Span // each snippet's code, in Snippets order
	Scratch    []Reg  // registers given to snippets as scratch
	Spilled    []Reg  // live registers pushed and popped around the snippets
	SavedFlags bool   // pushfq/popfq around the snippets
}

// Span is a byte range [Start, End) of a patch.
type Span struct{ Start, End int }

// ErrNoScratch: a snippet needs more scratch registers than exist.
var ErrNoScratch = errors.New("not enough scratch registers")

// scratchOrder is the preference for scratch registers: caller-saved
// first (a dead one is free to use), then callee-saved. RSP and RBP are
// never handed out (stack and frame pointer: an interrupt or unwinder may
// read them at any instruction).
var scratchOrder = []Reg{RAX, RCX, RDX, RSI, RDI, R8, R9, R10, R11, RBX, R12, R13, R14, R15}

// BuildPatch generates the patch for spec placed at addr. With no
// snippets the patch is the relocated instruction alone.
func BuildPatch(addr uint64, spec PatchSpec) (*Patch, error) {
	in, err := spec.analysis()
	if err != nil {
		return nil, err
	}
	if spec.FallThrough && !in.kind.canFallThrough() {
		return nil, in.refuse("a call, jmp or ret cannot fall through to the next instruction's patch")
	}
	var need Needs
	for _, s := range spec.Snippets {
		need = need.union(s.Needs())
	}
	if need.Fixed&(RSP.Bit()|RBP.Bit()) != 0 {
		return nil, fmt.Errorf("%w: a snippet claims %%rsp or %%rbp", ErrNoScratch)
	}
	p := &Patch{Addr: addr}
	// Scratch: dead registers first, then live ones (spilled).
	var dead, live []Reg
	for _, r := range scratchOrder {
		if need.Fixed&r.Bit() != 0 {
			continue
		}
		if spec.Live.Regs&r.Bit() == 0 {
			dead = append(dead, r)
		} else {
			live = append(live, r)
		}
	}
	cand := append(dead, live...)
	if need.Regs > len(cand) {
		return nil, fmt.Errorf("%w: %d wanted, %d usable", ErrNoScratch, need.Regs, len(cand))
	}
	p.Scratch = cand[:need.Regs]
	for _, r := range scratchOrder {
		used := need.Fixed&r.Bit() != 0 || regIn(r, p.Scratch)
		if used && spec.Live.Regs&r.Bit() != 0 {
			p.Spilled = append(p.Spilled, r)
		}
	}
	p.SavedFlags = spec.Live.Flags && need.Flags

	a := NewAsm(addr)
	skip := spec.RedZone > 0 && (p.SavedFlags || len(p.Spilled) > 0 || !stackless(spec.Snippets))
	if skip {
		a.LeaRSP(-spec.RedZone)
	}
	if p.SavedFlags {
		a.Pushfq()
	}
	for _, r := range p.Spilled {
		a.Push(r)
	}
	for _, s := range spec.Snippets {
		start := a.Len()
		s.Emit(a, p.Scratch[:s.Needs().Regs])
		p.Spans = append(p.Spans, Span{start, a.Len()})
	}
	for i := len(p.Spilled) - 1; i >= 0; i-- {
		a.Pop(p.Spilled[i])
	}
	if p.SavedFlags {
		a.Popfq()
	}
	if skip {
		a.LeaRSP(spec.RedZone)
	}
	if err := a.Err(); err != nil {
		return nil, err
	}
	p.Instr = a.Len()
	code, err := in.relocateBack(bytes.Clone(a.Bytes()), addr+uint64(p.Instr), !spec.FallThrough)
	if err != nil {
		return nil, err
	}
	p.Code = code
	return p, nil
}

// InsideRedZone returns the instrumentation between a patch's red zone
// skip (lea -rz(%rsp),%rsp) and its restore, and the skip's length; code
// unchanged without a red zone or a skip. A skip without its restore is a
// *VerifyError.
func InsideRedZone(instr []byte, rz int32) ([]byte, int, error) {
	if rz <= 0 {
		return instr, 0, nil
	}
	down, up := leaRSP(-rz), leaRSP(rz)
	if !bytes.HasPrefix(instr, down) {
		return instr, 0, nil
	}
	if !bytes.HasSuffix(instr, up) || len(instr) < len(down)+len(up) {
		return nil, 0, &VerifyError{Offset: 0, Reason: "red zone skip without its restore at the end"}
	}
	return instr[len(down) : len(instr)-len(up)], len(down), nil
}

// stackless reports whether every snippet is one that never pushes
// (counters and hit flags: one instruction on memory).
func stackless(ss []Snippet) bool {
	for _, s := range ss {
		switch s.(type) {
		case Counter, HitFlag:
		default:
			return false
		}
	}
	return true
}

func regIn(r Reg, rs []Reg) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// PatchLen is the length BuildPatch would give spec at any address within
// reach: every encoding it uses has a fixed length, so callers size the
// allocation before they know the address.
func PatchLen(near uint64, spec PatchSpec) (int, error) {
	p, err := BuildPatch(near, spec)
	if err != nil {
		return 0, err
	}
	return len(p.Code), nil
}

// VerifyPatch decodes p back and checks it before it is ever spliced:
//   - the instrumentation decodes instruction by instruction to exactly
//     p.Instr bytes; it holds no call, return, indirect branch, interrupt
//     or system instruction; its branches go forward to an instruction
//     boundary inside it (or to its end), or are conditional branches back
//     to an instruction already decoded (a retry loop); the stack pointer is only moved
//     by push/pop/pushfq/popfq, with the same depth on every path and
//     zero at the end;
//   - each snippet that implements Checker accepts its span;
//   - the rest is the site's instruction relocated (VerifyRelocation).
//
// Whether the instrumentation preserves live registers and flags is
// checked by the caller with cfg.Clobbers, an independent decoder walk.
func VerifyPatch(p *Patch, spec PatchSpec) error {
	if p.Instr < 0 || p.Instr > len(p.Code) {
		return &VerifyError{Offset: 0, Reason: fmt.Sprintf("instrumentation length %d outside the patch", p.Instr)}
	}
	if len(p.Spans) != len(spec.Snippets) {
		return &VerifyError{Offset: 0, Reason: fmt.Sprintf("%d spans for %d snippets", len(p.Spans), len(spec.Snippets))}
	}
	instr, base, err := InsideRedZone(p.Code[:p.Instr], spec.RedZone)
	if err != nil {
		return err
	}
	if err := verifyInstrumentation(instr, p.Addr+uint64(base)); err != nil {
		var ve *VerifyError
		if errors.As(err, &ve) {
			ve.Offset += base
		}
		return err
	}
	if spec.RedZone > 0 && base == 0 {
		// No skip: nothing may push into the red zone.
		for off := 0; off < len(instr); {
			in, err := x86dec.Decode(instr[off:])
			if err != nil {
				break // verifyInstrumentation decoded it all
			}
			if in.Op == x86asm.PUSH || in.Op == x86asm.PUSHFQ {
				return &VerifyError{Offset: off, Reason: "pushes into the red zone without moving %rsp below it"}
			}
			off += in.Len
		}
	}
	for i, s := range spec.Snippets {
		sp := p.Spans[i]
		if sp.Start < 0 || sp.End < sp.Start || sp.End > p.Instr {
			return &VerifyError{Offset: sp.Start, Reason: fmt.Sprintf("snippet %d span [%d,%d) outside the instrumentation", i, sp.Start, sp.End)}
		}
		if c, ok := s.(Checker); ok {
			if err := c.Check(p.Code[sp.Start:sp.End], p.Addr+uint64(sp.Start)); err != nil {
				var ve *VerifyError
				if errors.As(err, &ve) {
					ve.Offset += sp.Start
				}
				return fmt.Errorf("snippet %d: %w", i, err)
			}
		}
	}
	err = verifyRelocation(p.Code[p.Instr:], p.Addr+uint64(p.Instr), spec.Site, !spec.FallThrough)
	var ve *VerifyError
	if errors.As(err, &ve) {
		ve.Offset += p.Instr
	}
	return err
}

// forbiddenInInstrumentation are operations a snippet never needs and that
// would leave the patch or change privileged state.
var forbiddenInInstrumentation = map[x86asm.Op]bool{
	x86asm.CALL: true, x86asm.RET: true, x86asm.LCALL: true, x86asm.LJMP: true, x86asm.LRET: true,
	x86asm.INT: true, x86asm.INTO: true, x86asm.ICEBP: true, x86asm.IRET: true, x86asm.IRETD: true, x86asm.IRETQ: true,
	x86asm.SYSCALL: true, x86asm.SYSRET: true, x86asm.SYSENTER: true, x86asm.SYSEXIT: true,
	x86asm.HLT: true, x86asm.STI: true, x86asm.CLI: true, x86asm.UD0: true, x86asm.UD1: true, x86asm.UD2: true,
	x86asm.LOOP: true, x86asm.LOOPE: true, x86asm.LOOPNE: true, x86asm.JRCXZ: true, x86asm.JECXZ: true,
	x86asm.ENTER: true, x86asm.LEAVE: true,
}

func verifyInstrumentation(code []byte, base uint64) error {
	r := &reader{code: code, base: base}
	depth := map[int]int{} // offset → stack depth a branch arrives with
	seen := map[int]int{}  // offset of each instruction decoded → stack depth there
	cur, reachable := 0, true
	fail := func(format string, args ...any) error { return r.fail(format, args...) }
	for r.off < len(code) {
		if d, ok := depth[r.off]; ok {
			if reachable && d != cur {
				return fail("stack depth %d on one path, %d on another", cur, d)
			}
			cur, reachable = d, true
		}
		inst, _, err := r.decode(15)
		if err != nil {
			return err
		}
		seen[r.off] = cur
		if r.off+inst.Len > len(code) {
			return fail("instruction runs past the instrumentation")
		}
		// The instruction as text, for an error only: formatting every
		// instruction of every patch was a sixth of arming a coverage
		// session.
		text := lazyText{inst, r.pc()}
		if forbiddenInInstrumentation[inst.Op] {
			return fail("%q has no place in instrumentation", text)
		}
		switch inst.Op {
		case x86asm.PUSH, x86asm.PUSHFQ:
			if _, ok := inst.Args[0].(x86asm.Reg); !ok && inst.Op == x86asm.PUSH {
				return fail("only register pushes: %q", text)
			}
			cur++
		case x86asm.POP, x86asm.POPFQ:
			if _, ok := inst.Args[0].(x86asm.Reg); !ok && inst.Op == x86asm.POP {
				return fail("only register pops: %q", text)
			}
			if cur--; cur < 0 {
				return fail("pops more than it pushed")
			}
		default:
			if usesStack(inst) {
				return fail("%q touches %%rsp", text)
			}
		}
		if rel, ok := inst.Args[0].(x86asm.Rel); ok {
			if !jccOps[inst.Op] && inst.Op != x86asm.JMP {
				return fail("unexpected relative operand: %q", text)
			}
			to := r.off + inst.Len + int(rel)
			if to <= r.off {
				// A loop (a cmpxchg retry): back to an instruction
				// already seen, at the same stack depth. The snippet's
				// own Check says what the loop does.
				if d, ok := seen[to]; !ok || d != cur || inst.Op == x86asm.JMP {
					return fail("%q does not branch forward, and is not a conditional retry loop to an instruction already decoded at the same stack depth", text)
				}
				r.off += inst.Len
				continue
			}
			if to > len(code) {
				return fail("%q does not branch forward inside the instrumentation", text)
			}
			if d, ok := depth[to]; ok && d != cur {
				return fail("branch arrives with stack depth %d, another path with %d", cur, d)
			}
			depth[to] = cur
			if inst.Op == x86asm.JMP {
				reachable = false
			}
		} else if inst.Op == x86asm.JMP {
			return fail("indirect jump %q", text)
		}
		r.off += inst.Len
	}
	if d, ok := depth[len(code)]; ok && reachable && d != cur {
		return fail("stack depth %d at the end on one path, %d on another", cur, d)
	} else if ok && !reachable {
		cur = d
	}
	if cur != 0 {
		return fail("stack depth %d at the end of the instrumentation", cur)
	}
	// Every branch target must be an instruction boundary: one of those
	// decoded above (every instruction, in order), or the end.
	for to := range depth {
		if _, ok := seen[to]; !ok && to != len(code) {
			return &VerifyError{Offset: to, Reason: "a branch lands inside an instruction"}
		}
	}
	return nil
}

// usesStack reports an instruction that names RSP (other than push/pop).
func usesStack(inst x86asm.Inst) bool {
	for _, a := range inst.Args {
		if a == nil {
			break
		}
		if usesRSP(a) {
			return true
		}
	}
	return false
}

// Counter counts executions: lock incq Addr(%rip). Locked so CPUs running
// the point at once never lose a count; RIP-relative so it needs no
// scratch register. Writes flags (not CF).
type Counter struct{ Addr uint64 }

func (c Counter) Needs() Needs         { return Needs{Flags: true} }
func (c Counter) Emit(a *Asm, _ []Reg) { a.LockIncq(c.Addr) }
func (c Counter) String() string       { return fmt.Sprintf("counter %#x", c.Addr) }
func (c Counter) Check(code []byte, at uint64) error {
	r := &reader{code: code, base: at}
	if err := r.lockIncq(c.Addr); err != nil {
		return err
	}
	return r.end()
}

// Predicate is a condition evaluated at the point, guarding a group of
// snippets (Guard).
type Predicate interface {
	Needs() Needs
	// EmitSkip appends a test and returns the forward branches to take
	// when the predicate does NOT hold; Guard binds them past its body.
	EmitSkip(a *Asm, scratch []Reg) []Label
}

// Guard runs Then only when If holds: KernInst's predicated primitives
// (e.g. count only one process's calls).
type Guard struct {
	If   Predicate
	Then []Snippet
}

func (g Guard) Needs() Needs {
	n := g.If.Needs()
	n.Flags = true // the branch reads what the test wrote
	for _, s := range g.Then {
		n = n.union(s.Needs())
	}
	return n
}

func (g Guard) Emit(a *Asm, scratch []Reg) {
	skips := g.If.EmitSkip(a, scratch[:g.If.Needs().Regs])
	for _, s := range g.Then {
		s.Emit(a, scratch[:s.Needs().Regs])
	}
	for _, l := range skips {
		a.Bind(l)
	}
}

// TaskField32 holds when the 32-bit field at Offset of the current task
// (struct task_struct, found through the per-CPU variable at per-CPU offset
// CurrentTask) equals Value: pid and tgid predicates. Offsets come from
// BTF, never from constants.
type TaskField32 struct {
	CurrentTask int32 // per-CPU offset of current_task (%gs-relative)
	Offset      int32 // offset of the field in task_struct
	Value       int32
}

func (p TaskField32) Needs() Needs { return Needs{Regs: 1, Flags: true} }

func (p TaskField32) EmitSkip(a *Asm, scratch []Reg) []Label {
	a.MovqGS(scratch[0], p.CurrentTask)
	a.CmplImm(scratch[0], p.Offset, p.Value)
	return []Label{a.JccForward(CondNE)}
}

// lazyText formats an instruction in GNU syntax when printed (%q, %s).
type lazyText struct {
	inst x86asm.Inst
	pc   uint64
}

func (t lazyText) String() string { return gnu(t.inst, t.pc) }
