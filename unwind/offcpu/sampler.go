package offcpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kinst/kinst/unwind"
	"golang.org/x/sys/unix"
)

// Options select threads and stacks; they apply to both collectors.
type Options struct {
	PID int // only this process (thread group); 0 for every process
	TID int // only this thread; 0 for every thread
	// States keeps only threads in these states; empty keeps every state
	// except running.
	States     States
	Group      Group
	KernelOnly bool // do not collect user stacks
	UserOnly   bool // do not collect kernel stacks
	// IncludeSelf also profiles the profiler's own process.
	IncludeSelf bool
	// UserThreadsOnly leaves out kernel threads; KernelThreadsOnly keeps
	// only them (BCC's -u and -k).
	UserThreadsOnly, KernelThreadsOnly bool
}

func (o *Options) validate() error {
	if o.KernelOnly && o.UserOnly {
		return errors.New("kernel-only and user-only exclude each other")
	}
	if o.UserThreadsOnly && o.KernelThreadsOnly {
		return errors.New("user-threads-only and kernel-threads-only exclude each other")
	}
	if o.PID < 0 || o.TID < 0 {
		return errors.New("pid and tid must be positive")
	}
	return nil
}

// resolve checks that the process or thread asked for exists, and fills
// in the process of a thread given alone.
func (o *Options) resolve() error {
	switch {
	case o.TID != 0:
		tgid, err := threadGroup(o.TID)
		if err != nil {
			return fmt.Errorf("thread %d: %w", o.TID, ErrNoSuchThread)
		}
		if o.PID != 0 && o.PID != tgid {
			return fmt.Errorf("thread %d is in process %d, not %d: %w", o.TID, tgid, o.PID, ErrNoSuchThread)
		}
		o.PID = tgid
	case o.PID != 0:
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/task", o.PID)); err != nil {
			return fmt.Errorf("process %d: %w", o.PID, ErrNoSuchThread)
		}
	}
	return nil
}

// ErrNoSuchThread is returned when the process or thread asked for does
// not exist.
var ErrNoSuchThread = errors.New("no such process or thread")

// thread is one thread's open /proc files. A descriptor of -1 was not
// wanted or could not be opened.
type thread struct {
	pid, tid                        int
	stat, stack, syscall, schedstat int
	procName                        string
	kthread                         bool
	gen                             uint32 // pass that last saw it

	// last is what the previous sample of this thread found, and
	// switches how many times it had been scheduled in before that sample
	// was read (the third field of schedstat). While that count stands
	// still the thread has not run, so its state and both stacks are
	// still what last says.
	last     *entry
	switches uint64
}

