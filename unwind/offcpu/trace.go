package offcpu

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/kinst/kinst/kernel"
	"golang.org/x/sys/unix"
)

// TraceOptions add the tracer's own limits to Options.
type TraceOptions struct {
	Options
	MinBlock time.Duration // ignore blocks shorter than this
	MaxBlock time.Duration // ignore blocks longer than this; 0 for no limit
	// StackEntries sizes the BPF stack-trace map (distinct stacks).
	StackEntries uint32
	// ForceRawTracepoint skips the tp_btf attempt (for tests of the
	// fallback).
	ForceRawTracepoint bool
}

// Tracer measures off-CPU time at every context switch with BPF: at a
// thread's switch-out it records the time, its kernel and user stack ids
// (BPF stack-trace maps), its state and name, keyed by thread id; at its
// next switch-in it adds the elapsed time to a hash map keyed by (process,
// thread, stacks, state, name). Nothing crosses to user space per event.
//
// It attaches to sched_switch as tp_btf (Linux 5.5+, BTF) and falls back
// to a raw tracepoint; both need the four-argument sched_switch of Linux
// 5.18+ (prev_state). User stacks come from bpf_get_stackid, which walks
// frame pointers: code built without them shows one or two user frames.
type Tracer struct {
	opts   TraceOptions
	start  time.Time
	maps   *traceMaps
	link   link.Link
	Attach string // "tp_btf" or "raw_tracepoint"
	// complete, if set, completes cut user stacks (CompleteFrom).
	complete *Sampler
}

type traceMaps struct {
	starts, counts, stacks *ebpf.Map
}

func (m *traceMaps) close() {
	for _, x := range []*ebpf.Map{m.starts, m.counts, m.stacks} {
		if x != nil {
			x.Close()
		}
	}
}

func newTraceMaps(stackEntries uint32) (*traceMaps, error) {
	m := &traceMaps{}
	var err error
	if m.starts, err = ebpf.NewMap(&ebpf.MapSpec{Name: "offcpu_start", Type: ebpf.LRUHash, KeySize: 4, ValueSize: startSize, MaxEntries: 65536}); err == nil {
		if m.counts, err = ebpf.NewMap(&ebpf.MapSpec{Name: "offcpu_counts", Type: ebpf.Hash, KeySize: keySize, ValueSize: valueSize, MaxEntries: 65536}); err == nil {
			m.stacks, err = ebpf.NewMap(&ebpf.MapSpec{Name: "offcpu_stacks", Type: ebpf.StackTrace, KeySize: 4, ValueSize: 8 * maxStackDepth, MaxEntries: stackEntries})
		}
	}
	if err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

// ErrBPFUnavailable is matched when the kernel or the caller's privileges
// do not allow the tracer's BPF program.
var ErrBPFUnavailable = errors.New("BPF tracing unavailable")

// The BPF maps' layouts, shared with the program below.
const (
	startSize = 40 // u64 ts; u32 tgid; s32 kstack; s32 ustack; u32 state; char comm[16]
	keySize   = 40 // u32 tgid; u32 pid; s32 kstack; s32 ustack; u32 state; u32 pad; char comm[16]
	valueSize = 16 // u64 ns; u64 blocks

	// state word: prev_state with bit 31 set when the switch was a preemption.
	preemptBit = 1 << 31

	taskDead      = 0x80   // TASK_DEAD in prev_state
	bpfFUserStack = 1 << 8 // BPF_F_USER_STACK
	maxStackDepth = 127    // PERF_MAX_STACK_DEPTH
)

// NewTracer loads and attaches the BPF program. Close detaches it.
func NewTracer(o TraceOptions) (*Tracer, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.MaxBlock > 0 && o.MaxBlock < o.MinBlock {
		return nil, errors.New("max-block is shorter than min-block")
	}
	if o.MinBlock < 0 || o.MaxBlock < 0 {
		return nil, errors.New("min-block and max-block must not be negative")
	}
	if err := o.resolve(); err != nil {
		return nil, err
	}
	if o.StackEntries == 0 {
		o.StackEntries = 16384
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: raising RLIMIT_MEMLOCK: %v (tracing needs root)", ErrBPFUnavailable, err)
	}
	kspec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("%w: kernel BTF: %v", ErrBPFUnavailable, err)
	}
	var task taskLayout
	if task.pid, err = memberOffset(kspec, "task_struct", "pid"); err == nil {
		task.flags, err = memberOffset(kspec, "task_struct", "flags")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBPFUnavailable, err)
	}
	if err := checkSchedSwitch(kspec); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBPFUnavailable, err)
	}
	m, err := newTraceMaps(o.StackEntries)
	if err != nil {
		return nil, fmt.Errorf("%w: creating maps: %v", ErrBPFUnavailable, err)
	}
	t := &Tracer{opts: o, maps: m}
	var errs []error
	if !o.ForceRawTracepoint {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "offcpu_switch", Type: ebpf.Tracing, AttachType: ebpf.AttachTraceRawTp,
			AttachTo: "sched_switch", License: "GPL", Instructions: switchProgram(o, m, task, true)})
		if err == nil {
			t.link, err = link.AttachTracing(link.TracingOptions{Program: prog})
			prog.Close() // the link holds it
			t.Attach = "tp_btf"
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tp_btf/sched_switch: %w", err))
		}
	}
	if t.link == nil {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "offcpu_switch", Type: ebpf.RawTracepoint,
			License: "GPL", Instructions: switchProgram(o, m, task, false)})
		if err == nil {
			t.link, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sched_switch", Program: prog})
			prog.Close()
			t.Attach = "raw_tracepoint"
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("raw_tracepoint/sched_switch: %w", err))
			m.close()
			return nil, fmt.Errorf("%w: %v", ErrBPFUnavailable, errors.Join(errs...))
		}
	}
	t.start = time.Now()
	return t, nil
}

