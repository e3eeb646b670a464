package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/procsession"
)

// CountOptions are the flags of `kinst count`.
type CountOptions struct {
	Points   []string
	Duration time.Duration // 0: until Ctrl-C or the command exits
	Interval time.Duration
	// TotalsOnly leaves out the rows every Interval (--interval 0): only
	// the totals at the end are printed, and no intervals in --json.
	TotalsOnly bool
	JSON       bool
	SVG        string // write an SVG chart of the counts per second here
	Name       string // session name (kinst ls, kinst detach)
	// TTL removes the counters after this long even if kinst is gone.
	TTL     time.Duration
	Command []string // run this and count for its lifetime
	// Debug is where a FILE:LINE point's addresses come from.
	Debug DebugOptions
}

// Count attaches a counter at every point of the kernel, reports live,
// and removes the counters when the duration ends, the command exits or
// a signal arrives. It returns the exit status kinst should exit with.
func Count(ctx context.Context, c *api.Client, o CountOptions, env Env) (int, error) {
	if len(o.Points) == 0 {
		return 2, errors.New("count: name at least one POINT (FUNC, FUNC+0xOFF, FILE:LINE or a classic name such as lookuppn)")
	}
	return count(ctx, kernelTarget(ctx, c, o.Debug, env.Err), o, env)
}

// CountProcess is `kinst count -p PID` (or -p 0 -- CMD): the same
// session as the kernel's, hosted by kinst over the process.
func CountProcess(ctx context.Context, pid int, o CountOptions, env Env) (int, error) {
	if len(o.Points) == 0 {
		return 2, errors.New("count -p: name at least one POINT (FUNC, LIB:FUNC, FUNC+0xOFF or FILE:LINE)")
	}
	if o.Name != "" || o.TTL != 0 {
		return 2, fmt.Errorf("count -p: %w", errProcessFlags)
	}
	if err := checkOutputDir("count", o.SVG); err != nil {
		return 2, err
	}
	t, err := processTarget(pid, o.Command, env, procsession.Options{})
	if err != nil {
		return 1, err
	}
	return count(ctx, t, o, env)
}

// count is `kinst count` on a target.
func count(ctx context.Context, t sessionTarget, o CountOptions, env Env) (int, error) {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	lp, err := t.lines(o.Points)
	var sess api.Session
	if err == nil {
		sess, err = t.host.CreateSession(ctx, t.request(api.SessionRequest{Points: lp.points, Name: o.Name, TTLNS: int64(o.TTL)}))
	}
	if err != nil {
		if t.proc != nil {
			t.proc.abort()
		}
		return 1, err
	}
	stdout, stderr := env.Out, env.Err
	// A probe of a source line is named by the line it was asked as.
	for i := range sess.Probes {
		sess.Probes[i].Resolved.Point = lp.label(i, sess.Probes[i].Resolved.Point)
	}
	for _, p := range sess.Probes {
		describeProbe(stderr, p.Resolved, p.Mechanism)
	}
	report := output.CountReport{IntervalNS: int64(o.Interval)}
	if o.TotalsOnly {
		report.IntervalNS = 0
	}
	series, locWidth := probeSeries(sess)
	if !o.JSON && !o.TotalsOnly {
		fmt.Fprintf(stdout, "%8s  %-*s  %12s  %12s\n", "time", locWidth, "location", "+interval", "total")
	}
	res, err := t.run(ctx, sess, runOptions{Duration: o.Duration, Interval: o.Interval, Command: o.Command,
		Waiting: "kinst: counting; Ctrl-C to stop"}, env,
		func(el time.Duration, s api.Sample) {
			for i := range series {
				if i < len(s.Totals) {
					series[i].Add(metrics.Point{Time: s.Time, Calls: s.Totals[i]})
				}
			}
			if o.TotalsOnly {
				return
			}
			report.Intervals = append(report.Intervals, output.CountSample{ElapsedNS: int64(el), Deltas: s.Deltas})
			if !o.JSON {
				for i, p := range sess.Probes {
					fmt.Fprintf(stdout, "%8.3f  %-*s  %12d  %12d\n", el.Seconds(), locWidth, location(p.Resolved), s.Deltas[i], s.Totals[i])
				}
			}
		})
	report.ExitStatus = res.ExitStatus
	exitStatus := res.status()
	if err != nil {
		return max(exitStatus, 1), err
	}
	if t.proc != nil {
		report.Ended = t.proc.end
	}
	report.DurationNS = int64(res.Duration)
	final := res.Final
	if err := writePlot(o.SVG, "kinst count", series, stderr); err != nil {
		return max(exitStatus, 1), err
	}
	for i, p := range final.Probes {
		p.Point = lp.label(i, p.Point)
		if p.Mechanism == "none" {
			fmt.Fprintf(stderr, "kinst: %s: the library was not seen loaded: nothing counted\n", p.Point)
		}
		cp := output.CountProbe{Point: p.Point, Function: p.Function, Offset: p.Offset, Address: p.Address, Count: p.Count, Mechanism: p.Mechanism}
		if p.Classic != nil {
			cp.Classic = p.Classic.Solaris
		}
		report.Probes = append(report.Probes, cp)
	}
	if o.JSON {
		return exitStatus, writeJSON(stdout, report)
	}
	fmt.Fprintf(stdout, "\ncounts over %.3f s %s:\n", time.Duration(report.DurationNS).Seconds(), t.removed(final.Probes))
	return exitStatus, printCounts(stdout, report.Probes, t.function)
}

