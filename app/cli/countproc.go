package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/process"
	"github.com/kinst/kinst/splice"
)

// CountProcess is `kinst count -p PID` (or `kinst count -p 0 … -- CMD`,
// a command started stopped and spliced before it runs): the engine runs
// in kinst itself, splicing the process through ptrace and a shared
// memfd (package process); no kerninstd is involved.
func CountProcess(ctx context.Context, pid int, o CountOptions, env Env) (int, error) {
	stdout, stderr := env.Out, env.Err
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	// CMD is reaped only after kinst has let it go: while kinst traces
	// it, a wait for it would take ptrace's stops for its exit.
	var cmd *exec.Cmd
	if len(o.Command) > 0 {
		cmd = exec.Command(o.Command[0], o.Command[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = env.CmdIn, env.CmdOut, env.CmdErr
		if err := process.Start(cmd); err != nil {
			return 1, err
		}
		pid = cmd.Process.Pid
		defer func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		}()
	}
	lib := ""
	for _, p := range o.Points {
		if i := strings.IndexByte(p, ':'); i >= 0 {
			if _, err := strconv.Atoi(p[i+1:]); err != nil {
				lib = p[:i]
			}
		}
	}
	tg, err := process.Attach(pid, lib)
	if err != nil {
		return 1, err
	}
	sites := make([]*splice.Site, len(o.Points))
	for i, p := range o.Points {
		if sites[i], err = tg.Resolve(p); err != nil {
			tg.Close()
			return 1, fmt.Errorf("%s: %w", p, err)
		}
	}
	reqs, err := tg.Count("kinst", sites)
	if err != nil {
		tg.Close()
		return 1, err
	}
	for i, s := range sites {
		in := tg.Eng.Installed(reqs[i])
		fmt.Fprintf(stderr, "kinst: spliced %s in process %d at %s (%#x): %q, %s splice\n", o.Points[i], pid, s.Where(), s.Addr(), s.Insn().String(), in.Class)
	}
	start := time.Now()
	if cmd != nil {
		unix.Kill(pid, unix.SIGCONT)
	}
	report := api.CountReport{IntervalNS: int64(o.Interval)}
	last := make([]uint64, len(reqs))
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	var deadline <-chan time.Time
	if o.Duration > 0 {
		deadline = time.After(o.Duration)
	}
	gone := make(chan struct{})
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go func() { // the process may exit on its own
		for alive(pid) {
			select {
			case <-stopWatch:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		close(gone)
	}()
	if !o.JSON {
		fmt.Fprintf(stdout, "%8s  %-24s  %12s  %12s\n", "time", "location", "+interval", "total")
	}
	sample := func() {
		el := time.Since(start)
		deltas := make([]uint64, len(reqs))
		for i, r := range reqs {
			n := tg.Dev.Counter(r.Counter())
			deltas[i], last[i] = n-last[i], n
			if !o.JSON {
				fmt.Fprintf(stdout, "%8.3f  %-24s  %12d  %12d\n", el.Seconds(), o.Points[i], deltas[i], n)
			}
		}
		report.Intervals = append(report.Intervals, api.CountSample{ElapsedNS: int64(el), Deltas: deltas})
	}
	var status *int
loop:
	for {
		select {
		case <-tick.C:
			sample()
		case <-deadline:
			break loop
		case <-ctx.Done():
			break loop
		case <-gone:
			break loop
		}
	}
	report.DurationNS = int64(time.Since(start))
	for i, r := range reqs {
		s := sites[i]
		report.Probes = append(report.Probes, api.CountProbe{Point: o.Points[i], Function: s.Fn.Name, Offset: s.Addr() - s.Fn.Addr,
			Address: api.Addr(s.Addr()), Count: tg.Dev.Counter(r.Counter()), Mechanism: "splice"})
	}
	if alive(pid) { // an exited process's text went with it
		for _, e := range tg.Eng.RemoveEach(reqs) {
			if e != nil {
				fmt.Fprintf(stderr, "kinst: remove: %v\n", e)
			}
		}
		if err := tg.Close(); err != nil {
			fmt.Fprintf(stderr, "kinst: detach: %v\n", err)
		}
	} else {
		tg.Abandon()
	}
	if cmd != nil {
		if alive(pid) {
			cmd.Process.Signal(os.Interrupt) // --duration or Ctrl-C ended the count
		}
		err := cmd.Wait()
		s := 0
		if ee, ok := err.(*exec.ExitError); ok {
			s = ee.ExitCode()
		}
		status = &s
	}
	report.ExitStatus = status
	exit := 0
	if status != nil {
		exit = *status
	}
	if o.JSON {
		return exit, writeJSON(stdout, report)
	}
	fmt.Fprintf(stdout, "\ncounts over %.3f s in process %d (splices removed):\n", time.Duration(report.DurationNS).Seconds(), pid)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "count\tpoint\tlocation\taddress")
	for _, p := range report.Probes {
		fmt.Fprintf(tw, "%d\t%s\t%s+%#x\t%#x\n", p.Count, p.Point, p.Function, p.Offset, uint64(p.Address))
	}
	return exit, tw.Flush()
}

// alive: the process exists and has not exited (a zombie has).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}
