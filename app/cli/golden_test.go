package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/kerninstd/kerninstdtest"
	"github.com/kinst/kinst/output"
)

// The reports are compared with golden files in testdata/, written
// through a real kerninstd over an in-memory kernel (kerninstdtest) with
// a clock the test moves: `go test ./app/cli -update` rewrites them.
var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares a report's stdout and stderr with testdata/name.
func golden(t *testing.T, name string, stdout, stderr string) {
	t.Helper()
	got := "-- stdout --\n" + stdout + "-- stderr --\n" + stderr
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./app/cli -update writes it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the report (go test ./app/cli -update rewrites it):\n%s", path, lineDiff(string(want), got))
	}
}

// lineDiff shows the lines of want and got from the first that differs.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	show := func(l []string) string {
		l = l[min(i, len(l)):]
		return strings.Join(l[:min(len(l), 8)], "\n")
	}
	return fmt.Sprintf("line %d: want\n%s\ngot\n%s", i+1, show(w), show(g))
}

// buffer is a bytes.Buffer safe for the report's and CMD's goroutines.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// fixture is a daemon over the test kernel and the environment of a
// report run against it, with -- CMD run in process by workloads.
type fixture struct {
	t       *testing.T
	s       *kerninstdtest.Server
	c       *api.Client
	stdout  buffer
	stderr  buffer
	env     Env
	sampled chan struct{}
	// workloads are the commands -- CMD may name: each gets CMD's
	// stdout and returns its exit status.
	workloads map[string]func(stdout io.Writer) int
}

func newFixture(t *testing.T, asJSON bool) *fixture {
	s := kerninstdtest.New(t)
	f := &fixture{t: t, s: s, c: s.Client, sampled: make(chan struct{}, 64), workloads: map[string]func(io.Writer) int{}}
	env, done, err := NewEnv(Streams{Stdin: strings.NewReader(""), Stdout: &f.stdout, Stderr: &f.stderr, JSON: asJSON})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { done(nil) })
	env.Clock = s.Clock
	env.sampled = func() { f.sampled <- struct{}{} }
	env.Start = func(argv []string, _ io.Reader, stdout, _ io.Writer) (Process, error) {
		w, ok := f.workloads[argv[0]]
		if !ok {
			return nil, fmt.Errorf("no workload %q", argv[0])
		}
		p := &inProcess{done: make(chan int, 1)}
		go func() {
			// A workload that fails its test (Fatal ends its goroutine)
			// still ends the command, with status -1.
			status := -1
			defer func() { p.done <- status }()
			status = w(stdout)
		}()
		return p, nil
	}
	f.env = env
	return f
}

// inProcess is a workload run as -- CMD.
type inProcess struct{ done chan int }

func (p *inProcess) Wait() int              { return <-p.done }
func (p *inProcess) Signal(os.Signal) error { return nil }

// streaming waits until the daemon samples the n-th stream of the test:
// its counts start from there.
func (f *fixture) streaming(n int) { f.s.Clock.AwaitTickers(n) }

// tick moves the clock by d and waits for the report to take the sample.
func (f *fixture) tick(d time.Duration) {
	f.s.Clock.Advance(d)
	<-f.sampled
}

func (f *fixture) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

// check compares the report with its golden file, after replacing
// session IDs (random) with their names.
func (f *fixture) check(name string, ids map[string]string) {
	f.t.Helper()
	out, errOut := f.stdout.String(), f.stderr.String()
	for id, n := range ids {
		// As wide as the ID, so that columns stay aligned.
		name := fmt.Sprintf("%-*.*s", len(id), len(id), "ID-"+n+strings.Repeat("_", len(id)))
		out = strings.ReplaceAll(out, id, name)
		errOut = strings.ReplaceAll(errOut, id, name)
	}
	golden(f.t, name, out, errOut)
}

var lookup = kerninstdtest.Addr("filename_lookup", 0xb)