func (t *thread) close() {
	for _, fd := range []int{t.stat, t.stack, t.syscall, t.schedstat} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// entry is one distinct raw stack: counted during sampling, symbolised
// once at the end.
type entry struct {
	group    string
	pid, tid int
	state    byte
	kstack   string
	user     []userFrame
	userProc *unwind.Process // names user
	userErr  string
	samples  int64
	names    []string // user, named (trace completion)
	kraw     bool     // kstack holds raw addresses (task iterator), not /proc text
}

// Sampler collects off-CPU stacks by periodic reads of /proc. It is not
// safe for concurrent use.
type Sampler struct {
	opts    Options
	self    int
	period  time.Duration
	threads map[int]*thread // by tid
	live    map[int]int     // open threads per pid
	gen     uint32
	agg     map[string]*entry // by raw key (see sampleThread)
	order   []*entry
	user    *userStacks // nil with KernelOnly
	// reread turns off the reuse of a sample for a thread that has not
	// run since (benchmarks measure the full cost with it).
	reread bool
	start  time.Time
	// end is when Run returned (zero before, or without Run).
	end    time.Time
	passes int
	visits int
	// unreadable counts thread visits whose files could not be opened
	// (other than because the thread exited).
	unreadable int

	// Scratch buffers reused by every pass.
	dirBuf, readBuf, stackBuf, key []byte
	pids, tids                     []int
	frames                         []userFrame

	// iter reads every task in one pass when BPF allows it (iter.go);
	// nil: the /proc files.
	iter *taskIter

	// The threads each stack was seen in, kept for Tracer.CompleteFrom.
	byThread map[int][]*entry
	seen     map[threadEntry]bool
}

// NewSampler returns a sampler for threads selected by o. period is the
// interval the caller will call Pass at; it turns sample counts into
// estimated off-CPU time.
func NewSampler(o Options, period time.Duration) (*Sampler, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if period <= 0 {
		return nil, errors.New("sampling period must be positive")
	}
	s := &Sampler{
		opts:     o,
		self:     os.Getpid(),
		period:   period,
		threads:  make(map[int]*thread),
		live:     make(map[int]int),
		agg:      make(map[string]*entry),
		dirBuf:   make([]byte, 32<<10),
		readBuf:  make([]byte, 1024),
		stackBuf: make([]byte, 4096),
		start:    time.Now(),
	}
	if !o.KernelOnly {
		s.user = newUserStacks()
	}
	if err := s.opts.resolve(); err != nil {
		return nil, err
	}
	s.iter, _ = newTaskIter(s.opts) // else /proc
	if s.iter != nil && s.opts.PID == 0 && s.opts.TID == 0 && !s.iter.seesAll(s.self) {
		s.iter.close()
		s.iter = nil
	}
	return s, nil
}

// Close releases every open /proc descriptor.
func (s *Sampler) Close() error {
	for _, t := range s.threads {
		s.drop(t)
	}
	if s.iter != nil {
		s.iter.close()
		s.iter = nil
	}
	return nil
}

// Pass takes one sample of every selected thread that is off CPU and
// returns how many threads it visited.
func (s *Sampler) Pass() (int, error) {
	s.gen++
	s.passes++
	visited := 0
	var err error
	switch {
	case s.iter != nil:
		visited, err = s.passIter()
	case s.opts.TID != 0:
		s.visit(s.opts.PID, s.opts.TID) // NewSampler found the PID
		visited = 1
	case s.opts.PID != 0:
		visited, err = s.visitProcess(s.opts.PID)
	default:
		s.pids, err = readDirIDs("/proc", s.dirBuf, s.pids[:0])
		if err != nil {
			return 0, err
		}
		for _, pid := range s.pids {
			if pid == s.self && !s.opts.IncludeSelf {
				continue
			}
			n, _ := s.visitProcess(pid) // it may have exited meanwhile
			visited += n
		}
	}
	// Forget threads that are gone.
	for _, t := range s.threads {
		if t.gen != s.gen {
			s.drop(t)
		}
	}
	s.visits += visited
	return visited, err
}

// threadGroup returns the process (thread group) of thread tid, from the
// Tgid line of /proc/TID/status (/proc/TID exists for any thread).
func threadGroup(tid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no Tgid in status")
}

func (s *Sampler) visitProcess(pid int) (int, error) {
	var err error
	s.tids, err = readDirIDs("/proc/"+strconv.Itoa(pid)+"/task", s.dirBuf, s.tids[:0])
	if err != nil {
		return 0, err
	}
	for _, tid := range s.tids {
		s.visit(pid, tid)
	}
	return len(s.tids), nil
}

func (s *Sampler) visit(pid, tid int) {
	t := s.threads[tid]
	if t == nil || t.pid != pid {
		if t != nil {
			s.drop(t)
		}
		var err error
		if t, err = s.open(pid, tid); err != nil {
			if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ESRCH) {
				s.unreadable++ // descriptor limit, permissions
			}
			return
		}
		if s.live[pid] == 0 && s.user != nil {
			// A process new to this run: if its pid was seen before,
			// it named another process then.
			s.user.forget(pid)
		}
		s.live[pid]++
		s.threads[tid] = t
	}
	t.gen = s.gen
	if err := s.sampleThread(t); errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) {
		// Exited (or the tid was reused): reopen if it shows up again.
		s.drop(t)
	}
}

// drop closes a thread's files and forgets it.
func (s *Sampler) drop(t *thread) {
	t.close()
	delete(s.threads, t.tid)
	if s.live[t.pid]--; s.live[t.pid] <= 0 {
		delete(s.live, t.pid)
	}
}

