package livemetrics

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/livetest"
	"github.com/kinst/kinst/output"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// timeJSON runs kinst time in the guest and decodes its report.
func timeJSON(t *testing.T, ctx context.Context, args ...string) output.TimeReport {
	t.Helper()
	argv := append([]string{"kinst", "time", "--json"}, args...)
	out, errs, code := guest.Exec(t, ctx, argv...)
	if code != 0 {
		t.Fatalf("%q: status %d\n%s\n%s", argv, code, out, errs)
	}
	var r output.TimeReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%q: %v\n%s", argv, err, out)
	}
	t.Logf("%s", errs)
	return r
}

// sleeps runs a script in which sleep processes record their start and
// end in /proc/uptime (10 ms resolution) on stderr, and returns the
// report and the sleeps' durations as the guest saw them: an oracle for
// the time spent inside do_nanosleep, which is slightly less.
func sleeps(t *testing.T, ctx context.Context, script string, args ...string) (output.TimeReport, []float64) {
	t.Helper()
	argv := append([]string{"kinst", "time", "--json", "do_nanosleep", "--comm", "sleep"}, args...)
	argv = append(argv, "--", "sh", "-c", script)
	out, errs, code := guest.Exec(t, ctx, argv...)
	if code != 0 {
		t.Fatalf("%q: status %d\n%s\n%s", argv, code, out, errs)
	}
	var r output.TimeReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var d []float64
	for _, line := range strings.Split(errs, "\n") {
		var s, e float64
		if n, _ := fmt.Sscanf(line, "uptime %f %f", &s, &e); n == 2 {
			d = append(d, e-s)
		}
	}
	if len(r.Functions) != 1 {
		t.Fatalf("functions %+v", r.Functions)
	}
	return r, d
}

// timedSleep is a shell snippet: sleep SECONDS, bracketed by uptime.
func timedSleep(sec int) string {
	return fmt.Sprintf(`s=$(cut -d" " -f1 /proc/uptime); sleep %d; echo "uptime $s $(cut -d" " -f1 /proc/uptime)" >&2`, sec)
}

// Three sleeps of 1 s, one after the other: do_nanosleep is where a
// sleeping task waits, so each call lasts its sleep. The comm filter keeps
// out every other sleeper in the guest (kerninstd's runtime sleeps too).
// Oracle: 1 s each at least (less 2 % for the TSC calibration), and no
// more than the guest's own measurement of each sleep plus 20 ms.
func TestWallTimeOfSleep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	one := timedSleep(1)
	r, d := sleeps(t, ctx, one+"; "+one+"; "+one)
	f := r.Functions[0]
	if f.Calls != 3 || len(d) != 3 {
		t.Fatalf("%d calls of do_nanosleep by sleep (%d measured), want 3", f.Calls, len(d))
	}
	guestSum := d[0] + d[1] + d[2]
	livetest.Within(t, "total wall time (s)", f.WallNS/1e9, 3*0.98, guestSum+3*0.02)
	livetest.Within(t, "average wall time (s)", f.AvgWallNS/1e9, 0.98, guestSum/3+0.02)
	// One sleep at a time: concurrency is at most 1, and the sleeps
	// fill most of the run.
	livetest.Within(t, "concurrency", f.Concurrency, 0.5, 1.0)
	t.Logf("kernel: %d calls, %.3f s in all; the guest measured %.2f s", f.Calls, f.WallNS/1e9, guestSum)
}

// Four sleeps of 2 s at once: four threads inside do_nanosleep together,
// so an interval wholly inside their common window shows concurrency 4.
func TestConcurrencyOfHeldThreads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 4
	r, d := sleeps(t, ctx, fmt.Sprintf("for i in $(seq %d); do (%s) & done; wait", n, timedSleep(2)), "--interval", "250ms")
	f := r.Functions[0]
	if f.Calls != n || len(d) != n {
		t.Fatalf("%d calls (%d measured), want %d", f.Calls, len(d), n)
	}
	guestSum := 0.0
	for _, x := range d {
		guestSum += x
	}
	livetest.Within(t, "total wall time (s)", f.WallNS/1e9, n*2*0.98, guestSum+n*0.02)
	peak := 0.0
	for _, iv := range r.Intervals {
		peak = max(peak, iv.Functions[0].Concurrency)
	}
	// Never more than n threads inside; the 250 ms intervals inside the
	// window where all four sleep show n, up to the TSC calibration.
	livetest.Within(t, "peak interval concurrency", peak, n*0.95, n*1.02)
}

