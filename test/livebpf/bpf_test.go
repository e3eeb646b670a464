package livebpf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/output"
)

func TestNoDriver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in, err := client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Mechanism != "bpf" {
		t.Errorf("kerninstd mechanism %q, want bpf", in.Mechanism)
	}
	out := gsh(t, ctx, "cut -d' ' -f1 /proc/modules; ls /dev/kerninst 2>&1 || true")
	if strings.Contains(out, "kerninst\n") || !strings.Contains(out, "No such file") {
		t.Fatalf("the driver is there:\n%s", out)
	}
	nothingAttached(t, ctx)
}

// countWithOracle counts point over statCalls stat(2) calls and a tracefs
// kprobe on filename_lookup over a slightly wider window.
func countWithOracle(t *testing.T, ctx context.Context, point string) (output.CountProbe, uint64) {
	t.Helper()
	out := gsh(t, ctx, fmt.Sprintf(`T=/sys/kernel/tracing
echo 'p:kinst/oracle filename_lookup' >> $T/kprobe_events
echo 1 > $T/events/kinst/oracle/enable
before=$(awk '$1=="oracle"{print $2}' $T/kprobe_profile)
kinst count %s --json -- kinst workload stat %d / > /tmp/count.json
after=$(awk '$1=="oracle"{print $2}' $T/kprobe_profile)
echo 0 > $T/events/kinst/oracle/enable
echo '-:kinst/oracle' >> $T/kprobe_events
echo "$before $after"
cat /tmp/count.json`, point, statCalls))
	first, rest, _ := strings.Cut(out, "\n")
	var before, after uint64
	if _, err := fmt.Sscan(first, &before, &after); err != nil {
		t.Fatalf("kprobe_profile readings %q: %v", first, err)
	}
	var rep output.CountReport
	if err := json.Unmarshal([]byte(rest), &rep); err != nil {
		t.Fatalf("count --json: %v\n%s", err, rest)
	}
	if len(rep.Probes) != 1 || rep.ExitStatus == nil || *rep.ExitStatus != 0 {
		t.Fatalf("count report: %+v", rep)
	}
	return rep.Probes[0], after - before
}

// TestCountByBPF counts filename_lookup at its entry (fentry) and at an
// instruction of its entry block (a kprobe at FUNC+OFF): each equals the
// workload's calls within the guest's own lookups, and the kprobe
// oracle's count, whose window is a little wider.
func TestCountByBPF(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := client.CFG(ctx, "filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	// An instruction of the entry block past the first (ENDBR or the
	// ftrace call site), and not a call: kprobes refuse nothing there.
	var second string
	for _, in := range g.Blocks[0].Instructions[1:] {
		if !strings.HasPrefix(in.Text, "call") && !strings.HasPrefix(in.Text, "nop") {
			second = fmt.Sprintf("filename_lookup+%#x", in.Offset)
			break
		}
	}
	if second == "" {
		t.Fatalf("no instruction to probe in filename_lookup's entry block: %+v", g.Blocks[0])
	}
	for _, tc := range []struct{ point, mechanism string }{
		{"lookuppn", "fentry"},
		{second, "kprobe"},
	} {
		t.Run(tc.mechanism, func(t *testing.T) {
			p, oracle := countWithOracle(t, ctx, tc.point)
			t.Logf("%s by %s: %d; kprobe oracle %d; workload %d stat calls", tc.point, p.Mechanism, p.Count, oracle, statCalls)
			if p.Mechanism != tc.mechanism || p.Function != "filename_lookup" {
				t.Errorf("probe %+v, want mechanism %s", p, tc.mechanism)
			}
			if p.Count < statCalls || p.Count > statCalls+slack {
				t.Errorf("counted %d calls, want %d..%d", p.Count, statCalls, statCalls+slack)
			}
			if oracle < p.Count || oracle > p.Count+slack {
				t.Errorf("kprobe oracle %d, kinst %d: want the oracle in [kinst, kinst+%d]", oracle, p.Count, slack)
			}
			nothingAttached(t, ctx)
		})
	}
}

// TestTimeByBPF times clock_nanosleep(2) over 20 sleeps of 50 ms made by
// one shell: 20 calls, at least a second in all, within the emulated
// guest's late wake-ups. (busybox's usleep, through glibc, is the only
// caller of clock_nanosleep here: Go programs sleep with nanosleep(2).)
func TestTimeByBPF(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := gsh(t, ctx, `kinst time --json __x64_sys_clock_nanosleep -- sh -c 'i=0; while [ $i -lt 20 ]; do usleep 50000; i=$((i+1)); done'`)
	var rep output.TimeReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("time --json: %v\n%s", err, out)
	}
	if len(rep.Functions) != 1 {
		t.Fatalf("time report: %+v", rep)
	}
	f := rep.Functions[0]
	t.Logf("__x64_sys_clock_nanosleep by %s: %d calls, %.3f s in all, %.1f ms each", f.Mechanism, f.Calls, f.WallNS/1e9, f.AvgWallNS/1e6)
	if f.Mechanism != "fentry" {
		t.Errorf("mechanism %q, want fentry", f.Mechanism)
	}
	// init's `sleep 3600` is asleep throughout: its call neither starts
	// nor ends in the window; allow a few other sleepers.
	if f.Calls < 20 || f.Calls > 25 {
		t.Errorf("%d calls, want 20..25", f.Calls)
	}
	if f.WallNS < 20*50e6*0.98 || f.WallNS > 20*50e6*3 {
		t.Errorf("%.3f s inside, want about %.3f s", f.WallNS/1e9, 20*50e6/1e9)
	}
	nothingAttached(t, ctx)
}