func TestGoldenCount(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			f := newFixture(t, asJSON)
			f.workloads["lookups"] = func(stdout io.Writer) int {
				f.streaming(1)
				for i := uint64(1); i <= 3; i++ {
					f.must(f.s.Kernel.Count(lookup, 1000*i))
					f.tick(time.Second)
				}
				fmt.Fprintln(stdout, "workload: done")
				return 3
			}
			status, err := Count(context.Background(), f.c, CountOptions{Points: []string{"lookuppn"}, Interval: time.Second,
				JSON: asJSON, Name: "fs", Command: []string{"lookups"}}, f.env)
			if err != nil || status != 3 {
				t.Fatalf("status %d, %v", status, err)
			}
			f.check(map[bool]string{false: "count", true: "count-json"}[asJSON], nil)
		})
	}
}

// A run bounded by --duration: samples, then the deadline between two.
func TestGoldenCountDuration(t *testing.T) {
	f := newFixture(t, false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.s.Clock.AwaitTimer() // the deadline: the run has started
		f.streaming(1)
		for i := uint64(1); i <= 2; i++ {
			f.must(f.s.Kernel.Count(lookup, 10*i))
			f.tick(time.Second)
		}
		f.s.Clock.Advance(500 * time.Millisecond)
	}()
	status, err := Count(context.Background(), f.c, CountOptions{Points: []string{"filename_lookup+0xb", "do_sys_openat2"},
		Interval: time.Second, Duration: 2500 * time.Millisecond}, f.env)
	<-done
	if err != nil || status != 0 {
		t.Fatalf("status %d, %v", status, err)
	}
	f.check("count-duration", nil)
}

func TestGoldenTime(t *testing.T) {
	open := kerninstdtest.Addr("do_sys_openat2", 9)
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			f := newFixture(t, asJSON)
			f.workloads["opens"] = func(stdout io.Writer) int {
				f.streaming(1)
				for i := uint64(1); i <= 3; i++ {
					// i×100 calls of i×2 µs, and as many lookups of 1.5 µs.
					f.must(f.s.Kernel.Time(open, 100*i, 100*i*i*2000))
					f.must(f.s.Kernel.Time(lookup, 100*i, 100*i*1500))
					f.tick(time.Second)
				}
				fmt.Fprintln(stdout, "workload: done")
				return 0
			}
			status, err := Time(context.Background(), f.c, TimeOptions{Functions: []string{"do_sys_openat2", "filename_lookup"},
				Filter: api.Filter{PID: 42}, Interval: time.Second, JSON: asJSON, Name: "copen", TTL: time.Hour,
				Command: []string{"opens"}}, f.env)
			if err != nil || status != 0 {
				t.Fatalf("status %d, %v", status, err)
			}
			f.check(map[bool]string{false: "time", true: "time-json"}[asJSON], nil)
		})
	}
}

// drillWorkload runs one level of a drill-down: every function timed
// has the calls and ticks of costs.
func (f *fixture) drillWorkload(costs map[string][2]uint64) func(io.Writer) int {
	return func(io.Writer) int {
		list, err := f.c.Sessions(context.Background())
		f.must(err)
		for _, s := range list {
			for _, tm := range s.Timers {
				c := costs[tm.Function]
				f.must(f.s.Kernel.Time(uint64(tm.Entry.Address), c[0], c[1]))
			}
		}
		return 0
	}
}

func TestGoldenDrillDown(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			f := newFixture(t, asJSON)
			f.workloads["creat"] = f.drillWorkload(map[string][2]uint64{
				"do_sys_openat2": {1000, 10_000_000}, "do_filp_open": {1000, 7_000_000},
				"putname": {1000, 500_000}, "path_openat": {1000, 6_000_000},
			})
			err := DrillDown(context.Background(), f.c, DrillOptions{Root: "do_sys_openat2", Depth: 4, Callees: 24, MinShare: 0.3,
				JSON: asJSON, Command: []string{"creat"}}, f.env)
			if err != nil {
				t.Fatal(err)
			}
			f.check(map[bool]string{false: "drilldown", true: "drilldown-json"}[asJSON], nil)
		})
	}
}