func memberOffset(spec *btf.Spec, typ, member string) (int16, error) {
	var s *btf.Struct
	if err := spec.TypeByName(typ, &s); err != nil {
		return 0, fmt.Errorf("BTF: %s: %v", typ, err)
	}
	for _, m := range s.Members {
		if m.Name == member {
			return int16(m.Offset.Bytes()), nil
		}
	}
	return 0, fmt.Errorf("BTF: %s has no member %s", typ, member)
}

// checkSchedSwitch insists on sched_switch(preempt, prev, next, prev_state).
func checkSchedSwitch(spec *btf.Spec) error {
	var td *btf.Typedef
	if err := spec.TypeByName("btf_trace_sched_switch", &td); err != nil {
		return fmt.Errorf("BTF: btf_trace_sched_switch: %v", err)
	}
	ptr, ok := td.Type.(*btf.Pointer)
	if !ok {
		return errors.New("BTF: btf_trace_sched_switch is not a function pointer")
	}
	proto, ok := ptr.Target.(*btf.FuncProto)
	if !ok || len(proto.Params) != 5 { // void *__data first
		return errors.New("sched_switch lacks its prev_state argument (needs Linux 5.18 or later)")
	}
	return nil
}

// switchProgram is the sched_switch handler. ctx holds the tracepoint's
// arguments as u64s: preempt, prev, next, prev_state. In sched_switch the
// current task is still prev. direct says whether task_struct pointers may
// be dereferenced directly (tp_btf) or need bpf_probe_read_kernel.
//
// Stack frame (offsets from R10): start value at -80, tid key at -84,
// scratch u32 at -88, counts key at -40, counts value at -104.
func switchProgram(o TraceOptions, m *traceMaps, task taskLayout, direct bool) asm.Instructions {
	const (
		startV = -80
		tidK   = -84
		tmp    = -88
		countK = -40
		countV = -104
	)
	in := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		// Switch-out of prev (the current task).
		asm.FnGetCurrentPidTgid.Call(),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Mov.Reg32(asm.R1, asm.R8),
		asm.JEq.Imm(asm.R1, 0, "in"), // the idle task
	}
	if o.TID != 0 {
		in = append(in, asm.JNE.Imm(asm.R1, int32(o.TID), "in"))
	}
	if o.PID != 0 {
		in = append(in, asm.Mov.Reg(asm.R2, asm.R8), asm.RSh.Imm(asm.R2, 32), asm.JNE.Imm(asm.R2, int32(o.PID), "in"))
	}
	if !o.IncludeSelf {
		in = append(in, asm.Mov.Reg(asm.R2, asm.R8), asm.RSh.Imm(asm.R2, 32), asm.JEq.Imm(asm.R2, int32(os.Getpid()), "in"))
	}
	// A task switching out for the last time (TASK_DEAD) never comes back.
	in = append(in,
		asm.LoadMem(asm.R1, asm.R6, 24, asm.DWord),
		asm.And.Imm(asm.R1, taskDead),
		asm.JNE.Imm(asm.R1, 0, "in"))
	if o.UserThreadsOnly || o.KernelThreadsOnly {
		// prev->flags & PF_KTHREAD
		in = append(in, asm.LoadMem(asm.R7, asm.R6, 8, asm.DWord))
		in = append(in, loadTaskWord(asm.R1, asm.R7, task.flags, tmp, direct)...)
		in = append(in, asm.And.Imm(asm.R1, pfKthread))
		if o.UserThreadsOnly {
			in = append(in, asm.JNE.Imm(asm.R1, 0, "in"))
		} else {
			in = append(in, asm.JEq.Imm(asm.R1, 0, "in"))
		}
	}
	in = append(in,
		asm.Mov.Reg32(asm.R1, asm.R8),
		asm.StoreMem(asm.RFP, tidK, asm.R1, asm.Word),
		asm.Mov.Reg(asm.R2, asm.R8), asm.RSh.Imm(asm.R2, 32),
		asm.StoreMem(asm.RFP, startV+8, asm.R2, asm.Word),
		asm.StoreImm(asm.RFP, startV+12, -1, asm.Word),
		asm.StoreImm(asm.RFP, startV+16, -1, asm.Word),
	)
	if !o.UserOnly {
		in = append(in,
			asm.Mov.Reg(asm.R1, asm.R6), asm.LoadMapPtr(asm.R2, m.stacks.FD()), asm.Mov.Imm(asm.R3, 0),
			asm.FnGetStackid.Call(),
			asm.StoreMem(asm.RFP, startV+12, asm.R0, asm.Word))
	}
	if !o.KernelOnly {
		in = append(in,
			asm.Mov.Reg(asm.R1, asm.R6), asm.LoadMapPtr(asm.R2, m.stacks.FD()), asm.Mov.Imm(asm.R3, bpfFUserStack),
			asm.FnGetStackid.Call(),
			asm.StoreMem(asm.RFP, startV+16, asm.R0, asm.Word))
	}
	in = append(in,
		// state word = prev_state | preempt<<31
		asm.LoadMem(asm.R1, asm.R6, 24, asm.DWord),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.DWord),
		asm.And.Imm(asm.R2, 1),
		asm.LSh.Imm(asm.R2, 31),
		asm.Or.Reg(asm.R1, asm.R2),
		asm.StoreMem(asm.RFP, startV+20, asm.R1, asm.Word),
		asm.Mov.Reg(asm.R1, asm.RFP), asm.Add.Imm(asm.R1, startV+24), asm.Mov.Imm(asm.R2, 16),
		asm.FnGetCurrentComm.Call(),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, startV, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, m.starts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP), asm.Add.Imm(asm.R2, tidK),
		asm.Mov.Reg(asm.R3, asm.RFP), asm.Add.Imm(asm.R3, startV),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),

		// Switch-in of next: was it switched out before?
		asm.LoadMem(asm.R7, asm.R6, 16, asm.DWord).WithSymbol("in"),
	)
	in = append(in, loadTaskWord(asm.R1, asm.R7, task.pid, tmp, direct)...)
	in = append(in,
		asm.StoreMem(asm.RFP, tidK, asm.R1, asm.Word),
		asm.LoadMapPtr(asm.R1, m.starts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP), asm.Add.Imm(asm.R2, tidK),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.FnKtimeGetNs.Call(),
		asm.LoadMem(asm.R1, asm.R9, 0, asm.DWord),
		asm.Sub.Reg(asm.R0, asm.R1),
		asm.Mov.Reg(asm.R8, asm.R0), // R8 = blocked ns
		// counts key from the start record
		asm.LoadMem(asm.R1, asm.R9, 8, asm.Word), asm.StoreMem(asm.RFP, countK, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.RFP, tidK, asm.Word), asm.StoreMem(asm.RFP, countK+4, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R9, 12, asm.Word), asm.StoreMem(asm.RFP, countK+8, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R9, 16, asm.Word), asm.StoreMem(asm.RFP, countK+12, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R9, 20, asm.Word), asm.StoreMem(asm.RFP, countK+16, asm.R1, asm.Word),
		asm.StoreImm(asm.RFP, countK+20, 0, asm.Word),
		asm.LoadMem(asm.R1, asm.R9, 24, asm.DWord), asm.StoreMem(asm.RFP, countK+24, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R9, 32, asm.DWord), asm.StoreMem(asm.RFP, countK+32, asm.R1, asm.DWord),
		asm.LoadMapPtr(asm.R1, m.starts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP), asm.Add.Imm(asm.R2, tidK),
		asm.FnMapDeleteElem.Call(),
	)
	if o.MinBlock > 0 {
		in = append(in, asm.LoadImm(asm.R1, int64(o.MinBlock), asm.DWord), asm.JLT.Reg(asm.R8, asm.R1, "out"))
	}
	if o.MaxBlock > 0 {
		in = append(in, asm.LoadImm(asm.R1, int64(o.MaxBlock), asm.DWord), asm.JGT.Reg(asm.R8, asm.R1, "out"))
	}
	in = append(in,
		asm.LoadMapPtr(asm.R1, m.counts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP), asm.Add.Imm(asm.R2, countK),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "new"),
		asm.StoreXAdd(asm.R0, asm.R8, asm.DWord),
		asm.Mov.Imm(asm.R1, 1),
		asm.Add.Imm(asm.R0, 8),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Ja.Label("out"),
		asm.StoreMem(asm.RFP, countV, asm.R8, asm.DWord).WithSymbol("new"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreMem(asm.RFP, countV+8, asm.R1, asm.DWord),
		asm.LoadMapPtr(asm.R1, m.counts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP), asm.Add.Imm(asm.R2, countK),
		asm.Mov.Reg(asm.R3, asm.RFP), asm.Add.Imm(asm.R3, countV),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
	return in
}

