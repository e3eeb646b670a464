package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/output"
)

// DecayOptions configure `kinst bench cover-decay`.
type DecayOptions struct {
	Callees  string        // cover this function and its callees…
	Depth    int           // …this many calls down
	Path     string        // the loop stats this path
	Step     time.Duration // throughput per step
	Baseline time.Duration // uninstrumented, before and after
	Duration time.Duration // under coverage, after arming
	Runs     int           // sessions in a row; each step's median is kept
	JSON     bool
}

// decayRecovered is the ratio the overhead-decay benchmark's goal names.
const decayRecovered = 0.95

// BenchDecay measures the overhead of a coverage session as its probes
// remove themselves: a loop of stat(2) calls on one thread runs
// throughout; in each of o.Runs runs its throughput per step is taken
// uninstrumented (Baseline), then from the moment a coverage session
// over o.Callees and its callees (o.Depth deep) is armed (Duration),
// then again uninstrumented after the session is removed (drift). It
// runs where kerninstd runs (the guest).
func BenchDecay(ctx context.Context, c *api.Client, o DecayOptions, env Env) error {
	if o.Step <= 0 || o.Baseline < o.Step || o.Duration < o.Step || o.Depth < 1 || o.Runs < 1 {
		return errors.New("bench cover-decay: --step must be positive, --baseline and --duration at least one step, --depth and --runs at least 1")
	}
	var st unix.Stat_t
	if err := unix.Stat(o.Path, &st); err != nil {
		return fmt.Errorf("bench cover-decay: stat %s: %w", o.Path, err)
	}
	var calls atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var st unix.Stat_t
		for {
			select {
			case <-stop:
				return
			default:
			}
			for range 16 {
				unix.Stat(o.Path, &st)
			}
			calls.Add(16)
		}
	}()
	defer func() {
		close(stop)
		<-done
	}()
	rates := func(n int) []float64 {
		return stepRates(n, o.Step, calls.Load, time.Now, func(t time.Time) { time.Sleep(time.Until(t)) })
	}
	steps := func(d time.Duration) int { return int(d / o.Step) }
	fmt.Fprintf(env.Err, "kinst: stat(2) loop on %s: warming up…\n", o.Path)
	rates(steps(300 * time.Millisecond)) // the emulator translates the path once
	var runs []decayRun
	for r := 0; r < o.Runs; r++ {
		var run decayRun
		run.base = rates(steps(o.Baseline))
		sess, err := c.CreateSession(ctx, api.SessionRequest{CoverCallees: []string{o.Callees}, CoverDepth: o.Depth,
			Name: "bench-cover-decay", TTLNS: int64(o.Duration + time.Minute)})
		if err != nil {
			return err
		}
		if sess.Cover == nil {
			c.RemoveSession(context.WithoutCancel(ctx), sess.ID)
			return errors.New("bench cover-decay: kerninstd made no coverage session (an older kerninstd?)")
		}
		fmt.Fprintf(env.Err, "kinst: run %d: %d probes armed over %d blocks in %s; %v under coverage…\n", r+1,
			sess.Cover.Armed, sess.Cover.TotalBlocks, fmtNS(float64(sess.Cover.ArmNS)), o.Duration)
		run.under = rates(steps(o.Duration))
		final, err := c.RemoveSession(context.WithoutCancel(ctx), sess.ID)
		if err != nil {
			return err
		}
		if final.Cover == nil {
			return errors.New("bench cover-decay: the session's final state has no coverage")
		}
		run.cov = *final.Cover
		run.after = rates(steps(o.Baseline))
		runs = append(runs, run)
	}
	rep := decayReport(o, runs)
	rep.Workload = "stat(2) of " + o.Path
	return writeDecayReport(env.Out, rep, o.JSON)
}

// stepRates samples count's rate per second over n steps of step: the
// i-th step ends (i+1) steps after the first began, whatever the samples
// before it cost, and its rate is over the time it actually took. now and
// sleepUntil are the clock.
func stepRates(n int, step time.Duration, count func() uint64, now func() time.Time, sleepUntil func(time.Time)) []float64 {
	out := make([]float64, n)
	start := now()
	t0, c0 := start, count()
	for i := range out {
		sleepUntil(start.Add(time.Duration(i+1) * step))
		t1, c1 := now(), count()
		out[i] = float64(c1-c0) / t1.Sub(t0).Seconds()
		t0, c0 = t1, c1
	}
	return out
}

