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
	"sync"
	"testing"
	"time"

	"github.com/kinst/kinst/output"
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

// blockIn is a guest shell command that starts exe reading a pipe
// nobody writes to, in the background, with no descriptor left open to
// the exec agent (which waits for them to close).
func blockIn(exe string) string {
	return "(sleep 1000 </dev/null 2>/dev/null | " + exe + " >/dev/null 2>&1 &)"
}

// markWriter collects a command's stderr and closes seen when mark
// first appears in it.
type markWriter struct {
	bytes.Buffer
	mark string
	seen chan struct{}
	once sync.Once
}

func (w *markWriter) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if strings.Contains(w.Buffer.String(), w.mark) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
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
	gsh(t, ctx, blockIn("/tmp/kblock"))
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
	var us output.UnwindStacks
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
	var rep output.OffCPUReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("kinst offcpu --json: %v\n%s", err, out)
	}
	if len(rep.Top) != 1 {
		t.Fatalf("kinst offcpu -p %d in the guest: %d stacks, want the one: %s", pid, len(rep.Top), out)
	}
	s := rep.Top[0]
	t.Logf("kinst offcpu -p %d: kernel %v user %v (%d samples, wchan %s)", pid, s.Kernel, s.User, s.Samples, s.Wchan)
	if rep.Source == nil || *rep.Source != "bpf_iter" {
		t.Errorf("kinst offcpu in the guest read threads through %v, want the BPF task iterator (bpf_iter)", rep.Source)
	}
	if !slices.Equal(s.Kernel, kstack) || s.Wchan != kstack[0] || s.State != "S" {
		t.Errorf("offcpu kernel stack %v wchan %s state %s, the guest's /proc/%d/stack %v (state S)", s.Kernel, s.Wchan, s.State, pid, kstack)
	}
	if !inOrder(s.User, blockerChain) || s.UserError != "" {
		t.Errorf("offcpu user stack %v (%s), want %v", s.User, s.UserError, blockerChain)
	}

	// Tracing: blocks that begin after the tracer attached, in both
	// builds. BPF alone (-F 0) follows the frame pointers of kblock-fp;
	// kblock's stack stops short. With the sampler beside the
	// tracer (-F 19), kblock's is completed with the CFI-unwound callers.
	trace := func(freq string) (output.OffCPUReport, map[string][]output.OffCPUStack) {
		t.Helper()
		// The blockers start once the tracer says it is attached (loading
		// the kernel's BTF takes seconds under emulation).
		attached := &markWriter{mark: "tracing sched_switch", seen: make(chan struct{})}
		var outb bytes.Buffer
		type result struct {
			code int
			err  error
		}
		done := make(chan result, 1)
		go func() {
			code, err := guest.Exec(ctx, []string{"kinst", "offcpu", "--trace", "--duration", "4s", "-F", freq, "--group", "pid", "--top", "0", "--json"}, &outb, attached)
			done <- result{code, err}
		}()
		var r result
		select {
		case <-attached.seen:
			gsh(t, ctx, blockIn("/tmp/kblock-fp")+"; "+blockIn("/tmp/kblock"))
			r = <-done
		case r = <-done:
		}
		if r.err != nil {
			t.Fatalf("guest exec kinst offcpu --trace: %v", r.err)
		}
		out, errs, code := outb.String(), attached.String(), r.code
		if strings.Contains(errs, "BPF tracing unavailable") {
			t.Skipf("BPF in the guest: %s", errs)
		}
		if code != 0 {
			t.Fatalf("kinst offcpu --trace in the guest: status %d\n%s%s", code, out, errs)
		}
		var rep output.OffCPUReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("kinst offcpu --trace --json: %v\n%s", err, out)
		}
		t.Logf("trace -F %s: %s", freq, strings.TrimSpace(errs))
		byBuild := map[string][]output.OffCPUStack{}
		for _, s := range rep.Top {
			dash := strings.LastIndexByte(s.Group, '-')
			build := s.Group[:max(dash, 0)]
			if (build != "kblock" && build != "kblock-fp") || s.PID != nil && *s.PID == pid || !slices.Contains(s.Kernel, "ksys_read") {
				continue // not ours, blocked since before the trace (not seen), or not in its read
			}
			t.Logf("trace -F %s: %s: kernel %v user %v [%s]", freq, s.Group, s.Kernel, s.User, s.UserError)
			// BPF's kernel stack starts in the scheduler, which
			// /proc/PID/stack leaves out: it must end as the guest's does.
			if len(s.Kernel) < len(kstack) || !slices.Equal(s.Kernel[len(s.Kernel)-len(kstack):], kstack) {
				t.Errorf("trace -F %s: %s: kernel stack %v does not end as the guest's /proc/PID/stack %v", freq, s.Group, s.Kernel, kstack)
			}
			byBuild[build] = append(byBuild[build], s)
		}
		for _, b := range []string{"kblock", "kblock-fp"} {
			if len(byBuild[b]) != 1 {
				t.Errorf("trace -F %s: %d stacks of %s blocked in read, want one (%d stacks in all)\n%s", freq, len(byBuild[b]), b, len(rep.Top), errs)
				byBuild[b] = append(byBuild[b], output.OffCPUStack{})
			}
		}
		return rep, byBuild
	}
	rep, by := trace("0")
	// Static glibc's start-up code keeps no frame pointers: the walk
	// goes astray below main, but the chain above it is whole.
	if s := by["kblock-fp"][0]; !inOrder(s.User, append([]string{"__libc_read"}, blockerFPChain...)) {
		t.Errorf("trace -F 0: kblock-fp's user stack %v [%s], want the frame-pointer chain %v", s.User, s.UserError, blockerFPChain)
	}
	// Where the walk ends in kblock depends on what its rbp holds: an
	// address outside every file (cut, and counted) or zero (the walk
	// ends as at a stack's real end). Either way it stops short of level1.
	if s := by["kblock"][0]; slices.Contains(s.User, "level1") || len(s.User) == 0 || rep.UserCut == nil || (s.UserError != "") != (*rep.UserCut > 0) {
		t.Errorf("trace -F 0: kblock's user stack %v [%s], %v blocks cut; want it to stop before level1, counted when cut", s.User, s.UserError, rep.UserCut)
	}
	rep, by = trace("19")
	if s := by["kblock"][0]; !inOrder(s.User, blockerChain) || s.UserError != "" || rep.UserCompleted == nil || *rep.UserCompleted == 0 {
		t.Errorf("trace -F 19: kblock's user stack %v [%s], %v blocks completed; want it completed to %v", s.User, s.UserError, rep.UserCompleted, blockerChain)
	}
}
