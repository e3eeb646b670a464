package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/internal/outfile"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/procsession"
)

// TimeOptions are the flags of `kinst time`.
type TimeOptions struct {
	Functions []string
	Lock      string // waiters on this mutex instead of Functions
	Filter    api.Filter
	Virtual   bool
	Duration  time.Duration
	Interval  time.Duration
	// TotalsOnly leaves out the rows every Interval (--interval 0).
	TotalsOnly bool
	JSON       bool
	SVG        string // write an SVG chart here
	Name       string
	TTL        time.Duration
	Command    []string
	Debug      DebugOptions // the debug vmlinux of FILE:A-B regions
}

// Time times kernel functions: calls, wall time, concurrency.
func Time(ctx context.Context, c *api.Client, o TimeOptions, env Env) (int, error) {
	if len(o.Functions) == 0 && o.Lock == "" {
		return 2, errors.New("time: name at least one kernel function")
	}
	funcs, ranges := splitLineRanges(o.Functions)
	var regions []api.Region
	if len(ranges) > 0 {
		var err error
		regions, err = lineRegions(ranges, env.Err, func(mod string) (*debuginfo.File, string, error) {
			if mod == "" {
				dbg, err := debugForDaemon(ctx, c, o.Debug)
				if err != nil {
					return nil, "", fmt.Errorf("a source line range needs the kernel's debug vmlinux: %w", err)
				}
				return dbg, "", nil
			}
			f, err := findLoadedModule(ctx, c, mod, o.Debug)
			return f, kernelModule(mod) + ":", err // MODULE:FUNC: a static name may be the core kernel's too
		})
		if err != nil {
			return 1, err
		}
	}
	o.Functions = funcs
	t := kernelTarget(ctx, c, o.Debug, env.Err)
	t.regions = regions
	return timeOn(ctx, t, o, env)
}

// timedRange matches a source line range, FILE:A-B, or one line FILE:A,
// as a timer.
var timedRange = regexp.MustCompile(`^(.+\.(?:c|h|S|s|rs|cc|cpp)):([0-9]+)(?:-([0-9]+))?$`)

// splitLineRanges sets the FILE:A-B (and FILE:LINE) timers apart from
// the functions.
func splitLineRanges(timers []string) (funcs, ranges []string) {
	for _, s := range timers {
		if timedRange.MatchString(s) {
			ranges = append(ranges, s)
		} else {
			funcs = append(funcs, s)
		}
	}
	return funcs, ranges
}

// lineRegions are the timed regions of FILE:A-B ranges: the code of the
// lines in each function holding some (debuginfo.LineRangeSpans), as
// offsets into the function, which the session's host plans
// (splice.Func.RegionSites). open opens a module's debug file ("" the
// kernel's vmlinux, or a process's executable) and says what goes before
// its function names (a process's library: LIB:).
func lineRegions(ranges []string, w io.Writer, open func(mod string) (*debuginfo.File, string, error)) ([]api.Region, error) {
	files := map[string]*debuginfo.File{} // by module, "" the vmlinux
	prefixes := map[string]string{}       // before a module's function names: a process's LIB:
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var out []api.Region
	for _, r := range ranges {
		m := timedRange.FindStringSubmatch(r)
		lo, _ := strconv.Atoi(m[2])
		hi := lo
		if m[3] != "" {
			hi, _ = strconv.Atoi(m[3])
		}
		if lo <= 0 || hi < lo {
			return nil, fmt.Errorf("%s: want FILE:A-B with 0 < A ≤ B", r)
		}
		mod, file := splitModuleFile(m[1])
		dbg := files[mod]
		if dbg == nil {
			var err error
			if dbg, prefixes[mod], err = open(mod); err != nil {
				return nil, fmt.Errorf("%s: %w", r, err)
			}
			files[mod] = dbg
		}
		fss, err := dbg.LineRangeSpans(file, lo, hi)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (in %s)", r, err, dbg.Path)
		}
		for _, fs := range fss {
			reg := api.Region{Name: r, Function: prefixes[mod] + fs.Func}
			if len(fss) > 1 {
				reg.Name = r + " in " + fs.Func
			}
			var spans []string
			for _, sp := range fs.Spans {
				reg.Spans = append(reg.Spans, api.OffsetSpan{Lo: sp.Lo - fs.Addr, Hi: sp.Hi - fs.Addr})
				spans = append(spans, fmt.Sprintf("+%#x-%#x", sp.Lo-fs.Addr, sp.Hi-fs.Addr))
			}
			fmt.Fprintf(w, "kinst: %s is %s of %s\n", r, strings.Join(spans, ", "), fs.Func)
			out = append(out, reg)
		}
	}
	return out, nil
}

