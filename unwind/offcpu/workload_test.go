package offcpu

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	buildErr  string
	buildDir  string
)

// The workload's builds: without frame pointers (what the sampler's CFI
// unwinding must handle) and with them (what BPF's unwinder needs), each
// also linked by LLD, whose executable segment shares a file page with
// the read-only one (the LLD builds only where ld.lld is installed).
const (
	noFramePointers    = "workload"
	framePointers      = "workload-fp"
	noFramePointersLLD = "workload-lld"
	framePointersLLD   = "workload-fp-lld"
)

// lldMissing is set when ld.lld is not installed.
var lldMissing bool

// workloadBinary compiles testdata/workload.c both ways, once per test
// binary, and returns the path of the build asked for.
func workloadBinary(tb testing.TB, build string) string {
	tb.Helper()
	buildOnce.Do(func() {
		cc, err := exec.LookPath("gcc")
		if err != nil {
			buildErr = "gcc not installed: cannot build the test workload"
			return
		}
		buildDir, err = os.MkdirTemp("", "offcpu-workload")
		if err != nil {
			buildErr = err.Error()
			return
		}
		builds := map[string][]string{
			noFramePointers: {"-fomit-frame-pointer"},
			framePointers:   {"-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"},
		}
		if _, err := exec.LookPath("ld.lld"); err != nil {
			lldMissing = true
		} else {
			builds[noFramePointersLLD] = append(slices.Clone(builds[noFramePointers]), "-fuse-ld=lld")
			builds[framePointersLLD] = append(slices.Clone(builds[framePointers]), "-fuse-ld=lld")
		}
		for name, flags := range builds {
			args := append([]string{"-O2", "-g", "-fno-optimize-sibling-calls", "-pthread", "-o", filepath.Join(buildDir, name)}, flags...)
			cmd := exec.Command(cc, append(args, "testdata/workload.c")...)
			if b, err := cmd.CombinedOutput(); err != nil {
				buildErr = "building workload: " + err.Error() + "\n" + string(b)
				return
			}
		}
	})
	if buildErr != "" {
		if strings.HasPrefix(buildErr, "gcc not installed") {
			tb.Skip(buildErr)
		}
		tb.Fatal(buildErr)
	}
	if lldMissing && strings.HasSuffix(build, "-lld") {
		tb.Skip("ld.lld not installed (Debian package lld): no LLD-linked workload")
	}
	return filepath.Join(buildDir, build)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// workload is a running testdata/workload.c.
type workload struct {
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	stdout *bufio.Reader
}

// startWorkload runs the workload built without frame pointers with args
// and waits for its "ready"; the process exits when the test ends (its
// stdin closes).
func startWorkload(tb testing.TB, args ...string) *workload {
	return startBuild(tb, noFramePointers, args...)
}

func startBuild(tb testing.TB, build string, args ...string) *workload {
	tb.Helper()
	cmd := exec.Command(workloadBinary(tb, build), args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	w := &workload{cmd: cmd, pid: cmd.Process.Pid, stdin: stdin, stdout: bufio.NewReader(stdout)}
	line, err := w.stdout.ReadString('\n')
	if err != nil || line != "ready\n" {
		tb.Fatalf("workload did not start: %q %v", line, err)
	}
	return w
}

// halfAccount is the halfsleep thread's own account of its time, in
// seconds, from clock_gettime: asleep as requested (state S), inside
// nanosleep (asleep plus the wait for a CPU after waking), and since it
// started.
type halfAccount struct{ asleep, inCall, elapsed float64 }

func (a halfAccount) sub(b halfAccount) halfAccount {
	return halfAccount{a.asleep - b.asleep, a.inCall - b.inCall, a.elapsed - b.elapsed}
}

// halfsleep asks the workload for halfsleep's account.
func (w *workload) halfsleep(tb testing.TB) (a halfAccount) {
	tb.Helper()
	if _, err := io.WriteString(w.stdin, "report\n"); err != nil {
		tb.Fatal(err)
	}
	line, err := w.stdout.ReadString('\n')
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := fmt.Sscanf(line, "halfsleep %g %g %g", &a.asleep, &a.inCall, &a.elapsed); err != nil {
		tb.Fatalf("workload report %q: %v", line, err)
	}
	return a
}

func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: /proc/PID/task/TID/stack and BPF are root-only")
	}
}
