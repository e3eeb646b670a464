package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/process"
	"github.com/kinst/kinst/procsession"
	"github.com/kinst/kinst/unwind"
)

// sessionHost is where the session of `kinst count`, `kinst time` or
// `kinst cover` lives: kerninstd for the kernel (daemonHost), or sessions kinst hosts
// itself over a user process (procsession.Host). Both take the same
// requests and give the same sessions and samples, so one loop reports
// either.
type sessionHost interface {
	CreateSession(ctx context.Context, req api.SessionRequest) (api.Session, error)
	RemoveSession(ctx context.Context, id string) (api.Session, error)
	Samples(ctx context.Context, id string, interval time.Duration) (sampleStream, error)
}

// sampleStream is a session's samples; io.EOF when it ends.
type sampleStream interface {
	Next() (api.Sample, error)
	Close() error
}

// daemonHost is kerninstd's sessions.
type daemonHost struct{ *api.Client }

func (d daemonHost) Samples(ctx context.Context, id string, interval time.Duration) (sampleStream, error) {
	return d.Client.Samples(ctx, id, interval)
}

// processHost is a process's sessions, hosted by kinst.
type processHost struct{ *procsession.Host }

func (p processHost) Samples(ctx context.Context, id string, interval time.Duration) (sampleStream, error) {
	return p.Host.Samples(ctx, id, interval)
}

// sessionTarget is what a session command runs on: the host of its
// session, how its source lines are found, and, for a user process, the
// process (nil for the kernel).
type sessionTarget struct {
	host sessionHost
	// lines expands FILE:LINE and FUNC:+N points from the target's DWARF.
	lines func(points []string) (linePoints, error)
	// regions are the timed regions of kinst time's line ranges.
	regions []api.Region
	proc    *procTarget
}

// kernelTarget is kerninstd's kernel.
func kernelTarget(ctx context.Context, c *api.Client, debug DebugOptions, w io.Writer) sessionTarget {
	return sessionTarget{host: daemonHost{c}, lines: func(points []string) (linePoints, error) {
		return expandSourceLines(ctx, c, points, debug, w)
	}}
}

// request is req as the target takes it: a kernel session is tied to
// kinst's sample stream (kerninstd removes it if kinst dies); a process
// session lives in kinst and goes with it anyway.
func (t sessionTarget) request(req api.SessionRequest) api.SessionRequest {
	req.Tied = t.proc == nil
	return req
}

// run streams the session's samples (runSession) and, for a process,
// lets it go at the end: the command's exit status is then its own.
func (t sessionTarget) run(ctx context.Context, sess api.Session, o runOptions, env Env,
	onSample func(elapsed time.Duration, s api.Sample)) (runResult, error) {
	if t.proc == nil {
		return runSession(ctx, t.host, sess, o, env, onSample)
	}
	o.Command, o.Started, o.RunOn = nil, t.proc.started(), true
	if o.Started == nil && o.Duration == 0 {
		o.Waiting = strings.Replace(o.Waiting, "; Ctrl-C", fmt.Sprintf(" in process %d until it exits; Ctrl-C", t.proc.pid), 1)
	}
	res, err := runSession(ctx, t.host, sess, o, env, onSample)
	res.ExitStatus = t.proc.finish(env.Err)
	return res, err
}

// function is how a report prints a function's name: a process's
// demangled (C++, Rust), its library kept.
func (t sessionTarget) function(name string) string {
	if t.proc == nil {
		return name
	}
	if lib, fn, ok := strings.Cut(name, ":"); ok {
		return lib + ":" + unwind.Demangle(fn)
	}
	return unwind.Demangle(name)
}

// removed says what the end of a run did with the splices: removed
// (kerninstd's, or a live process's), or, for a process that exited or
// ran exec, that they went with it.
func (t sessionTarget) removed(probes []api.Probe) string {
	if t.proc == nil {
		return "(" + removedWhat(probes) + " removed)"
	}
	return fmt.Sprintf("in process %d (%s)", t.proc.pid, t.proc.ended())
}

// removedTimers is removed for a time report's functions.
func (t sessionTarget) removedTimers(fns []output.TimedFunction) string {
	probes := make([]api.Probe, len(fns))
	for i, f := range fns {
		probes[i].Mechanism = f.Mechanism
	}
	return t.removed(probes)
}

// procTarget is a user process under `kinst count -p`, `kinst time
// --user` or `kinst cover --user`:
// its sessions are a procsession.Host in kinst itself, splicing through
// ptrace and a shared memfd (package process); no kerninstd is involved.
// With -- CMD the command is started stopped at its entry point (its
// libraries mapped) and spliced before its own code runs.
type procTarget struct {
	host *procsession.Host
	pid  int
	cmd  *exec.Cmd // -- CMD, nil when attached to a running process
	end  string    // how the run ended (api's Ended), set by finish
}

