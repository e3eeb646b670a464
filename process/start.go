package process

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Start starts cmd stopped at its entry point, before its first
// instruction of its own runs but after the dynamic loader has mapped the
// libraries it links (so LIB:FUNC resolves; a library it dlopens later
// is not there yet); SIGCONT lets it go. The child traces itself to its
// starting thread (PTRACE_TRACEME), which catches the exec's stop, runs
// it to an int3 at the entry (AT_ENTRY of its auxiliary vector), puts
// the byte back, and lets the child go with SIGSTOP.
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
		if err := runToEntry(pid); err != nil {
			return fmt.Errorf("%s: %w", cmd.Path, err)
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

// atEntry is AT_ENTRY: the program's entry point in the auxiliary vector.
const atEntry = 9

// runToEntry runs the traced child, stopped after its exec, to its entry
// point: an int3 there, then the byte and the pc put back. Signals on the
// way are delivered.
func runToEntry(pid int) error {
	auxv, err := os.ReadFile(fmt.Sprintf("/proc/%d/auxv", pid))
	if err != nil {
		return err
	}
	var entry uint64
	for i := 0; i+16 <= len(auxv); i += 16 {
		if binary.LittleEndian.Uint64(auxv[i:]) == atEntry {
			entry = binary.LittleEndian.Uint64(auxv[i+8:])
		}
	}
	if entry == 0 {
		return fmt.Errorf("no entry point in its auxiliary vector")
	}
	m, err := openMem(pid)
	if err != nil {
		return err
	}
	defer m.close()
	orig := make([]byte, 1)
	if err := m.read(entry, orig); err != nil {
		return err
	}
	if err := m.write(entry, []byte{0xcc}); err != nil {
		return err
	}
	sig := 0
	for {
		if err := unix.PtraceCont(pid, sig); err != nil {
			return err
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
			return err
		}
		if ws.Exited() || ws.Signaled() {
			return fmt.Errorf("exited before its entry point (%v)", ws)
		}
		sig = 0
		if !ws.Stopped() {
			continue
		}
		if ws.StopSignal() != unix.SIGTRAP {
			sig = int(ws.StopSignal())
			continue
		}
		var regs unix.PtraceRegs
		if err := unix.PtraceGetRegs(pid, &regs); err != nil {
			return err
		}
		if regs.Rip != entry+1 {
			sig = int(unix.SIGTRAP) // not ours
			continue
		}
		if err := m.write(entry, orig); err != nil {
			return err
		}
		regs.Rip = entry
		return unix.PtraceSetRegs(pid, &regs)
	}
}
