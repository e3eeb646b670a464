package codegen

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/arch/x86/x86asm"
)

// Timer snippets (KernInst §4: AOT "average number of executing threads"
// and wall timers) need no per-thread storage. Each timed region has ONE
// 64-bit word W in the counter heap, updated by a single locked
// instruction, holding
//
//	W = S·2^16 + c      (mod 2^64)
//
// where c (low 16 bits) is the number of threads inside the region and S
// (high 48 bits) is Σ exit TSC − Σ entry TSC over the threads that entered
// (mod 2^48). At TSC t the integral of c over time — the total
// thread-time spent inside, i.e. the sum of every call's wall time,
// finished or not — is S + c·t (metrics.TimerIntegral). TimerEnter adds
// 1 − t·2^16 and TimerExit adds t·2^16 − 1: both fields change in the
// same locked add, so a reader never sees one without the other, and the
// integral is exact under any interleaving of CPUs, interrupts and
// preemption. Average concurrency and average latency follow from
// differences of the integral (Little's law), so one word serves both.
// Recursion is counted per level, like concurrency. 48 bits of TSC wrap
// after days at GHz rates; readers only take differences over one
// sampling interval.
//
// TimerExit is clamped: an exit that finds c = 0 changes nothing, so a
// thread that entered before the timer was attached and leaves after
// cannot drive the count negative (that would add −t per unmatched exit,
// an error growing forever). If such a thread leaves while another is
// inside, it ends that thread's interval early: a bounded error that only
// exists until the threads present at attach time have left. At most
// 65535 threads may be inside one region at once.

// tscShift16 leaves the TSC shifted left by 16 in %rax (clobbers %rdx):
// rdtsc; shl $32,%rdx; or %rdx,%rax; shl $16,%rax.
func tscShift16(a *Asm) {
	a.Rdtsc()
	a.ShlqImm(RDX, 32)
	a.OrqReg(RAX, RDX)
	a.ShlqImm(RAX, 16)
}

// TimerEnter: a thread enters the region timed by Word (see above).
type TimerEnter struct{ Word uint64 }

func (t TimerEnter) Needs() Needs   { return Needs{Fixed: RAX.Bit() | RDX.Bit(), Flags: true} }
func (t TimerEnter) String() string { return fmt.Sprintf("timer enter %#x", t.Word) }

func (t TimerEnter) Emit(a *Asm, _ []Reg) {
	tscShift16(a)
	a.Raw(0x48, 0xf7, 0xd8) // neg %rax
	a.Raw(0x48, 0xff, 0xc0) // inc %rax
	a.LockAddq(t.Word, RAX)
}

// TimerExit: a thread leaves the region timed by Word, unless nobody is
// inside (see above). A cmpxchg loop: other CPUs may change the word
// between the load and the exchange.
type TimerExit struct{ Word uint64 }

func (t TimerExit) Needs() Needs {
	return Needs{Fixed: RAX.Bit() | RCX.Bit() | RDX.Bit(), Flags: true}
}
func (t TimerExit) String() string { return fmt.Sprintf("timer exit %#x", t.Word) }

// Lengths inside TimerExit's loop, for its two short branches.
const (
	lenTestAX   = 3 // test %ax,%ax
	lenJcc8     = 2
	lenLeaRAXRC = 4 // lea (%rax,%rcx),%rdx
	lenCmpxchg  = 9 // lock cmpxchg %rdx,disp32(%rip)
)

func (t TimerExit) Emit(a *Asm, _ []Reg) {
	tscShift16(a)
	a.Raw(0x48, 0x8d, 0x48, 0xff) // lea -1(%rax),%rcx
	a.MovqLoad(RAX, t.Word)
	a.Raw(0x66, 0x85, 0xc0)                                                 // loop: test %ax,%ax
	a.Raw(0x74, lenLeaRAXRC+lenCmpxchg+lenJcc8)                             // je done: nobody inside
	a.Raw(0x48, 0x8d, 0x14, 0x08)                                           // lea (%rax,%rcx),%rdx
	a.ripOp([]byte{0xf0, 0x48}, []byte{0x0f, 0xb1}, byte(RDX), t.Word, nil) // lock cmpxchg %rdx,W(%rip)
	a.Raw(0x75, 0x100-(lenTestAX+lenJcc8+lenLeaRAXRC+lenCmpxchg+lenJcc8))   // jne loop
	// done:
}