// probeSeries starts a plot series for each of the session's probes at
// its creation, and gives the width of the longest location: live rows
// use fixed widths, each printed as its sample arrives.
func probeSeries(sess api.Session) (series []metrics.Series, width int) {
	series, width = make([]metrics.Series, len(sess.Probes)), 8
	for i, p := range sess.Probes {
		series[i].Name = location(p.Resolved)
		series[i].Add(metrics.Point{Time: sess.Created})
		width = max(width, len(series[i].Name))
	}
	return series, width
}

// printCounts is the table of final counts, function names as name
// gives them.
func printCounts(w io.Writer, probes []output.CountProbe, name func(string) string) error {
	tw := newTable(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "count\tpoint\tlocation\taddress")
	for _, p := range probes {
		if p.Function == "" { // never placed: its library was not loaded
			fmt.Fprintf(tw, "%d\t%s\t-\t-\n", p.Count, p.Point)
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%s+%#x\t%#x\n", p.Count, p.Point, name(p.Function), p.Offset, uint64(p.Address))
	}
	return tw.Flush()
}

// location is how a probe is named in live rows: the point as asked, and
// where it landed when that differs.
func location(r api.Resolved) string {
	at := fmt.Sprintf("%s+%#x", r.Function, r.Offset)
	if r.Point == at || r.Function == "" {
		return at
	}
	return r.Point + " (" + at + ")"
}

// viaBPF says a mechanism is BPF's, not the driver's splice.
func viaBPF(mechanism string) bool {
	return mechanism != "" && mechanism != "splice" && mechanism != "none"
}

// removedWhat names what a report's end removed: splices, or BPF probes
// where kerninstd runs without the driver.
func removedWhat(ps []api.Probe) string {
	for _, p := range ps {
		if viaBPF(p.Mechanism) {
			return "BPF probes"
		}
	}
	return "splices"
}

// describeProbe prints where a point landed, and the classic-name mapping.
// A point not placed yet (mechanism "none") was described as it waited.
func describeProbe(w io.Writer, r api.Resolved, mechanism string) {
	if mechanism == "none" {
		return
	}
	if r.Classic != nil {
		fmt.Fprintf(w, "kinst: %s → %s (classic name; Linux equivalent: %s)\n", r.Classic.Solaris, r.Classic.Linux, r.Classic.Why)
	}
	if viaBPF(mechanism) {
		fmt.Fprintf(w, "kinst: counting %s at %s+%#x (%#x) with BPF %s (kerninst.ko is not loaded)\n",
			r.Point, r.Function, r.Offset, uint64(r.Address), mechanism)
		return
	}
	flags := "flags dead"
	if r.FlagsLive {
		flags = "flags saved"
	}
	fmt.Fprintf(w, "kinst: spliced %s at %s+%#x (%#x): %d-byte %q, %s splice, %s\n",
		r.Point, r.Function, r.Offset, uint64(r.Address), r.Length, r.Instruction, r.SpliceClass, flags)
}