// The pid predicate: process A makes 3000 stat calls, process B 5000, at
// the same time; timing filename_lookup (one call per stat) for A's pid
// counts A's alone.
func TestPIDPredicate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A is the subshell that execs the workload, so $A is its pid; the
	// command under kinst time releases A, runs B, and waits for A (a
	// zombie until the outer shell reaps it, hence the state check).
	script := `set -e
rm -f /tmp/go-a; mkfifo /tmp/go-a
(read x < /tmp/go-a; exec kinst workload stat 3000 /) &
A=$!
kinst time filename_lookup --pid $A --json -- sh -c "echo go > /tmp/go-a & kinst workload stat 5000 /
while [ -e /proc/$A ] && [ \"\$(cut -d' ' -f3 /proc/$A/stat)\" != Z ]; do sleep 0.1; done"`
	out := guest.Sh(t, ctx, script)
	var r output.TimeReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.HasPrefix(r.Filter, "pid ") {
		t.Errorf("filter %q", r.Filter)
	}
	calls := r.Functions[0].Calls
	// A's own start-up may look up a few paths after the fifo opens.
	if calls < 3000 || calls > 3050 {
		t.Fatalf("filename_lookup calls by A: %d, want 3000 (+50 for its start-up), not B's 5000 too", calls)
	}
}

// An untied session named "scrape" with a TTL: Prometheus's parser reads
// /metrics, kinst ls lists the session, and the TTL removes it and puts
// the original bytes back. A second session goes with kinst detach.
func TestMetricsEndpointAndSessions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := guest.Client
	s, err := c.CreateSession(ctx, api.SessionRequest{Name: "scrape", Timers: []string{"do_sys_openat2"}, TTLNS: int64(20 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	entry := s.Timers[0].Entry
	guest.Sh(t, ctx, "kinst workload files /tmp 200")

	// The guest's TCP listener wants its token: first without (refused),
	// then with it.
	resp, err := http.Get("http://" + guest.KerninstdAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /metrics without the token: %s; want 401", resp.Status)
	}
	tok, err := api.ReadToken(guest.TokenFile())
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+guest.KerninstdAddr()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	var calls, wall float64
	for _, m := range fams["kinst_function_calls_total"].GetMetric() {
		for _, l := range m.Label {
			if l.GetName() == "session" && l.GetValue() == "scrape" {
				calls = m.GetCounter().GetValue()
			}
		}
	}
	for _, m := range fams["kinst_function_wall_seconds_total"].GetMetric() {
		wall = max(wall, m.GetCounter().GetValue())
	}
	// 200 rounds each open a file to write it and again to read it.
	if calls < 400 || wall <= 0 {
		t.Fatalf("do_sys_openat2 calls %v, wall %v s; want ≥ 400 and > 0", calls, wall)
	}

	// kinst watch sees the session's timer, with a rate while files are
	// opened.
	w := guest.Sh(t, ctx, "kinst workload files /tmp 300 & kinst watch --json --iterations 2 --interval 300ms; wait")
	var rows []output.WatchRow
	if err := json.Unmarshal([]byte(w), &rows); err != nil || len(rows) != 1 || rows[0].Metric != "time do_sys_openat2" ||
		rows[0].Session != "scrape" || rows[0].Total < uint64(calls) || len(rows[0].History) != 2 {
		t.Errorf("kinst watch: %v %s", err, w)
	}

	ls := guest.Sh(t, ctx, "kinst ls --json")
	var list []api.Session
	if err := json.Unmarshal([]byte(ls), &list); err != nil || len(list) != 1 || list[0].Name != "scrape" || list[0].Expires == nil {
		t.Fatalf("kinst ls: %v %s", err, ls)
	}
	if _, err := c.CreateSession(ctx, api.SessionRequest{Name: "manual", Timers: []string{"vfs_read"}}); err != nil {
		t.Fatal(err)
	}
	if out := guest.Sh(t, ctx, "kinst detach manual"); !strings.Contains(out, "detached manual") {
		t.Errorf("kinst detach: %s", out)
	}

	deadline := time.Now().Add(40 * time.Second)
	for {
		list, err := c.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions still there after their TTL: %+v", list)
		}
		time.Sleep(500 * time.Millisecond)
	}
	mem, err := c.Read(ctx, fmt.Sprintf("%#x", uint64(entry.Address)), entry.Length)
	if err != nil {
		t.Fatal(err)
	}
	if mem.Bytes != entry.Bytes {
		t.Fatalf("entry bytes after the TTL %s, want the original %s", mem.Bytes, entry.Bytes)
	}
	_ = hex.EncodeToString
}

// kinst time --svg writes an SVG with both panels; it parses as XML and
// rasterises with rsvg-convert on the host (skipped if not installed).
func TestPlotRenders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	guest.Sh(t, ctx, "kinst time do_sys_openat2 vfs_read --interval 200ms --svg /tmp/plot.svg -- kinst workload files /tmp 300 >/dev/null")
	svg := guest.Sh(t, ctx, "cat /tmp/plot.svg")
	var doc struct {
		XMLName xml.Name `xml:"svg"`
		Groups  []struct {
			ID    string `xml:"id,attr"`
			Paths []struct {
				Series string `xml:"data-series,attr"`
			} `xml:"path"`
		} `xml:"g"`
	}
	if err := xml.Unmarshal([]byte(svg), &doc); err != nil {
		t.Fatalf("plot is not XML: %v", err)
	}
	panels := 0
	for _, g := range doc.Groups {
		if g.ID == "calls" || g.ID == "concurrency" {
			panels++
			if len(g.Paths) != 2 || g.Paths[0].Series != "do_sys_openat2" || g.Paths[1].Series != "vfs_read" {
				t.Errorf("panel %s paths %+v", g.ID, g.Paths)
			}
		}
	}
	if panels != 2 {
		t.Fatalf("%d panels", panels)
	}
	rsvg, err := exec.LookPath("rsvg-convert")
	if err != nil {
		t.Skip("rsvg-convert not installed (apt-get install librsvg2-bin): structure checked, rasterising skipped")
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "plot.svg")
	os.WriteFile(in, []byte(svg), 0o600)
	out, err := exec.Command(rsvg, in).Output()
	if err != nil || !bytes.HasPrefix(out, []byte("\x89PNG")) {
		t.Fatalf("rsvg-convert: %v (%d bytes)", err, len(out))
	}
}

