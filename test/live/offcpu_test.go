package live

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

// guestPut copies data into the guest at path (mode 0755): the exec agent
// has no stdin, so it goes gzipped and base64-encoded in arguments below
// the kernel's 128 KiB limit on one argument.
func guestPut(t *testing.T, ctx context.Context, path string, data []byte) {
	t.Helper()
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	zw.Write(data)
	zw.Close()
	enc := base64.StdEncoding.EncodeToString(z.Bytes())
	gsh(t, ctx, "rm -f "+path+".b64")
	for len(enc) > 0 {
		n := min(len(enc), 96<<10)
		gsh(t, ctx, fmt.Sprintf("printf %%s %s >> %s.b64", enc[:n], path))
		enc = enc[n:]
	}
	gsh(t, ctx, fmt.Sprintf("base64 -d %[1]s.b64 | gunzip > %[1]s && rm %[1]s.b64 && chmod 755 %[1]s", path))
}

// staticBlocker builds ../../unwind/testdata/blocker.c statically (the
// guest has no libc) with the given extra flags.
func staticBlocker(t *testing.T, name string, flags ...string) []byte {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed: cannot build the guest's workload")
	}
	out := filepath.Join(t.TempDir(), name)
	args := append([]string{"-static", "-O2", "-fno-optimize-sibling-calls", "-o", out}, flags...)
	args = append(args, filepath.Join(repoRoot(), "unwind", "testdata", "blocker.c"))
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Skipf("gcc -static (libc6-dev's libc.a needed): %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// guestKernelStack is the guest's own /proc/PID/stack as function names.
func guestKernelStack(t *testing.T, ctx context.Context, pid int) []string {
	t.Helper()
	var names []string
	for _, line := range strings.Split(gsh(t, ctx, fmt.Sprintf("cat /proc/%d/stack", pid)), "\n") {
		if i := strings.IndexByte(line, ']'); i >= 0 {
			line = strings.TrimSpace(line[i+1:])
		}
		if i := strings.IndexByte(line, '+'); i >= 0 {
			line = line[:i]
		}
		if line != "" {
			names = append(names, line)
		}
	}
	return names
}

// inOrder reports whether want appears in frames as consecutive frames.
func inOrder(frames, want []string) bool {
	for i := range frames {
		if i+len(want) <= len(frames) && slices.Equal(frames[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

// The call chain of blocker.c, innermost first, below read(2); a
// frame-pointer walk skips level3, whose callee (libc's read wrapper)
// keeps no frame.
var (
	blockerChain   = []string{"level3", "level2", "level1", "main"}
	blockerFPChain = []string{"level2", "level1", "main"}
)

// TestGuestOffCPU runs kinst offcpu and kinst unwind stack inside the
// guest against a static program blocked in read(2) on a pipe at the
// bottom of a known call chain (main → level1 → level2 → level3 → read):
// the sampled kernel stack must equal the guest's own /proc/PID/stack,
// and the user stacks (CFI from `unwind stack` and the sampler, frame
// pointers from the BPF tracer, CFI-completed traced stacks of the build
// without frame pointers) must name the chain.
func TestGuestOffCPU(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	guestPut(t, ctx, "/tmp/kblock", staticBlocker(t, "kblock", "-fomit-frame-pointer"))
	guestPut(t, ctx, "/tmp/kblock-fp", staticBlocker(t, "kblock-fp", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"))
	defer gexec(t, ctx, "sh", "-c", "killall kblock kblock-fp; true")

	// Sampling and unwind stack: a blocker started first.
	gsh(t, ctx, "(sleep 1000 | /tmp/kblock >/dev/null 2>&1 &)")
	var pid int
	for i := 0; i < 50 && pid == 0; i++ {
		out, _, _ := gexec(t, ctx, "pidof", "kblock")
		pid, _ = strconv.Atoi(strings.TrimSpace(out))
		if pid == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if pid == 0 {
		t.Fatal("kblock did not start in the guest")
	}
	var kstack []string
	for i := 0; i < 50; i++ { // until it has reached its read
		if sc := strings.Fields(gsh(t, ctx, fmt.Sprintf("cat /proc/%d/syscall", pid))); len(sc) > 0 && sc[0] == "0" {
			kstack = guestKernelStack(t, ctx, pid)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !slices.Contains(kstack, "ksys_read") {
		t.Fatalf("kblock %d is not blocked in read: /proc/%d/stack %v", pid, pid, kstack)
	}
	t.Logf("guest /proc/%d/stack: %v", pid, kstack)

	out, errs, code := gexec(t, ctx, "kinst", "unwind", "stack", "--json", strconv.Itoa(pid))
	if code != 0 {
		t.Fatalf("kinst unwind stack in the guest: status %d\n%s%s", code, out, errs)
	}
	var us api.UnwindStacks
	if err := json.Unmarshal([]byte(out), &us); err != nil || len(us.Threads) != 1 {
		t.Fatalf("kinst unwind stack --json: %v %s", err, out)
	}
	var frames []string
	for _, f := range us.Threads[0].Frames {
		frames = append(frames, f.Symbol)
	}
	t.Logf("kinst unwind stack %d: %v", pid, frames)
	if us.Threads[0].Syscall == nil || *us.Threads[0].Syscall != 0 || !inOrder(frames, blockerChain) {
		t.Errorf("kinst unwind stack %d in the guest: syscall %v frames %v, want read (0) and %v", pid, us.Threads[0].Syscall, frames, blockerChain)
	}

	out, errs, code = gexec(t, ctx, "kinst", "offcpu", "-p", strconv.Itoa(pid), "--duration", "1s", "-F", "19", "--json")
	if code != 0 {
		t.Fatalf("kinst offcpu in the guest: status %d\n%s%s", code, out, errs)
	}
	var rep api.OffCPUReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("kinst offcpu --json: %v\n%s", err, out)
	}
	if len(rep.Top) != 1 {
		t.Fatalf("kinst offcpu -p %d in the guest: %d stacks, want the one: %s", pid, len(rep.Top), out)
	}
	s := rep.Top[0]
	t.Logf("kinst offcpu -p %d: kernel %v user %v (%d samples, wchan %s)", pid, s.Kernel, s.User, s.Samples, s.Wchan)
	if !slices.Equal(s.Kernel, kstack) || s.Wchan != kstack[0] || s.State != "S" {
		t.Errorf("offcpu kernel stack %v wchan %s state %s, the guest's /proc/%d/stack %v (state S)", s.Kernel, s.Wchan, s.State, pid, kstack)
	}
	if !inOrder(s.User, blockerChain) || s.UserError != "" {
		t.Errorf("offcpu user stack %v (%s), want %v", s.User, s.UserError, blockerChain)
	}

	// Tracing: blocks that begin after the tracer attached, in both
	// builds; the sampler beside the tracer completes the build without
	// frame pointers.
	out, errs, code = gexec(t, ctx, "sh", "-c", `(sleep 1; (sleep 1000 | /tmp/kblock-fp >/dev/null 2>&1 &); (sleep 1000 | /tmp/kblock >/dev/null 2>&1 &)) &
exec kinst offcpu --trace --duration 3s -F 19 --group pid --top 0 --json`)
	if strings.Contains(errs, "BPF tracing unavailable") {
		t.Skipf("BPF in the guest: %s", errs)
	}
	if code != 0 {
		t.Fatalf("kinst offcpu --trace in the guest: status %d\n%s%s", code, out, errs)
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("kinst offcpu --trace --json: %v\n%s", err, out)
	}
	t.Logf("trace: %s", strings.TrimSpace(errs))
	found := map[string]bool{}
	for _, s := range rep.Top {
		dash := strings.LastIndexByte(s.Group, '-')
		build := s.Group[:max(dash, 0)]
		if (build != "kblock" && build != "kblock-fp") || s.PID == pid {
			continue // not ours, or blocked since before the trace (not seen)
		}
		t.Logf("traced %s: kernel %v user %v [%s]", s.Group, s.Kernel, s.User, s.UserError)
		want := blockerChain
		if build == "kblock-fp" {
			want = blockerFPChain
		}
		// BPF's kernel stack starts in the scheduler, which
		// /proc/PID/stack leaves out: it must end as the guest's does.
		if inOrder(s.User, want) && len(s.Kernel) >= len(kstack) && slices.Equal(s.Kernel[len(s.Kernel)-len(kstack):], kstack) {
			found[build] = true
		}
	}
	for _, b := range []string{"kblock", "kblock-fp"} {
		if !found[b] {
			t.Errorf("no traced stack of %s blocked in read under %v", b, blockerChain)
		}
	}
	if rep.UserCompleted == nil || *rep.UserCompleted == 0 {
		t.Errorf("trace: no user stack completed from the sampler (%v)", rep.UserCompleted)
	}
}
