package cli

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/kinst/kinst/internal/outfile"
)

// Env is what a report runs with: where the report, the diagnostics and
// the output of -- CMD go, the clock, and how CMD starts. NewEnv builds
// it from the command line; tests substitute a clock they advance by
// hand and an in-process CMD.
type Env struct {
	Out io.Writer // the report: stdout, or the file of -o
	Err io.Writer // progress and diagnostics
	// CmdIn, CmdOut and CmdErr are -- CMD's standard streams.
	CmdIn          io.Reader
	CmdOut, CmdErr io.Writer
	// Clock is nil for the system's.
	Clock Clock
	// Start starts -- CMD; nil starts it as a child process.
	Start func(argv []string, stdin io.Reader, stdout, stderr io.Writer) (Process, error)

	// sampled, if set, runs after each sample of a session has been
	// reported (tests wait on it).
	sampled func()
}

// Clock is the time a report measures with.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// Process is a running -- CMD.
type Process interface {
	// Wait waits for it to exit and returns its status as a shell
	// reports it (128+N when signal N killed it).
	Wait() int
	Signal(os.Signal) error
}

// Streams are the process's standard streams and the output flags of a
// report command.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Output         string // -o FILE: the report goes there instead of stdout
	JSON           bool   // the report is JSON
}

// NewEnv routes a report: to the file of -o if given, else to stdout.
// -- CMD keeps the terminal's streams, except that when a JSON report
// goes to stdout, CMD's stdout goes to stderr, so nothing it prints can
// corrupt the JSON. Call finish with the command's error when it is
// done: the file of -o is put in place only when that is nil; otherwise
// a file already there is left as it was (outfile).
func NewEnv(s Streams) (e Env, finish func(error) error, err error) {
	e = Env{Out: s.Stdout, Err: s.Stderr, CmdIn: s.Stdin, CmdOut: s.Stdout, CmdErr: s.Stderr}
	finish = func(err error) error { return err }
	switch {
	case s.Output != "" && s.Output != "-":
		f, err := outfile.Create(s.Output)
		if err != nil {
			return e, finish, err
		}
		e.Out, finish = f, f.Finish
	case s.JSON:
		e.CmdOut = s.Stderr
	}
	return e, finish, nil
}

func (e Env) now() time.Time {
	if e.Clock == nil {
		return time.Now()
	}
	return e.Clock.Now()
}

func (e Env) after(d time.Duration) <-chan time.Time {
	if e.Clock == nil {
		return time.After(d)
	}
	return e.Clock.After(d)
}

func (e Env) since(t time.Time) time.Duration { return e.now().Sub(t) }

// start starts -- CMD.
func (e Env) start(argv []string) (Process, error) {
	if e.Start != nil {
		return e.Start(argv, e.CmdIn, e.CmdOut, e.CmdErr)
	}
	return StartProcess(argv, e.CmdIn, e.CmdOut, e.CmdErr)
}

// StartProcess starts argv as a child process with the given streams.
func StartProcess(argv []string, stdin io.Reader, stdout, stderr io.Writer) (Process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return child{cmd}, nil
}

type child struct{ cmd *exec.Cmd }

func (c child) Wait() int                { return exitCode(c.cmd.Wait()) }
func (c child) Signal(s os.Signal) error { return c.cmd.Process.Signal(s) }

// exitCode is the status a shell would report for the error of Wait.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}
