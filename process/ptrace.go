package process

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// tracer runs every ptrace request on one locked OS thread: Linux ties a
// tracee to the thread that attached it.
type tracer struct {
	reqs chan func()
	done chan struct{}
}

func newTracer() *tracer {
	t := &tracer{reqs: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		defer close(t.done)
		for f := range t.reqs {
			f()
		}
	}()
	return t
}

// do runs f on the tracer thread and waits for it.
func (t *tracer) do(f func() error) error {
	errc := make(chan error, 1)
	t.reqs <- func() { errc <- f() }
	return <-errc
}

func (t *tracer) close() {
	close(t.reqs)
	<-t.done
}

// stopped is a thread held in a ptrace stop while the text changes.
type stopped struct {
	tid  int
	regs unix.PtraceRegs
	sig  int // a signal its stop swallowed, given back when it goes on
}

// tasks lists the process's threads.
func tasks(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	sort.Ints(out)
	return out, nil
}

// stopAll seizes and interrupts every thread of pid, until a listing
// finds none new (a thread may be created meanwhile), and reads each
// one's registers. Run on the tracer thread. On error every thread
// seized so far is let go.
//
// A vfork child (posix_spawn's, until it runs exec) runs in the
// process's memory but is not one of its threads: it is never held.
// Its parent thread waits in vfork killably, and stops for the
// interrupt only once the child has run exec or exited, so stopAll
// returns only then: no change is written while such a child could be
// running the code it changes (TestVforkChild). A thread that has not
// stopped after slowStop is described to note (nil: no one is told),
// once: kinst would otherwise wait without a word for as long as such a
// child runs.
func stopAll(pid int, note func(string)) (map[int]*stopped, error) {
	held := map[int]*stopped{}
	// gone are the threads found exited or exiting: a zombie stays
	// listed (a thread group leader that called pthread_exit, until the
	// process ends), and asking again each round never ended.
	gone := map[int]bool{}
	for {
		tids, err := tasks(pid)
		if err != nil {
			resumeAll(pid, held)
			if errors.Is(err, fs.ErrNotExist) {
				// It exited while kinst waited for a thread to stop (a
				// thread in vfork stops only once its child has run exec
				// or exited).
				return nil, fmt.Errorf("%w: process %d has exited", ErrNoProcess, pid)
			}
			return nil, err
		}
		fresh := 0
		for _, tid := range tids {
			if held[tid] != nil || gone[tid] {
				continue
			}
			if err := unix.PtraceSeize(tid); err != nil {
				if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EPERM) && exiting(pid, tid) {
					gone[tid] = true
					continue
				}
				resumeAll(pid, held)
				return nil, fmt.Errorf("%w: ptrace(SEIZE, %d): %v%s", ErrNotTraceable, tid, err, ptraceNote(tid))
			}
			fresh++
			if err := unix.PtraceInterrupt(tid); err != nil {
				unix.PtraceDetach(tid)
				gone[tid] = exiting(pid, tid)
				continue
			}
			st := &stopped{tid: tid}
			var slow *time.Timer
			if note != nil {
				slow = time.AfterFunc(slowStop, func() { note(notStopped(pid, tid)) })
			}
			err := waitStop(st)
			if slow != nil {
				slow.Stop()
			}
			if err != nil {
				if errors.Is(err, unix.ECHILD) || errors.Is(err, unix.ESRCH) {
					gone[tid] = true
					continue // exited
				}
				unix.PtraceDetach(tid)
				resumeAll(pid, held)
				return nil, err
			}
			if err := unix.PtraceGetRegs(tid, &st.regs); err != nil {
				unix.PtraceDetach(tid)
				gone[tid] = exiting(pid, tid)
				continue
			}
			held[tid] = st
		}
		if fresh == 0 {
			if len(held) == 0 {
				return nil, fmt.Errorf("%w: process %d has no threads left", ErrNoProcess, pid)
			}
			return held, nil
		}
	}
}

// slowStop is how long stopAll waits for a thread to stop before it says
// so.
const slowStop = time.Second

// notStopped says why thread tid of pid may not have stopped yet: a
// thread in vfork (its wchan kernel_clone, or one naming vfork) stops
// once its child has run exec or exited.
func notStopped(pid, tid int) string {
	task := fmt.Sprintf("/proc/%d/task/%d/", pid, tid)
	wchan, _ := os.ReadFile(task + "wchan")
	children, _ := os.ReadFile(task + "children")
	kids := strings.Fields(string(children))
	what := fmt.Sprintf("thread %d of process %d has not stopped after %v", tid, pid, slowStop)
	if w := string(wchan); len(kids) > 0 && (w == "kernel_clone" || strings.Contains(w, "vfork")) {
		return fmt.Sprintf("%s: it is in vfork, and stops once its child %s has run exec or exited; kinst writes nothing while the child runs in the process's memory, and waits", what, kids[0])
	}
	if w := string(wchan); w != "" && w != "0" {
		return fmt.Sprintf("%s (it waits in the kernel, in %s); kinst waits", what, w)
	}
	return what + "; kinst waits"
}

