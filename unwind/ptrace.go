package unwind

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// PtraceRegs stops thread tid for as long as it takes to read its
// registers (PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_GETREGS, detach),
// for a thread that is running or when BP is wanted too. A system call
// the thread was blocked in is restarted afterwards. It needs ptrace
// access to the thread and fails if another tracer is attached.
func PtraceRegs(tid int) (Regs, error) {
	// Every ptrace request must come from the thread that attached.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(tid); err != nil {
		return Regs{}, fmt.Errorf("ptrace seize %d: %w", tid, err)
	}
	defer unix.PtraceDetach(tid)
	if err := unix.PtraceInterrupt(tid); err != nil {
		return Regs{}, fmt.Errorf("ptrace interrupt %d: %w", tid, err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
		return Regs{}, fmt.Errorf("waiting for %d to stop: %w", tid, err)
	}
	if !ws.Stopped() {
		return Regs{}, fmt.Errorf("thread %d did not stop (wait status %#x)", tid, uint32(ws))
	}
	var r unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &r); err != nil {
		return Regs{}, fmt.Errorf("ptrace getregs %d: %w", tid, err)
	}
	return Regs{PC: r.Rip, SP: r.Rsp, BP: r.Rbp}, nil
}
