package unwind

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// startBlocker runs a blocker binary, which blocks in read(2) on its
// stdin (a pipe nobody writes) below main → level1 → level2 → level3,
// and waits until its thread sleeps in that read.
func startBlocker(t *testing.T, path string) int {
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
		t.Fatalf("blocker said %q, %v", line, err)
	}
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		_, nr, err := SyscallRegs(pid, pid)
		if err == nil && nr == 0 { // read
			return pid
		}
		if err != nil && !errors.Is(err, ErrNotBlocked) {
			t.Fatal(err)
		}
	}
	t.Fatal("blocker never blocked in read(2)")
	return 0
}

// names symbolises pcs in the process.
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
			if tc.fp {
				// level3 computes its CFA from rbp, which /proc does not give.
				if len(frames) < 2 || frames[1] != "level3" {
					t.Errorf("stack %q does not reach level3", frames)
				}
			} else {
				checkFullStack(t, frames, methods)
			}

			// ptrace gives rbp too: the whole stack for every build.
			pregs, err := PtraceRegs(pid)
			if err != nil {
				t.Skipf("ptrace: %v", err)
			}
			if pregs.PC != regs.PC || pregs.SP != regs.SP {
				t.Errorf("ptrace regs %+v, /proc syscall %+v", pregs, regs)
			}
			p.Mem.Reset()
			pcs, methods = StackMethods(pregs, p.Mem, p, 0)
			frames = names(p, pcs)
			t.Logf("CFI, registers from ptrace: %v via %v", frames, methods)
			checkFullStack(t, frames, methods)

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

func checkFullStack(t *testing.T, frames []string, methods []Method) {
	t.Helper()
	if !hasChain(frames) {
		t.Errorf("stack %q lacks level3 level2 level1 main", frames)
	}
	if last := frames[len(frames)-1]; last != "_start" {
		t.Errorf("outermost frame %q, want _start (its CFI marks the return address undefined)", last)
	}
	for i, m := range methods {
		if m != ByCFI {
			t.Errorf("frame %d (%s) found by %v, want cfi", i+1, frames[i+1], m)
		}
	}
}
