package cli

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

// decayFixture is three runs of 100 ms steps: the first with a baseline
// around 1000 calls/s, under coverage slow while probes are live,
// dipping once at 0.7 s, back for good from 0.8 s; the second the same
// on a guest twice as fast whose probes went later; the third the same
// on a guest half as fast. Each step's median is the first run's.
func decayFixture() (DecayOptions, []decayRun) {
	o := DecayOptions{Callees: "__x64_sys_newfstatat", Depth: 3, Path: "/", Step: 100 * time.Millisecond, Runs: 3}
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	cov := api.CoverReport{Functions: make([]api.CoverFunction, 12), TotalBlocks: 400, Armed: 380, ArmNS: ms(850),
		Timeline: []api.CoverSample{{LiveProbes: 380}, {ElapsedNS: ms(60), LiveProbes: 200, Covered: 180},
			{ElapsedNS: ms(110), LiveProbes: 150, Covered: 230}, {ElapsedNS: ms(160), LiveProbes: 148, Covered: 232},
			{ElapsedNS: ms(650), LiveProbes: 140, Covered: 240}}}
	late := cov
	late.ArmNS = ms(900)
	late.Timeline = []api.CoverSample{{LiveProbes: 380}, {ElapsedNS: ms(400), LiveProbes: 100, Covered: 280}}
	scale := func(v []float64, f float64) []float64 {
		out := make([]float64, len(v))
		for i := range v {
			out[i] = v[i] * f
		}
		return out
	}
	one := decayRun{cov: cov, base: []float64{980, 1000, 1020, 990, 1010},
		under: []float64{150, 600, 900, 960, 970, 955, 940, 990, 1000, 995}, after: []float64{1005, 990, 1000}}
	two := decayRun{cov: late, base: scale(one.base, 2), under: scale(one.under, 2), after: scale(one.after, 2)}
	three := decayRun{cov: cov, base: scale(one.base, 0.5), under: scale(one.under, 0.5), after: scale(one.after, 0.5)}
	return o, []decayRun{one, two, three}
}

// The steps' ratios, the live probes at each step's end from the
// timelines (the median of the runs'), and the recovery (the 0.94 dip
// at 0.7 s resets it).
func TestDecayReport(t *testing.T) {
	o, runs := decayFixture()
	r := decayReport(o, runs)
	if r.Baseline != 1000 || r.BaselineMin != 0.98 || r.BaselineMax != 1.02 || r.After != 1 || len(r.Steps) != 10 ||
		r.Runs != 3 || r.ArmNS != int64(850*time.Millisecond) {
		t.Fatalf("report %+v", r)
	}
	wantLive := []int{200, 148, 148, 148, 148, 148, 140, 140, 140, 140}
	for i, s := range r.Steps {
		if s.LiveProbes != wantLive[i] || s.Ratio != runs[0].under[i]/1000 || s.CallsPerSec != runs[0].under[i] ||
			s.ElapsedNS != int64(i+1)*int64(100*time.Millisecond) {
			t.Errorf("step %d: %+v, want %d live", i, s, wantLive[i])
		}
	}
	if r.RecoveredNS == nil || *r.RecoveredNS != int64(700*time.Millisecond) {
		t.Errorf("recovered at %v, want 0.7 s", r.RecoveredNS)
	}
	// Never recovered: the last step is below in two runs of three.
	runs[0].under[9], runs[2].under[9] = 900, 450
	if r := decayReport(o, runs); r.RecoveredNS != nil {
		t.Errorf("recovered at %d with the last step at 0.9", *r.RecoveredNS)
	}
}

// bench cover-decay runs a loop where kerninstd runs: its table is
// rendered from a report of known figures.
func TestGoldenBenchDecay(t *testing.T) {
	o, runs := decayFixture()
	rep := decayReport(o, runs)
	rep.Workload = "stat(2) of /"
	for _, asJSON := range []bool{false, true} {
		var out bytes.Buffer
		if err := writeDecayReport(&out, rep, asJSON); err != nil {
			t.Fatal(err)
		}
		golden(t, map[bool]string{false: "bench-decay", true: "bench-decay-json"}[asJSON], out.String(), "")
	}
}

// The steps end one step apart from the first's start, however long
// each sample took to read (here the clock runs 30 ms late at every
// wake-up): 30 steps of 100 ms last 3 s, not the 46.5 s of steps that
// each waited one step longer than the last; each rate is over the time
// its step actually took.
func TestStepRates(t *testing.T) {
	clock := time.Unix(0, 0)
	var wakes []time.Time
	calls := uint64(0)
	now := func() time.Time { return clock }
	sleepUntil := func(at time.Time) {
		wakes = append(wakes, at)
		if at.After(clock) {
			clock = at.Add(30 * time.Millisecond)
		}
		calls += 1000
	}
	r := stepRates(30, 100*time.Millisecond, func() uint64 { return calls }, now, sleepUntil)
	if len(r) != 30 || len(wakes) != 30 {
		t.Fatalf("%d rates, %d wake-ups", len(r), len(wakes))
	}
	for i, w := range wakes {
		if want := time.Unix(0, 0).Add(time.Duration(i+1) * 100 * time.Millisecond); !w.Equal(want) {
			t.Errorf("step %d ends at %v, want %v", i, w.Sub(time.Unix(0, 0)), want.Sub(time.Unix(0, 0)))
		}
	}
	if total := clock.Sub(time.Unix(0, 0)); total != 3030*time.Millisecond {
		t.Errorf("30 steps of 100 ms took %v", total)
	}
	// The first step took 130 ms, the others 100 ms.
	if math.Abs(r[0]-1000/0.13) > 1e-6 || math.Abs(r[1]-10000) > 1e-6 {
		t.Errorf("rates %v, want %v then 10000", r[:2], 1000/0.13)
	}
}