// taskLayout holds offsets into struct task_struct, from the kernel's BTF.
type taskLayout struct{ pid, flags int16 }

// loadTaskWord loads the u32 at task+off into dst: directly where the
// verifier knows task's BTF type (tp_btf), else with
// bpf_probe_read_kernel through the stack slot at R10+scratch (which
// clobbers R1–R5; a failed read yields 0).
func loadTaskWord(dst, task asm.Register, off int16, scratch int16, direct bool) asm.Instructions {
	if direct {
		return asm.Instructions{asm.LoadMem(dst, task, off, asm.Word)}
	}
	return asm.Instructions{
		asm.StoreImm(asm.RFP, scratch, 0, asm.Word),
		asm.Mov.Reg(asm.R1, asm.RFP), asm.Add.Imm(asm.R1, int32(scratch)), asm.Mov.Imm(asm.R2, 4),
		asm.Mov.Reg(asm.R3, task), asm.Add.Imm(asm.R3, int32(off)),
		asm.FnProbeReadKernel.Call(),
		asm.LoadMem(dst, asm.RFP, scratch, asm.Word),
	}
}

// Close detaches the program and frees the maps.
func (t *Tracer) Close() error {
	var err error
	if t.link != nil {
		err = t.link.Close()
		t.link = nil
	}
	if t.maps != nil {
		t.maps.close()
		t.maps = nil
	}
	return err
}

