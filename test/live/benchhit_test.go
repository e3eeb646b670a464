package live

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/kinst/kinst/internal/cli"
)

// TestBenchHit runs `kinst bench hit` in the guest: every mechanism's
// row, the BPF kprobe's included, must be present, and every row that ran
// must have counted exactly the loop's getppid calls (the loop's own count
// is the oracle; nothing else in the quiet guest calls getppid).
func TestBenchHit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, errOut, code := gexec(t, ctx, "kinst", "bench", "hit", "--json", "--calls", "20000", "--runs", "3")
	if code != 0 {
		t.Fatalf("bench hit: status %d\n%s", code, errOut)
	}
	var rep cli.HitReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bench hit --json: %v\n%s", err, out)
	}
	if rep.Expected != 20000*3 {
		t.Errorf("expected_hits %d, want %d", rep.Expected, 20000*3)
	}
	rows := map[string]cli.HitRow{}
	for _, r := range rep.Rows {
		rows[r.Mechanism] = r
		t.Logf("%-20s %-28s ratio %.3f hits %d %s", r.Mechanism, r.Point, r.Ratio, r.Hits, r.Skipped)
		if r.Mechanism == "none" || r.Skipped != "" {
			continue
		}
		if r.Hits != rep.Expected {
			t.Errorf("%s: %d hits, want the loop's %d calls", r.Mechanism, r.Hits, rep.Expected)
		}
		if r.Ratio <= 0 {
			t.Errorf("%s: ratio %v", r.Mechanism, r.Ratio)
		}
	}
	for _, m := range []string{"none", "direct splice", "kprobe (int3)", "kprobe (optimized)", "bpf kprobe"} {
		r, ok := rows[m]
		if !ok {
			t.Errorf("no %q row", m)
		} else if r.Skipped != "" {
			t.Errorf("%s skipped: %s", m, r.Skipped)
		}
	}
}
