package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/unwind"
)

// CoverOptions are the flags of `kinst cover`.
type CoverOptions struct {
	Targets  []string      // functions, or globs over function names
	Modules  []string      // and every function of these modules' text
	Callees  []string      // and these functions with their callees…
	Depth    int           // …this many calls down (0: 1); ignored without Callees
	SVG      string        // write a chart of live probes and covered blocks here
	Duration time.Duration // 0: until Ctrl-C or the command exits
	Filter   api.Filter    // pid or comm: only these tasks' execution covers
	JSON     bool
	Name     string        // session name (kinst ls, kinst detach)
	TTL      time.Duration // remove the probes after this long even if kinst is gone
	Command  []string      // run this and cover for its lifetime
	Files    []string      // --file: every function whose code comes from these source files
	Lines    string        // --lines A-B: only the blocks of these lines of the one --file
	Lcov     string        // --lcov: write an lcov tracefile here
	Debug    DebugOptions  // where source lines come from
	// Trap lets --user coverage use trap splices (process.TrapHazard
	// says why they are refused by default).
	Trap bool
	// AllBlocks probes every block, none inferred from its successors.
	AllBlocks bool
}

// Cover arms a coverage probe at every basic block of the targets; the
// daemon removes each probe once it has run. When the duration ends, the
// command exits or a signal arrives, the remaining probes are removed and
// the report printed. It returns the exit status kinst should exit with.
func Cover(ctx context.Context, c *api.Client, o CoverOptions, env Env) (int, error) {
	if len(o.Targets) == 0 && len(o.Files) == 0 && len(o.Modules) == 0 && len(o.Callees) == 0 {
		return 2, errors.New("cover: name at least one function or glob (vfs_*), --file, --module or --callees")
	}
	for _, path := range []string{o.SVG, o.Lcov} {
		if err := checkOutputDir("cover", path); err != nil {
			return 2, err
		}
	}
	if _, err := parseLineRange(o); err != nil {
		return 2, err
	}
	dbg, err := coverDebug(ctx, c, &o, env)
	if err != nil {
		return 1, err
	}
	if dbg != nil {
		defer dbg.Close()
	}
	req := api.SessionRequest{Cover: o.Targets, CoverModules: o.Modules, CoverCallees: o.Callees, CoverAllBlocks: o.AllBlocks,
		Tied: true, Name: o.Name, TTLNS: int64(o.TTL)}
	if len(o.Callees) > 0 {
		req.CoverDepth = o.Depth
	}
	if o.Filter != (api.Filter{}) {
		f := o.Filter
		req.Filter = &f
	}
	sess, err := c.CreateSession(ctx, req)
	if err != nil {
		return 1, err
	}
	t := kernelTarget(ctx, c, o.Debug, env.Err)
	if sess.Cover == nil {
		c.RemoveSession(context.WithoutCancel(ctx), sess.ID)
		return 1, errors.New("cover: kerninstd made no coverage session (an older kerninstd?)")
	}
	return coverOn(ctx, t, sess, o, env, daemonDebug(ctx, c, dbg, o.Debug))
}

// coverOn runs a coverage session made on a target until the duration
// ends, the command exits or a signal arrives, and writes its report:
// source lines from dbg for the kernel (a process's host gives its own).
func coverOn(ctx context.Context, t sessionTarget, sess api.Session, o CoverOptions, env Env, dbg kernelDebug) (int, error) {
	armed, where := sess.Cover, ""
	if t.proc != nil {
		where = fmt.Sprintf(" in process %d", t.proc.pid)
	}
	fmt.Fprintf(env.Err, "kinst: %d probes armed%s in %s (planned in %s) over %d blocks of %s (%d inferred from their successors, %d refused)",
		armed.Armed, where, fmtNS(float64(armed.ArmNS)), fmtNS(float64(armed.PlanNS)), armed.TotalBlocks, functions(armed.FunctionCount), armed.Inferred, armed.RefusedBlocks)
	if armed.Filter != "" {
		fmt.Fprintf(env.Err, "; %s only", armed.Filter)
	}
	fmt.Fprintln(env.Err)
	if t.proc != nil && armed.RefusedBlocks > 0 {
		if all, err := t.proc.host.CoverReport(ctx, sess.ID); err == nil {
			writeRefusals(env.Err, all, 3)
		}
	}
	res, err := t.run(ctx, sess, runOptions{Duration: o.Duration, Interval: time.Second, Command: o.Command,
		Waiting: "kinst: covering; Ctrl-C to stop"}, env, func(time.Duration, api.Sample) {})
	exitStatus := res.status()
	if err != nil {
		return max(exitStatus, 1), err
	}
	if res.Final.Cover == nil {
		return max(exitStatus, 1), errors.New("cover: the session's final state has no coverage")
	}
	report := *res.Final.Cover
	report.DurationNS = int64(res.Duration)
	report.ExitStatus = res.ExitStatus
	if t.proc != nil {
		report.Session, report.Ended = fmt.Sprintf("process %d", t.proc.pid), t.proc.end
	} else {
		annotateOrSay(env.Err, &report, dbg)
	}
	return writeCoverOutputs(o, report, exitStatus, env)
}

