package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kinst/kinst/output"
)

// A SIGINT sent to kinst alone (kill -INT, timeout -s INT), not to the
// command's process group as a terminal's Ctrl-C is, still ends a run
// with -- CMD: kinst passes it on after a moment and reports the
// command's status (128+2), rather than wait for the command to end by
// itself.
func TestInterruptKinstAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the process engine's tests run as root")
	}
	var out, errb bytes.Buffer
	var once sync.Once
	env := Env{Out: &out, Err: &errb, CmdIn: strings.NewReader(""), CmdOut: io.Discard, CmdErr: io.Discard}
	// After the first sample runSession is listening for the signal.
	env.sampled = func() { once.Do(func() { syscall.Kill(os.Getpid(), syscall.SIGINT) }) }
	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		st, err := CountProcess(context.Background(), 0, CountOptions{Points: []string{"libc:nanosleep"}, Interval: 50 * time.Millisecond,
			Command: []string{"sleep", "60"}}, env)
		done <- result{st, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || r.status != 128+int(syscall.SIGINT) {
			t.Errorf("status %d, %v; want %d (the command interrupted)\n%s", r.status, r.err, 128+int(syscall.SIGINT), errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("kinst still waits for the command it was interrupted during\n%s", errb.String())
	}
	if !strings.Contains(out.String(), "counts over") {
		t.Errorf("no report:\n%s", out.String())
	}
}

// A run whose --duration ends before its command: kinst ends the command
// with SIGTERM, reports its status (128+15), and exits 0, the run having
// gone as asked (it exited 143).
func TestDurationEndsCommand(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the process engine's tests run as root")
	}
	var out, errb bytes.Buffer
	env := Env{Out: &out, Err: &errb, CmdIn: strings.NewReader(""), CmdOut: io.Discard, CmdErr: io.Discard}
	st, err := CountProcess(context.Background(), 0, CountOptions{Points: []string{"libc:nanosleep"}, Duration: 300 * time.Millisecond,
		Command: []string{"sleep", "60"}, JSON: true}, env)
	var rep output.CountReport
	if err != nil || st != 0 || json.Unmarshal(out.Bytes(), &rep) != nil || rep.ExitStatus == nil || *rep.ExitStatus != 128+int(syscall.SIGTERM) {
		t.Errorf("status %d, %v; want 0, and the command's 143 in the report: %s\n%s", st, err, out.String(), errb.String())
	}
}