// Wait returns when ctx is done or duration (if positive) has passed.
func (t *Tracer) Wait(ctx context.Context, duration time.Duration) {
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	<-ctx.Done()
}

// stateLetter maps the state word to /proc's letters (the kernel's
// task_state_to_char for the states a switched-out task can be in).
func stateLetter(w uint32) string {
	if w&preemptBit != 0 {
		return "R"
	}
	const (
		interruptible   = 0x1
		uninterruptible = 0x2
		stopped         = 0x4
		traced          = 0x8
		parked          = 0x40
		dead            = taskDead
		noload          = 0x400
	)
	switch {
	case w&(uninterruptible|noload) == uninterruptible|noload:
		return "I"
	case w&uninterruptible != 0:
		return "D"
	case w&interruptible != 0:
		return "S"
	case w&stopped != 0:
		return "T"
	case w&traced != 0:
		return "t"
	case w&parked != 0:
		return "P"
	case w&dead != 0:
		return "X"
	case w == 0:
		return "R"
	}
	return "?"
}

// Profile reads the kernel's aggregation and symbolises it: kernel
// addresses with kallsyms, user addresses with the process's mappings
// (a process that has exited by now keeps hex addresses). Threads still
// blocked now count up to now; threads that have not been switched out
// since the tracer started are not seen at all.
func (t *Tracer) Profile() (*Profile, error) {
	p := &Profile{Mode: "trace", Start: t.start, Duration: time.Since(t.start)}
	agg, err := t.collect()
	if err != nil {
		return nil, err
	}
	ksyms, kerr := kallsyms()
	user := newUserStacks()
	kcache := map[int32][]string{}
	stack := make([]uint64, maxStackDepth)
	for key, val := range agg {
		k := parseKey(key)
		tgid, pid, kid, uid, comm := k.tgid, k.pid, k.kstack, k.ustack, k.comm
		state := stateLetter(k.state)
		if t.opts.States != "" && !t.opts.States.Has(state[0]) {
			continue
		}
		s := Stack{State: state, OffCPU: time.Duration(val[0]), Samples: int64(val[1])}
		s.Group, s.PID, s.TID = t.opts.Group.label(procName(tgid, comm), comm, tgid, pid)
		if !t.opts.UserOnly {
			if kid < 0 {
				p.Lost += s.Samples
			} else if names, ok := kcache[kid]; ok {
				s.Kernel = names
			} else {
				for i, a := range t.readStack(kid, stack) {
					s.Kernel = append(s.Kernel, kernelName(ksyms, kerr, callerPC(i, a)))
				}
				s.Kernel = trimTracing(s.Kernel)
				kcache[kid] = s.Kernel
			}
			s.Wchan = firstNonSched(s.Kernel)
		}
		if !t.opts.KernelOnly && uid >= 0 {
			s.User = user.framePointerNames(tgid, t.readStack(uid, stack))
			t.finishUser(p, &s, pid)
		}
		p.Stacks = append(p.Stacks, s)
	}
	p.Stacks = merge(p.Stacks)
	slices.SortFunc(p.Stacks, func(a, b Stack) int { return cmp.Compare(b.OffCPU, a.OffCPU) })
	p.DebugNotes = user.debugNotes()
	return p, nil
}

