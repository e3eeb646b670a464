package live

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/kinst/kinst/output"
)

// kinst bench cover-decay in the guest: a stat(2) loop under a coverage
// session over newfstatat's call graph, three and four calls deep. The figures
// are logged (guest time under emulation: speed is the benchmark's to
// report, not the test's to judge); the test checks the report's shape
// against the session's own accounting and that nothing is left.
func TestBenchCoverDecay(t *testing.T) {
	for _, depth := range []string{"3", "4"} {
		t.Run("depth="+depth, func(t *testing.T) { benchCoverDecay(t, depth) })
	}
}

func benchCoverDecay(t *testing.T, depth string) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	out, errOut, code := gexec(t, ctx, "kinst", "bench", "cover-decay", "--json", "--duration", "3s", "--depth", depth)
	if code != 0 {
		t.Fatalf("bench cover-decay: status %d\n%s", code, errOut)
	}
	var r output.DecayReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s under coverage of %s %d deep: %d functions, %d blocks, %d probes armed in %v; baseline %.0f calls/s (steps %.3f–%.3f), after %.3f",
		r.Workload, r.Callees, r.Depth, r.Functions, r.Blocks, r.Armed, time.Duration(r.ArmNS), r.Baseline, r.BaselineMin, r.BaselineMax, r.After)
	for _, s := range r.Steps {
		t.Logf("  %6.3f s  ratio %.3f  %5d live  %5d covered", time.Duration(s.ElapsedNS).Seconds(), s.Ratio, s.LiveProbes, s.Covered)
	}
	if r.RecoveredNS != nil {
		t.Logf("ratio ≥ 0.95 for good from %.3f s after arming", time.Duration(*r.RecoveredNS).Seconds())
	} else {
		t.Logf("ratio still below 0.95 at the last step")
	}
	if r.Functions < 5 || r.Armed < 50 || len(r.Steps) != 30 || r.Baseline <= 0 {
		t.Fatalf("report: %d functions, %d armed, %d steps, baseline %.0f", r.Functions, r.Armed, len(r.Steps), r.Baseline)
	}
	for i, s := range r.Steps {
		// Every probe gone was hit, and its block covered; covered blocks
		// beyond those are inferred ones.
		removed := r.Armed - s.LiveProbes
		if removed < 0 || s.Covered < removed || s.Covered > removed+r.Inferred || i > 0 && s.LiveProbes > r.Steps[i-1].LiveProbes {
			t.Errorf("step %d: %d live, %d covered of %d armed and %d inferred (previous %d live)", i, s.LiveProbes, s.Covered, r.Armed, r.Inferred, r.Steps[max(i-1, 0)].LiveProbes)
		}
	}
	if last := r.Steps[len(r.Steps)-1]; last.Covered == 0 {
		t.Errorf("the loop covered nothing: %+v", last)
	}
	if info, err := client.Info(ctx); err != nil || info.Splices != 0 || info.DriverSplices != 0 || info.Sessions != 0 {
		t.Errorf("after the benchmark: %+v, %v", info, err)
	}
}