// TimeProcess is `kinst time -p PID FUNC…` (or -p 0 -- CMD): calls, wall
// time and concurrency of functions in a user process, from the same
// timer words as the kernel's, in the same session.
func TimeProcess(ctx context.Context, pid int, o TimeOptions, env Env) (int, error) {
	if len(o.Functions) == 0 {
		return 2, errors.New("time -p: name at least one function")
	}
	funcs, ranges := splitLineRanges(o.Functions)
	if o.Virtual || o.Lock != "" || o.Filter != (api.Filter{}) {
		return 2, errors.New("time -p: --virtual, --lock and the filters are for the kernel")
	}
	if o.Name != "" || o.TTL != 0 {
		return 2, fmt.Errorf("time -p: %w", errProcessFlags)
	}
	if err := checkOutputDir("time", o.SVG); err != nil {
		return 2, err
	}
	t, err := processTarget(pid, o.Command, env, procsession.Options{})
	if err != nil {
		return 1, err
	}
	if len(ranges) > 0 {
		// The executable's functions, from its DWARF (a library's lines
		// are not yet).
		t.regions, err = lineRegions(ranges, env.Err, func(lib string) (*debuginfo.File, string, error) {
			if lib != "" {
				f, err := t.proc.host.LibraryDebug(lib)
				return f, lib + ":", err
			}
			f, err := t.proc.executableDebug()
			return f, "", err
		})
		if err != nil {
			t.proc.abort()
			return 1, err
		}
	}
	o.Functions = funcs
	return timeOn(ctx, t, o, env)
}

// timeOn is `kinst time` on a target.
func timeOn(ctx context.Context, t sessionTarget, o TimeOptions, env Env) (int, error) {
	stdout, stderr := env.Out, env.Err
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	req := t.request(timeRequest(&o))
	req.Regions = t.regions
	asked := env.now()
	sess, err := t.host.CreateSession(ctx, req)
	if err != nil {
		if t.proc != nil {
			t.proc.abort()
		}
		return 1, err
	}
	for _, t := range sess.Timers {
		describeTimer(stderr, t)
	}
	series, width := timerSeries(sess)
	report := output.TimeReport{Session: sess.Name, IntervalNS: int64(o.Interval)}
	if o.TotalsOnly {
		report.IntervalNS = 0
	}
	if t.proc != nil {
		report.Session = fmt.Sprintf("process %d", t.proc.pid)
	}
	if len(sess.Timers) > 0 {
		report.Filter = sess.Timers[0].Filter
	}
	if !o.JSON && !o.TotalsOnly {
		fmt.Fprintf(stdout, "%8s  %-*s  %10s  %12s  %12s  %11s  %6s\n", "time", width, "function", "calls/s", "avg wall", "avg virtual", "concurrency", "inside")
	}
	res, err := t.run(ctx, sess, runOptions{Duration: o.Duration, Interval: o.Interval, Command: o.Command,
		Waiting: "kinst: timing; Ctrl-C to stop"}, env,
		func(el time.Duration, s api.Sample) {
			if report.FirstDataNS == 0 {
				report.FirstDataNS = int64(env.since(asked))
			}
			iv := output.TimeInterval{ElapsedNS: int64(el)}
			for i, p := range s.Timers {
				if i >= len(series) {
					break
				}
				prev := series[i].Points[len(series[i].Points)-1]
				series[i].Add(metrics.Point(p))
				r := metrics.Derive(prev, metrics.Point(p))
				iv.Functions = append(iv.Functions, output.Rates(r))
				if !o.JSON && !o.TotalsOnly {
					virt := "-"
					if o.Virtual {
						virt = fmtNS(r.AvgVirtualNS)
					}
					fmt.Fprintf(stdout, "%8.3f  %-*s  %10.0f  %12s  %12s  %11.3f  %6d\n", el.Seconds(), width, series[i].Name,
						r.CallsPerSec, fmtNS(r.AvgWallNS), virt, r.Concurrency, p.Inside)
				}
			}
			if !o.TotalsOnly {
				report.Intervals = append(report.Intervals, iv)
			}
		})
	report.ExitStatus = res.ExitStatus
	status := res.status()
	if err != nil {
		return max(status, 1), err
	}
	if t.proc != nil {
		report.Ended = t.proc.end
	}
	report.DurationNS = int64(res.Duration)
	report.DetachNS = int64(res.Detach)
	for i, t := range res.Final.Timers {
		tf, last := sessionTotals(t, sess.Created, res.Duration)
		report.Functions = append(report.Functions, tf)
		if i < len(series) {
			series[i].Add(last)
		}
	}
	if err := writePlot(o.SVG, "kinst time", series, stderr); err != nil {
		return max(status, 1), err
	}
	if o.JSON {
		return status, writeJSON(stdout, report)
	}
	return status, printTimeReport(stdout, report, res.Duration, t.removedTimers(report.Functions))
}

// timeRequest is the session o asks for.
func timeRequest(o *TimeOptions) api.SessionRequest {
	req := api.SessionRequest{Timers: o.Functions, Tied: true, Name: o.Name, TTLNS: int64(o.TTL), Virtual: o.Virtual, Lock: o.Lock}
	if o.Lock != "" {
		o.Virtual = true // the daemon splits each wait into spinning and sleeping
	}
	if o.Filter != (api.Filter{}) {
		f := o.Filter
		req.Filter = &f
	}
	return req
}

