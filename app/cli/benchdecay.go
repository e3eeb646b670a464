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
)

// DecayOptions configure `kinst bench cover-decay`.
type DecayOptions struct {
	Callees  string        // cover this function and its callees…
	Depth    int           // …this many calls down
	Path     string        // the loop stats this path
	Step     time.Duration // throughput per step
	Baseline time.Duration // uninstrumented, before and after
	Duration time.Duration // under coverage, after arming
	JSON     bool
}

// decayRecovered is the ratio the overhead-decay benchmark's goal names.
const decayRecovered = 0.95

// BenchDecay measures the overhead of a coverage session as its probes
// remove themselves: a loop of stat(2) calls on one thread runs
// throughout; its throughput per step is taken uninstrumented
// (Baseline), then from the moment a coverage session over
// o.Callees and its callees (o.Depth deep) is armed (Duration), then
// again uninstrumented after the session is removed (drift). It runs
// where kerninstd runs (the guest).
func BenchDecay(ctx context.Context, c *api.Client, o DecayOptions, env Env) error {
	if o.Step <= 0 || o.Baseline < o.Step || o.Duration < o.Step || o.Depth < 1 {
		return errors.New("bench cover-decay: --step must be positive, --baseline and --duration at least one step, --depth at least 1")
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
	// rates samples the loop's calls per second over n steps.
	rates := func(n int) []float64 {
		out := make([]float64, n)
		t0, c0 := time.Now(), calls.Load()
		for i := range out {
			time.Sleep(time.Until(t0.Add(time.Duration(i+1) * o.Step)))
			t1, c1 := time.Now(), calls.Load()
			out[i] = float64(c1-c0) / t1.Sub(t0).Seconds()
			t0, c0 = t1, c1
		}
		return out
	}
	steps := func(d time.Duration) int { return int(d / o.Step) }
	fmt.Fprintf(env.Err, "kinst: stat(2) loop on %s: warming up, then %v uninstrumented…\n", o.Path, o.Baseline)
	rates(steps(300 * time.Millisecond)) // the emulator translates the path once
	base := rates(steps(o.Baseline))

	sess, err := c.CreateSession(ctx, api.SessionRequest{CoverCallees: []string{o.Callees}, CoverDepth: o.Depth,
		Name: "bench-cover-decay", TTLNS: int64(o.Duration + time.Minute)})
	if err != nil {
		return err
	}
	if sess.Cover == nil {
		c.RemoveSession(context.WithoutCancel(ctx), sess.ID)
		return errors.New("bench cover-decay: kerninstd made no coverage session (an older kerninstd?)")
	}
	fmt.Fprintf(env.Err, "kinst: %d probes armed over %d blocks in %s; %v under coverage…\n",
		sess.Cover.Armed, sess.Cover.TotalBlocks, fmtNS(float64(sess.Cover.ArmNS)), o.Duration)
	under := rates(steps(o.Duration))
	final, err := c.RemoveSession(context.WithoutCancel(ctx), sess.ID)
	if err != nil {
		return err
	}
	if final.Cover == nil {
		return errors.New("bench cover-decay: the session's final state has no coverage")
	}
	after := rates(steps(o.Baseline))
	rep := decayReport(o, *final.Cover, base, under, after)
	rep.Workload = "stat(2) of " + o.Path
	return writeDecayReport(env.Out, rep, o.JSON)
}

// decayReport derives the report from the per-step rates: uninstrumented
// before (base), under coverage from its arming (under) and after; the
// live probes at each step's end are the session's timeline's.
func decayReport(o DecayOptions, cov api.CoverReport, base, under, after []float64) api.DecayReport {
	b := median(base)
	rep := api.DecayReport{Callees: o.Callees, Depth: o.Depth, Functions: len(cov.Functions), Blocks: cov.TotalBlocks,
		Armed: cov.Armed, ArmNS: cov.ArmNS, StepNS: int64(o.Step), Baseline: b, Steps: []api.DecayStep{}}
	if b <= 0 {
		return rep
	}
	rep.BaselineMin, rep.BaselineMax = 1, 1
	for _, r := range base {
		rep.BaselineMin, rep.BaselineMax = min(rep.BaselineMin, r/b), max(rep.BaselineMax, r/b)
	}
	rep.After = median(after) / b
	for i, r := range under {
		end := int64(i+1) * int64(o.Step)
		s := api.DecayStep{ElapsedNS: end, CallsPerSec: r, Ratio: r / b, LiveProbes: cov.Armed}
		for _, t := range cov.Timeline {
			if t.ElapsedNS <= end {
				s.LiveProbes, s.Covered = t.LiveProbes, t.Covered
			}
		}
		rep.Steps = append(rep.Steps, s)
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
func writeDecayReport(w io.Writer, r api.DecayReport, asJSON bool) error {
	if asJSON {
		return writeJSON(w, r)
	}
	fmt.Fprintf(w, "overhead decay of a %s loop under coverage of %s and its callees %d deep\n", r.Workload, r.Callees, r.Depth)
	fmt.Fprintf(w, "(%d functions, %d blocks, %d probes armed in %s; guest time under emulation: read the ratios)\n",
		r.Functions, r.Blocks, r.Armed, fmtNS(float64(r.ArmNS)))
	fmt.Fprintf(w, "uninstrumented: %.0f calls/s (median of %s steps; steps from %.3f to %.3f of it); after the session: %.3f\n\n",
		r.Baseline, fmtNS(float64(r.StepNS)), r.BaselineMin, r.BaselineMax, r.After)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
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