// writeCoverOutputs writes a finished coverage report where o asks: the
// lcov tracefile, the chart, then the report itself (JSON or text). It
// returns the exit status, raised to 1 when a file could not be written.
func writeCoverOutputs(o CoverOptions, report api.CoverReport, exitStatus int, env Env) (int, error) {
	if r, _ := parseLineRange(o); r != nil {
		report = r.keep(report)
	}
	if o.Lcov != "" {
		if err := writeLcovFile(o.Lcov, report); err != nil {
			fmt.Fprintf(env.Err, "kinst: %v\n", err)
			exitStatus = max(exitStatus, 1)
		}
	}
	if o.SVG != "" {
		if err := writeCoverPlot(o.SVG, report); err != nil {
			return max(exitStatus, 1), err
		}
		fmt.Fprintf(env.Err, "kinst: wrote %s\n", o.SVG)
	}
	if o.JSON {
		return exitStatus, writeJSON(env.Out, report)
	}
	return exitStatus, writeCover(env.Out, report)
}

// writeCover prints a coverage report: totals, a row per function, each
// function's blocks, and the timeline of live probes.
func writeCover(w io.Writer, r api.CoverReport) error {
	fmt.Fprintf(w, "coverage over %.3f s: %d of %d blocks (%s) in %s", time.Duration(r.DurationNS).Seconds(),
		r.CoveredBlocks, r.TotalBlocks, percent(r.CoveredBlocks, r.TotalBlocks), functions(len(r.Functions)))
	if r.Filter != "" {
		fmt.Fprintf(w, ", %s only", r.Filter)
	}
	fmt.Fprintf(w, "\n%d probes armed in %s, %d removed after their first hit, %d blocks inferred from their successors (%d of them covered), %d blocks refused\n\n",
		r.Armed, fmtNS(float64(r.ArmNS)), r.Removed, r.Inferred, r.CoveredInferred, refusedBlocks(&r))
	tw := newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "function\taddress\tblocks\tcovered\trefused\tcoverage\t")
	for _, f := range r.Functions {
		fmt.Fprintf(tw, "%s\t%#x\t%d\t%d\t%d\t%s\t\n", cell(unwind.Demangle(f.Function)), uint64(f.Address), f.Total, f.Covered, f.Refused, percent(f.Covered, f.Total))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range r.Functions {
		fmt.Fprintf(w, "\n%s (%#x):\n", unwind.Demangle(f.Function), uint64(f.Address))
		if f.Error != "" {
			fmt.Fprintf(w, "  not read: %s\n", f.Error)
			continue
		}
		tw := newTable(w, 0, 0, 2, ' ', 0)
		withLines := hasLines(f)
		if withLines {
			fmt.Fprintln(tw, "  block\tstart\tcovered\tprobe\tline")
		} else {
			fmt.Fprintln(tw, "  block\tstart\tcovered\tprobe")
		}
		for _, b := range f.Blocks {
			state, probe := "no", ""
			switch {
			case b.Refused != nil && !b.Inferred:
				state, probe = "refused", *b.Refused
			case b.Covered:
				state = "yes"
			}
			switch {
			case b.Inferred:
				probe = "inferred"
			case b.Point != nil:
				probe = *b.Point
			}
			fmt.Fprintf(tw, "  %d\t+%#x\t%s\t%s", b.Index, uint64(b.Start)-uint64(f.Address), state, probe)
			if withLines && len(b.Lines) > 0 {
				fmt.Fprintf(tw, "\t%s", b.Lines[0])
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\ntimeline:")
	tw = newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "elapsed s\tlive probes\tcovered\t")
	for _, s := range r.Timeline {
		fmt.Fprintf(tw, "%.3f\t%d\t%d\t\n", time.Duration(s.ElapsedNS).Seconds(), s.LiveProbes, s.Covered)
	}
	return tw.Flush()
}

// refusedBlocks is the blocks of r with neither a probe nor an inferred
// coverage.
func refusedBlocks(r *api.CoverReport) int {
	n := 0
	for _, f := range r.Functions {
		for _, b := range f.Blocks {
			if b.Refused != nil && !b.Inferred {
				n++
			}
		}
	}
	return n
}

// percent is n of total as a percentage.
func percent(n, total int) string {
	if total == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(total))
}

// coverSummary is a coverage session in kinst ls.
func coverSummary(r *api.CoverReport) string {
	live := r.Armed - r.Removed
	fns := "functions"
	if r.FunctionCount == 1 {
		fns = "function"
	}
	return fmt.Sprintf("cover %d %s (%d/%d blocks, %d probes live)", r.FunctionCount, fns, r.CoveredBlocks, r.TotalBlocks, live)
}

// functions is "1 function" or "N functions".
func functions(n int) string {
	if n == 1 {
		return "1 function"
	}
	return fmt.Sprintf("%d functions", n)
}