// step is one expected instruction of a snippet, for Check.
type step struct {
	op   x86asm.Op
	word bool // its memory operand is the snippet's word, RIP-relative
	lock bool
	args []x86asm.Arg // expected operands; for a word access, the register one
}

var tscSteps = []step{
	{op: x86asm.RDTSC},
	{op: x86asm.SHL, args: []x86asm.Arg{x86asm.RDX, x86asm.Imm(32)}},
	{op: x86asm.OR, args: []x86asm.Arg{x86asm.RAX, x86asm.RDX}},
	{op: x86asm.SHL, args: []x86asm.Arg{x86asm.RAX, x86asm.Imm(16)}},
}

// Check decodes the snippet back.
func (t TimerEnter) Check(code []byte, at uint64) error {
	return checkSteps(code, at, t.Word, append(append([]step{}, tscSteps...),
		step{op: x86asm.NEG, args: []x86asm.Arg{x86asm.RAX}},
		step{op: x86asm.INC, args: []x86asm.Arg{x86asm.RAX}},
		step{op: x86asm.ADD, word: true, lock: true, args: []x86asm.Arg{x86asm.RAX}}), nil)
}

// Check decodes the snippet back, including where its two branches go.
func (t TimerExit) Check(code []byte, at uint64) error {
	steps := append(append([]step{}, tscSteps...),
		step{op: x86asm.LEA, args: []x86asm.Arg{x86asm.RCX, x86asm.Mem{Base: x86asm.RAX, Disp: -1}}},
		step{op: x86asm.MOV, word: true, args: []x86asm.Arg{x86asm.RAX}},
		step{op: x86asm.TEST, args: []x86asm.Arg{x86asm.AX, x86asm.AX}}, // loop
		step{op: x86asm.JE},
		step{op: x86asm.LEA, args: []x86asm.Arg{x86asm.RDX, x86asm.Mem{Base: x86asm.RAX, Scale: 1, Index: x86asm.RCX}}},
		step{op: x86asm.CMPXCHG, word: true, lock: true, args: []x86asm.Arg{x86asm.RDX}},
		step{op: x86asm.JNE})
	// Branch targets, as step indexes: je → the end, jne → the test.
	return checkSteps(code, at, t.Word, steps, map[int]int{7: len(steps), 10: 6})
}

// checkSteps decodes code and compares it with steps; branches maps the
// index of each branch step to the index of the step it must reach
// (len(steps): the end).
func checkSteps(code []byte, at, word uint64, steps []step, branches map[int]int) error {
	r := &reader{code: code, base: at}
	offs := make([]int, len(steps)+1)
	rels := map[int]int{}
	for i, s := range steps {
		offs[i] = r.off
		inst, _, err := r.decode(15)
		if err != nil {
			return err
		}
		text := gnu(inst, r.pc())
		if inst.Op != s.op {
			return r.fail("%q where %v was expected", text, s.op)
		}
		if s.lock != hasLock(inst) {
			return r.fail("%q: lock prefix wrong", text)
		}
		if s.word {
			m, ok := memArg(inst)
			if !ok || m.Base != x86asm.RIP || m.Segment != 0 || inst.MemBytes != 8 ||
				r.pc()+uint64(inst.Len)+uint64(int64(int32(m.Disp))) != word {
				return r.fail("%q does not address the 8-byte word %#x", text, word)
			}
			if reg, ok := regArg(inst); !ok || len(s.args) != 1 || reg != s.args[0] {
				return r.fail("%q: register operand is not %v", text, s.args)
			}
		} else {
			for j, want := range s.args {
				if inst.Args[j] != want {
					return r.fail("%q: operand %d is not %v", text, j, want)
				}
			}
			if len(s.args) > 0 && inst.DataSize != 64 && inst.Op != x86asm.TEST {
				return r.fail("%q: not a 64-bit operation", text)
			}
		}
		if rel, ok := inst.Args[0].(x86asm.Rel); ok {
			rels[i] = r.off + inst.Len + int(rel)
		}
		r.off += inst.Len
	}
	offs[len(steps)] = r.off
	for i, to := range branches {
		if got, ok := rels[i]; !ok || got != offs[to] {
			return &VerifyError{Offset: offs[i], Reason: fmt.Sprintf("branch goes to +%#x, want +%#x", got, offs[to])}
		}
	}
	return r.end()
}

