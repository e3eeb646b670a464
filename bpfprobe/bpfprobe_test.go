package bpfprobe

import (
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The oracle is the test's own count of getppid(2) calls, each of which
// enters __x64_sys_getppid once; the calls come from one locked thread
// and nothing else in the test process calls it.
const getppid = "__x64_sys_getppid"

func newSet(t *testing.T) *Set {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("BPF probes need root")
	}
	s, err := NewSet(16)
	if err != nil {
		t.Skipf("no BPF here: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func calls(n int) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := 0; i < n; i++ {
		unix.Getppid()
	}
}

func TestCountMechanisms(t *testing.T) {
	s := newSet(t)
	for i, mech := range []string{FEntry, KprobeMulti, Kprobe} {
		t.Run(mech, func(t *testing.T) {
			p, err := s.CountWith(mech, getppid, 0, i)
			if err != nil {
				t.Skipf("%s not available on this kernel: %v", mech, err)
			}
			if p.Mechanism() != mech {
				t.Fatalf("mechanism %q", p.Mechanism())
			}
			calls(1000)
			got := s.Counter(i)
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			// Other processes may call getppid too: at least ours, and
			// nothing after the probe is gone.
			if got < 1000 || got > 1100 {
				t.Errorf("%s counted %d of 1000 calls", mech, got)
			}
			calls(100)
			if after := s.Counter(i); after != got {
				t.Errorf("%s still counting after Close: %d then %d", mech, got, after)
			}
		})
	}
}

func TestCountOffsetAndErrors(t *testing.T) {
	s := newSet(t)
	// fn+0 chooses among the entry mechanisms; an instruction boundary
	// inside needs a kprobe; the first instruction's length is unknown
	// here, so only refusals are checked.
	if _, err := s.Count("kinst_no_such_function", 0, 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("unknown function: %v", err)
	}
	var ae *AttachError
	if _, err := s.Count(getppid, 1, 0); !errors.As(err, &ae) || len(ae.Tried) != 1 {
		t.Fatalf("mid-instruction offset: %v", err)
	}
	if _, err := s.Count(getppid, 0, 99); err == nil {
		t.Fatal("slot out of range accepted")
	}
	if n := len(s.probes); n != 0 {
		t.Fatalf("%d probes left after refusals", n)
	}
}

func TestTime(t *testing.T) {
	s := newSet(t)
	for _, mech := range []string{FEntry, Kprobe} {
		t.Run(mech, func(t *testing.T) {
			s.Clear(0, 2)
			// nanosleep: each call sleeps at least 2 ms.
			p, err := s.TimeWith(mech, "hrtimer_nanosleep", 0, 1)
			if err != nil {
				t.Skipf("%s not available: %v", mech, err)
			}
			defer p.Close()
			runtime.LockOSThread()
			for i := 0; i < 20; i++ {
				time.Sleep(2 * time.Millisecond)
			}
			runtime.UnlockOSThread()
			n, ns := s.Counter(0), s.Counter(1)
			if n < 20 {
				t.Fatalf("%s: %d calls of 20", mech, n)
			}
			if ns < 20*2e6 {
				t.Errorf("%s: %d calls took %d ns in all, under 20 × 2 ms", mech, n, ns)
			}
			if p.Inside() < 0 {
				t.Errorf("inside %d", p.Inside())
			}
		})
	}
}