// sessions makes two sessions: "fs" counting lookuppn, tied to nothing,
// with a TTL, and "copen" timing do_sys_openat2; it returns their IDs.
func (f *fixture) sessions() map[string]string {
	ctx := context.Background()
	fs, err := f.c.CreateSession(ctx, api.SessionRequest{Name: "fs", Points: []string{"lookuppn"}, TTLNS: int64(time.Hour)})
	f.must(err)
	f.s.Clock.Advance(30 * time.Second)
	cp, err := f.c.CreateSession(ctx, api.SessionRequest{Name: "copen", Timers: []string{"do_sys_openat2"}})
	f.must(err)
	return map[string]string{fs.ID: "fs", cp.ID: "copen"}
}

func TestGoldenWatch(t *testing.T) {
	open := kerninstdtest.Addr("do_sys_openat2", 9)
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			f := newFixture(t, asJSON)
			ids := f.sessions()
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := uint64(1); i <= 3; i++ {
					d := f.s.Clock.AwaitTimer()
					f.must(f.s.Kernel.Count(lookup, 500*i))
					f.must(f.s.Kernel.Time(open, 100*i, 100*i*3000))
					f.s.Clock.Advance(d)
				}
			}()
			err := Watch(context.Background(), f.c, WatchOptions{Interval: time.Second, Iterations: 3, History: 30, JSON: asJSON}, f.env)
			<-done
			if err != nil {
				t.Fatal(err)
			}
			f.check(map[bool]string{false: "watch", true: "watch-json"}[asJSON], ids)
		})
	}
}

func TestGoldenLsDetach(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			f := newFixture(t, asJSON)
			ids := f.sessions()
			f.must(f.s.Kernel.Count(lookup, 42))
			f.must(f.s.Kernel.Time(kerninstdtest.Addr("do_sys_openat2", 9), 7, 7*2500))
			f.s.Clock.Advance(90 * time.Second)
			ctx := context.Background()
			f.must(Ls(ctx, f.c, asJSON, f.env))
			f.must(Detach(ctx, f.c, "copen", asJSON, f.env))
			f.check(map[bool]string{false: "ls-detach", true: "ls-detach-json"}[asJSON], ids)
		})
	}
}

func TestGoldenRead(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		f := newFixture(t, asJSON)
		f.must(Read(context.Background(), f.c, "filename_lookup+0x9", 40, asJSON, f.env))
		f.check(map[bool]string{false: "rd", true: "rd-json"}[asJSON], nil)
	}
}

func TestGoldenCFG(t *testing.T) {
	for format, name := range map[CFGFormat]string{CFGText: "cfg", CFGJSON: "cfg-json", CFGDot: "cfg-dot"} {
		f := newFixture(t, format == CFGJSON)
		f.must(ShowCFG(context.Background(), f.c, "filename_lookup", format, f.env))
		f.check(name, nil)
	}
	for _, asJSON := range []bool{false, true} {
		f := newFixture(t, asJSON)
		f.must(ShowCalls(context.Background(), f.c, "path_openat", asJSON, f.env))
		f.check(map[bool]string{false: "cfg-calls", true: "cfg-calls-json"}[asJSON], nil)
	}
}

// Measured times (bench steps, the census's seconds) vary from run to
// run: normalize replaces them with D, and squeezes the spaces of text
// lines (tabwriter aligns columns to the widths of the times), so that
// the rest of the report is compared. Progress lines ("\r…") keep their
// last state.
var (
	durationText = regexp.MustCompile(`\b\d+(\.\d+)?( s|ns|µs|ms|s)\b`)
	timeJSON     = regexp.MustCompile(`("(\w+_ns|seconds)": )-?[0-9.e+-]+`)
	spaces       = regexp.MustCompile(` {2,}`)
)