func (s *Sampler) open(pid, tid int) (*thread, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/"
	t := &thread{pid: pid, tid: tid, stat: -1, stack: -1, syscall: -1, schedstat: -1}
	var err error
	if t.stat, err = openRO(dir + "stat"); err != nil {
		return nil, err
	}
	if t.syscall, err = openRO(dir + "syscall"); err != nil {
		t.close()
		return nil, err
	}
	// Needs CONFIG_SCHED_INFO; without it every sample reads everything.
	t.schedstat, _ = openRO(dir + "schedstat")
	if !s.opts.UserOnly {
		// Needs CAP_SYS_ADMIN (root); without it only user stacks remain.
		t.stack, _ = openRO(dir + "stack")
	}
	if s.opts.Group == ByProcessName || s.opts.Group == ByPID {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err == nil {
			t.procName = string(trimNL(b))
		}
	}
	return t, nil
}

func trimNL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		return b[:n-1]
	}
	return b
}

// kernelStack reads t's kernel stack as /proc gives it, nil when it
// may not be read (not root): the profile goes on with user stacks.
func (s *Sampler) kernelStack(t *thread) ([]byte, error) {
	if t.stack < 0 {
		return nil, nil
	}
	kstack, err := preadAll(t.stack, s.stackBuf)
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		unix.Close(t.stack)
		t.stack = -1
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s.stackBuf = kstack[:cap(kstack)]
	return kstack, nil
}

// sampleThread reads one thread. schedstat comes first: while the thread
// has not been scheduled in since its last sample, that sample still holds
// (blocked all along, or woken and still waiting for a CPU, which is
// off-CPU time too and which the tracer also counts against the stack the
// thread blocked in), and one small read is all it costs. Otherwise the
// syscall file is the cheapest test of "on a CPU": the kernel answers
// "running" for a thread in TASK_RUNNING without touching its stack.
func (s *Sampler) sampleThread(t *thread) error {
	var switches uint64
	if t.schedstat >= 0 {
		b, err := preadAll(t.schedstat, s.readBuf)
		if err != nil {
			return err
		}
		if switches, err = parseSchedstat(b); err != nil {
			return err
		}
		if t.last != nil && switches == t.switches && !s.reread {
			t.last.samples++
			return nil
		}
	}
	t.last = nil
	b, err := preadAll(t.syscall, s.readBuf)
	if err != nil {
		return err
	}
	sc, _, err := unwind.ParseSyscall(b)
	if errors.Is(err, unwind.ErrNotBlocked) {
		return nil // on a CPU, or runnable
	}
	if err != nil {
		return err
	}
	b, err = preadAll(t.stat, s.readBuf)
	if err != nil {
		return err
	}
	st, err := parseStat(b)
	if err != nil {
		return err
	}
	switch st.state {
	case 'R', 'Z', 'X':
		return nil // woke up meanwhile, or has no stack any more
	}
	if !s.opts.States.Has(st.state) {
		return nil
	}
	t.kthread = st.flags&pfKthread != 0
	if (s.opts.UserThreadsOnly && t.kthread) || (s.opts.KernelThreadsOnly && !t.kthread) {
		return nil
	}
	// The raw key: pid/tid as grouped, group name, state, kernel stack
	// text, user frames. Symbolisation waits until a key is new.
	key := s.keyHead(t, st.comm, st.state)
	kstack, err := s.kernelStack(t)
	if err != nil {
		return err
	}
	key = append(append(key, kstack...), 0)
	// A thread blocked outside a system call (nr -1: a page fault, say)
	// still has its user sp and pc in the syscall file.
	key, frames, uproc, uerr := s.appendUser(key, t, sc.PC, sc.SP)
	s.key = key
	e := s.agg[string(key)]
	if e == nil {
		e = &entry{state: st.state, kstack: string(kstack), userProc: uproc}
		e.group, e.pid, e.tid = s.opts.Group.label(t.procName, string(st.comm), t.pid, t.tid)
		e.user = append([]userFrame(nil), frames...)
		if uerr != nil {
			e.userErr = uerr.Error()
		}
		s.agg[string(key)] = e
		s.order = append(s.order, e)
	}
	e.samples++
	s.noteThread(t.tid, e)
	if t.schedstat >= 0 {
		t.last, t.switches = e, switches
	}
	return nil
}

