package core

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/kinst/kinst/kernel"
)

// Task is one kernel task (a thread) as the dump holds it.
type Task struct {
	Addr    uint64 `json:"-"`       // the task_struct
	Address string `json:"address"` // Addr in hex
	PID     int    `json:"pid"`
	TGID    int    `json:"tgid"`
	Comm    string `json:"comm"`
	State   string `json:"state"` // ps letter: R S D T t X Z P I
	CPU     int    `json:"cpu"`
	// Active: the task was running on CPU when the dump was taken (it is
	// that CPU's current task), so its stack starts from the CPU's
	// registers, not from the context-switch frame.
	Active   bool   `json:"active"`
	threadSP uint64 // thread.sp: the inactive_task_frame of a switched-out task
	stack    uint64 // task_struct.stack: the kernel stack's base; 0 once freed
	hasStack bool   // BTF has task_struct.stack, so stack is meaningful
}

// Stack is the base of the task's kernel stack (task_struct.stack), if
// BTF has the member and the task still has a stack.
func (t *Task) Stack() (uint64, bool) { return t.stack, t.hasStack && t.stack != 0 }

// taskLayout holds the task_struct offsets used here, from BTF.
type taskLayout struct {
	tasks, pid, tgid, comm, state, exitState, cpu, threadSP, signal, threadNode uint64
	threadHead                                                                  uint64 // in signal_struct
	commLen                                                                     uint64
	stack                                                                       uint64 // 0: BTF has no task_struct.stack
}

func (k *Kernel) taskLayout() (*taskLayout, error) {
	t, err := k.Types()
	if err != nil {
		return nil, err
	}
	var l taskLayout
	var errs []error
	off := func(dst *uint64, st string, paths ...string) {
		for _, p := range paths {
			if o, err := t.Offset(st, p); err == nil {
				*dst = o
				return
			}
		}
		errs = append(errs, fmt.Errorf("struct %s has none of %v", st, paths))
	}
	off(&l.tasks, "task_struct", "tasks")
	off(&l.pid, "task_struct", "pid")
	off(&l.tgid, "task_struct", "tgid")
	off(&l.comm, "task_struct", "comm")
	off(&l.state, "task_struct", "__state", "state") // __state since 5.14
	off(&l.exitState, "task_struct", "exit_state")
	off(&l.cpu, "task_struct", "thread_info.cpu", "cpu") // in thread_info since 5.16
	off(&l.threadSP, "task_struct", "thread.sp")
	off(&l.signal, "task_struct", "signal")
	off(&l.threadNode, "task_struct", "thread_node")
	off(&l.threadHead, "signal_struct", "thread_head")
	if len(errs) > 0 {
		return nil, fmt.Errorf("BTF: %v", errs)
	}
	l.stack, _ = t.Offset("task_struct", "stack") // optional: never at offset 0 (thread_info or __state is)
	l.commLen, _ = t.MemberSize("task_struct", "comm")
	if l.commLen == 0 || l.commLen > 64 {
		l.commLen = 16
	}
	return &l, nil
}

// maxTasks bounds list walks through a corrupt dump.
const maxTasks = 1 << 20

