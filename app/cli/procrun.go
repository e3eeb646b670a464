package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/process"
)

// procRun is a process under `kinst cover -p`: the engine runs in kinst
// itself, splicing the process through ptrace and a
// shared memfd (package process); no kerninstd is involved. With -- CMD
// the command is started stopped at its entry point (its libraries
// mapped) and spliced before its own code runs.
type procRun struct {
	pid    int
	cmd    *exec.Cmd
	tg     *process.Target
	stderr io.Writer

	// execed is set by run when the process has run exec: its splices
	// went with its old program; nothing is sampled or removed after.
	execed atomic.Bool
	// end says how the splices went, for the report (set by finish):
	// api's Ended.
	end string
}

// ended is end in words, for the text report.
func (r *procRun) ended() string {
	switch r.end {
	case "exec":
		return "it ran exec: the splices went with its old program"
	case "exited":
		return "it exited"
	}
	return "splices removed"
}

// loaded reports whether the process has mapped more files since kinst
// last looked (Target.Refresh, which reads them), when waiting points or
// targets wait for a library.
func (r *procRun) loaded(waiting int) bool {
	if waiting == 0 || !r.live() {
		return false
	}
	mods, err := r.tg.Refresh()
	return err == nil && len(mods) > 0
}

// live: the process runs the program kinst attached to (it has neither
// exited nor run exec).
func (r *procRun) live() bool {
	if !process.Alive(r.pid) || r.execed.Load() {
		return false
	}
	_, ex := r.tg.Exec()
	return !ex
}

// openProcess attaches to pid, or starts command.
func openProcess(pid int, command []string, env Env) (*procRun, error) {
	r := &procRun{pid: process.ThreadGroup(pid), stderr: env.Err}
	if r.pid != pid && pid != 0 {
		fmt.Fprintf(env.Err, "kinst: %d is a thread of process %d: splicing the process (its threads share its text)\n", pid, r.pid)
	}
	if len(command) > 0 {
		r.cmd = exec.Command(command[0], command[1:]...)
		r.cmd.Stdin, r.cmd.Stdout, r.cmd.Stderr = env.CmdIn, env.CmdOut, env.CmdErr
		if err := process.Start(r.cmd); err != nil {
			return nil, err
		}
		r.pid = r.cmd.Process.Pid
	}
	tg, err := process.Attach(r.pid)
	if err != nil {
		r.kill()
		return nil, err
	}
	r.tg = tg
	return r, nil
}

func (r *procRun) kill() {
	if r.cmd != nil && r.cmd.ProcessState == nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
	}
}

// run lets the process go (a started command) and calls sample every
// interval until duration ends, ctx is done or the process exits.
func (r *procRun) run(ctx context.Context, duration, interval time.Duration, sample func(el time.Duration)) time.Duration {
	start := time.Now()
	if r.cmd != nil {
		unix.Kill(r.pid, unix.SIGCONT)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var deadline <-chan time.Time
	if duration > 0 {
		deadline = time.After(duration)
	}
	// A command is reaped only after kinst has let it go: while kinst
	// traces it, a wait for it would take ptrace's stops for its exit.
	gone := make(chan struct{})
	execed := make(chan string, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for process.Alive(r.pid) {
			if exe, ok := r.tg.Exec(); ok && !r.execed.Load() {
				r.execed.Store(true)
				execed <- exe
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		close(gone)
	}()
	for {
		select {
		case exe := <-execed:
			// The splices went with the old program. A started command
			// runs on (it is what the user asked to run) until it ends,
			// the duration does, or Ctrl-C.
			fmt.Fprintf(r.stderr, "kinst: process %d ran exec (now %s) %s after the start: kinst's probes went with the program it attached to, and the report covers what ran before; to measure the new program, attach to it (-p %d) or run it directly after --\n",
				r.pid, exe, time.Since(start).Round(time.Millisecond), r.pid)
			if r.cmd == nil {
				return time.Since(start)
			}
		case <-tick.C:
			if r.execed.Load() {
				continue
			}
			sample(time.Since(start))
		case <-deadline:
			return time.Since(start)
		case <-ctx.Done():
			return time.Since(start)
		case <-gone:
			return time.Since(start)
		}
	}
}

// finish removes the probes (remove) from a process still alive, lets it
// go, and reaps a started command (interrupting it if the count ended
// first); it returns the command's exit status.
func (r *procRun) finish(remove func() []error, stderr interface{ Write([]byte) (int, error) }) *int {
	switch {
	case r.execed.Load():
		r.end = "exec"
	case !process.Alive(r.pid):
		r.end = "exited"
	default:
		r.end = "removed"
	}
	if r.live() { // an exited process's text went with it, an exec's too
		for _, e := range remove() {
			if e != nil {
				fmt.Fprintf(stderr, "kinst: remove: %v\n", e)
			}
		}
		if err := r.tg.Close(); err != nil {
			fmt.Fprintf(stderr, "kinst: detach: %v\n", err)
		}
	} else {
		r.tg.Abandon()
	}
	if r.cmd == nil {
		return nil
	}
	if process.Alive(r.pid) {
		r.cmd.Process.Signal(os.Interrupt)
	}
	err := r.cmd.Wait()
	s := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		s = ee.ExitCode()
	}
	return &s
}
