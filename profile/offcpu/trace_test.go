package offcpu

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTraceWorkload(t *testing.T) {
	requireRoot(t)
	for _, raw := range []bool{false, true} {
		name := "tp_btf"
		if raw {
			name = "raw_tracepoint"
		}
		t.Run(name, func(t *testing.T) {
			cmd := startWorkload(t)
			tr, err := NewTracer(TraceOptions{Options: Options{PID: cmd.Process.Pid}, ForceRawTracepoint: raw})
			if errors.Is(err, ErrBPFUnavailable) {
				t.Skipf("BPF unavailable here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			if tr.Attach != name {
				t.Fatalf("attached as %s, want %s", tr.Attach, name)
			}
			time.Sleep(2500 * time.Millisecond)
			p, err := tr.Profile()
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range p.Top(20) {
				t.Logf("%s %s %v %d %v | %v", s.Group, s.State, s.OffCPU, s.Samples, s.Kernel, s.User)
			}
		})
	}
}

func joined(s []string) string { return strings.Join(s, ";") }
