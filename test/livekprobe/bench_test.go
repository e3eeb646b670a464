package livekprobe

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/app/livetest"
	"github.com/kinst/kinst/output"
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
	var rep output.HitReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bench hit --json: %v\n%s", err, out)
	}
	if rep.Expected != 20000*3 {
		t.Errorf("expected_hits %d, want %d", rep.Expected, 20000*3)
	}
	rows := map[string]output.HitRow{}
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
	for _, m := range []string{"none", "direct splice", "kprobe (int3)", "kprobe (optimized)", "bpf kprobe", "bpf fentry", "bpf kprobe.multi"} {
		r, ok := rows[m]
		if !ok {
			t.Errorf("no %q row", m)
		} else if m == "bpf kprobe.multi" && strings.Contains(r.Skipped, "not supported") {
			t.Logf("this kernel has no kprobe.multi: %s", r.Skipped) // Debian 6.1 is built without CONFIG_FPROBE
		} else if r.Skipped != "" {
			t.Errorf("%s skipped: %s", m, r.Skipped)
		}
	}
}

// TestBenchSpliceAgainstKprobe runs `kinst bench splice --kprobe`: the
// same request made as a tracefs kprobe must have been timed, and the text
// restored. The ratio is reported (a benchmark, not asserted).
func TestBenchSpliceAgainstKprobe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, errOut, code := gexec(t, ctx, "kinst", "bench", "splice", "lookuppn", "--cycles", "200", "--kprobe", "--json")
	if code != 0 {
		t.Fatalf("bench splice: status %d\n%s", code, errOut)
	}
	var res output.BenchSpliceReport
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench splice --json: %v\n%s", err, out)
	}
	if !res.Restored || res.Cycles != 200 {
		t.Errorf("%d cycles, restored %v", res.Cycles, res.Restored)
	}
	if k := res.Kprobe; k.Skipped != "" || k.Attach.N == 0 || k.Ratio <= 0 {
		t.Fatalf("kprobe comparison: %+v", k)
	}
	t.Logf("kinst request %v (median of steps); tracefs kprobe define+enable %v: %.1f×",
		time.Duration(res.Request), time.Duration(res.Kprobe.Attach.Median), res.Kprobe.Ratio)
}

// Waiters on module_mutex: four shells read /proc/modules (which takes the
// mutex) in loops. Oracle: a tracefs kprobe on __mutex_lock_slowpath,
// filtered on the same lock, over a slightly wider window, counts at
// least as many contended acquisitions as kinst; the average number of
// waiters is between 0 and the four contenders.
func TestWaitersAgreeWithKprobe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Contention depends on scheduling: a round without any contended
	// acquisition proves nothing, so try up to three.
	var out string
	for round := 0; round < 3; round++ {
		out = gsh(t, ctx, `T=/sys/kernel/tracing
A=0x$(awk '$3=="module_mutex"{print $1}' /proc/kallsyms)
echo 'p:kinst/waitor __mutex_lock_slowpath lock=%di:x64' >> $T/kprobe_events
echo "lock == $A" > $T/events/kinst/waitor/filter
echo > $T/trace
echo 1 > $T/events/kinst/waitor/enable
kinst waiters module_mutex --json -- sh -c 'for i in 1 2 3 4 5 6; do (for j in $(seq 80); do cat /proc/modules >/dev/null; done) & done; wait' > /tmp/waiters.json
echo 0 > $T/events/kinst/waitor/enable
n=$(grep -c waitor: $T/trace || true)
echo '-:kinst/waitor' >> $T/kprobe_events
echo "kprobe $n"
cat /tmp/waiters.json`)
		if !strings.HasPrefix(out, "kprobe 0\n") {
			break
		}
	}
	if strings.HasPrefix(out, "kprobe 0\n") {
		t.Skip("no contended acquisition of module_mutex in three rounds: nothing to compare")
	}
	first, rest, _ := strings.Cut(out, "\n")
	var oracle uint64
	if _, err := fmt.Sscanf(first, "kprobe %d", &oracle); err != nil {
		t.Fatalf("%q: %v", first, err)
	}
	var r output.TimeReport
	if err := json.Unmarshal([]byte(rest), &r); err != nil {
		t.Fatalf("%v\n%s", err, rest)
	}
	f := r.Functions[0]
	if !strings.HasPrefix(r.Filter, "lock module_mutex") {
		t.Errorf("filter %q", r.Filter)
	}
	t.Logf("kinst: %d contended acquisitions, %.3f average waiters, wait %.2f ms (%.2f ms spinning); kprobe: %d", f.Calls, f.Concurrency, f.AvgWallNS/1e6, *f.AvgVirtual/1e6, oracle)
	if f.Calls > oracle || (oracle > 0 && f.Calls == 0) {
		t.Errorf("kinst counted %d slow-path entries for the lock, the kprobe %d: want 0 < kinst ≤ kprobe", f.Calls, oracle)
	}
	livetest.Within(t, "average waiters", f.Concurrency, 0, 4)
}