// decayRun is one run's rates per step, uninstrumented before (base),
// under coverage from its arming (under) and after, and its session.
type decayRun struct {
	cov                api.CoverReport
	base, under, after []float64
}

// decayReport derives the report from the runs: each run's steps are
// taken relative to its own uninstrumented median, and each step's
// figures are the median over runs (the live probes at a step's end from
// each session's timeline).
func decayReport(o DecayOptions, runs []decayRun) output.DecayReport {
	rep := output.DecayReport{Callees: o.Callees, Depth: o.Depth, Runs: len(runs), StepNS: int64(o.Step), Steps: []output.DecayStep{}}
	if len(runs) == 0 {
		return rep
	}
	first := runs[0].cov
	rep.Functions, rep.Blocks, rep.Armed, rep.Inferred = len(first.Functions), first.TotalBlocks, first.Armed, first.Inferred
	var bases, afters, arms []float64
	rep.BaselineMin, rep.BaselineMax = 1, 1
	for _, r := range runs {
		b := median(r.base)
		bases, arms = append(bases, b), append(arms, float64(r.cov.ArmNS))
		if b <= 0 {
			return rep
		}
		for _, v := range r.base {
			rep.BaselineMin, rep.BaselineMax = min(rep.BaselineMin, v/b), max(rep.BaselineMax, v/b)
		}
		afters = append(afters, median(r.after)/b)
	}
	rep.Baseline, rep.After, rep.ArmNS = median(bases), median(afters), int64(median(arms))
	for i := range runs[0].under {
		end := int64(i+1) * int64(o.Step)
		var cps, ratio, live, covered []float64
		for k, r := range runs {
			if i >= len(r.under) {
				continue
			}
			cps, ratio = append(cps, r.under[i]), append(ratio, r.under[i]/bases[k])
			l, c := r.cov.Armed, 0
			for _, t := range r.cov.Timeline {
				if t.ElapsedNS <= end {
					l, c = t.LiveProbes, t.Covered
				}
			}
			live, covered = append(live, float64(l)), append(covered, float64(c))
		}
		rep.Steps = append(rep.Steps, output.DecayStep{ElapsedNS: end, CallsPerSec: median(cps), Ratio: median(ratio),
			LiveProbes: int(median(live)), Covered: int(median(covered))})
	}
	for i := len(rep.Steps) - 1; i >= 0 && rep.Steps[i].Ratio >= decayRecovered; i-- {
		if i == 0 {
			rep.RecoveredNS = new(int64) // recovered as soon as armed
		} else {
			v := rep.Steps[i-1].ElapsedNS
			rep.RecoveredNS = &v
		}
	}
	return rep
}

// writeDecayReport prints bench cover-decay's table, or its JSON.
func writeDecayReport(w io.Writer, r output.DecayReport, asJSON bool) error {
	if asJSON {
		return writeJSON(w, r)
	}
	fmt.Fprintf(w, "overhead decay of a %s loop under coverage of %s and its callees %d deep\n", r.Workload, r.Callees, r.Depth)
	fmt.Fprintf(w, "(%d functions, %d blocks, %d probes armed in %s; guest time under emulation: read the ratios)\n",
		r.Functions, r.Blocks, r.Armed, fmtNS(float64(r.ArmNS)))
	fmt.Fprintf(w, "uninstrumented: %.0f calls/s (median of %s steps; steps from %.3f to %.3f of it); after the session: %.3f\n",
		r.Baseline, fmtNS(float64(r.StepNS)), r.BaselineMin, r.BaselineMax, r.After)
	fmt.Fprintf(w, "each step: the median over %d runs, each relative to its own uninstrumented median\n\n", r.Runs)
	tw := newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "after arming s\tcalls/s\tratio\tlive probes\tcovered\t")
	for _, s := range r.Steps {
		fmt.Fprintf(tw, "%.3f\t%.0f\t%.3f\t%d\t%d\t\n", time.Duration(s.ElapsedNS).Seconds(), s.CallsPerSec, s.Ratio, s.LiveProbes, s.Covered)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.RecoveredNS == nil {
		_, err := fmt.Fprintf(w, "\nthroughput still below %.2f of uninstrumented at the last step\n", decayRecovered)
		return err
	}
	_, err := fmt.Fprintf(w, "\nthroughput at least %.2f of uninstrumented from %.3f s after arming onwards\n", decayRecovered,
		time.Duration(*r.RecoveredNS).Seconds())
	return err
}