// Tasks lists every task: init_task's tasks list gives the thread-group
// leaders, each leader's signal->thread_head its threads. The idle tasks
// of CPUs other than 0 are not on these lists; each CPU's current task
// is marked Active.
func (k *Kernel) Tasks() ([]Task, error) {
	l, err := k.taskLayout()
	if err != nil {
		return nil, err
	}
	s, err := k.KernelSymbols()
	if err != nil {
		return nil, err
	}
	initTask, ok := s.Address("init_task")
	if !ok {
		return nil, &kernel.NoSymbolError{Name: "init_task"}
	}
	current := k.currentTasks()
	var out []Task
	seen := map[uint64]bool{}
	live := k.Live()
	var skipped []string
	// tolerate: on a live system a task that exits while the lists are
	// walked leaves a list that no longer leads back to its head, or a
	// task_struct being freed; that item is skipped and said, the walk
	// goes on. A dump does not change, so there it is an error.
	tolerate := func(err error) error {
		if err == nil || !live {
			return err
		}
		skipped = append(skipped, err.Error())
		return nil
	}
	defer func() { k.setTaskAnomalies(skipped) }()
	add := func(addr uint64) error {
		if seen[addr] {
			return nil
		}
		seen[addr] = true
		t, err := k.readTask(l, addr)
		if err != nil {
			return err
		}
		if cpu, ok := current[addr]; ok {
			t.Active, t.CPU = true, cpu
		}
		out = append(out, t)
		return nil
	}
	err = k.walkList(initTask+l.tasks, l.tasks, func(leader uint64) error {
		if err := add(leader); err != nil {
			return tolerate(err)
		}
		sig, err := k.ReadU64(leader + l.signal)
		if err != nil || sig == 0 {
			return nil // a task being torn down
		}
		return tolerate(k.walkList(sig+l.threadHead, l.threadNode, add))
	})
	if err = tolerate(err); err != nil {
		return out, err
	}
	if !seen[initTask] {
		if err := add(initTask); err != nil {
			return out, err
		}
	}
	// The idle tasks of CPUs other than 0 are on no task list; nor is a
	// running task the dump caught between lists.
	for _, ct := range k.cpuTasks() {
		for _, addr := range []uint64{ct.current, ct.idle} {
			if addr == 0 {
				continue
			}
			if err := tolerate(add(addr)); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// TaskAnomalies lists what the last Tasks skipped on a live system: a
// list cut while it was walked, a task_struct that could not be read.
// Empty for a dump.
func (k *Kernel) TaskAnomalies() []string {
	k.modMu.Lock()
	defer k.modMu.Unlock()
	return k.taskSkipped
}

func (k *Kernel) setTaskAnomalies(s []string) {
	k.modMu.Lock()
	defer k.modMu.Unlock()
	k.taskSkipped = s
}

// walkList walks a list_head list of at most maxTasks entries.
func (k *Kernel) walkList(head, entryOff uint64, f func(entry uint64) error) error {
	return k.WalkList(head, entryOff, maxTasks, f)
}

func (k *Kernel) readTask(l *taskLayout, addr uint64) (Task, error) {
	end := max(l.pid+4, l.tgid+4, l.comm+l.commLen, l.state+4, l.exitState+4, l.cpu+4, l.threadSP+8, l.stack+8)
	b := make([]byte, end)
	if err := k.ReadVirt(b, addr); err != nil {
		return Task{}, fmt.Errorf("task_struct at %#x: %w", addr, err)
	}
	u32 := func(o uint64) uint32 { return binary.LittleEndian.Uint32(b[o:]) }
	comm := b[l.comm : l.comm+l.commLen]
	if i := bytes.IndexByte(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	var stack uint64
	if l.stack != 0 {
		stack = binary.LittleEndian.Uint64(b[l.stack:])
	}
	return Task{
		stack:    stack,
		hasStack: l.stack != 0,
		Addr:     addr,
		Address:  fmt.Sprintf("%#x", addr),
		PID:      int(int32(u32(l.pid))),
		TGID:     int(int32(u32(l.tgid))),
		Comm:     string(comm),
		State:    stateLetter(u32(l.state), u32(l.exitState)),
		CPU:      int(u32(l.cpu)),
		threadSP: binary.LittleEndian.Uint64(b[l.threadSP:]),
	}, nil
}

// The task state bits of include/linux/sched.h. They are #defines, not
// enums, so BTF does not carry them; these are 6.1's values
// (TASK_FROZEN is 6.1's freezer bit; older kernels do not set it).
const (
	taskInterruptible   = 0x0001
	taskUninterruptible = 0x0002
	taskStopped         = 0x0004 // __TASK_STOPPED
	taskTraced          = 0x0008 // __TASK_TRACED
	exitDead            = 0x0010 // in exit_state
	exitZombie          = 0x0020 // in exit_state
	taskParked          = 0x0040
	taskNoload          = 0x0400
	taskRTLockWait      = 0x1000
	taskFrozen          = 0x8000
	taskIdle            = taskUninterruptible | taskNoload
	// taskReport is TASK_REPORT, the bits get_task_state reports;
	// taskReportIdle (TASK_REPORT_IDLE) is the index past them, "I".
	taskReport     = taskInterruptible | taskUninterruptible | taskStopped | taskTraced | exitDead | exitZombie | taskParked
	taskReportIdle = taskReport + 1
)

// stateLetter is the kernel's __task_state_index and task_index_to_char
// (include/linux/sched.h, as fs/proc/array.c reports it): the state and
// exit_state bits within TASK_REPORT, TASK_REPORT_IDLE when all of
// TASK_IDLE's bits are set, TASK_UNINTERRUPTIBLE for a task waiting on
// an RT lock or frozen by the freezer; the highest bit set picks a
// letter of "RSDTtXZPI".
func stateLetter(state, exitState uint32) string {
	s := (state | exitState) & taskReport
	if state&taskIdle == taskIdle {
		s = taskReportIdle
	}
	if state&(taskRTLockWait|taskFrozen) != 0 {
		s = taskUninterruptible
	}
	return string("RSDTtXZPI"[bits.Len32(s)])
}

// currentTasks maps each CPU's current task to the CPU.
func (k *Kernel) currentTasks() map[uint64]int {
	out := map[uint64]int{}
	for cpu, ct := range k.cpuTasks() {
		if ct.current != 0 {
			out[ct.current] = cpu
		}
	}
	return out
}

// cpuTask is what one CPU's runqueue knows of its tasks.
type cpuTask struct{ current, idle uint64 }

// cpuTasks reads each CPU's current task (the per-CPU pointer that
// kernel.TaskLayout locates: current_task, or pcpu_hot.current_task
// since 6.2) and idle task (runqueues.idle); a zero address where the
// dump does not say.
func (k *Kernel) cpuTasks() []cpuTask {
	out := make([]cpuTask, len(k.Dump.CPUs()))
	tl, errCur := k.TaskLayout()
	var idle uint64 // runqueues.idle, as an offset from the per-CPU base
	haveIdle := false
	if s, err := k.KernelSymbols(); err == nil {
		if rq, ok := s.Address("runqueues"); ok {
			if t, err := k.Types(); err == nil {
				off, err := t.Offset("rq", "idle")
				idle, haveIdle = rq+off, err == nil
			}
		}
	}
	for i := range out {
		base, err := k.PerCPUOffset(i)
		if err != nil {
			continue
		}
		if errCur == nil {
			out[i].current, _ = k.ReadU64(base + uint64(tl.CurrentTask))
		}
		if haveIdle {
			out[i].idle, _ = k.ReadU64(base + idle)
		}
	}
	return out
}

// Task finds a task by PID (the thread id).
func (k *Kernel) Task(pid int) (Task, error) {
	ts, err := k.Tasks()
	if err != nil {
		return Task{}, err
	}
	for _, t := range ts {
		if t.PID == pid {
			return t, nil
		}
	}
	return Task{}, fmt.Errorf("no task with pid %d in the dump", pid)
}

// TaskAt reads the task_struct at addr, whether or not it is on the
// task lists (a task being created or torn down, or one found in a
// register). An address on no list must look like a task: see
// checkTask.
func (k *Kernel) TaskAt(addr uint64) (Task, error) {
	ts, err := k.Tasks()
	if err != nil {
		return Task{}, err
	}
	for _, t := range ts {
		if t.Addr == addr {
			return t, nil
		}
	}
	l, err := k.taskLayout()
	if err != nil {
		return Task{}, err
	}
	if addr%8 != 0 {
		return Task{}, fmt.Errorf("%#x is not a task: on no task list, and not aligned as a task_struct is", addr)
	}
	t, err := k.readTask(l, addr)
	if err != nil {
		return Task{}, err
	}
	if err := k.checkTask(l, t); err != nil {
		return Task{}, fmt.Errorf("%#x is not a task: on no task list, and %w", addr, err)
	}
	return t, nil
}

// pidMaxLimit is PID_MAX_LIMIT on 64-bit kernels (include/linux/threads.h).
const pidMaxLimit = 4 << 20

// threadSize bounds a task's kernel stack: THREAD_SIZE is 16 KiB on
// x86-64, 32 KiB with KASAN; 64 KiB leaves room for both.
const threadSize = 64 << 10

// checkTask tells whether a task_struct read from an address on no task
// list is self-consistent: a pid and tgid within PID_MAX_LIMIT, a
// printable comm, and either its saved stack pointer inside its own
// kernel stack or its tasks links pointing back at it.
func (k *Kernel) checkTask(l *taskLayout, t Task) error {
	if t.PID <= 0 || t.PID > pidMaxLimit || t.TGID <= 0 || t.TGID > pidMaxLimit {
		return fmt.Errorf("its pid %d and tgid %d are not both in 1..%d", t.PID, t.TGID, pidMaxLimit)
	}
	if t.Comm == "" {
		return fmt.Errorf("its comm is empty")
	}
	for _, c := range []byte(t.Comm) {
		if c < 0x20 || c >= 0x7f {
			return fmt.Errorf("its comm %q is not printable", t.Comm)
		}
	}
	if t.hasStack && t.stack != 0 && t.threadSP >= t.stack && t.threadSP < t.stack+threadSize {
		return nil
	}
	self := t.Addr + l.tasks
	next, err1 := k.ReadU64(self)
	prev, err2 := k.ReadU64(self + 8)
	if err1 == nil && err2 == nil {
		nprev, err1 := k.ReadU64(next + 8)
		pnext, err2 := k.ReadU64(prev)
		if err1 == nil && err2 == nil && nprev == self && pnext == self {
			return nil
		}
	}
	return fmt.Errorf("neither its saved stack pointer %#x is in its stack at %#x nor its tasks links lead back to it", t.threadSP, t.stack)
}
