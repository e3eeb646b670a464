package unwind

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestUnwindSignalFrame unwinds a thread blocked in read(2) inside a
// signal handler: through glibc's __restore_rt, whose CFA is [rsp+160]
// (the saved rsp of the ucontext) and whose return address is the exact
// interrupted pc. The oracle is gdb's backtrace, and the program's own
// functions on both sides of the signal frame.
func TestUnwindSignalFrame(t *testing.T) {
	cmd := startReady(t, buildCFile(t, "testdata/sigblock.c", "-fomit-frame-pointer"))
	pid := cmd.Process.Pid
	waitSyscall(t, pid, unix.SYS_PAUSE)
	if err := cmd.Process.Signal(unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitSyscall(t, pid, unix.SYS_READ)

	_, pcs, methods, frames := procStack(t, pid)
	t.Logf("%v via %v", frames, methods)
	joined := " " + strings.Join(frames, " ") + " "
	if !strings.Contains(joined, " in_handler handler ") || !strings.Contains(joined, " waiter main ") ||
		strings.Index(joined, " handler ") > strings.Index(joined, " waiter ") || frames[len(frames)-1] != "_start" {
		t.Errorf("stack %q: want in_handler handler, the trampoline, pause, waiter main … _start", frames)
	}
	for i, m := range methods {
		if m != ByCFI {
			t.Errorf("frame %d (%s) found by %v, want cfi", i+1, frames[i+1], m)
		}
	}
	if gdbPCs := gdbBacktrace(t, pid); gdbPCs != nil && !slices.Equal(pcs, gdbPCs) {
		t.Errorf("stack %#x, gdb's %#x", pcs, gdbPCs)
	}
}

// TestUnwindRealignedFrame unwinds through a function that realigns its
// stack through a DRAP register (CFA [rbp-8], rbp saved at rbp+0): from
// /proc registers, where rbp is unknown and a scan finds the frame
// record, and from ptrace's, by CFI alone; both equal gdb's backtrace.
func TestUnwindRealignedFrame(t *testing.T) {
	bin := buildCFile(t, "testdata/drap.c", "-fomit-frame-pointer")
	tab, err := Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	deref := false
	for i := 0; i < tab.Len(); i++ {
		if r := tab.Row(i); r.CFA.Kind == CFADeref && r.CFA.Reg == RegRBP && r.RBP.Kind == RuleAtBP {
			deref = true
		}
	}
	if !deref {
		t.Skip("this gcc did not realign drap's stack through DRAP")
	}
	pid := startReady(t, bin).Process.Pid
	waitSyscall(t, pid, unix.SYS_READ)
	p, pcs, methods, frames := procStack(t, pid)
	t.Logf("/proc registers: %v via %v", frames, methods)
	if !strings.Contains(" "+strings.Join(frames, " ")+" ", " leaf drap main ") || frames[len(frames)-1] != "_start" {
		t.Errorf("stack %q: want leaf drap main … _start", frames)
	}
	pregs, err := PtraceRegs(pid)
	if err != nil {
		t.Skipf("ptrace: %v", err)
	}
	p.Mem.Reset()
	ppcs, pmethods := StackMethods(pregs, p.Mem, p, 0)
	t.Logf("ptrace registers: %v via %v", names(p, ppcs), pmethods)
	if !slices.Equal(pcs, ppcs) {
		t.Errorf("stack from /proc registers %#x, from ptrace registers %#x", pcs, ppcs)
	}
	for i, m := range pmethods {
		if m != ByCFI {
			t.Errorf("with ptrace registers, frame %d found by %v, want cfi", i+1, m)
		}
	}
	if gdbPCs := gdbBacktrace(t, pid); gdbPCs != nil && !slices.Equal(pcs, gdbPCs) {
		t.Errorf("stack %#x, gdb's %#x", pcs, gdbPCs)
	}
}

// waitSyscall waits until pid's main thread sleeps in system call nr.
func waitSyscall(t testing.TB, pid, nr int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		_, n, err := SyscallRegs(pid, pid)
		if err == nil && n == nr {
			return
		}
		if err != nil && !errors.Is(err, ErrNotBlocked) {
			t.Fatal(err)
		}
	}
	t.Fatalf("process %d never blocked in system call %d", pid, nr)
}

// startReady runs a test program with its stdin a pipe nobody writes,
// and waits for it to print "ready".
func startReady(t testing.TB, path string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		stdin.Close()
		cmd.Wait()
	})
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("%s said %q, %v", path, line, err)
	}
	return cmd
}

// startBlocker runs a blocker binary, which blocks in read(2) on its
// stdin below main → level1 → level2 → level3, and waits until its
// thread sleeps in that read.
func startBlocker(t testing.TB, path string) int {
	t.Helper()
	pid := startReady(t, path).Process.Pid
	waitSyscall(t, pid, unix.SYS_READ)
	return pid
}

// names symbolises pcs in the process.
// procStack unwinds pid's stack from the registers /proc gives for its
// system call, and names the frames.
func procStack(t *testing.T, pid int) (*Process, []uint64, []Method, []string) {
	t.Helper()
	p, err := NewCache().Process(pid)
	if err != nil {
		t.Fatal(err)
	}
	regs, _, err := SyscallRegs(pid, pid)
	if err != nil {
		t.Fatal(err)
	}
	pcs, methods := StackMethods(regs, p.Mem, p, 0)
	return p, pcs, methods, names(p, pcs)
}

func names(p *Process, pcs []uint64) []string {
	out := make([]string, len(pcs))
	for i, pc := range pcs {
		s, ok := p.Symbolize(pc)
		switch {
		case !ok:
			out[i] = fmt.Sprintf("%#x", pc)
		case s.Name == "":
			out[i] = fmt.Sprintf("%s+%#x", s.File, s.Offset)
		default:
			out[i] = s.Name
		}
	}
	return out
}

