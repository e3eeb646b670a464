package offcpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// A BPF task iterator (bpf_iter/task) gives a sampling pass what the
// /proc files give, for every task in one read: state, flags, name, the
// schedule count of schedstat, the user registers of /proc/…/syscall
// (bpf_task_pt_regs) and the kernel stack of /proc/…/stack
// (bpf_get_task_stack, the same stack_trace_save_tsk walk). Four preads
// per thread become one record in a seq_file read. Where it cannot load
// (not root, a kernel before 5.15), the sampler reads /proc.

// The record layout, written by taskIterProgram.
const (
	recTgid   = 0  // u32
	recTid    = 4  // u32
	recState  = 8  // u32 __state
	recFlags  = 12 // u32
	recPcount = 16 // u64 sched_info.pcount
	recIP     = 24 // u64 user pc
	recSP     = 32 // u64 user sp
	recNStack = 40 // s64 bytes of kernel stack, or a negative errno
	recComm   = 48 // char[16]
	recStack  = 64 // u64[maxStackDepth]
	recSize   = recStack + 8*maxStackDepth
)

type taskIter struct {
	prog    *ebpf.Program
	scratch *ebpf.Map
	it      *link.Iter
	buf     []byte
}

// noTaskIter makes samplers read /proc (tests of that path).
var noTaskIter bool

func newTaskIter(o Options) (*taskIter, error) {
	if noTaskIter {
		return nil, errors.New("task iterator turned off")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, err
	}
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, err
	}
	var offs [6]int16
	for i, m := range [][2]string{{"task_struct", "tgid"}, {"task_struct", "pid"}, {"task_struct", "__state"},
		{"task_struct", "flags"}, {"task_struct", "sched_info"}, {"task_struct", "comm"}} {
		if offs[i], err = memberOffset(spec, m[0], m[1]); err != nil {
			return nil, err
		}
	}
	pcount, err := memberOffset(spec, "sched_info", "pcount")
	if err != nil {
		return nil, err
	}
	ti := &taskIter{buf: make([]byte, 0, 256*recSize)}
	ti.scratch, err = ebpf.NewMap(&ebpf.MapSpec{Name: "offcpu_task", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: recSize, MaxEntries: 1})
	if err != nil {
		return nil, err
	}
	ti.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "offcpu_tasks", Type: ebpf.Tracing, AttachType: ebpf.AttachTraceIter,
		AttachTo: "task", License: "GPL", Instructions: taskIterProgram(o, ti.scratch, offs, pcount)})
	if err == nil {
		ti.it, err = link.AttachIter(link.IterOptions{Program: ti.prog})
	}
	if err != nil {
		ti.close()
		return nil, err
	}
	return ti, nil
}

func (ti *taskIter) close() {
	if ti.it != nil {
		ti.it.Close()
	}
	if ti.prog != nil {
		ti.prog.Close()
	}
	ti.scratch.Close()
}