// Run calls Pass every period until ctx is done or duration (if positive)
// has passed. progress, if not nil, is called after every pass.
func (s *Sampler) Run(ctx context.Context, duration time.Duration, progress func(pass, visited int)) error {
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	tick := time.NewTicker(s.period)
	defer tick.Stop()
	defer func() { s.end = time.Now() }()
	for {
		n, err := s.Pass()
		if err != nil {
			return err
		}
		if progress != nil {
			progress(s.passes, n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Profile symbolises what was sampled so far. Raw stacks that name the
// same functions (the same code in two processes, say) merge.
func (s *Sampler) Profile() *Profile {
	end := s.end
	if end.IsZero() {
		end = time.Now()
	}
	p := &Profile{Mode: "sample", Start: s.start, Duration: end.Sub(s.start), Period: s.period,
		Passes: s.passes, Threads: s.visits, Unreadable: s.unreadable, Source: s.source()}
	for _, e := range s.order {
		st := Stack{Group: e.group, PID: e.pid, TID: e.tid, State: string(e.state),
			Kernel: e.kernelFrames(), UserError: e.userErr, Samples: e.samples}
		if len(st.Kernel) > 0 {
			// /proc/PID/stack starts after the scheduler's own frames, so
			// its innermost frame is what get_wchan() reports.
			st.Wchan = st.Kernel[0]
		}
		if s.user != nil {
			st.User = names(e.userProc, e.user)
		}
		p.Stacks = append(p.Stacks, st)
	}
	p.Stacks = merge(p.Stacks)
	for i := range p.Stacks {
		p.Stacks[i].OffCPU = sampledTime(p.Duration, p.Stacks[i].Samples, s.passes)
	}
	if s.user != nil {
		p.DebugNotes = s.user.debugNotes()
	}
	return p
}

// sampledTime is the off-CPU time samples of passes stand for in a run
// of duration d: each pass stands for an equal share of the run, so a
// thread seen off CPU in every pass was off CPU for all of it. (n passes
// over a run are n samples but only n−1 intervals between them: counting
// a period, or the mean interval between passes, per sample counts one
// interval too many.) Exact, and without overflow for any real run.
func sampledTime(d time.Duration, samples int64, passes int) time.Duration {
	if passes <= 0 || d <= 0 {
		return 0
	}
	n := time.Duration(passes)
	return d/n*time.Duration(samples) + d%n*time.Duration(samples)/n
}

// keyHead starts a sample's raw key in s.key: pid or tid as grouped, the
// group name, the state letter, each ended by a NUL.
func (s *Sampler) keyHead(t *thread, comm []byte, state byte) []byte {
	key := s.key[:0]
	group := comm
	if s.opts.Group == ByProcessName || s.opts.Group == ByPID {
		group = []byte(t.procName)
	}
	switch s.opts.Group {
	case ByPID:
		key = strconv.AppendInt(key, int64(t.pid), 10)
	case ByTID:
		key = strconv.AppendInt(key, int64(t.tid), 10)
	}
	key = append(key, 0)
	key = append(key, group...)
	return append(key, 0, state, 0)
}

// appendUser unwinds t's user stack from pc and sp, when the sampler
// takes user stacks and t is no kernel thread, and appends the pid and
// the frames to a sample's raw key.
func (s *Sampler) appendUser(key []byte, t *thread, pc, sp uint64) ([]byte, []userFrame, *unwind.Process, error) {
	if s.user == nil || t.kthread || pc == 0 {
		return key, s.frames[:0], nil, nil
	}
	frames, uproc, uerr := s.user.unwind(t.pid, pc, sp, s.frames[:0])
	s.frames = frames
	key = strconv.AppendInt(key, int64(t.pid), 10)
	for _, f := range frames {
		key = appendFrame(key, f)
	}
	return key, frames, uproc, uerr
}
