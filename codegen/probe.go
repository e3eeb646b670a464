package codegen

import (
	"encoding/binary"
	"fmt"
)

// Metric primitives (KernInst §4): what a patch runs before the relocated
// instruction. A Probe is a list of Actions on counter-heap words,
// optionally under a Guard on the current task. Every register a probe
// uses is pushed and popped around it, and RFLAGS too when the site's
// flags are live, so a probe can be placed at any spliceable instruction
// without liveness information about general registers.
//
// The time primitives need no per-thread storage. Each timer is ONE
// 64-bit word W updated by a single locked instruction, holding
//
//	W = S·2^16 + c      (mod 2^64)
//
// where c (low 16 bits) is the number of threads inside the timed region
// and S (high 48 bits) is Σ exit TSC − Σ entry TSC over the threads that
// entered (mod 2^48). At any time t the region's integral of c over time
// — total thread-time inside, i.e. the sum of every call's wall time,
// finished or not — is S + c·t. Entry adds 1 − t·2^16, exit adds
// t·2^16 − 1; because both fields change in the same locked add, a reader
// never sees one without the other and the integral is exact under any
// interleaving of CPUs and preemption. Recursion is counted per level,
// like concurrency. 48 bits of TSC wrap after days at GHz rates; readers
// only take differences over one sampling interval (metrics.Timer).
//
// Exits are clamped: an exit that finds c = 0 changes nothing, so a
// thread that entered before the probe was attached and leaves after
// cannot drive the count negative (it would add −t per unmatched exit,
// an error that grows forever). If such a thread leaves while another is
// inside, it ends that thread's interval early: a bounded error that
// only exists until the threads present at attach time have left.

// ActionKind is what an Action does to its word.
type ActionKind int

const (
	// ActCount adds one to the word (lock incq): calls.
	ActCount ActionKind = iota
	// ActEnter adds 1 − tsc·2^16 (one lock add): a thread enters.
	ActEnter
	// ActExit adds tsc·2^16 − 1 unless the low 16 bits are zero (a
	// cmpxchg loop): a thread leaves.
	ActExit
)

func (k ActionKind) String() string {
	switch k {
	case ActCount:
		return "count"
	case ActEnter:
		return "enter"
	case ActExit:
		return "exit"
	}
	return fmt.Sprintf("action(%d)", int(k))
}

// Action is one primitive on the counter-heap word at Word (a kernel
// address, 8-byte aligned, within rel32 reach of the patch).
type Action struct {
	Kind ActionKind
	Word uint64
}

// GuardField is the task_struct field a Guard compares.
type GuardField int

const (
	GuardTGID GuardField = iota // process id (task->tgid)
	GuardPID                    // thread id (task->pid)
	GuardComm                   // command name (task->comm, 16 bytes, NUL-padded)
)

func (f GuardField) String() string {
	switch f {
	case GuardTGID:
		return "tgid"
	case GuardPID:
		return "pid"
	case GuardComm:
		return "comm"
	}
	return fmt.Sprintf("field(%d)", int(f))
}

// TaskCommLen is TASK_COMM_LEN.
const TaskCommLen = 16

// Guard runs a probe's actions only when the current task matches. The
// offsets come from the kernel's BTF (see metrics/task), never from
// constants: task_struct's layout changes with every configuration.
type Guard struct {
	// CurrentTask is the %gs-relative offset of the per-CPU pointer to
	// the running task_struct: the per-CPU symbol current_task on 6.1,
	// pcpu_hot+offsetof(current_task) from 6.2 on.
	CurrentTask uint32
	Field       GuardField
	Offset      uint32 // of pid, tgid or comm in task_struct
	Value       uint32 // pid or tgid
	Comm        [TaskCommLen]byte
}

// Probe is the instrumentation one request places at one instruction.
type Probe struct {
	Guard   *Guard
	Actions []Action
	// SaveFlags: RFLAGS is live at the site; every action clobbers it.
	SaveFlags bool
}

// Register numbers in ModRM/opcode encodings.
const (
	rAX = 0
	rCX = 1
	rDX = 2
)

// regs returns which of RAX, RCX, RDX the probe uses, as a bit set by
// register number.
func (p *Probe) regs() uint8 {
	var r uint8
	if p.Guard != nil {
		r |= 1 << rAX
		if p.Guard.Field == GuardComm {
			r |= 1 << rDX
		}
	}
	for _, a := range p.Actions {
		switch a.Kind {
		case ActEnter:
			r |= 1<<rAX | 1<<rDX
		case ActExit:
			r |= 1<<rAX | 1<<rCX | 1<<rDX
		}
	}
	return r
}