// hasChain reports whether level3, level2, level1, main appear as
// consecutive frames.
func hasChain(frames []string) bool {
	return strings.Contains(" "+strings.Join(frames, " ")+" ", " level3 level2 level1 main ")
}

// TestUnwindBlockedProcess unwinds a real process blocked in read(2),
// with registers from /proc/PID/task/TID/syscall (the process keeps
// sleeping) and from ptrace, memory through process_vm_readv, and CFI
// from the mapped files. The oracle is the program's own call chain.
func TestUnwindBlockedProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc")
	}
	for _, tc := range []struct {
		name  string
		flags []string
		fp    bool // built with frame pointers
	}{
		{"no-frame-pointers", []string{"-fomit-frame-pointer"}, false},
		{"no-frame-pointers-static", []string{"-fomit-frame-pointer", "-static"}, false},
		{"frame-pointers", []string{"-fno-omit-frame-pointer"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid := startBlocker(t, buildC(t, tc.flags...))
			cache := NewCache()
			p, err := cache.Process(pid)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Missing) != 0 {
				t.Fatalf("mappings without files: %v", p.Missing)
			}

			// Registers from /proc: SP and PC only, the thread keeps sleeping.
			regs, _, err := SyscallRegs(pid, pid)
			if err != nil {
				t.Fatal(err)
			}
			pcs, methods := StackMethods(regs, p.Mem, p, 0)
			frames := names(p, pcs)
			t.Logf("CFI, registers from /proc/%d/syscall: %v via %v", pid, frames, methods)
			// With frame pointers, level3's CFA is rbp-based and /proc
			// does not give rbp: a validated stack scan finds it, once.
			checkFullStack(t, frames, methods, tc.fp)

			// ptrace gives rbp too: the same stack, by CFI alone.
			pregs, err := PtraceRegs(pid)
			if err != nil {
				t.Skipf("ptrace: %v", err)
			}
			if pregs.PC != regs.PC || pregs.SP != regs.SP {
				t.Errorf("ptrace regs %+v, /proc syscall %+v", pregs, regs)
			}
			p.Mem.Reset()
			ppcs, pmethods := StackMethods(pregs, p.Mem, p, 0)
			t.Logf("CFI, registers from ptrace: %v via %v", names(p, ppcs), pmethods)
			checkFullStack(t, names(p, ppcs), pmethods, false)
			if !slices.Equal(pcs, ppcs) {
				t.Errorf("stack from /proc registers %#x, from ptrace registers %#x", pcs, ppcs)
			}

			// An independent unwinder: gdb's backtrace, past main.
			if gdbPCs := gdbBacktrace(t, pid); gdbPCs != nil && !slices.Equal(pcs, gdbPCs) {
				t.Errorf("stack %#x, gdb's %#x", pcs, gdbPCs)
			}

			fp := names(p, FramePointers(pregs, p.Mem, 0))
			t.Logf("frame pointers: %v", fp)
			// libc's read keeps no frame: rbp is level3's, whose return
			// address is in level2, so the chain skips level3.
			if tc.fp && !strings.Contains(strings.Join(fp, " "), " level2 level1 main ") {
				t.Errorf("frame-pointer stack %q lacks level2 level1 main", fp)
			}
		})
	}
}

func checkFullStack(t *testing.T, frames []string, methods []Method, oneScan bool) {
	t.Helper()
	if !hasChain(frames) {
		t.Errorf("stack %q lacks level3 level2 level1 main", frames)
	}
	if last := frames[len(frames)-1]; last != "_start" {
		t.Errorf("outermost frame %q, want _start (its CFI marks the return address undefined)", last)
	}
	scans := 0
	for i, m := range methods {
		switch {
		case m == ByScan && oneScan && frames[i] == "level3":
			scans++
		case m != ByCFI:
			t.Errorf("frame %d (%s) found by %v, want cfi", i+1, frames[i+1], m)
		}
	}
	if oneScan && scans != 1 {
		t.Errorf("methods %v: want level3's caller found by a scan", methods)
	}
}

// gdbBacktrace attaches gdb to pid and returns the pc of every frame of
// its backtrace past main and the entry point, or nil without gdb.
func gdbBacktrace(t *testing.T, pid int) []uint64 {
	t.Helper()
	if _, err := exec.LookPath("gdb"); err != nil {
		t.Log("no gdb: stack not compared with gdb's")
		return nil
	}
	out, err := exec.Command("gdb", "-p", strconv.Itoa(pid), "-batch", "-nx",
		"-iex", "set debuginfod enabled off",
		"-ex", "set backtrace past-main on", "-ex", "set backtrace past-entry on",
		"-ex", "frame apply all -q p/x $pc").CombinedOutput()
	if err != nil {
		// Yama's ptrace_scope may forbid gdb, which is not our child's parent.
		t.Logf("gdb could not run, stack not compared with gdb's: %v\n%s", err, out)
		return nil
	}
	var pcs []uint64
	for _, line := range strings.Split(string(out), "\n") {
		// "$1 = 0x7ff3602b02ad"
		if _, v, ok := strings.Cut(line, " = 0x"); ok && strings.HasPrefix(line, "$") {
			pc, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				t.Fatalf("gdb line %q", line)
			}
			pcs = append(pcs, pc)
		}
	}
	if len(pcs) == 0 {
		t.Logf("no frames in gdb's output, stack not compared with gdb's:\n%s", out)
		return nil
	}
	return pcs
}
