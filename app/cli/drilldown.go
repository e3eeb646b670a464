package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/output"
)

// DrillOptions are the flags of `kinst drilldown`.
type DrillOptions struct {
	Root     string
	Depth    int     // levels to descend at most
	Callees  int     // callees timed per level at most (the first call sites)
	MinShare float64 // stop when the heaviest callee has less of its caller's time
	JSON     bool
	Command  []string // the workload, run once per level
}

// DrillDown reproduces KernInst's investigation style (§5: where does
// copen's time go?): time a function and the functions it calls directly
// over one run of a workload, follow the callee with the most wall time,
// and repeat until no callee dominates.
func DrillDown(ctx context.Context, c *api.Client, o DrillOptions, env Env) error {
	stdout := env.Out
	if o.Root == "" || len(o.Command) == 0 {
		return errors.New("drilldown: name a function and a workload: drilldown FUNC -- CMD…")
	}
	var report output.DrillReport
	fn := o.Root
	for d := 0; d < o.Depth; d++ {
		level, err := drillLevel(ctx, c, fn, o, env)
		if err != nil {
			return err
		}
		report.Levels = append(report.Levels, level)
		report.Dominant = fn
		if !o.JSON {
			printLevel(stdout, d, level)
		}
		if len(level.Rows) < 2 || level.Rows[1].Share < o.MinShare {
			break
		}
		fn = level.Rows[1].Function
	}
	if o.JSON {
		return writeJSON(stdout, report)
	}
	fmt.Fprintf(stdout, "\ndominant cost: %s\n", report.Dominant)
	return nil
}

// drillLevel times fn and its direct callees over one run of the
// workload. Callees that cannot be timed are dropped with the reason.
func drillLevel(ctx context.Context, c *api.Client, fn string, o DrillOptions, env Env) (output.DrillLevel, error) {
	level := output.DrillLevel{Function: fn}
	callees, err := directCallees(ctx, c, fn)
	if err != nil {
		return level, err
	}
	if len(callees) > o.Callees {
		callees = callees[:o.Callees]
	}
	funcs := append([]string{fn}, callees...)
	var sess api.Session
	for {
		sess, err = c.CreateSession(ctx, api.SessionRequest{Timers: funcs, Tied: true})
		var apiErr *api.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.Point == "" || apiErr.Point == fn {
			break
		}
		level.Skipped = append(level.Skipped, apiErr.Point+": "+apiErr.ErrorResponse.Error)
		funcs = without(funcs, apiErr.Point)
	}
	if err != nil {
		return level, fmt.Errorf("time %s: %w", fn, err)
	}
	fmt.Fprintf(env.Err, "kinst: timing %s and %d callee(s) over one run of the workload\n", fn, len(funcs)-1)
	res, err := runSession(ctx, daemonHost{c}, sess, runOptions{Interval: 1e9, Command: o.Command}, env, func(time.Duration, api.Sample) {})
	if err != nil {
		return level, err
	}
	if res.ExitStatus != nil && *res.ExitStatus != 0 {
		return level, fmt.Errorf("workload exited with status %d", *res.ExitStatus)
	}
	var top float64
	for _, t := range res.Final.Timers {
		if t.Function == fn {
			top = t.WallNS
		}
	}
	for _, t := range res.Final.Timers {
		row := output.DrillRow{Function: t.Function, Calls: t.Calls, WallNS: t.WallNS}
		if t.Calls > 0 {
			row.AvgWallNS = t.WallNS / float64(t.Calls)
		}
		if top > 0 {
			row.Share = t.WallNS / top
		}
		level.Rows = append(level.Rows, row)
	}
	sort.SliceStable(level.Rows, func(i, j int) bool {
		if (level.Rows[i].Function == fn) != (level.Rows[j].Function == fn) {
			return level.Rows[i].Function == fn
		}
		return level.Rows[i].WallNS > level.Rows[j].WallNS
	})
	return level, nil
}

// directCallees lists the functions fn calls directly, in the order of
// their first call site, without the tracing and mitigation helpers.
func directCallees(ctx context.Context, c *api.Client, fn string) ([]string, error) {
	g, err := c.CFG(ctx, fn)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, b := range g.Blocks {
		for _, in := range b.Instructions {
			if !strings.HasPrefix(in.Text, "call") || in.Target == "" {
				continue
			}
			name, off, _ := strings.Cut(in.Target, "+")
			if off != "0x0" || seen[name] || name == g.Function || skipCallee(name) {
				continue
			}
			seen[name] = true
			out = append(out, name)
		}
	}
	return out, nil
}

// skipCallee: helpers that are not where a path's time goes.
func skipCallee(name string) bool {
	for _, p := range []string{"__fentry__", "__x86_", "__stack_chk_fail", "__warn_printk", "__might_", "__cond_resched",
		"_raw_spin_", "kfree", "__kmalloc", "kmem_cache_", "__sanitizer", "__static_call"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func without(s []string, x string) []string {
	var out []string
	for _, v := range s {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

func printLevel(w io.Writer, depth int, l output.DrillLevel) {
	fmt.Fprintf(w, "\nlevel %d: %s\n", depth, l.Function)
	tw := newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "calls\ttotal wall\tavg wall\tshare\tfunction\t")
	for _, r := range l.Rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.1f%%\t%s\t\n", r.Calls, fmtNS(r.WallNS), fmtNS(r.AvgWallNS), 100*r.Share, r.Function)
	}
	tw.Flush()
	for _, s := range l.Skipped {
		fmt.Fprintf(w, "  (not timed: %s)\n", s)
	}
}