func memArg(inst x86asm.Inst) (x86asm.Mem, bool) {
	for _, a := range inst.Args {
		if m, ok := a.(x86asm.Mem); ok {
			return m, true
		}
	}
	return x86asm.Mem{}, false
}

func regArg(inst x86asm.Inst) (x86asm.Reg, bool) {
	for _, a := range inst.Args {
		if r, ok := a.(x86asm.Reg); ok {
			return r, true
		}
	}
	return 0, false
}

func hasLock(inst x86asm.Inst) bool {
	for _, p := range inst.Prefix {
		if p == 0 {
			break
		}
		if p&0xff == x86asm.PrefixLOCK {
			return true
		}
	}
	return false
}

// TaskComm holds when the current task's command name (task_struct.comm,
// TASK_COMM_LEN bytes, NUL-padded by the kernel's strscpy_pad) equals Comm:
// two 8-byte compares. Names longer than 15 bytes are truncated by the
// kernel; give the truncated name.
type TaskComm struct {
	CurrentTask int32 // per-CPU offset of current_task (%gs-relative)
	Offset      int32 // offset of comm in task_struct
	Comm        [TaskCommLen]byte
}

// TaskCommLen is TASK_COMM_LEN.
const TaskCommLen = 16

func (p TaskComm) Needs() Needs { return Needs{Regs: 2, Flags: true} }

func (p TaskComm) EmitSkip(a *Asm, scratch []Reg) []Label {
	task, v := scratch[0], scratch[1]
	a.MovqGS(task, p.CurrentTask)
	var skips []Label
	for half := 0; half < 2; half++ {
		a.Raw(rexW(0, v), 0xb8+byte(v)&7) // movabs $imm64,%v
		a.Raw(p.Comm[8*half : 8*half+8]...)
		a.Raw(rexW(v, task), 0x39) // cmp %v,disp(%task)
		a.memOp(byte(v), task, p.Offset+int32(8*half))
		skips = append(skips, a.JccForward(CondNE))
	}
	return skips
}

// Seq runs snippets one after the other: several primitives of one
// request at one point (a counter and a timer entry, say).
type Seq []Snippet

func (q Seq) Needs() Needs {
	var n Needs
	for _, s := range q {
		n = n.union(s.Needs())
	}
	return n
}

func (q Seq) Emit(a *Asm, scratch []Reg) {
	for _, s := range q {
		s.Emit(a, scratch[:s.Needs().Regs])
	}
}

// RegEquals holds when a register equals Value at the point: at a
// function's entry, a predicate on an argument (the lock a task waits
// for, in %rdi). Reg is reserved (Fixed) so that it is never handed out
// as a scratch register and overwritten before the compare.
type RegEquals struct {
	Reg   Reg
	Value uint64
}

func (p RegEquals) Needs() Needs { return Needs{Regs: 1, Fixed: p.Reg.Bit(), Flags: true} }

func (p RegEquals) EmitSkip(a *Asm, scratch []Reg) []Label {
	v := scratch[0]
	a.Raw(rexW(0, v), 0xb8+byte(v)&7) // movabs $Value,%v
	a.code = binary.LittleEndian.AppendUint64(a.code, p.Value)
	a.Raw(rexW(v, p.Reg), 0x39, 0xc0|byte(v)&7<<3|byte(p.Reg)&7) // cmp %v,%reg
	return []Label{a.JccForward(CondNE)}
}
