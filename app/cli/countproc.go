package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/arch/x86/x86asm"
	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/process"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/unwind"
)

// procRun is a process under `kinst count -p` or `kinst time -p`: the
// engine runs in kinst itself, splicing the process through ptrace and a
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

// procCounters are `kinst count -p`'s counters in a process: one per
// point, spliced now or, for a point in a library not loaded yet, when
// the process loads it.
type procCounters struct {
	r              *procRun
	interval       time.Duration
	points, labels []string
	sites          []*splice.Site
	reqs           []*engine.Request // nil: not spliced (yet)
	pending        map[int]bool      // points whose library is not loaded yet
	start          time.Time
}

// resolve resolves every point, and splices those whose code is mapped:
// all or none.
func (c *procCounters) resolve() error {
	n := len(c.points)
	c.sites, c.reqs, c.pending = make([]*splice.Site, n), make([]*engine.Request, n), map[int]bool{}
	var now []int
	for i, p := range c.points {
		s, err := c.r.tg.Resolve(p)
		if errors.Is(err, process.ErrNoLibrary) {
			c.pending[i] = true
			fmt.Fprintf(c.r.stderr, "kinst: %s: the library is not loaded yet; the counter is spliced when the process loads it (kinst looks every %s: calls before that are not counted)\n", p, c.interval)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		c.sites[i] = s
		now = append(now, i)
	}
	c.start = time.Now()
	return c.count(now)
}

// count splices the points idx names, all or none.
func (c *procCounters) count(idx []int) error {
	ss := make([]*splice.Site, len(idx))
	for k, i := range idx {
		ss[k] = c.sites[i]
	}
	rs, err := c.r.tg.Count("kinst", ss)
	if err != nil {
		return err
	}
	for k, i := range idx {
		c.reqs[i] = rs[k]
		s, in := c.sites[i], c.r.tg.Installed(rs[k])
		fmt.Fprintf(c.r.stderr, "kinst: spliced %s in process %d at %s (%#x): %q, %s splice\n", c.labels[i], c.r.pid, s.Where(), s.Addr(), s.Insn().String(), in.Class)
	}
	return nil
}

// load splices the pending points whose library the process has loaded
// since the last look.
func (c *procCounters) load() {
	if !c.r.loaded(len(c.pending)) {
		return
	}
	for i := range c.pending {
		s, err := c.r.tg.Resolve(c.points[i])
		if errors.Is(err, process.ErrNoLibrary) {
			continue
		}
		delete(c.pending, i)
		if err == nil {
			c.sites[i] = s
			err = c.count([]int{i})
		}
		if err != nil {
			fmt.Fprintf(c.r.stderr, "kinst: %s: %v\n", c.labels[i], err)
			continue
		}
		fmt.Fprintf(c.r.stderr, "kinst: %s: its library was loaded %s after the start\n", c.labels[i], time.Since(c.start).Round(time.Millisecond))
	}
}

// counter is point i's count so far.
func (c *procCounters) counter(i int) uint64 {
	if c.reqs[i] == nil {
		return 0
	}
	return c.r.tg.Counter(c.reqs[i], 0)
}

// probes are the report's probes, and the requests to remove.
func (c *procCounters) probes() ([]api.CountProbe, []*engine.Request) {
	var probes []api.CountProbe
	var spliced []*engine.Request
	for i, q := range c.reqs {
		if q == nil { // its library never loaded
			fmt.Fprintf(c.r.stderr, "kinst: %s: the library was not seen loaded: nothing counted\n", c.labels[i])
			probes = append(probes, api.CountProbe{Point: c.labels[i], Mechanism: "none"})
			continue
		}
		s := c.sites[i]
		probes = append(probes, api.CountProbe{Point: c.labels[i], Function: s.Fn.Name, Offset: s.Addr() - s.Fn.Addr,
			Address: api.Addr(s.Addr()), Count: c.r.tg.Counter(q, 0), Mechanism: "splice"})
		spliced = append(spliced, q)
	}
	return probes, spliced
}

// openCountProcess checks o, opens the process (or starts -- CMD) and
// resolves and splices o's points. On error it gives the exit status:
// 2 for a usage error.
func openCountProcess(pid int, o *CountOptions, env Env) (*procCounters, int, error) {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Name != "" || o.TTL != 0 {
		return nil, 2, errors.New("count -p: --name and --ttl name kerninstd sessions; a process's counters live as long as kinst does")
	}
	if err := checkOutputDir("count", o.SVG); err != nil {
		return nil, 2, err
	}
	r, err := openProcess(pid, o.Command, env)
	if err != nil {
		return nil, 1, err
	}
	// Source lines, from the executable's DWARF: its functions only.
	lp, err := expandLines(o.Points, env.Err, func() (*debuginfo.File, error) {
		dbg, err := debuginfo.Open(fmt.Sprintf("/proc/%d/exe", r.pid))
		if err != nil {
			return nil, fmt.Errorf("a source line in a process needs the executable's DWARF (build it with -g): %w", err)
		}
		return dbg, nil
	})
	c := &procCounters{r: r, interval: o.Interval, points: lp.points, labels: lp.labels}
	if err == nil {
		err = c.resolve()
	}
	if err != nil {
		r.tg.Close()
		r.kill()
		return nil, 1, err
	}
	return c, 0, nil
}

// CountProcess is `kinst count -p PID` (or -p 0 -- CMD).
func CountProcess(ctx context.Context, pid int, o CountOptions, env Env) (int, error) {
	stdout, stderr := env.Out, env.Err
	c, code, err := openCountProcess(pid, &o, env)
	if err != nil {
		return code, err
	}
	report := api.CountReport{IntervalNS: int64(o.Interval)}
	last := make([]uint64, len(c.reqs))
	if !o.JSON {
		fmt.Fprintf(stdout, "%8s  %-24s  %12s  %12s\n", "time", "location", "+interval", "total")
	}
	series := make([]metrics.Series, len(c.reqs))
	begin := time.Now()
	for i := range series {
		series[i].Name = c.labels[i]
		series[i].Add(metrics.Point{Time: begin})
	}
	dur := c.r.run(ctx, o.Duration, o.Interval, func(el time.Duration) {
		c.load()
		deltas := make([]uint64, len(c.reqs))
		for i := range c.reqs {
			n := c.counter(i)
			deltas[i], last[i] = n-last[i], n
			series[i].Add(metrics.Point{Time: time.Now(), Calls: n})
			if !o.JSON {
				fmt.Fprintf(stdout, "%8.3f  %-24s  %12d  %12d\n", el.Seconds(), c.labels[i], deltas[i], n)
			}
		}
		report.Intervals = append(report.Intervals, api.CountSample{ElapsedNS: int64(el), Deltas: deltas})
	})
	report.DurationNS = int64(dur)
	probes, spliced := c.probes()
	report.Probes = probes
	report.ExitStatus = c.r.finish(func() []error { return c.r.tg.RemoveEach(spliced) }, stderr)
	report.Ended = c.r.end
	exit, err := plotAfter(report.ExitStatus, o.SVG, "kinst count", series, stderr)
	if err != nil {
		return exit, err
	}
	if o.JSON {
		return exit, writeJSON(stdout, report)
	}
	fmt.Fprintf(stdout, "\ncounts over %.3f s in process %d (%s):\n", dur.Seconds(), c.r.pid, c.r.ended())
	return exit, printCounts(stdout, report.Probes, unwind.Demangle)
}

// TimeProcess is `kinst time -p PID FUNC…` (or -p 0 -- CMD): calls, wall
// time and concurrency of functions in a user process, from the same
// timer words as the kernel's.
func TimeProcess(ctx context.Context, pid int, o TimeOptions, env Env) (int, error) {
	stdout, stderr := env.Out, env.Err
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Virtual || o.Lock != "" || o.Filter.PID != 0 || o.Filter.TID != 0 || o.Filter.Comm != "" || o.Name != "" || o.TTL != 0 {
		return 2, errors.New("time --user: --virtual, --lock, filters, --name and --ttl are for the kernel")
	}
	if err := checkOutputDir("time", o.SVG); err != nil {
		return 2, err
	}
	r, err := openProcess(pid, o.Command, env)
	if err != nil {
		return 1, err
	}
	timers, err := r.time(o.Functions)
	if err != nil {
		r.tg.Close()
		r.kill()
		return 1, err
	}
	untime := func() []error {
		var errs []error
		for _, tm := range timers {
			errs = append(errs, r.tg.Untime(tm))
		}
		return errs
	}
	read := timerReader(timers)
	points := make([]metrics.Point, len(timers))
	series := make([]metrics.Series, len(timers))
	for i := range timers {
		points[i] = read(i)
	}
	// The first reads calibrate the clock (a fraction of a second): the
	// rates start after them.
	start := time.Now()
	for i := range timers {
		points[i].Time = start
		series[i].Name = timers[i].Function
		series[i].Add(points[i])
	}
	first := append([]metrics.Point(nil), points...)
	report := api.TimeReport{Session: fmt.Sprintf("process %d", r.pid), IntervalNS: int64(o.Interval)}
	if !o.JSON {
		fmt.Fprintf(stdout, "%8s  %-24s  %10s  %12s  %12s  %11s\n", "time", "function", "calls/s", "avg wall", "total wall", "concurrency")
	}
	dur := r.run(ctx, o.Duration, o.Interval, func(el time.Duration) {
		iv := api.TimeInterval{ElapsedNS: int64(el)}
		for i := range timers {
			p := read(i)
			d := metrics.Derive(points[i], p)
			points[i] = p
			series[i].Add(p)
			iv.Functions = append(iv.Functions, api.Rates(d))
			if !o.JSON {
				fmt.Fprintf(stdout, "%8.3f  %-24s  %10.0f  %12s  %12s  %11.3f\n", el.Seconds(), timers[i].Function, d.CallsPerSec, fmtNS(d.AvgWallNS), fmtNS(p.WallNS), d.Concurrency)
			}
		}
		report.Intervals = append(report.Intervals, iv)
	})
	report.DurationNS = int64(dur)
	for i, tm := range timers {
		report.Functions = append(report.Functions, timedFunction(tm, first[i], read(i)))
	}
	report.ExitStatus = r.finish(untime, stderr)
	report.Ended = r.end
	exit, err := plotAfter(report.ExitStatus, o.SVG, "kinst time", series, stderr)
	if err != nil {
		return exit, err
	}
	if o.JSON {
		return exit, writeJSON(stdout, report)
	}
	fmt.Fprintf(stdout, "\ntotals over %.3f s in process %d (%s):\n", dur.Seconds(), r.pid, r.ended())
	return exit, printTimeTotals(stdout, report.Functions)
}

// printTimeTotals is the table of `kinst time -p`'s totals.
func printTimeTotals(w io.Writer, fns []api.TimedFunction) error {
	tw := newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "calls\tcalls/s\ttotal wall\tavg wall\tconcurrency\tfunction\t")
	for _, f := range fns {
		fmt.Fprintf(tw, "%d\t%.0f\t%s\t%s\t%.3f\t%s\t\n", f.Calls, f.CallsPerSec, fmtNS(f.WallNS), fmtNS(f.AvgWallNS), f.Concurrency, f.Function)
	}
	return tw.Flush()
}