// taskIterProgram writes one record per task selected by o with
// bpf_seq_write, built in a per-CPU scratch value (the stack is too small
// for it).
func taskIterProgram(opts Options, scratch *ebpf.Map, o [6]int16, pcount int16) asm.Instructions {
	tgid, pid, state, flags, sched, comm := o[0], o[1], o[2], o[3], o[4], o[5]
	in := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.DWord), // ctx->meta
		asm.LoadMem(asm.R7, asm.R1, 8, asm.DWord), // ctx->task
		asm.JEq.Imm(asm.R7, 0, "out"),             // the end of the walk
	}
	// The selection, in the kernel: only selected tasks cross over.
	if opts.PID != 0 {
		in = append(in, asm.LoadMem(asm.R1, asm.R7, tgid, asm.Word), asm.JNE.Imm(asm.R1, int32(opts.PID), "out"))
	}
	if opts.TID != 0 {
		in = append(in, asm.LoadMem(asm.R1, asm.R7, pid, asm.Word), asm.JNE.Imm(asm.R1, int32(opts.TID), "out"))
	}
	if !opts.IncludeSelf {
		in = append(in, asm.LoadMem(asm.R1, asm.R7, tgid, asm.Word), asm.JEq.Imm(asm.R1, int32(os.Getpid()), "out"))
	}
	kstack := asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.Mov.Reg(asm.R2, asm.R8), asm.Add.Imm(asm.R2, recStack),
		asm.Mov.Imm(asm.R3, 8*maxStackDepth),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnGetTaskStack.Call(),
		asm.StoreMem(asm.R8, recNStack, asm.R0, asm.DWord),
	}
	if opts.UserOnly {
		kstack = nil
	}
	in = append(in, asm.Instructions{
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, scratch.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP), asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.LoadMem(asm.R1, asm.R7, tgid, asm.Word), asm.StoreMem(asm.R8, recTgid, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R7, pid, asm.Word), asm.StoreMem(asm.R8, recTid, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R7, state, asm.Word), asm.StoreMem(asm.R8, recState, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R7, flags, asm.Word), asm.StoreMem(asm.R8, recFlags, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R7, sched+pcount, asm.DWord), asm.StoreMem(asm.R8, recPcount, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R7, comm, asm.DWord), asm.StoreMem(asm.R8, recComm, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R7, comm+8, asm.DWord), asm.StoreMem(asm.R8, recComm+8, asm.R1, asm.DWord),
		// The user registers saved at kernel entry (struct pt_regs: ip at
		// 128, sp at 152).
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.FnTaskPtRegs.Call(),
		asm.LoadMem(asm.R1, asm.R0, 128, asm.DWord), asm.StoreMem(asm.R8, recIP, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R0, 152, asm.DWord), asm.StoreMem(asm.R8, recSP, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R1, 0), asm.StoreMem(asm.R8, recNStack, asm.R1, asm.DWord),
		// A running task's kernel stack is moving under us: /proc does
		// not show one either.
		asm.LoadMem(asm.R1, asm.R8, recState, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "write"),
	}...)
	in = append(in, kstack...)
	return append(in,
		asm.LoadMem(asm.R1, asm.R6, 0, asm.DWord).WithSymbol("write"), // meta->seq
		asm.Mov.Reg(asm.R2, asm.R8),
		asm.Mov.Imm(asm.R3, recSize),
		asm.FnSeqWrite.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
}

// read returns every task's record, back to back (recSize bytes each).
func (ti *taskIter) read() ([]byte, error) {
	r, err := ti.it.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	buf := ti.buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, cap(buf))...)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF || (err == nil && n == 0) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the task iterator: %w", err)
		}
	}
	ti.buf = buf
	return buf, nil
}

// passIter is Pass through the task iterator.
func (s *Sampler) passIter() (int, error) {
	buf, err := s.iter.read()
	if err != nil {
		return 0, err
	}
	visited := 0
	for ; len(buf) >= recSize; buf = buf[recSize:] {
		rec := buf[:recSize]
		pid := int(binary.LittleEndian.Uint32(rec[recTgid:]))
		tid := int(binary.LittleEndian.Uint32(rec[recTid:]))
		switch {
		case s.opts.TID != 0 && tid != s.opts.TID,
			s.opts.PID != 0 && pid != s.opts.PID,
			pid == s.self && !s.opts.IncludeSelf:
			continue
		}
		visited++
		t := s.threads[tid]
		if t == nil || t.pid != pid {
			if t != nil {
				s.drop(t)
			}
			t = &thread{pid: pid, tid: tid, stat: -1, stack: -1, syscall: -1, schedstat: -1}
			if s.opts.Group == ByProcessName || s.opts.Group == ByPID {
				if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err == nil {
					t.procName = string(trimNL(b))
				}
			}
			if s.live[pid] == 0 && s.user != nil {
				s.user.forget(pid)
			}
			s.live[pid]++
			s.threads[tid] = t
		}
		t.gen = s.gen
		s.sampleRecord(t, rec)
	}
	return visited, nil
}

