package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
