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

// mmapLoop is code that maps a table of anonymous page runs, one
// mmap(addr, len, PROT_READ|PROT_EXEC, MAP_PRIVATE|MAP_ANONYMOUS|
// MAP_FIXED_NOREPLACE, -1, 0) each, in one run of the thread: a
// ptrace round trip per system call (remoteSyscall) was most of the time
// of arming libc's punned jumps, whose thousands of trampoline pages lie
// scattered over the address space. rdi is the table (addr, len
// quadwords), rsi its entries; it stops at its int3 with r14 the entries
// mapped and, where one was not, rax its mmap's answer.
var mmapLoop = []byte{
	0x49, 0x89, 0xfc, // mov %rdi,%r12
	0x49, 0x89, 0xf5, // mov %rsi,%r13
	0x45, 0x31, 0xf6, // xor %r14d,%r14d
	// loop (9):
	0x4d, 0x39, 0xee, // cmp %r13,%r14
	0x73, 0x34, // jae done
	0x49, 0x8b, 0x3c, 0x24, // mov (%r12),%rdi
	0x49, 0x8b, 0x74, 0x24, 0x08, // mov 0x8(%r12),%rsi
	0xba, 0x05, 0x00, 0x00, 0x00, // mov $PROT_READ|PROT_EXEC,%edx
	0x41, 0xba, 0x22, 0x00, 0x10, 0x00, // mov $MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED_NOREPLACE,%r10d
	0x49, 0xc7, 0xc0, 0xff, 0xff, 0xff, 0xff, // mov $-1,%r8
	0x45, 0x31, 0xc9, // xor %r9d,%r9d
	0xb8, 0x09, 0x00, 0x00, 0x00, // mov $SYS_mmap,%eax
	0x0f, 0x05, // syscall
	0x49, 0x3b, 0x04, 0x24, // cmp (%r12),%rax
	0x75, 0x09, // jne done
	0x49, 0x83, 0xc4, 0x10, // add $0x10,%r12
	0x49, 0xff, 0xc6, // inc %r14
	0xeb, 0xc7, // jmp loop
	// done (66):
	0xcc, // int3
}

// runCode makes thread st (held in a ptrace stop) run code at pc, in the
// process, with rdi and rsi set, until it reaches the int3 at end; it
// gives the registers there and puts the thread's own back. As in
// remoteSyscall, orig_rax -1 keeps a system call it was stopped in from
// restarting until its registers are back; a signal on the way is kept
// for resumeAll to send again.
func runCode(st *stopped, pc, end, rdi, rsi uint64) (unix.PtraceRegs, error) {
	var out unix.PtraceRegs
	r := st.regs
	r.Rip, r.Orig_rax, r.Rdi, r.Rsi = pc, ^uint64(0), rdi, rsi
	if err := unix.PtraceSetRegs(st.tid, &r); err != nil {
		return out, err
	}
	defer unix.PtraceSetRegs(st.tid, &st.regs)
	for {
		if err := unix.PtraceCont(st.tid, 0); err != nil {
			return out, err
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(st.tid, &ws, unix.WALL, nil); err != nil {
			return out, err
		}
		if ws.Exited() || ws.Signaled() {
			noteExit(st.tid, ws)
			return out, fmt.Errorf("%w: thread %d died in code kinst made it run", ErrNoProcess, st.tid)
		}
		if !ws.Stopped() || ws.TrapCause() == unix.PTRACE_EVENT_STOP {
			continue // a group stop's report: nothing to keep
		}
		if err := unix.PtraceGetRegs(st.tid, &out); err != nil {
			return out, err
		}
		if ws.StopSignal() == unix.SIGTRAP && out.Rip == end+1 {
			return out, nil
		}
		if ws.StopSignal() == unix.SIGTRAP || ws.StopSignal() == unix.SIGSEGV || ws.StopSignal() == unix.SIGILL || ws.StopSignal() == unix.SIGBUS {
			return out, fmt.Errorf("code kinst made thread %d run stopped at %#x with %v", st.tid, out.Rip, ws.StopSignal())
		}
		st.sig = int(ws.StopSignal()) // another signal first: keep it for later
	}
}