// timerSeries starts a plot series for each of the session's timers at
// its creation, and gives the width of the longest function's name.
func timerSeries(sess api.Session) (series []metrics.Series, width int) {
	series, width = make([]metrics.Series, len(sess.Timers)), 8
	for i, t := range sess.Timers {
		series[i].Name = t.Function
		p := metrics.Point(t.Totals)
		p.Time = sess.Created
		series[i].Add(p)
		width = max(width, len(t.Function))
	}
	return series, width
}

// sessionTotals is a timer's totals over its session's whole life, as
// the daemon saw it, with its rates over the run (dur: what the report
// says the totals are over; the session's life adds the arming and the
// removal around it, in which a command's process makes no call), and
// its last point.
func sessionTotals(t api.TimerInfo, created time.Time, dur time.Duration) (output.TimedFunction, metrics.Point) {
	last := metrics.Point(t.Totals)
	first := last
	first.Calls, first.WallNS, first.VirtualNS, first.Time = 0, 0, 0, created
	if dur > 0 {
		first.Time = last.Time.Add(-dur)
	}
	r := metrics.Derive(first, last)
	tf := output.TimedFunction{Function: t.Function, Entry: at(t.Entry), Calls: t.Calls, CallsPerSec: r.CallsPerSec,
		WallNS: t.WallNS, AvgWallNS: r.AvgWallNS, Concurrency: r.Concurrency, Mechanism: t.Mechanism}
	for _, e := range t.Exits {
		tf.Exits = append(tf.Exits, at(e))
	}
	if t.Virtual {
		v, avg := t.VirtualNS, r.AvgVirtualNS
		tf.VirtualNS, tf.AvgVirtual = &v, &avg
	}
	return tf, last
}

// printTimeReport is `kinst time`'s table of totals; removed says what
// became of the splices (sessionTarget.removed).
func printTimeReport(w io.Writer, report output.TimeReport, dur time.Duration, removed string) error {
	fmt.Fprintf(w, "\ntotals over %s %s%s:\n", fmtSeconds(dur), removed, filterNote(report.Filter))
	tw := newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "calls\tcalls/s\ttotal wall\tavg wall\ttotal virtual\tavg virtual\tconcurrency\tfunction\t")
	for _, f := range report.Functions {
		tv, av := "-", "-"
		if f.VirtualNS != nil {
			tv, av = fmtNS(*f.VirtualNS), fmtNS(*f.AvgVirtual)
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%s\t%s\t%s\t%s\t%.3f\t%s\t\n", f.Calls, f.CallsPerSec, fmtNS(f.WallNS), fmtNS(f.AvgWallNS), tv, av, f.Concurrency, f.Function)
	}
	return tw.Flush()
}

// fmtSeconds is a run's length: seconds to the millisecond, and a run
// shorter than a tenth of a second to the microsecond (a command's 5 ms
// said "0.005 s", a 400 µs one "0.000 s").
func fmtSeconds(d time.Duration) string {
	if d < 100*time.Millisecond {
		return fmt.Sprintf("%.3f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.3f s", d.Seconds())
}

func filterNote(f string) string {
	if f == "" {
		return ""
	}
	return ", only " + f
}

func at(r api.Resolved) string { return fmt.Sprintf("%s+%#x", r.Function, r.Offset) }

// describeTimer prints where a timer's splices landed.
func describeTimer(w io.Writer, t api.TimerInfo) {
	if viaBPF(t.Mechanism) {
		fmt.Fprintf(w, "kinst: timing %s with BPF %s (kerninst.ko is not loaded)\n", t.Function, t.Mechanism)
		return
	}
	var exits []string
	same := ""
	for _, e := range t.Exits {
		exits = append(exits, fmt.Sprintf("+%#x", e.Offset))
		if e.Offset == t.Entry.Offset && e.Function == t.Entry.Function {
			same = " (an exit at the entry's instruction: no other fits before the return, so its calls are counted but the time inside is not seen)"
		}
	}
	fmt.Fprintf(w, "kinst: timing %s: entry at +%#x, %d exit(s) at %s%s%s\n", t.Function, t.Entry.Offset, len(t.Exits),
		strings.Join(exits, " "), filterNote(t.Filter), same)
}

// fmtNS prints a duration given in (fractional) nanoseconds.
func fmtNS(ns float64) string {
	switch {
	case ns == 0:
		return "0"
	case ns < 1e3:
		return fmt.Sprintf("%.0fns", ns)
	case ns < 1e6:
		return fmt.Sprintf("%.2fµs", ns/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.2fms", ns/1e6)
	}
	return fmt.Sprintf("%.3fs", ns/1e9)
}

// writePlot writes series as an SVG chart to path, when there is one,
// and says so on stderr.
func writePlot(path, title string, series []metrics.Series, stderr io.Writer) error {
	if path == "" {
		return nil
	}
	if err := outfile.Write(path, func(w io.Writer) error { return metrics.PlotSVG(w, title, series) }); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "kinst: wrote %s\n", path)
	return nil
}
