package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/unwind"
)

const libc = "/lib/x86_64-linux-gnu/libc.so.6"

func TestUnwindTableJSON(t *testing.T) {
	if _, err := os.Stat(libc); err != nil {
		t.Skip(err)
	}
	tab, err := unwind.Open(libc)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := ShowUnwindTable(libc, nil, true, &out); err != nil {
		t.Fatal(err)
	}
	var rep output.UnwindTable
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != tab.Len() || rep.FDEs != tab.FDEs || rep.BytesPerRow != unwind.RowBytes || rep.BuildID == "" {
		t.Errorf("report: %d rows, %d FDEs, %d bytes/row, build id %q; table: %d rows, %d FDEs",
			len(rep.Rows), rep.FDEs, rep.BytesPerRow, rep.BuildID, tab.Len(), tab.FDEs)
	}
	plt := 0
	for i, r := range rep.Rows {
		row := tab.Row(i)
		if r.CFA != row.CFA.String() || r.RBP != row.RBP.String() || r.RA != row.RA.String() {
			t.Fatalf("row %d: %+v, table %v %v %v", i, r, row.CFA, row.RBP, row.RA)
		}
		if r.CFAExpr == "plt" {
			plt++
		}
	}
	if plt != 1 {
		t.Errorf("%d .plt rows, want 1", plt)
	}

	// --pc: the one row in effect.
	out.Reset()
	pc := tab.Row(10).PC
	if err := ShowUnwindTable(libc, &pc, true, &out); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Rows) != 1 || rep.Rows[0].CFA != tab.Row(10).CFA.String() {
		t.Errorf("--pc %#x: %s (%v)", pc, out.String(), err)
	}
}

func TestUnwindTableRefusals(t *testing.T) {
	var out bytes.Buffer
	err := ShowUnwindTable("/proc/self/status", nil, false, &out)
	if err == nil || !strings.Contains(err.Error(), "not an ELF file") || out.Len() != 0 {
		t.Errorf("a text file: %v, output %q", err, out.String())
	}
	if _, err := os.Stat(libc); err == nil {
		pc := uint64(0x10)
		if err := ShowUnwindTable(libc, &pc, false, &out); err == nil || out.Len() != 0 {
			t.Errorf("a pc no FDE covers: %v, output %q", err, out.String())
		}
	}
}

// TestUnwindStack unwinds sleep(1), a stripped distribution binary built
// without frame pointers, blocked in clock_nanosleep(2): the stack must
// run through libc's clock_nanosleep out of main to __libc_start_main,
// every caller found by CFI.
func TestUnwindStack(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	var rep struct {
		PID     int                   `json:"pid"`
		Threads []output.UnwindThread `json:"threads"`
	}
	// Wait for the sleep first: mappings read while the dynamic loader
	// is still at work would lack libc.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, nr, err := unwind.SyscallRegs(pid, pid); err == nil && nr == unix.SYS_CLOCK_NANOSLEEP {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sleep never blocked in clock_nanosleep")
		}
	}
	var out bytes.Buffer
	if err := ShowUnwindStack(pid, 0, false, true, &out); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Threads) != 1 {
		t.Fatalf("threads: %s", out.String())
	}
	frames := rep.Threads[0].Frames
	var names []string
	for i, f := range frames {
		names = append(names, f.Symbol)
		if i > 0 && f.Method != "cfi" {
			t.Errorf("frame %d %+v found by %q, want cfi", i, f, f.Method)
		}
	}
	t.Logf("sleep: %q", names)
	if len(names) < 4 || names[0] != "clock_nanosleep" || !slices.Contains(names, "__libc_start_main") {
		t.Errorf("stack %q: want clock_nanosleep first and __libc_start_main", names)
	}

	// A thread that is not the process's is an error, not an empty
	// stack (it exited 0 with "open /proc/PID/task/1/syscall" said).
	out.Reset()
	if err := ShowUnwindStack(pid, 1, false, false, &out); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("process %d has no thread 1 (its threads: %d)", pid, pid)) {
		t.Errorf("thread 1 of process %d: %v, want no such thread\n%s", pid, err, out.String())
	}

	// --ptrace while another tracer holds the thread: the blocked thread
	// still unwinds from /proc, and the tracer is named.
	held := make(chan error)
	release := make(chan struct{})
	go func() {
		runtime.LockOSThread() // ptrace requests come from the attaching thread
		defer runtime.UnlockOSThread()
		err := unix.PtraceSeize(pid)
		held <- err
		<-release
		if err == nil {
			unix.PtraceDetach(pid)
		}
	}()
	if err := <-held; err != nil {
		close(release)
		t.Skipf("ptrace seize: %v", err)
	}
	out.Reset()
	err := ShowUnwindStack(pid, 0, true, true, &out)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	rep.Threads = nil
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Threads) != 1 {
		t.Fatalf("%v: %s", err, out.String())
	}
	th := rep.Threads[0]
	if len(th.Frames) != len(frames) || th.Error != "" || !strings.Contains(th.Note, "traces it") {
		t.Errorf("--ptrace with another tracer: %d frames (want %d), error %q, note %q (want the tracer named)", len(th.Frames), len(frames), th.Error, th.Note)
	}
	t.Logf("--ptrace refused: %s", th.Note)
}

