package live

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kinst/kinst/app/bisect"
	"github.com/kinst/kinst/app/vm"
)

// The bisection harness end to end, a fresh VM per try: a set of points
// with one that panics the guest (a stand-in culprit: the arm command
// crashes the kernel through sysrq when it is among the points) is
// reduced to that point alone, each try's outcome read from the guest as
// a real hang or crash would be, and the try without it a pass.
func TestBisectHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("boots several VMs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	trial := &bisect.VMTrial{
		Config: vm.Config{CacheDir: live.Cache, KinstBin: filepath.Join(live.Bin, "kinst"), KerninstdBin: filepath.Join(live.Bin, "kerninstd"),
			KernelPackage: os.Getenv("KINST_KERNEL"), Accel: guest.Accel(),
			Ready: func(ctx context.Context, in *vm.Instance) error {
				c, err := in.Client()
				if err != nil {
					return err
				}
				return c.WaitReady(ctx, 2*time.Minute)
			}},
		// CULPRIT panics the kernel; the other points are counted.
		Arm:      []string{"sh", "-c", `for p; do [ "$p" = CULPRIT ] && echo c > /proc/sysrq-trigger; done; set -- $(for p; do [ "$p" = CULPRIT ] || echo "$p"; done); kinst count --duration 3s "$@"`, "arm"},
		Duration: 3 * time.Second,
		Timeout:  2 * time.Minute,
	}
	var log testWriter
	log.t = t
	// Three boots: the whole set (a crash), then each half: vfs_read
	// alone (a pass: counted, the guest healthy), CULPRIT alone (a crash).
	rep, err := bisect.Minimize(ctx, []string{"vfs_read", "CULPRIT"}, trial.Try, bisect.Options{Repeat: 1, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Minimal) != 1 || rep.Minimal[0] != "CULPRIT" || rep.Failure.Outcome != bisect.Crash || rep.Tries != 3 {
		t.Errorf("minimal %v (%s: %s) after %d tries; want [CULPRIT], a crash", rep.Minimal, rep.Failure.Outcome, rep.Failure.Detail, rep.Tries)
	}
	t.Logf("reduced to %v in %d tries (%v): %s: %s", rep.Minimal, rep.Tries, rep.Elapsed.Round(time.Second), rep.Failure.Outcome, rep.Failure.Detail)
}

// testWriter sends a bisection's progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