// exits are the exit statuses the tracer's waits took (pid → status): a
// process kinst started is its child, so a wait for a stop of its main
// thread that finds it exited reaps it, and its parent's own wait then
// finds nothing. Reaped gives the status back.
var exits sync.Map

func noteExit(tid int, ws unix.WaitStatus) { exits.Store(tid, ws) }

// Wait waits for a command kinst started (Start) and spliced, and gives
// its exit status as a shell reports it (128+N when signal N killed it).
// Where a wait of kinst's as its tracer found it exited and reaped it,
// cmd.Wait finds no child: the status is the one that wait took.
func Wait(cmd *exec.Cmd) int {
	err := cmd.Wait()
	var ws unix.WaitStatus
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		ws = unix.WaitStatus(ee.Sys().(syscall.WaitStatus))
	case errors.Is(err, unix.ECHILD):
		v, ok := exits.Load(cmd.Process.Pid)
		if !ok {
			return 1
		}
		ws = v.(unix.WaitStatus)
	default:
		return 1
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// waitStop waits for the thread's next stop. The interrupt's own stop is
// a PTRACE_EVENT_STOP; a signal that arrived first stops it as a
// signal-delivery-stop, which is kept to be given back.
func waitStop(st *stopped) error {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(st.tid, &ws, unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if ws.Exited() || ws.Signaled() {
			noteExit(st.tid, ws)
			return unix.ESRCH
		}
		if !ws.Stopped() {
			continue
		}
		// PTRACE_EVENT_STOP: the interrupt's stop, or a group-stop (a
		// stopped process stays stopped when let go).
		if int(ws)>>16 == unix.PTRACE_EVENT_STOP {
			return nil
		}
		// A signal-delivery-stop: remember the signal and wait for the
		// interrupt's stop, which follows. A SIGTRAP is delivered now
		// instead: an int3's leaves the pc past the int3, where the
		// thread must not run on before its handler (a trap splice's,
		// kinst's) has moved it; the thread stops at the handler's
		// first instruction.
		sig := ws.StopSignal()
		if sig == syscall.SIGTRAP {
			if err := unix.PtraceCont(st.tid, int(sig)); err != nil {
				return err
			}
			continue
		}
		st.sig = int(sig)
		if err := unix.PtraceCont(st.tid, 0); err != nil {
			return err
		}
	}
}

// resumeAll lets every held thread go, giving back any signal its stop
// swallowed. Run on the tracer thread.
func resumeAll(pid int, held map[int]*stopped) {
	for _, st := range held {
		unix.PtraceDetach(st.tid) // the signal, if any, is re-sent below
		if st.sig != 0 {
			unix.Tgkill(pid, st.tid, syscall.Signal(st.sig))
		}
	}
}

// exiting: thread tid of pid has exited or is exiting. ptrace refuses a
// thread whose exit has begun (exit_state set) with EPERM, not ESRCH: a
// program that starts and ends threads all the time made stopAll fail
// now and then (TestPunnedSplicesUnderLoad, 4 runs in 60), the thread's
// /proc entries gone a moment later.
func exiting(pid, tid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
	if err != nil {
		return true // gone
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && (strings.HasPrefix(rest, "Z") || strings.HasPrefix(rest, "X"))
}

// ptraceNote says why ptrace may have refused thread tid: another
// tracer holds it (only one may), or Yama's ptrace_scope forbids it.
func ptraceNote(tid int) string {
	if by := TracedBy(tid); by != "" {
		return by
	}
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	switch scope := strings.TrimSpace(string(b)); {
	case err != nil:
	case scope == "3":
		return " (kernel.yama.ptrace_scope is 3: no process may be traced until reboot)"
	case scope == "2":
		return " (kernel.yama.ptrace_scope is 2: tracing needs CAP_SYS_PTRACE; run kinst as root)"
	}
	return ""
}

// TracedBy names the tracer holding thread tid, if one does (a debugger,
// strace, another kinst), as " (process P, COMM, traces it: one tracer
// at a time)"; "" if none does. Only one tracer may hold a thread.
func TracedBy(tid int) string {
	st, err := readStatus(fmt.Sprintf("/proc/%d/status", tid))
	pid := st["TracerPid"]
	if err != nil || pid == "" || pid == "0" {
		return ""
	}
	comm, _ := os.ReadFile("/proc/" + pid + "/comm")
	return fmt.Sprintf(" (process %s, %s, traces it: one tracer at a time)", pid, strings.TrimSpace(string(comm)))
}

// readStatus reads a /proc status file (/proc/PID/status,
// /proc/PID/task/TID/status) as its fields, each value trimmed.
func readStatus(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	st := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	return st, nil
}