// Virtual time of a sleep: the task is off the CPU for almost all of each
// call, so on-CPU time is a small fraction of wall time (what remains is
// arming the timer and scheduling, slow under emulation: allow 5 %).
func TestVirtualTimeOfSleep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	one := timedSleep(1)
	r, d := sleeps(t, ctx, one+"; "+one, "--virtual")
	f := r.Functions[0]
	if f.Calls != 2 || len(d) != 2 || f.VirtualNS == nil {
		t.Fatalf("%d calls (%d measured), virtual %v", f.Calls, len(d), f.VirtualNS)
	}
	livetest.Within(t, "total wall time (s)", f.WallNS/1e9, 2*0.98, d[0]+d[1]+2*0.02)
	livetest.Within(t, "virtual / wall", *f.VirtualNS/f.WallNS, 0, 0.05)
	t.Logf("wall %.3f s, virtual %.3f ms", f.WallNS/1e9, *f.VirtualNS/1e6)
}

// Virtual time of a CPU-bound path: getppid never sleeps, so wall ≈
// virtual (a preemption inside a call is the only difference: allow 5 %);
// and the calls counted equal the calls the workload made.
func TestVirtualTimeOfCPUBound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := []string{"kinst", "time", "--json", "--virtual", "__x64_sys_getppid", "--comm", "kinst", "--", "kinst", "workload", "spin", "2s"}
	out, errs, code := guest.Exec(t, ctx, argv...)
	if code != 0 {
		t.Fatalf("status %d\n%s\n%s", code, out, errs)
	}
	var r output.TimeReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	var made uint64
	for _, line := range strings.Split(errs, "\n") {
		fmt.Sscanf(line, "workload: %d getppid calls", &made)
	}
	f := r.Functions[0]
	if made == 0 || f.Calls != made || f.VirtualNS == nil {
		t.Fatalf("calls %d, the workload made %d; virtual %v", f.Calls, made, f.VirtualNS)
	}
	livetest.Within(t, "virtual / wall", *f.VirtualNS/f.WallNS, 0.95, 1.0)
	t.Logf("%d calls, wall %.3f ms, virtual %.3f ms", f.Calls, f.WallNS/1e6, *f.VirtualNS/1e6)
}

// The drill-down from copen: under 1000 open(O_CREAT|O_TRUNC) calls,
// do_sys_openat2 is called at least 1000 times and its heaviest callee is
// do_filp_open (path lookup, the open and the truncation happen there),
// which the drill-down follows to the next level.
func TestDrillDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := guest.Sh(t, ctx, "kinst drilldown do_sys_openat2 --depth 2 --callees 8 --json -- kinst workload creat /tmp 1000")
	var r output.DrillReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(r.Levels) != 2 {
		t.Fatalf("%d levels, want 2: %s", len(r.Levels), out)
	}
	top := r.Levels[0]
	if top.Rows[0].Function != "do_sys_openat2" || top.Rows[0].Calls < 1000 {
		t.Fatalf("level 0 starts with %+v, want do_sys_openat2 with ≥ 1000 calls", top.Rows[0])
	}
	if len(top.Rows) < 2 || top.Rows[1].Function != "do_filp_open" || top.Rows[1].Share < 0.5 {
		t.Fatalf("heaviest callee %+v, want do_filp_open with most of the time", top.Rows[1:])
	}
	if r.Levels[1].Function != "do_filp_open" {
		t.Fatalf("level 1 is %s, want do_filp_open", r.Levels[1].Function)
	}
}