// sampleRecord is sampleThread for a task iterator record.
func (s *Sampler) sampleRecord(t *thread, rec []byte) {
	switches := binary.LittleEndian.Uint64(rec[recPcount:])
	if t.last != nil && switches == t.switches && !s.reread {
		t.last.samples++
		return
	}
	t.last = nil
	w := binary.LittleEndian.Uint32(rec[recState:])
	letter := stateLetter(w)
	switch letter {
	case "R", "X", "?":
		return // on a CPU or runnable, exiting, or unknown
	}
	if !s.opts.States.Has(letter[0]) {
		return
	}
	t.kthread = binary.LittleEndian.Uint32(rec[recFlags:])&pfKthread != 0
	if (s.opts.UserThreadsOnly && t.kthread) || (s.opts.KernelThreadsOnly && !t.kthread) {
		return
	}
	comm := rec[recComm : recComm+16]
	for i, c := range comm {
		if c == 0 {
			comm = comm[:i]
			break
		}
	}
	key := s.keyHead(t, comm, letter[0])
	var kstack []byte
	if !s.opts.UserOnly {
		if n := int64(binary.LittleEndian.Uint64(rec[recNStack:])); n > 0 {
			kstack = rec[recStack : recStack+min(int(n), 8*maxStackDepth)]
			key = append(key, kstack...)
		}
	}
	key = append(key, 0)
	ip, sp := binary.LittleEndian.Uint64(rec[recIP:]), binary.LittleEndian.Uint64(rec[recSP:])
	key, frames, uproc, uerr := s.appendUser(key, t, ip, sp)
	s.key = key
	e := s.agg[string(key)]
	if e == nil {
		e = &entry{state: letter[0], kstack: string(kstack), kraw: true, userProc: uproc}
		e.group, e.pid, e.tid = s.opts.Group.label(t.procName, string(comm), t.pid, t.tid)
		e.user = append([]userFrame(nil), frames...)
		if uerr != nil {
			e.userErr = uerr.Error()
		}
		s.agg[string(key)] = e
		s.order = append(s.order, e)
	}
	e.samples++
	s.noteThread(t.tid, e)
	t.last, t.switches = e, switches
}

// kernelFrames names the entry's kernel stack, innermost first: /proc's
// text, or the task iterator's raw return addresses through kallsyms
// (at the end, once per distinct stack).
func (e *entry) kernelFrames() []string {
	if !e.kraw {
		return kernelFrames([]byte(e.kstack))
	}
	ksyms, kerr := kallsyms()
	var out []string
	for i := 0; i+8 <= len(e.kstack); i += 8 {
		a := binary.LittleEndian.Uint64([]byte(e.kstack[i : i+8]))
		if a == 0 {
			break
		}
		// Return addresses: name the call, as /proc's %pB does.
		out = append(out, kernelName(ksyms, kerr, a-1))
	}
	return out
}

// source names where the sampler reads threads (Profile.Source).
func (s *Sampler) source() string {
	if s.iter != nil {
		return "bpf_iter"
	}
	return "proc"
}

// seesAll checks the iterator against /proc once: every thread /proc
// lists both before and after one iterator read must be in it. Seen on a
// 6.18 host: the iterator left out init's threads (pid 1), so a profile
// through it would silently miss them; /proc is used there instead.
func (ti *taskIter) seesAll(self int) bool {
	dirBuf := make([]byte, 32<<10)
	threads := func() map[int]bool {
		out := map[int]bool{}
		pids, _ := readDirIDs("/proc", dirBuf, nil)
		for _, pid := range pids {
			if pid == self {
				continue
			}
			tids, _ := readDirIDs("/proc/"+strconv.Itoa(pid)+"/task", dirBuf, nil)
			for _, tid := range tids {
				out[tid] = true
			}
		}
		return out
	}
	before := threads()
	buf, err := ti.read()
	if err != nil {
		return false
	}
	seen := map[int]bool{}
	for ; len(buf) >= recSize; buf = buf[recSize:] {
		seen[int(binary.LittleEndian.Uint32(buf[recTid:]))] = true
	}
	for tid := range threads() {
		if before[tid] && !seen[tid] {
			return false
		}
	}
	return true
}
