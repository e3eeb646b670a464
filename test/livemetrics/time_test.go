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

	"github.com/kinst/kinst/internal/cli"
	"github.com/kinst/kinst/kerninstd"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// timeJSON runs kinst time in the guest and decodes its report.
func timeJSON(t *testing.T, ctx context.Context, args ...string) cli.TimeReport {
	t.Helper()
	argv := append([]string{"kinst", "time", "--json"}, args...)
	out, errs, code := guest.Exec(t, ctx, argv...)
	if code != 0 {
		t.Fatalf("%q: status %d\n%s\n%s", argv, code, out, errs)
	}
	var r cli.TimeReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%q: %v\n%s", argv, err, out)
	}
	t.Logf("%s", errs)
	return r
}

func within(t *testing.T, what string, got, lo, hi float64) {
	t.Helper()
	if got < lo || got > hi {
		t.Errorf("%s = %.4g, want [%.4g, %.4g]", what, got, lo, hi)
	}
}

// Three sleeps of 1 s each: do_nanosleep is where a sleeping task waits, so
// each call lasts the sleep. The comm filter keeps out every other
// sleeper in the guest (kerninstd's own runtime sleeps too).
func TestWallTimeOfSleep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := timeJSON(t, ctx, "do_nanosleep", "--comm", "sleep", "--", "sh", "-c", "sleep 1; sleep 1; sleep 1")
	if len(r.Functions) != 1 {
		t.Fatalf("functions %+v", r.Functions)
	}
	f := r.Functions[0]
	if f.Calls != 3 {
		t.Fatalf("%d calls of do_nanosleep by sleep, want 3", f.Calls)
	}
	within(t, "average wall time (s)", f.AvgWallNS/1e9, 0.98, 1.2)
	within(t, "total wall time (s)", f.WallNS/1e9, 3*0.98, 3*1.2)
	within(t, "concurrency", f.Concurrency, 0.98*f.WallNS/float64(r.DurationNS)*0.9, 1)
}

// Four sleeps of 2 s at once: four threads inside do_nanosleep together,
// so the intervals wholly inside the common window show concurrency 4.
func TestConcurrencyOfHeldThreads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 4
	r := timeJSON(t, ctx, "do_nanosleep", "--comm", "sleep", "--interval", "250ms", "--",
		"sh", "-c", fmt.Sprintf("for i in $(seq %d); do sleep 2 & done; wait", n))
	f := r.Functions[0]
	if f.Calls != n {
		t.Fatalf("%d calls, want %d", f.Calls, n)
	}
	within(t, "total wall time (s)", f.WallNS/1e9, n*2*0.98, n*2*1.2)
	peak := 0.0
	for _, iv := range r.Intervals {
		peak = max(peak, iv.Functions[0].Concurrency)
	}
	within(t, "peak interval concurrency", peak, n*0.95, n*1.02)
}

// The pid predicate: process A makes 3000 stat calls, process B 5000, at
// the same time; timing filename_lookup (one call per stat) for A's pid
// counts A's alone.
func TestPIDPredicate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	script := `set -e
rm -f /tmp/go-a; mkfifo /tmp/go-a
(read x < /tmp/go-a; exec kinst workload stat 3000 /) &
A=$!
kinst time filename_lookup --pid $A --json -- sh -c "echo go > /tmp/go-a & kinst workload stat 5000 /; while kill -0 $A 2>/dev/null; do sleep 0.1; done"`
	out := guest.Sh(t, ctx, script)
	var r cli.TimeReport
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
	s, err := c.CreateSession(ctx, kerninstd.SessionRequest{Name: "scrape", Timers: []string{"do_sys_openat2"}, TTLNS: int64(20 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	entry := s.Timers[0].Entry
	guest.Sh(t, ctx, "kinst workload files /tmp 200")

	resp, err := http.Get("http://" + guest.KerninstdAddr() + "/metrics")
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

	ls := guest.Sh(t, ctx, "kinst ls --json")
	var list []kerninstd.Session
	if err := json.Unmarshal([]byte(ls), &list); err != nil || len(list) != 1 || list[0].Name != "scrape" || list[0].Expires == nil {
		t.Fatalf("kinst ls: %v %s", err, ls)
	}
	if _, err := c.CreateSession(ctx, kerninstd.SessionRequest{Name: "manual", Timers: []string{"vfs_read"}}); err != nil {
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

// kinst time --plot writes an SVG with both panels; it parses as XML and
// rasterises with rsvg-convert on the host (skipped if not installed).
func TestPlotRenders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	guest.Sh(t, ctx, "kinst time do_sys_openat2 vfs_read --interval 200ms --plot /tmp/plot.svg -- kinst workload files /tmp 300 >/dev/null")
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
