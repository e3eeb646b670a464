// Package live tests kinst end to end against a real, unmodified Debian
// kernel booted under QEMU, with the real kerninst.ko loaded and kerninstd
// running in the guest. One VM serves every test of the package.
//
// Set KINST_LIVE=0 to skip (unit runs); KINST_BIN to use prebuilt static
// binaries; KINST_CACHE for the download/build cache; KINST_STRESS_CYCLES
// for the length of the splice/unsplice burst.
package live

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kinst/kinst/internal/vm"
	"github.com/kinst/kinst/kerninstd"
)

var (
	guest  *vm.Instance
	client *kerninstd.Client
)

func TestMain(m *testing.M) {
	if os.Getenv("KINST_LIVE") == "0" {
		fmt.Println("live: KINST_LIVE=0, skipping the live-VM tests")
		os.Exit(0)
	}
	os.Exit(runWithVM(m))
}

func runWithVM(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	root := repoRoot()
	bin := os.Getenv("KINST_BIN")
	reapStaleVMs()
	tmp, err := os.MkdirTemp("", "kinst-live-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	// Whose VM this is: a later run reaps it if this process dies without
	// tearing it down (a panic in a benchmark skips TestMain's defers).
	os.WriteFile(filepath.Join(tmp, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o600)
	if bin == "" {
		bin = filepath.Join(tmp, "bin")
		for _, c := range []string{"kinst", "kerninstd"} {
			cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(bin, c), "./cmd/"+c)
			cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "build %s: %v\n%s", c, err, out)
				return 1
			}
		}
	}
	cache := os.Getenv("KINST_CACHE")
	if cache == "" {
		cache = filepath.Join(root, ".cache")
	}
	start := time.Now()
	guest, err = vm.Up(ctx, vm.Config{
		CacheDir:     cache,
		StateDir:     filepath.Join(tmp, "vm"),
		KinstBin:     filepath.Join(bin, "kinst"),
		KerninstdBin: filepath.Join(bin, "kerninstd"),
		Progress:     os.Stderr,
		Ready:        waitKerninstd,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "live: vm up: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "live: VM up in %.1fs (%s, %s)\n", time.Since(start).Seconds(), guest.Accel(), guest.KernelRelease())
	client = kerninstd.NewClient(guest.KerninstdAddr())
	code := m.Run()
	if code != 0 {
		if b, err := os.ReadFile(guest.SerialLog()); err == nil {
			fmt.Fprintf(os.Stderr, "live: serial log tail:\n%s\n", tail(string(b), 40))
		}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
	defer dcancel()
	if err := guest.Down(dctx); err != nil {
		fmt.Fprintf(os.Stderr, "live: vm down: %v\n", err)
	}
	return code
}

// reapStaleVMs stops test VMs whose test process is gone.
func reapStaleVMs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "kinst-live-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		if owner, _ := strconv.Atoi(strings.TrimSpace(string(b))); owner > 0 && processAlive(owner) {
			continue // still running
		}
		if in, err := vm.Attach(filepath.Join(d, "vm")); err == nil {
			fmt.Fprintf(os.Stderr, "live: stopping a VM left by a crashed run (%s)\n", d)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			in.Down(ctx)
			cancel()
		}
		os.RemoveAll(d)
	}
}

// processAlive: the process exists and is not a zombie waiting to be
// reaped.
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(st), ") ")
	return !strings.HasPrefix(rest, "Z")
}

func waitKerninstd(ctx context.Context, in *vm.Instance) error {
	return kerninstd.NewClient(in.KerninstdAddr()).WaitReady(ctx, 2*time.Minute)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// gexec runs a command in the guest and returns stdout, stderr and status.
func gexec(t *testing.T, ctx context.Context, argv ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := guest.Exec(ctx, argv, &out, &errb)
	if err != nil {
		t.Fatalf("guest exec %q: %v", argv, err)
	}
	return out.String(), errb.String(), code
}

// gsh runs a shell command in the guest and fails the test on a non-zero
// status.
func gsh(t *testing.T, ctx context.Context, script string) string {
	t.Helper()
	out, errs, code := gexec(t, ctx, "sh", "-c", script)
	if code != 0 {
		t.Fatalf("guest sh -c %q: status %d\nstdout: %s\nstderr: %s", script, code, out, errs)
	}
	return out
}