func normalize(s string) string {
	s = timeJSON.ReplaceAllString(s, "${1}0")
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if j := strings.LastIndex(l, "\r"); j >= 0 {
			l = l[j+1:]
		}
		if !strings.HasPrefix(strings.TrimSpace(l), `"`) { // not JSON
			l = strings.TrimSpace(spaces.ReplaceAllString(durationText.ReplaceAllString(l, "D"), " "))
		}
		lines[i] = l
	}
	return strings.Join(lines, "\n")
}

func (f *fixture) checkNormalized(name string) {
	f.t.Helper()
	golden(f.t, name, normalize(f.stdout.String()), normalize(f.stderr.String()))
}

func TestGoldenCFGStats(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		f := newFixture(t, asJSON)
		f.must(ShowStats(context.Background(), f.c, asJSON, f.env))
		f.checkNormalized(map[bool]string{false: "cfg-stats", true: "cfg-stats-json"}[asJSON])
	}
}

func TestGoldenBenchSplice(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		f := newFixture(t, asJSON)
		f.must(BenchSplice(context.Background(), f.c, "lookuppn", 5, false, asJSON, f.env))
		f.checkNormalized(map[bool]string{false: "bench-splice", true: "bench-splice-json"}[asJSON])
	}
}

func TestGoldenBenchChurn(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		f := newFixture(t, asJSON)
		f.must(BenchChurn(context.Background(), f.c, api.ChurnRequest{Functions: []string{"filename_lookup"}, Cycles: 4, Seed: 1}, asJSON, f.env))
		f.checkNormalized(map[bool]string{false: "bench-churn", true: "bench-churn-json"}[asJSON])
	}
}

// bench hit times system calls and tracefs and BPF kprobes where it
// runs: its table is rendered from a report of known figures.
func TestGoldenBenchHit(t *testing.T) {
	rep := output.HitReport{Function: "__x64_sys_getppid", Calls: 1000, Runs: 3, Expected: 3000, Rows: []output.HitRow{
		{Mechanism: "none", NsPerCall: 812, Ratio: 1},
		{Mechanism: "direct splice", Point: "__x64_sys_getppid+0x5", NsPerCall: 830, Ratio: 1.022, Overhead: 0.022, Hits: 3000},
		{Mechanism: "springboard splice", Skipped: "no instruction of this class in the entry block"},
		{Mechanism: "trap splice", Point: "__x64_sys_getppid+0xa", NsPerCall: 2400, Ratio: 2.955, Overhead: 1.955, Hits: 2999},
		{Mechanism: "kprobe (int3)", Point: "__x64_sys_getppid+0x5", Skipped: "no tracefs at /sys/kernel/tracing"},
	}}
	for _, asJSON := range []bool{false, true} {
		var out bytes.Buffer
		if err := writeHitReport(&out, rep, asJSON); err != nil {
			t.Fatal(err)
		}
		golden(t, map[bool]string{false: "bench-hit", true: "bench-hit-json"}[asJSON], out.String(), "")
	}
}

func TestGoldenBenchArm(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		f := newFixture(t, asJSON)
		f.must(BenchArm(context.Background(), f.c, ArmOptions{Blocks: []int{3}, Single: true, Targets: []string{"filename_lookup"}, JSON: asJSON}, f.env))
		f.checkNormalized(map[bool]string{false: "bench-arm", true: "bench-arm-json"}[asJSON])
	}
}

// TestBenchArmPatchBytes: a bench arm run's patch heap in use is its own
// probes', whether the run before it was reclaimed yet or not (the second
// of two runs reported 96 bytes where the first's 48 were still waiting
// for their batched reclaim, 48 where arming took longer than its delay).
func TestBenchArmPatchBytes(t *testing.T) {
	f := newFixture(t, true)
	var got []uint64
	for i, single := range []bool{false, true, false} {
		if i == 2 {
			time.Sleep(100 * time.Millisecond) // the last run's reclaim is done
		}
		before := len(f.stdout.String())
		f.must(BenchArm(context.Background(), f.c, ArmOptions{Blocks: []int{3}, Single: single, Targets: []string{"filename_lookup"}, JSON: true}, f.env))
		var rep output.ArmReport
		if err := json.Unmarshal([]byte(f.stdout.String()[before:]), &rep); err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Runs {
			got = append(got, r.PatchBytes)
		}
	}
	// (--single runs the batched mode too: four runs.)
	if len(got) != 4 || got[0] == 0 || slices.ContainsFunc(got, func(n uint64) bool { return n != got[0] }) {
		t.Errorf("patch heap in use over four runs of three probes: %v, want the same each time", got)
	}
}

