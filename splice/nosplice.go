package splice

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
)

// ErrNoSplice is matched by every NoSpliceError.
var ErrNoSplice = errors.New("no-splice site")

// NoSpliceError refuses a point that must never be overwritten, with why.
type NoSpliceError struct {
	Where  string // symbolic location
	Reason string
}

func (e *NoSpliceError) Error() string {
	return fmt.Sprintf("%s is a no-splice site: %s", e.Where, e.Reason)
}

func (e *NoSpliceError) Is(target error) bool { return target == ErrNoSplice }

// int3Path lists the functions a CPU runs between hitting an int3 and our
// die notifier redirecting it: a splice there would recurse (every splice
// is an int3 while it is written). atomic_notifier_call_chain takes
// rcu_read_lock, which with preemptible RCU (Debian's PREEMPT_DYNAMIC
// kernels) calls __rcu_read_lock and __rcu_read_unlock out of line; a
// coverage session over a system call's callees reached them, and the
// recursion overflowed the NMI nesting count (BUG in irqentry_nmi_enter).
// do_int3 asks kgdb and kprobes first (kgdb_ll_trap, get_kprobe).
var int3Path = map[string]bool{
	"exc_int3": true, "do_int3": true, "do_int3_user": true, "poke_int3_handler": true,
	"notify_die": true, "atomic_notifier_call_chain": true, "notifier_call_chain": true,
	"kprobe_int3_handler": true, "irqentry_nmi_enter": true, "irqentry_nmi_exit": true,
	"sync_core": true, "text_poke_bp_batch": true,
	"__rcu_read_lock": true, "__rcu_read_unlock": true, "rcu_read_unlock_special": true,
	"kgdb_ll_trap": true, "get_kprobe": true,
}

// stopPath lists the functions a CPU runs while the driver has it parked
// in stop_machine to write a splice's first byte: a splice there could
// leave that CPU unable to leave.
var stopPath = map[string]bool{
	"multi_cpu_stop": true, "stop_machine_yield": true, "cpu_stopper_thread": true,
	"touch_nmi_watchdog": true, "rcu_momentary_dyntick_idle": true, "ack_state": true, "set_state": true,
	"stop_machine": true, "stop_machine_cpuslocked": true, "smpboot_thread_fn": true,
}

// noinstrSections are [start, end) marker symbol pairs of text the kernel
// runs with instrumentation forbidden (entry code, noinstr functions).
var noinstrSections = [][2]string{
	{"__entry_text_start", "__entry_text_end"},
	{"__noinstr_text_start", "__noinstr_text_end"},
	{"__irqentry_text_start", "__irqentry_text_end"},
	{"__kprobes_text_start", "__kprobes_text_end"},
	// the retpoline and return thunks and what they call
	{"__indirect_thunk_start", "__indirect_thunk_end"},
}

// textBounds is [_stext, _etext), when kallsyms has both.
func textBounds(s *kernel.Symbols) (lo, hi uint64, ok bool) {
	lo, ok1 := s.Address("_stext")
	hi, ok2 := s.Address("_etext")
	return lo, hi, ok1 && ok2 && lo < hi
}

// isMitigation reports the helpers the return thunks call (SRSO's and
// retbleed's), which may lie outside the thunk section.
func isMitigation(name string) bool {
	return strings.HasSuffix(name, "_untrain_ret") || strings.HasSuffix(name, "_safe_ret")
}

// IsFtraceSite reports whether instruction i of f is an ftrace site: from
// ftrace's records when they were read, otherwise from the shape of the
// function's first instruction (cfg.Function.IsFtraceSite). o may be nil.
func IsFtraceSite(o *kernel.OwnedSites, f *cfg.Function, i int) bool {
	if o.HasFtraceRecords() {
		return i >= 0 && i < len(f.Insns) && o.Ftrace(f.Insns[i].Addr)
	}
	return f.IsFtraceSite(i)
}

// DieNotifiers is the set of functions on the kernel's die chain, by
// start address (kernel.Program.DieNotifiers).
type DieNotifiers map[uint64]bool

// NewDieNotifiers is the set of dn's functions.
func NewDieNotifiers(dn []kernel.DieNotifier) DieNotifiers {
	s := DieNotifiers{}
	for _, n := range dn {
		s[n.Func] = true
	}
	return s
}

// functionNoSplice is FunctionNoSplice with k's lists.
func (k *Facts) functionNoSplice(f *cfg.Function) string {
	return FunctionNoSplice(k.Symbols, f, DriverModule, k.Unprobeable, k.DieNotifiers)
}