// Append appends the probe's code to b, whose first byte is at address
// base; the code runs from there and falls through at its end. It refers
// to its words RIP-relative, so base must be where it will run.
func (p *Probe) Append(b []byte, base uint64) ([]byte, error) {
	here := func() uint64 { return base + uint64(len(b)) }
	// ripOp appends an instruction ending in a disp32 to target.
	ripOp := func(op []byte, target uint64, tail int) error {
		d, err := rel32(here()+uint64(len(op)+4+tail), target)
		if err != nil {
			return err
		}
		b = appendLE32(append(b, op...), d)
		return nil
	}
	if len(p.Actions) == 0 {
		return nil, fmt.Errorf("probe without actions")
	}
	if p.SaveFlags {
		b = append(b, opPushfq)
	}
	used := p.regs()
	for r := uint8(0); r < 8; r++ {
		if used&(1<<r) != 0 {
			b = append(b, 0x50+r) // push
		}
	}
	var skips []int // offsets of the guard's jne rel32 fields
	if g := p.Guard; g != nil {
		// mov %gs:CurrentTask,%rax
		b = append(b, 0x65, 0x48, 0x8b, 0x04, 0x25)
		b = binary.LittleEndian.AppendUint32(b, g.CurrentTask)
		switch g.Field {
		case GuardPID, GuardTGID:
			// cmpl $Value,Offset(%rax); jne end
			b = append(b, 0x81, 0xb8)
			b = binary.LittleEndian.AppendUint32(b, g.Offset)
			b = binary.LittleEndian.AppendUint32(b, g.Value)
			b = append(b, 0x0f, 0x85, 0, 0, 0, 0)
			skips = append(skips, len(b)-4)
		case GuardComm:
			for half := uint32(0); half < 2; half++ {
				// movabs $comm[8h:8h+8],%rdx; cmp %rdx,Offset+8h(%rax); jne end
				b = append(b, 0x48, 0xba)
				b = append(b, g.Comm[8*half:8*half+8]...)
				b = append(b, 0x48, 0x39, 0x90)
				b = binary.LittleEndian.AppendUint32(b, g.Offset+8*half)
				b = append(b, 0x0f, 0x85, 0, 0, 0, 0)
				skips = append(skips, len(b)-4)
			}
		default:
			return nil, fmt.Errorf("guard on unknown field %v", g.Field)
		}
	}
	for _, a := range p.Actions {
		if a.Word%8 != 0 {
			return nil, fmt.Errorf("%v word %#x is not 8-byte aligned", a.Kind, a.Word)
		}
		var err error
		switch a.Kind {
		case ActCount:
			err = ripOp(lockIncq, a.Word, 0)
		case ActEnter:
			b = append(b, tscShift16...)
			b = append(b, 0x48, 0xf7, 0xd8)                        // neg %rax
			b = append(b, 0x48, 0xff, 0xc0)                        // inc %rax
			err = ripOp([]byte{0xf0, 0x48, 0x01, 0x05}, a.Word, 0) // lock add %rax,W(%rip)
		case ActExit:
			b = append(b, tscShift16...)
			b = append(b, 0x48, 0x8d, 0x48, 0xff)                             // lea -1(%rax),%rcx
			if err = ripOp([]byte{0x48, 0x8b, 0x05}, a.Word, 0); err != nil { // mov W(%rip),%rax
				break
			}
			b = append(b, 0x66, 0x85, 0xc0)       // loop: test %ax,%ax
			b = append(b, 0x74, 4+9+2)            // je done (no thread inside: unmatched exit)
			b = append(b, 0x48, 0x8d, 0x14, 0x08) // lea (%rax,%rcx),%rdx
			// lock cmpxchg %rdx,W(%rip): on failure %rax is reloaded
			if err = ripOp([]byte{0xf0, 0x48, 0x0f, 0xb1, 0x15}, a.Word, 0); err != nil {
				break
			}
			b = append(b, 0x75, 0x100-(3+2+4+9+2)) // jne loop
		default:
			err = fmt.Errorf("unknown action %v", a.Kind)
		}
		if err != nil {
			return nil, err
		}
	}
	for _, at := range skips {
		binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-(at+4)))
	}
	for r := 7; r >= 0; r-- {
		if used&(1<<r) != 0 {
			b = append(b, 0x58+byte(r)) // pop
		}
	}
	if p.SaveFlags {
		b = append(b, opPopfq)
	}
	return b, nil
}

// tscShift16 leaves the TSC shifted left by 16 in %rax (clobbers %rdx):
// rdtsc; shl $32,%rdx; or %rdx,%rax; shl $16,%rax.
var tscShift16 = []byte{0x0f, 0x31, 0x48, 0xc1, 0xe2, 0x20, 0x48, 0x09, 0xd0, 0x48, 0xc1, 0xe0, 0x10}

// ProbePatch builds a patch placed at patchAddr: the probe's code, then
// site's instruction relocated, then the jump back (as CounterPatch).
func ProbePatch(patchAddr uint64, site Site, p *Probe) (code []byte, prefixLen int, err error) {
	in, err := analyze(site)
	if err != nil {
		return nil, 0, err
	}
	b, err := p.Append(nil, patchAddr)
	if err != nil {
		return nil, 0, err
	}
	n := len(b)
	code, err = in.relocate(b, patchAddr+uint64(n))
	return code, n, err
}
