package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"

	"github.com/kinst/kinst/output"
)

func TestParseUprobeProfile(t *testing.T) {
	// As 6.18's uprobe_profile prints it.
	const profile = "  /tmp/kinst-hit-1/hitloop kinst_bench/other                      7\n  /tmp/kinst-hit-1/hitloop uhit                                 500000\n"
	for _, tc := range []struct {
		event string
		want  uint64
		ok    bool
	}{{"uhit", 500000, true}, {"missing", 0, false}} {
		n, err := parseUprobeProfile(profile, tc.event)
		if (err == nil) != tc.ok || n != tc.want {
			t.Errorf("%s: %d, %v", tc.event, n, err)
		}
	}
}

// TestBenchHitUser runs a short `bench hit --user` on this machine:
// every row that ran counted exactly the calls it timed, and the splice
// rows of every class ran (timings are reported, not asserted).
func TestBenchHitUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bench hit --user needs root (ptrace, tracefs, BPF)")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	var out, errb bytes.Buffer
	err := BenchHitUser(context.Background(), HitOptions{Calls: 200000, Runs: 2, JSON: true}, Env{Out: &out, Err: &errb})
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var rep output.HitReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	ran := map[string]bool{}
	for _, r := range rep.Rows {
		t.Logf("%-20s %-10s %8.1f ns  ratio %8.2f  hits %d %s", r.Mechanism, r.Point, r.NsPerCall, r.Ratio, r.Hits, r.Skipped)
		if r.Mechanism == "none" || r.Skipped != "" {
			continue
		}
		ran[r.Mechanism] = true
		want := rep.Expected
		if r.Calls != 0 {
			want = r.Calls
		}
		if r.Hits != want {
			t.Errorf("%s: %d hits, want the %d calls it timed", r.Mechanism, r.Hits, want)
		}
	}
	// Every class is planned at the first instruction of hit() that
	// takes it, and hit() has instructions of every length.
	for _, m := range []string{"direct splice", "springboard splice", "covering splice", "trap splice", "punned splice"} {
		if !ran[m] {
			t.Errorf("%s did not run (rows that ran: %v)", m, ran)
		}
	}
}