// TestUnwindStackKernelThread asks for the stack of kthreadd (pid 2): it
// is a kernel thread (the oracle: "Kthread: 1" in /proc/2/status, or no
// /proc/2/exe on kernels without that line), which has no user stack,
// and its kernel stack is /proc/2/task/2/stack's (root only), which
// starts in kthreadd().
func TestUnwindStackKernelThread(t *testing.T) {
	status, err := os.ReadFile("/proc/2/status")
	if err != nil || !strings.Contains(string(status), "Name:\tkthreadd\n") {
		t.Skipf("pid 2 is not kthreadd here (%v)", err)
	}
	if strings.Contains(string(status), "\nKthread:\t0\n") {
		t.Fatal("/proc/2/status says kthreadd is not a kernel thread")
	}
	if _, err := os.Readlink("/proc/2/exe"); !strings.Contains(string(status), "\nKthread:\t1\n") && !errors.Is(err, os.ErrNotExist) {
		t.Skipf("cannot tell whether pid 2 is a kernel thread: /proc/2/exe: %v", err)
	}
	want, stackErr := os.ReadFile("/proc/2/task/2/stack")
	var wantFrames []string
	for _, line := range strings.Split(string(want), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			wantFrames = append(wantFrames, f[1])
		}
	}

	var out bytes.Buffer
	if err := ShowUnwindStack(2, 0, false, false, &out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Logf("%s", text)
	if !strings.HasPrefix(text, "thread 2 (kthreadd): a kernel thread, no user stack") || strings.Contains(text, "system call") {
		t.Errorf("text %q: want thread 2 (kthreadd) said to be a kernel thread, and no system call", text)
	}

	out.Reset()
	if err := ShowUnwindStack(2, 0, false, true, &out); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Threads []map[string]any `json:"threads"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Threads) != 1 {
		t.Fatalf("%s: %v", out.String(), err)
	}
	th := rep.Threads[0]
	if th["kernel_thread"] != true || th["syscall"] != nil {
		t.Errorf("JSON %v: want kernel_thread true and no syscall", th)
	}
	var got []string
	if fs, ok := th["kernel_stack"].([]any); ok {
		for _, f := range fs {
			s, _ := f.(string)
			got = append(got, s)
		}
	}
	if stackErr != nil {
		if th["error"] == nil || got != nil {
			t.Errorf("kernel stack unreadable (%v): JSON %v, want an error and no stack", stackErr, th)
		}
		return
	}
	if len(got) == 0 || !strings.HasPrefix(got[0], "kthreadd+") || !slices.Equal(got, wantFrames) {
		t.Errorf("kernel stack %q, /proc/2/task/2/stack %q: want equal, starting in kthreadd", got, wantFrames)
	}
}
