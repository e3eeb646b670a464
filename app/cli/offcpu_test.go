package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/unwind/folded"
	"github.com/kinst/kinst/unwind/offcpu"
)

// TestOffCPUReports runs `kinst offcpu` on a sleep(1) process and checks
// every output: JSON shape, folded text, SVG and pprof files.
func TestOffCPUReports(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: /proc/PID/task/TID/stack is root-only")
	}
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	time.Sleep(100 * time.Millisecond)
	dir := t.TempDir()
	base := OffCPUOptions{Options: offcpu.Options{PID: sleep.Process.Pid}, Frequency: 100, Duration: 300 * time.Millisecond, Top: 5}

	o := base
	o.JSON = true
	o.SVG = filepath.Join(dir, "off.svg")
	o.Pprof = filepath.Join(dir, "off.pb.gz")
	var out, errOut bytes.Buffer
	if err := OffCPU(context.Background(), o, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var r output.OffCPUReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out.String())
	}
	if r.Mode != "sample" || r.Passes == nil || *r.Passes < 2 || len(r.Top) != 1 || r.Top[0].Group != "sleep" || r.Top[0].State != "S" ||
		!strings.Contains(strings.Join(r.Top[0].Kernel, ";"), "nanosleep") || r.TotalNS <= 0 {
		t.Errorf("report %+v", r)
	}
	checkOffCPUKeys(t, out.Bytes(), map[string]bool{"attach": true, "lost": true}, map[string]bool{"pid": true, "tid": true})

	for _, f := range []string{o.SVG, o.Pprof} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}

	// Grouped by thread id, each stack has its process and thread.
	o = base
	o.JSON, o.Group = true, offcpu.ByTID
	out.Reset()
	if err := OffCPU(context.Background(), o, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	checkOffCPUKeys(t, out.Bytes(), map[string]bool{"attach": true, "lost": true}, nil)
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if pid := sleep.Process.Pid; len(r.Top) != 1 || r.Top[0].PID == nil || *r.Top[0].PID != pid || r.Top[0].TID == nil || *r.Top[0].TID != pid {
		t.Errorf("--group tid: top %+v, want pid and tid %d", r.Top, pid)
	}

	// Tracing: what only sampling counts is null.
	o = base
	o.JSON, o.Trace, o.Frequency = true, true, 0
	out.Reset()
	if err := OffCPU(context.Background(), o, &out, &errOut); err != nil {
		t.Logf("no trace report (BPF): %v", err)
	} else {
		checkOffCPUKeys(t, out.Bytes(), map[string]bool{"period_ns": true, "passes": true, "thread_visits": true, "unreadable": true},
			map[string]bool{"pid": true, "tid": true})
	}

	o = base
	o.Folded = true
	o.Fold.KernelOnly = true
	o.KernelOnly = true
	out.Reset()
	if err := OffCPU(context.Background(), o, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	p, err := folded.Parse(&out)
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 1 || !strings.HasPrefix(p.Stacks()[0].Frames[0], "sleep") {
		t.Errorf("folded: %+v", p.Stacks())
	}
}

func TestOffCPURejects(t *testing.T) {
	for _, o := range []OffCPUOptions{
		{Frequency: 49, Folded: true, JSON: true},
		{Frequency: 49, MinBlock: time.Millisecond},
		{Frequency: 0},
		{Frequency: 49, Options: offcpu.Options{States: "R"}},
		{Frequency: 49, SVG: "/nonexistent/dir/x.svg"},
	} {
		if err := OffCPU(context.Background(), o, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// offCPUKeys are the keys docs/json.md lists as the stable shape of
// `kinst offcpu --json`, of the report and of each top stack.
var offCPUKeys = [2][]string{
	{"mode", "attach", "duration_ns", "period_ns", "passes", "thread_visits", "unreadable", "lost", "distinct_stacks", "total_off_cpu_ns", "top"},
	{"group", "pid", "tid", "state", "wchan", "kernel", "user", "user_error", "samples", "off_cpu_ns"},
}

// optionalStackKeys may be absent from a top stack: lists and texts the
// stack does not have.
var optionalStackKeys = map[string]bool{"state": true, "wchan": true, "kernel": true, "user": true, "user_error": true}

// checkOffCPUKeys checks that a JSON report has every key, null exactly
// for those in null (report) and nullStack (each top stack).
func checkOffCPUKeys(t *testing.T, b []byte, null, nullStack map[string]bool) {
	t.Helper()
	var r map[string]json.RawMessage
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	check := func(what string, obj map[string]json.RawMessage, keys []string, null, optional map[string]bool) {
		for _, k := range keys {
			v, ok := obj[k]
			switch {
			case !ok && !optional[k]:
				t.Errorf("%s: no %q in %s", what, k, b)
			case ok && null[k] != (string(v) == "null"):
				t.Errorf("%s: %q is %s, want null %v", what, k, v, null[k])
			}
		}
	}
	check("report", r, offCPUKeys[0], null, nil)
	var top []map[string]json.RawMessage
	if err := json.Unmarshal(r["top"], &top); err != nil {
		t.Fatal(err)
	}
	for i, s := range top {
		check(fmt.Sprintf("top[%d]", i), s, offCPUKeys[1], nullStack, optionalStackKeys)
	}
}

// TestOffCPUJSONGolden writes the JSON reports of two fixed profiles,
// one sampled and grouped by thread name, one traced and grouped by
// thread id, and compares them with testdata/offcpu-*-json.golden (`go
// test ./app/cli -update` rewrites them): every key present, null where
// it does not apply.
func TestOffCPUJSONGolden(t *testing.T) {
	sampled := &offcpu.Profile{Mode: "sample", Duration: 1003 * time.Millisecond, Period: 200 * time.Millisecond,
		Passes: 6, Threads: 18, Unreadable: 0, Stacks: []offcpu.Stack{
			{Group: "sleeper", State: "S", Wchan: "hrtimer_nanosleep", Kernel: []string{"hrtimer_nanosleep", "do_syscall_64"},
				User: []string{"clock_nanosleep", "sleep_forever", "main"}, Samples: 6, OffCPU: 1003 * time.Millisecond},
			{Group: "kworker/0:1", State: "I", Wchan: "worker_thread", Kernel: []string{"worker_thread", "kthread"},
				Samples: 3, OffCPU: 501500 * time.Microsecond},
		}}
	traced := &offcpu.Profile{Mode: "trace", Duration: 2 * time.Second, Lost: 0, Stacks: []offcpu.Stack{
		{Group: "piper-4242", PID: 4241, TID: 4242, State: "S", Wchan: "pipe_read", Kernel: []string{"pipe_read", "vfs_read"},
			User: []string{"read", "[unknown]"}, Samples: 10, OffCPU: 1500 * time.Millisecond},
		{Group: "futexer-4243", PID: 4241, TID: 4243, State: "S", Wchan: "futex_do_wait", Kernel: []string{"futex_do_wait"},
			UserError: "user stack: pc outside any mapped file", Samples: 1, OffCPU: 3 * time.Millisecond},
	}}
	for _, tc := range []struct {
		name   string
		p      *offcpu.Profile
		attach string
		group  offcpu.Group
		null   []string
	}{
		{"offcpu-sample-json", sampled, "", offcpu.ByThreadName, []string{"attach", "lost"}},
		{"offcpu-trace-json", traced, "tp_btf", offcpu.ByTID, []string{"period_ns", "passes", "thread_visits", "unreadable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := writeJSON(&out, offCPUReport(tc.p, tc.attach, tc.group, 5)); err != nil {
				t.Fatal(err)
			}
			null := map[string]bool{}
			for _, k := range tc.null {
				null[k] = true
			}
			nullStack := map[string]bool{"pid": tc.group != offcpu.ByTID, "tid": tc.group != offcpu.ByTID}
			checkOffCPUKeys(t, out.Bytes(), null, nullStack)
			golden(t, tc.name, out.String(), "")
		})
	}
}
