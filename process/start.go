package process

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Start starts cmd stopped right after its exec, before its first
// instruction (and before the dynamic loader maps its libraries), so the
// executable can be spliced before it runs; SIGCONT lets it go. The child
// traces itself to its starting thread (PTRACE_TRACEME), which catches
// the exec's stop and lets the child go with SIGSTOP.
func Start(cmd *exec.Cmd) error {
	tr := newTracer()
	defer tr.close()
	return tr.do(func() error {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Ptrace = true
		if err := cmd.Start(); err != nil {
			return err
		}
		pid := cmd.Process.Pid
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
			return err
		}
		if !ws.Stopped() {
			return fmt.Errorf("%s exited before it ran (%v)", cmd.Path, ws)
		}
		if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(pid), 0, uintptr(unix.SIGSTOP), 0, 0); e != 0 {
			return fmt.Errorf("let %s go stopped: %v", cmd.Path, e)
		}
		// The SIGSTOP takes effect at once; wait until /proc says so.
		for i := 0; i < 1000; i++ {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if _, rest, ok := strings.Cut(string(b), ") "); ok && strings.HasPrefix(rest, "T") {
				return nil
			}
			time.Sleep(time.Millisecond)
		}
		return fmt.Errorf("%s did not stop after exec", cmd.Path)
	})
}