// FunctionNoSplice returns why no instruction of f may be spliced, or "".
// bl is the kernel's kprobe blacklist and die the functions on its die
// chain (nil: not read).
//
// The die chain is a rule of its own because the kprobe blacklist misses
// it: notify_die calls every notifier for each kernel int3, and those
// registered before kinst's at the same priority (hw_breakpoint's and
// kprobes', both INT_MAX) run before kinst's redirect. A splice in one is
// an int3 while it is written, and a trap splice for good: any other int3
// of kinst's hit meanwhile calls the notifier, which hits its int3, which
// calls it again, until the NMI nesting count overflows; the BUG that
// raises recurses through report_bug into the same int3 until the stack
// overflows, and the double fault then loops on its own stack. 6.1's
// hw_breakpoint_exceptions_notify is not NOKPROBE_SYMBOL (kprobes handle
// their int3 before notify_die, so the kernel never needed it to be).
func FunctionNoSplice(s *kernel.Symbols, f *cfg.Function, driverModule string, bl kernel.KprobeBlacklist, die DieNotifiers) string {
	switch {
	case f.Module != "" && f.Module == driverModule:
		return "kinst's own driver text"
	case bl[f.Addr]:
		return "the kernel forbids probes here (kprobes blacklist: NOKPROBE_SYMBOL or a section that must not be probed)"
	case die[f.Addr]:
		return "a die notifier: notify_die calls it for every int3, before kinst's redirect, so a splice there recurses"
	case int3Path[f.Name]:
		return "on the int3 / die-notifier path that splices rely on"
	case stopPath[f.Name]:
		return "run by CPUs parked in stop_machine while the driver writes a splice"
	case cfg.IsIndirectThunk(f.Name) || cfg.IsReturnThunk(f.Name) || isMitigation(f.Name):
		// The die notifier is called indirectly, through the thunk.
		return "a retpoline or return thunk: every indirect call or return runs it, the int3 path's included"
	}
	if lo, hi, ok := textBounds(s); f.Module == "" && ok && (f.Addr < lo || f.Addr >= hi) {
		// _etext itself, and what lies past it (init text the kernel
		// freed, alternatives it only copies from), is typed as text in
		// kallsyms but not run in place: its pages need not be
		// executable (the driver refuses them).
		return "outside the kernel's text (_stext…_etext): a section marker, or code the kernel frees or only copies"
	}
	for _, sec := range noinstrSections {
		if f.Module == "" && s.InRange(f.Addr, sec[0], sec[1]) {
			return fmt.Sprintf("inside %s…%s (code that must not be instrumented)", sec[0], sec[1])
		}
	}
	return ""
}

// ProcessNoSplice returns why instruction i of a process's function must
// not be spliced, or "". A process has no ftrace and no kernel tables;
// what is left is the landing pad, kept because indirect branches land on
// it (a user-space IBT would fault on anything else there), and an int3
// already in the text.
func ProcessNoSplice(f *cfg.Function, i int) string {
	switch {
	case i == 0 && f.HasLandingPad():
		return "the function's endbr64 (IBT landing pad): indirect calls land on it"
	case f.Insns[i].Bytes[0] == 0xcc:
		return "an int3 is already there (a debugger's breakpoint, a uprobe or another tool owns this byte)"
	}
	return ""
}

// GoFaultReason refuses to move an instruction of Go code that may fault
// on purpose.
const GoFaultReason = "Go code's load or store through a pointer: Go's nil checks are such accesses, which fault on purpose, and its runtime finds the function by the faulting pc (a copy of the instruction elsewhere is a pc it does not know: the program dies with \"unknown caller pc\")"

// GoMayFault reports whether the instruction reads or writes memory
// through a pointer that may be nil: an operand in memory whose base is
// not the stack (%rsp, %rbp), the pc or Go's g (%r14), or a string
// instruction's. Go compiles a nil check into such an access, and turns
// its fault into a panic by the faulting pc.
func GoMayFault(in *cfg.Instruction) bool {
	switch in.Inst.Op {
	case x86asm.LEA, x86asm.NOP, x86asm.PREFETCHNTA, x86asm.PREFETCHT0, x86asm.PREFETCHT1, x86asm.PREFETCHT2, x86asm.PREFETCHW:
		return false // no access
	case x86asm.MOVSB, x86asm.MOVSW, x86asm.MOVSD, x86asm.MOVSQ, x86asm.STOSB, x86asm.STOSW, x86asm.STOSD, x86asm.STOSQ,
		x86asm.LODSB, x86asm.LODSW, x86asm.LODSD, x86asm.LODSQ, x86asm.CMPSB, x86asm.CMPSW, x86asm.CMPSQ, x86asm.SCASB, x86asm.SCASW, x86asm.SCASQ:
		return true
	}
	for _, a := range in.Inst.Args {
		m, ok := a.(x86asm.Mem)
		if !ok {
			continue
		}
		switch {
		case m.Index != 0:
		case m.Base == x86asm.RSP, m.Base == x86asm.RBP, m.Base == x86asm.RIP, m.Base == x86asm.R14:
			continue
		case m.Base == 0 && (m.Segment == x86asm.FS || m.Segment == x86asm.GS):
			continue // thread-local: Go's g where it is not in %r14
		}
		return true
	}
	return false
}

// instructionNoSplice is InstructionNoSplice or ProcessNoSplice, as k's
// text is the kernel's or a process's; in a process's Go code, what
// GoMayFault finds too.
func (k *Facts) instructionNoSplice(f *cfg.Function, i int) string {
	if k.Process {
		if why := ProcessNoSplice(f, i); why != "" {
			return why
		}
		if k.GoModules[f.Module] && GoMayFault(&f.Insns[i]) {
			return GoFaultReason
		}
		return ""
	}
	return InstructionNoSplice(k.Owned, f, i)
}

// InstructionNoSplice returns why instruction i of f itself must not be
// spliced, or "": a site the kernel's tables name, the function's ftrace
// site, or an int3 already there. o may be nil.
func InstructionNoSplice(o *kernel.OwnedSites, f *cfg.Function, i int) string {
	in := &f.Insns[i]
	switch {
	case o.Reason(in.Addr) != "":
		return o.Reason(in.Addr)
	case i == 0 && f.HasLandingPad():
		return "the function's endbr64 (IBT landing pad) or its sealed form: indirect calls land on it and the kernel rewrites it (FineIBT, sealing)"
	case !o.HasFtraceRecords() && f.IsFtraceSite(i):
		return "the function's ftrace site (by the shape of its first instruction; ftrace's records were not read): ftrace owns these 5 bytes"
	case in.Bytes[0] == 0xcc:
		return "an int3 is already there (a kprobe or another tool owns this byte)"
	}
	return ""
}