// TestRefusedWithoutDriver: what only splices serve is refused with a
// clear error, and nothing is attached afterwards.
func TestRefusedWithoutDriver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name string
		req  api.SessionRequest
		says string
	}{
		{"cover", api.SessionRequest{Cover: []string{"filename_lookup"}}, "coverage needs the driver"},
		{"filter", api.SessionRequest{Timers: []string{"filename_lookup"}, Filter: &api.Filter{PID: 1}}, "filters"},
		{"virtual", api.SessionRequest{Timers: []string{"filename_lookup"}, Virtual: true}, "virtual"},
		{"unknown function", api.SessionRequest{Points: []string{"kinst_no_such_function"}}, "kinst_no_such_function"},
		{"mid-instruction", api.SessionRequest{Points: []string{"filename_lookup+0x1"}}, "boundary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.CreateSession(ctx, tc.req)
			var ae *api.APIError
			if !errors.As(err, &ae) || ae.Status >= 500 || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("CreateSession = %v, want a 4xx saying %q", err, tc.says)
			}
		})
	}
	if ss, err := client.Sessions(ctx); err != nil || len(ss) != 0 {
		t.Fatalf("sessions after refusals: %+v, %v", ss, err)
	}
	// The command line says it as plainly.
	_, errs, code := live.Exec(t, ctx, "kinst", "cover", "vfs_read", "-d", "1s")
	if code == 0 || !strings.Contains(errs, "kinst driver load") {
		t.Errorf("kinst cover without the driver: status %d, stderr %q", code, errs)
	}
	nothingAttached(t, ctx)
}

// TestRequestTime times a count request's attach and detach through
// kerninstd's API by each mechanism, five times each, and logs the
// medians: a figure for docs/setup.md, compared with the splices' (kinst
// bench splice), not asserted.
func TestRequestTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g, err := client.CFG(ctx, "filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	off := fmt.Sprintf("filename_lookup+%#x", g.Blocks[0].Instructions[1].Offset)
	for _, tc := range []struct{ point, mechanism string }{{"filename_lookup", "fentry"}, {off, "kprobe"}} {
		var attach, detach []time.Duration
		for i := 0; i < 5; i++ {
			// A kprobe just detached may leave its int3 for a moment
			// (the kernel unoptimizes it from delayed work), and the
			// planner refuses a byte another tool owns: wait for it.
			for wait := 0; wait < 50; wait++ {
				if b, err := live.ReadVirt(uint64(g.Address)+g.Blocks[0].Instructions[1].Offset, 1); err == nil && b[0] != 0xcc {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			start := time.Now()
			s, err := client.CreateSession(ctx, api.SessionRequest{Points: []string{tc.point}})
			if err != nil {
				t.Fatal(err)
			}
			mid := time.Now()
			if _, err := client.RemoveSession(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			attach, detach = append(attach, mid.Sub(start)), append(detach, time.Since(mid))
			if s.Probes[0].Mechanism != tc.mechanism {
				t.Fatalf("%s by %s, want %s", tc.point, s.Probes[0].Mechanism, tc.mechanism)
			}
		}
		t.Logf("%s by %s: attach median %v, detach median %v (5 requests, TCG guest)", tc.point, tc.mechanism, medianDur(attach), medianDur(detach))
	}
	nothingAttached(t, ctx)
}

func medianDur(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