// time puts timers on fns, all or none, saying where on stderr.
func (r *procRun) time(fns []string) ([]*process.Timer, error) {
	var timers []*process.Timer
	for _, fn := range fns {
		tm, err := r.tg.Time("kinst", fn)
		if err != nil {
			for _, t := range timers {
				r.tg.Untime(t)
			}
			return nil, err
		}
		timers = append(timers, tm)
		var exits []string
		for _, x := range tm.Exits {
			exits = append(exits, fmt.Sprintf("+%#x", x.Addr()-x.Fn.Addr))
		}
		fmt.Fprintf(r.stderr, "kinst: timing %s in process %d: entry at +%#x, %d exit(s) at %s\n", tm.Function, r.pid,
			tm.Entry.Addr()-tm.Entry.Fn.Addr, len(tm.Exits), strings.Join(exits, " "))
		if callsItself(tm.Entry.Fn) {
			fmt.Fprintf(r.stderr, "kinst: %s calls itself: every active frame is timed, so total wall counts nested calls again and concurrency is the average depth\n", tm.Function)
		}
	}
	return timers, nil
}

// timerReader reads process timers as metrics points: read(i) is
// timers[i]'s calls and wall time so far.
func timerReader(timers []*process.Timer) (read func(i int) metrics.Point) {
	clock := metrics.NewClock()
	accs := make([]metrics.TimerAcc, len(timers))
	return func(i int) metrics.Point {
		calls, w := timers[i].Read()
		ticks := accs[i].Add(w, metrics.TSC())
		return metrics.Point{Time: time.Now(), Calls: calls, WallNS: clock.Nanos(ticks), Inside: metrics.TimerInside(w)}
	}
}

