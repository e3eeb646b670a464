package process

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// syscallInsn is "syscall".
var syscallInsn = []byte{0x0f, 0x05}

// remoteSyscall makes thread st (held in a ptrace stop) run one system
// call: the two bytes at its pc become "syscall" for one single step, its
// registers the call's, and both are put back. orig_rax -1 keeps the
// kernel from restarting a system call the thread was stopped in; the
// saved registers, put back after, restart it as they would have.
func remoteSyscall(m *memFile, st *stopped, nr uint64, args ...uint64) (uint64, error) {
	pc := st.regs.Rip
	saved := make([]byte, len(syscallInsn))
	if err := m.read(pc, saved); err != nil {
		return 0, err
	}
	if err := m.write(pc, syscallInsn); err != nil {
		return 0, err
	}
	defer m.write(pc, saved)
	r := st.regs
	r.Rax, r.Orig_rax = nr, ^uint64(0)
	argRegs := []*uint64{&r.Rdi, &r.Rsi, &r.Rdx, &r.R10, &r.R8, &r.R9}
	for i, a := range args {
		*argRegs[i] = a
	}
	if err := unix.PtraceSetRegs(st.tid, &r); err != nil {
		return 0, err
	}
	defer unix.PtraceSetRegs(st.tid, &st.regs)
	if err := unix.PtraceSingleStep(st.tid); err != nil {
		return 0, err
	}
	for {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(st.tid, &ws, unix.WALL, nil); err != nil {
			return 0, err
		}
		if ws.Exited() || ws.Signaled() {
			noteExit(st.tid, ws)
			return 0, fmt.Errorf("%w: thread %d died during a system call kinst made it run", ErrNoProcess, st.tid)
		}
		if ws.Stopped() && ws.StopSignal() == unix.SIGTRAP {
			break
		}
		if ws.Stopped() { // another signal first: keep it for later, step on
			st.sig = int(ws.StopSignal())
			if err := unix.PtraceSingleStep(st.tid); err != nil {
				return 0, err
			}
		}
	}
	var out unix.PtraceRegs
	if err := unix.PtraceGetRegs(st.tid, &out); err != nil {
		return 0, err
	}
	if int64(out.Rax) < 0 && int64(out.Rax) > -4096 {
		return 0, fmt.Errorf("system call %d in the process: %w", nr, unix.Errno(-int64(out.Rax)))
	}
	return out.Rax, nil
}
