// Package livecore tests `kinst core` against dumps of a real,
// unmodified Debian kernel booted under QEMU, taken through QMP
// dump-guest-memory, with the guest's own view (ps, /proc/PID/stack,
// dmesg, /proc/kallsyms) as the oracle. One VM serves the package; the
// last test panics it.
//
// Set KINST_LIVE=0 to skip; KINST_BIN to use prebuilt static binaries;
// KINST_CACHE for the download/build cache. The VM bootstrap is a small
// copy of test/live's (that package's helpers are not importable).
package livecore

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
)

var (
	guest *vm.Instance
	bin   string // directory with kinst and kerninstd
	tmp   string // this run's scratch directory (dumps go here)
	cache string // KINST_CACHE: the kernel package and its vmlinux
)

func TestMain(m *testing.M) {
	if os.Getenv("KINST_LIVE") == "0" {
		fmt.Println("livecore: KINST_LIVE=0, skipping the live-VM tests")
		os.Exit(0)
	}
	os.Exit(runWithVM(m))
}

func runWithVM(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	root := repoRoot()
	reapStaleVMs()
	var err error
	tmp, err = os.MkdirTemp("", "kinst-livecore-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	os.WriteFile(filepath.Join(tmp, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o600)
	bin = os.Getenv("KINST_BIN")
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
	cache = os.Getenv("KINST_CACHE")
	if cache == "" {
		cache = filepath.Join(root, ".cache")
	}
	start := time.Now()
	guest, err = vm.Up(ctx, vm.Config{
		CacheDir:     cache,
		StateDir:     filepath.Join(tmp, "vm"),
		MemoryMB:     1024,
		KinstBin:     filepath.Join(bin, "kinst"),
		KerninstdBin: filepath.Join(bin, "kerninstd"),
		Progress:     os.Stderr,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "livecore: vm up: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "livecore: VM up in %.1fs (%s, %s)\n", time.Since(start).Seconds(), guest.Accel(), guest.KernelRelease())
	code := m.Run()
	if code != 0 {
		if b, err := os.ReadFile(guest.SerialLog()); err == nil {
			fmt.Fprintf(os.Stderr, "livecore: serial log tail:\n%s\n", tail(string(b), 40))
		}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
	defer dcancel()
	if err := guest.Down(dctx); err != nil {
		fmt.Fprintf(os.Stderr, "livecore: vm down: %v\n", err)
	}
	return code
}

// reapStaleVMs stops VMs of this package whose test process is gone.
func reapStaleVMs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "kinst-livecore-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		if owner, _ := strconv.Atoi(strings.TrimSpace(string(b))); owner > 0 && syscall.Kill(owner, 0) == nil {
			continue
		}
		if in, err := vm.Attach(filepath.Join(d, "vm")); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			in.Down(ctx)
			cancel()
		}
		os.RemoveAll(d)
	}
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

// gsh runs a shell command in the guest and fails the test on a non-zero
// status.
func gsh(t testing.TB, ctx context.Context, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := guest.Exec(ctx, []string{"sh", "-c", script}, &out, &errb)
	if err != nil || code != 0 {
		t.Fatalf("guest sh -c %q: status %d, %v\nstdout: %s\nstderr: %s", script, code, err, out.String(), errb.String())
	}
	return out.String()
}

// dumpGuest writes a dump of the guest's memory with QMP
// dump-guest-memory (format "elf" or "kdump-zlib").
func dumpGuest(t testing.TB, name, format string) string {
	t.Helper()
	path := filepath.Join(tmp, name)
	start := time.Now()
	if err := guest.Dump(path, format); err != nil {
		t.Fatalf("dump-guest-memory %s: %v", format, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s dump: %d MiB in %.1fs", format, st.Size()>>20, time.Since(start).Seconds())
	return path
}

// kinst runs the host's kinst and returns its stdout; it fails the test
// on a non-zero status.
func kinst(t testing.TB, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "kinst"), args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kinst %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out
}