// timedFunction is a timer's line of the report, from its first and
// last reads.
func timedFunction(tm *process.Timer, first, last metrics.Point) api.TimedFunction {
	d := metrics.Derive(first, last)
	tf := api.TimedFunction{Function: tm.Function, Entry: at(api.Resolved{Function: tm.Entry.Fn.Name, Offset: tm.Entry.Addr() - tm.Entry.Fn.Addr}),
		Calls: last.Calls, CallsPerSec: d.CallsPerSec, WallNS: last.WallNS, AvgWallNS: d.AvgWallNS, Concurrency: d.Concurrency, Mechanism: "splice"}
	for _, x := range tm.Exits {
		tf.Exits = append(tf.Exits, fmt.Sprintf("%s+%#x", x.Fn.Name, x.Addr()-x.Fn.Addr))
	}
	return tf
}

// plotAfter is the exit status of a process run (0 when it goes on)
// and, with svg, its plot written.
func plotAfter(status *int, svg, title string, series []metrics.Series, stderr io.Writer) (int, error) {
	exit := 0
	if status != nil {
		exit = *status
	}
	if err := writePlot(svg, title, series, stderr); err != nil {
		return max(exit, 1), err
	}
	return exit, nil
}

// callsItself: fn has a direct call to its own entry, recursion a timer
// sees as nested frames (a tail call to itself is an exit, then an entry).
func callsItself(fn *cfg.Function) bool {
	for i := range fn.Insns {
		in := &fn.Insns[i]
		if in.Inst.Op != x86asm.CALL {
			continue
		}
		if to, ok := cfg.BranchTarget(in); ok && to == fn.Addr {
			return true
		}
	}
	return false
}
