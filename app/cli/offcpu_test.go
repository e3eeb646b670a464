package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
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
	var r api.OffCPUReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out.String())
	}
	if r.Mode != "sample" || r.Passes < 2 || len(r.Top) != 1 || r.Top[0].Group != "sleep" || r.Top[0].State != "S" ||
		!strings.Contains(strings.Join(r.Top[0].Kernel, ";"), "nanosleep") || r.TotalNS <= 0 {
		t.Errorf("report %+v", r)
	}
	for _, f := range []string{o.SVG, o.Pprof} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
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