// traceKey is a key of the counts map, decoded.
type traceKey struct {
	tgid, pid      int
	kstack, ustack int32 // stack ids, < 0 when the stack was not taken
	state          uint32
	comm           string
}

// parseKey decodes a key of the counts map: u32 tgid; u32 pid; s32
// kstack; s32 ustack; u32 state; u32 pad; char comm[16]. The comm is a C
// string: what follows its NUL is not part of the name (the kernel does
// not always clear it).
func parseKey(key [keySize]byte) traceKey {
	comm := key[24:40]
	if i := bytes.IndexByte(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	return traceKey{
		tgid:   int(binary.LittleEndian.Uint32(key[0:])),
		pid:    int(binary.LittleEndian.Uint32(key[4:])),
		kstack: int32(binary.LittleEndian.Uint32(key[8:])),
		ustack: int32(binary.LittleEndian.Uint32(key[12:])),
		state:  binary.LittleEndian.Uint32(key[16:]),
		comm:   string(comm),
	}
}

// collect reads the finished blocks and adds the ones in progress, with
// the same limits the BPF program applies. With a maximum, blocks in
// progress are left out: how long they will last is not known yet.
func (t *Tracer) collect() (map[[keySize]byte][2]uint64, error) {
	agg := map[[keySize]byte][2]uint64{}
	var key [keySize]byte
	var val [valueSize]byte
	it := t.maps.counts.Iterate()
	for it.Next(&key, &val) {
		agg[key] = [2]uint64{binary.LittleEndian.Uint64(val[0:]), binary.LittleEndian.Uint64(val[8:])}
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	if t.opts.MaxBlock > 0 {
		return agg, nil
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil { // bpf_ktime_get_ns's clock
		return nil, err
	}
	now := uint64(ts.Nano())
	var tid uint32
	var start [startSize]byte
	it = t.maps.starts.Iterate()
	for it.Next(&tid, &start) {
		began := binary.LittleEndian.Uint64(start[0:])
		if began > now {
			continue
		}
		d := now - began
		if d < uint64(t.opts.MinBlock) {
			continue
		}
		var k [keySize]byte
		copy(k[0:4], start[8:12])
		binary.LittleEndian.PutUint32(k[4:], tid)
		copy(k[8:20], start[12:24])
		copy(k[24:40], start[24:40])
		v := agg[k]
		agg[k] = [2]uint64{v[0] + d, v[1] + 1}
	}
	return agg, it.Err()
}

// trimTracing drops the frames of the tracer itself from the top of a
// BPF kernel stack: the program, the tracepoint glue and __schedule.
func trimTracing(frames []string) []string {
	for i, f := range frames {
		if f == "__schedule" {
			return frames[i+1:]
		}
		if !strings.HasPrefix(f, "bpf_") && !strings.HasPrefix(f, "__bpf_") && !strings.HasPrefix(f, "__traceiter_") {
			return frames[i:]
		}
	}
	return frames
}

// kallsyms is the running kernel's symbol table, read once per process:
// reading and indexing /proc/kallsyms costs a few hundred milliseconds.
var kallsyms = sync.OnceValues(func() (*kernel.Symbols, error) { return kernel.LoadKallsyms("/proc/kallsyms") })

func (t *Tracer) readStack(id int32, buf []uint64) []uint64 {
	if err := t.maps.stacks.Lookup(uint32(id), buf); err != nil {
		return nil
	}
	n := 0
	for n < len(buf) && buf[n] != 0 {
		n++
	}
	return buf[:n]
}

func kernelName(s *kernel.Symbols, err error, a uint64) string {
	if err == nil {
		if sym, _, ok := s.At(a); ok {
			return sym.Name
		}
	}
	return "0x" + strconv.FormatUint(a, 16)
}

// firstNonSched is what get_wchan() reports: the first frame outside the
// scheduler. The BPF stack starts inside the tracepoint and __schedule.
func firstNonSched(frames []string) string {
	for _, f := range frames {
		switch f {
		case "__schedule", "schedule", "__traceiter_sched_switch", "preempt_schedule_common",
			"schedule_timeout", "schedule_hrtimeout_range_clock", "schedule_hrtimeout_range",
			"io_schedule", "io_schedule_timeout", "schedule_preempt_disabled":
			continue
		}
		return f
	}
	return ""
}

func procName(tgid int, fallback string) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tgid) + "/comm")
	if err != nil {
		return fallback
	}
	return string(trimNL(b))
}