// processTarget attaches to pid, or starts command stopped and attaches
// to it.
func processTarget(pid int, command []string, env Env, o procsession.Options) (sessionTarget, error) {
	p := &procTarget{pid: process.ThreadGroup(pid)}
	if p.pid != pid && pid != 0 {
		fmt.Fprintf(env.Err, "kinst: %d is a thread of process %d: splicing the process (its threads share its text)\n", pid, p.pid)
	}
	if len(command) > 0 {
		p.cmd = exec.Command(command[0], command[1:]...)
		p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = env.CmdIn, env.CmdOut, env.CmdErr
		if err := process.Start(p.cmd); err != nil {
			return sessionTarget{}, err
		}
		p.pid = p.cmd.Process.Pid
	}
	o.Log = env.Err
	h, err := procsession.Open(p.pid, o)
	if err != nil {
		p.kill()
		return sessionTarget{}, err
	}
	p.host = h
	// Source lines, from the executable's DWARF: its functions only.
	lines := func(points []string) (linePoints, error) {
		return expandLines(points, env.Err, p.executableDebug, func(fn, lib string) (*debuginfo.File, string, error) {
			if lib == "" {
				return nil, "", fmt.Errorf("%s is not in the executable's DWARF (a library's line: LIB:FILE:LINE)", fn)
			}
			f, err := p.host.LibraryDebug(lib)
			return f, lib + ":", err
		})
	}
	return sessionTarget{host: processHost{h}, lines: lines, proc: p}, nil
}

// executableDebug is the process's executable's DWARF, for its source
// lines.
func (p *procTarget) executableDebug() (*debuginfo.File, error) {
	exe := fmt.Sprintf("/proc/%d/exe", p.pid)
	dbg, err := debuginfo.OpenOrFind(exe)
	if err != nil {
		return nil, fmt.Errorf("a source line in a process needs the executable's DWARF (build it with -g) or its debug file: %w", err)
	}
	dbg.PlaceMergedLines() // a program's lines as gdb places them
	if real, err := os.Readlink(exe); err == nil && dbg.Path == exe {
		dbg.Path = real // what reports name: the file, not the link
	}
	return dbg, nil
}

// functionDebug opens the debug information of the process's function
// cfg describes (its executable's or its library's: their DWARF, or their
// debug files by build id) and finds the function's link-time address
// there. The caller closes the file.
func (p *procTarget) functionDebug(cfg api.CFG) (*debuginfo.File, uint64, error) {
	var dbg *debuginfo.File
	var err error
	if cfg.Module == "" {
		dbg, err = p.executableDebug()
	} else {
		dbg, err = p.host.LibraryDebug(cfg.Module)
	}
	if err != nil {
		return nil, 0, err
	}
	link, err := linkAddr(dbg.Symbols(), unqualified(cfg))
	if err != nil {
		dbg.Close()
		return nil, 0, fmt.Errorf("%s: %w (in %s)", cfg.Function, err, dbg.Path)
	}
	return dbg, link, nil
}

// unqualified is a process's CFG with its function named as its library
// names it: the host qualifies a library's functions (LIB:NAME).
func unqualified(cfg api.CFG) api.CFG {
	cfg.Function = strings.TrimPrefix(cfg.Function, cfg.Module+":")
	return cfg
}

// abort lets the process go when no session could be made: a started
// command is killed.
func (p *procTarget) abort() {
	p.host.Close()
	p.kill()
}

func (p *procTarget) kill() {
	if p.cmd != nil && p.cmd.ProcessState == nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	}
}

// started is a started command as runSession waits for it; nil when
// kinst attached to a running process.
func (p *procTarget) started() Process {
	if p.cmd == nil {
		return nil
	}
	return tracedChild{p}
}

// tracedChild is a started command as runSession waits for it: Wait lets
// it run (it was started stopped), within the run. Its exit is seen in
// /proc, not by waiting: kinst may hold its threads in ptrace stops at
// any time (a splice, a sweep), and a wait would take those stops. It is
// reaped by finish, after the host has let it go.
type tracedChild struct{ p *procTarget }

func (c tracedChild) Wait() int {
	unix.Kill(c.p.pid, unix.SIGCONT)
	for process.Alive(c.p.pid) {
		time.Sleep(5 * time.Millisecond) // the run's end, and a rate's
	}
	return 0 // the status is finish's
}

func (c tracedChild) Signal(s os.Signal) error { return c.p.cmd.Process.Signal(s) }

// finish notes how the process went, lets it go (Close removes what is
// still spliced) and reaps a started command: its exit status, nil when
// kinst attached to a running process.
func (p *procTarget) finish(stderr io.Writer) *int {
	p.end = p.host.Ended()
	if p.end == "" {
		p.end = "removed"
	}
	if err := p.host.Close(); err != nil {
		fmt.Fprintf(stderr, "kinst: detach: %v\n", err)
	}
	if p.cmd == nil {
		return nil
	}
	if process.Alive(p.pid) {
		p.cmd.Process.Signal(os.Interrupt)
	}
	s := process.Wait(p.cmd)
	return &s
}

// ended is how the run ended, in words for the text report.
func (p *procTarget) ended() string {
	switch p.end {
	case "exec":
		return "it ran exec: the splices went with its old program"
	case "exited":
		return "it exited"
	}
	return "splices removed"
}

// errProcessFlags is a kernel session's flag given with -p.
var errProcessFlags = errors.New("--name and --ttl name kerninstd sessions; a process's probes live as long as kinst does")