// kinst annotate: a counter at every block that takes one, each block
// run a known number of times while CMD runs (its probe's instruction,
// found from the session kerninstd lists); the counts land on the right
// blocks, the counters are gone after; then the same function marked
// from a saved coverage report, nothing installed.
func TestGoldenAnnotate(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			f := newFixture(t, asJSON)
			ran := map[uint64]uint64{} // probe address → executions
			f.workloads["lookups"] = func(stdout io.Writer) int {
				f.streaming(1)
				list, err := f.c.Sessions(context.Background())
				if err != nil || len(list) != 1 {
					t.Errorf("sessions %v, %v", list, err)
					return 1
				}
				for i, p := range list[0].Probes {
					ran[uint64(p.Address)] = uint64(10 * (i + 1))
					f.must(f.s.Kernel.Count(uint64(p.Address), uint64(10*(i+1))))
				}
				f.tick(time.Second)
				return 0
			}
			status, err := AnnotateFunction(context.Background(), f.c, AnnotateOptions{Function: "filename_lookup", JSON: asJSON,
				Command: []string{"lookups"}}, f.env)
			if err != nil || status != 0 {
				t.Fatalf("status %d, %v", status, err)
			}
			if info, err := f.c.Info(context.Background()); err != nil || info.Sessions != 0 || info.Splices != 0 {
				t.Errorf("after annotate: %+v, %v", info, err)
			}
			if len(ran) < 2 {
				t.Fatalf("%d blocks counted", len(ran))
			}
			f.check(map[bool]string{false: "annotate", true: "annotate-json"}[asJSON], nil)
		})
	}
	f := newFixture(t, false)
	status, err := AnnotateFunction(context.Background(), f.c, AnnotateOptions{Function: "filename_lookup", From: "testdata/cover-a.json"}, f.env)
	if err != nil || status != 0 {
		t.Fatalf("--from: status %d, %v", status, err)
	}
	f.check("annotate-from", nil)
	if _, err := AnnotateFunction(context.Background(), f.c, AnnotateOptions{Function: "do_sys_openat2", From: "testdata/cover-a.json"}, f.env); err == nil {
		t.Error("--from a report without the function succeeded")
	}
}

// A session removed by another client (kinst detach) while its run goes
// on: the stream ends, and the report stands on the last totals seen,
// said so, with kinst's status the command's (it failed with "no such
// session" and no totals).
func TestCountDetachedElsewhere(t *testing.T) {
	f := newFixture(t, false)
	f.workloads["lookups"] = func(stdout io.Writer) int {
		f.streaming(1)
		f.must(f.s.Kernel.Count(lookup, 1000))
		f.tick(time.Second)
		ss, err := f.c.Sessions(context.Background())
		f.must(err)
		_, err = f.c.RemoveSession(context.Background(), ss[0].ID) // kinst detach, elsewhere
		f.must(err)
		time.Sleep(100 * time.Millisecond) // the stream's end reaches the run first
		return 0
	}
	status, err := Count(context.Background(), f.c, CountOptions{Points: []string{"lookuppn"}, Interval: time.Second,
		Name: "fs", Command: []string{"lookups"}}, f.env)
	if err != nil || status != 0 {
		t.Fatalf("status %d, %v\n%s", status, err, f.stderr.String())
	}
	if !strings.Contains(f.stderr.String(), "session fs was removed elsewhere") || !regexp.MustCompile(`(?m)^1000 +lookuppn `).MatchString(f.stdout.String()) {
		t.Errorf("stdout:\n%s\nstderr:\n%s", f.stdout.String(), f.stderr.String())
	}
}
