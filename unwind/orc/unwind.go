package orc

import (
	"errors"
	"fmt"
)

// Memory reads 64-bit words of kernel memory (stacks, pt_regs).
type Memory interface {
	ReadU64(addr uint64) (uint64, error)
}

// Finder finds the ORC entry for an instruction address; a *Table is
// one, and a caller may combine the kernel's table with modules'.
type Finder interface {
	Lookup(ip uint64) (Entry, bool)
}

// Offsets of registers in struct pt_regs (x86-64).
const (
	ptR13  = 16
	ptBP   = 32
	ptR10  = 56
	ptDX   = 96
	ptDI   = 112
	ptIP   = 128
	ptCS   = 136
	ptSP   = 152
	ptSize = 168
	ptIRET = ptIP // IRET_FRAME_OFFSET: where the hardware frame starts
)

// Regs are the registers an unwind can start from and that pt_regs
// frames may supply.
type Regs struct {
	IP, SP, BP, DX, DI, R10, R13 uint64
	CS                           uint64
}

// State is where an unwind starts.
type State struct {
	IP, SP, BP uint64
	// Signal: IP is the interrupted instruction itself, not a return
	// address (true when starting from CPU registers).
	Signal bool
	// Regs, when set, are the full registers at the start (a CPU's
	// registers from a dump note), for entries based on DX, DI, R10, R13.
	Regs *Regs
	// MaxFrames caps the unwind; 0 means only the ceiling (MaxFrames).
	MaxFrames int
}

// Frame is one step of an unwound stack.
type Frame struct {
	IP, SP uint64
	// Signal marks a frame entered by an interrupt or exception: IP is
	// the interrupted instruction (the frame above a pt_regs).
	Signal bool
}

// Why an unwind stopped early.
var (
	ErrNoEntry  = errors.New("no ORC entry for the address")
	ErrBadEntry = errors.New("ORC entry this unwinder does not understand")
	ErrRead     = errors.New("stack memory unreadable")
	ErrLoop     = errors.New("stack going the wrong way")
	ErrTooDeep  = errors.New("stack deeper than the frame limit")
	// ErrNotKernel: a return address or interrupted IP read from the
	// stack is outside the kernel half, where only pt_regs from user
	// mode may lead (a corrupt stack).
	ErrNotKernel = errors.New("address outside the kernel read from the stack")
	// ErrUserMode: the start state is in user space, so there is no
	// kernel stack to unwind (a CPU caught running user code).
	ErrUserMode = errors.New("the CPU was in user mode")
)

// StopError says where an unwind stopped and why; it matches the Err*
// values above.
type StopError struct {
	IP     uint64
	Reason error
	Detail string
}

func (e *StopError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("unwind stopped at %#x: %v: %s", e.IP, e.Reason, e.Detail)
	}
	return fmt.Sprintf("unwind stopped at %#x: %v", e.IP, e.Reason)
}
func (e *StopError) Unwrap() error { return e.Reason }

// MaxFrames bounds an unwind.
const MaxFrames = 100000

// isKernel reports whether addr is in the kernel half of the address
// space.
func isKernel(addr uint64) bool { return addr >= 0xffff800000000000 }

// Unwind walks a stack from st, innermost frame first, as the kernel's
// unwind_next_frame does: the entry for each IP (IP−1 for a return
// address, so a call to a noreturn function at the end of a function
// finds the caller's row) gives the caller's stack pointer; a call frame
// has the return address just below it, a pt_regs frame holds the
// interrupted IP and SP. It stops at the outermost kernel frame (an
// "end" entry, or pt_regs from user mode). The frames found are returned
// with an error when the walk could not finish cleanly.
func Unwind(f Finder, mem Memory, st State) ([]Frame, error) {
	w := &walker{mem: mem, ip: st.IP, sp: st.SP, bp: st.BP, signal: st.Signal, regs: st.Regs}
	var frames []Frame
	limit := MaxFrames
	if st.MaxFrames > 0 && st.MaxFrames < limit {
		limit = st.MaxFrames
	}
	// A frame seen before, at the same ip and sp, means the walk is in a
	// cycle: a CPU that double-faults while on its double-fault stack
	// starts again at that stack's top, so the pt_regs it leaves point
	// back into frames the walk has already passed.
	type ipsp struct{ ip, sp uint64 }
	seen := map[ipsp]bool{}
	for {
		if !isKernel(w.ip) {
			if len(frames) == 0 {
				return frames, w.stop(ErrUserMode, "")
			}
			return frames, w.stop(ErrNotKernel, "from the frame at sp %#x", frames[len(frames)-1].SP)
		}
		if seen[ipsp{w.ip, w.sp}] {
			return frames, w.stop(ErrLoop, "the frame at sp %#x comes round again", w.sp)
		}
		seen[ipsp{w.ip, w.sp}] = true
		frames = append(frames, Frame{IP: w.ip, SP: w.sp, Signal: w.signal})
		if len(frames) >= limit {
			return frames, w.stop(ErrTooDeep, "%d frames", limit)
		}
		look := w.ip
		if !w.signal {
			look--
		}
		e, ok := f.Lookup(look)
		if !ok {
			return frames, w.stop(ErrNoEntry, "")
		}
		if e.SPReg == RegUndefined {
			if e.End {
				return frames, nil
			}
			return frames, w.stop(ErrBadEntry, "undefined stack pointer")
		}
		cfa, indirect, err := w.cfa(e)
		if err != nil {
			return frames, err
		}
		prevSP := w.sp
		if done, err := w.caller(e, cfa); done || err != nil {
			return frames, err
		}
		if err := w.callerBP(e, cfa); err != nil {
			return frames, err
		}
		// Within one stack the caller's frame is above the callee's. Two
		// kinds of frame switch stacks: pt_regs (an exception or NMI stack
		// back to the interrupted one) and an indirect stack pointer, the
		// saved sp at the top of an IRQ stack that call_on_irqstack leaves
		// (a CPU caught inside an interrupt handler returns to its task
		// stack, lower in memory than the IRQ stack).
		if !w.signal && !indirect && w.sp <= prevSP {
			return frames, w.stop(ErrLoop, "sp %#x after %#x", w.sp, prevSP)
		}
	}
}

// walker is Unwind's state: the frame being unwound.
type walker struct {
	mem        Memory
	ip, sp, bp uint64
	signal     bool
	regs       *Regs  // registers known for the current frame
	regsAddr   uint64 // address of the current pt_regs in memory
	fullRegs   bool   // regsAddr holds a whole pt_regs, not only its iret frame
}

// stop is why the walk ends at the current ip.
func (w *walker) stop(reason error, format string, a ...any) error {
	return &StopError{IP: w.ip, Reason: reason, Detail: fmt.Sprintf(format, a...)}
}

// reg is the register at pt_regs offset off, where it is known.
func (w *walker) reg(off uint64) (uint64, bool) {
	if w.regs != nil {
		switch off {
		case ptDX:
			return w.regs.DX, true
		case ptDI:
			return w.regs.DI, true
		case ptR10:
			return w.regs.R10, true
		case ptR13:
			return w.regs.R13, true
		case ptBP:
			return w.regs.BP, true
		}
	}
	if w.regsAddr != 0 && (w.fullRegs || off >= ptIRET) {
		v, err := w.mem.ReadU64(w.regsAddr + off)
		return v, err == nil
	}
	return 0, false
}

// cfa is the frame's canonical frame address as e computes it, and
// whether it was read from memory (a stack switch).
func (w *walker) cfa(e Entry) (cfa uint64, indirect bool, err error) {
	switch e.SPReg {
	case RegSP:
		cfa = w.sp + uint64(int64(e.SPOffset))
	case RegBP:
		cfa = w.bp + uint64(int64(e.SPOffset))
	case RegSPIndirect:
		cfa, indirect = w.sp, true
	case RegBPIndirect:
		cfa, indirect = w.bp+uint64(int64(e.SPOffset)), true
	case RegR10, RegR13, RegDI, RegDX:
		off := map[uint8]uint64{RegR10: ptR10, RegR13: ptR13, RegDI: ptDI, RegDX: ptDX}[e.SPReg]
		v, ok := w.reg(off)
		if !ok {
			return 0, false, w.stop(ErrBadEntry, "stack pointer based on register %d, which is not known here", e.SPReg)
		}
		cfa = v
	default:
		return 0, false, w.stop(ErrBadEntry, "stack pointer register %d", e.SPReg)
	}
	if indirect {
		v, err := w.mem.ReadU64(cfa)
		if err != nil {
			return 0, false, w.stop(ErrRead, "%v", err)
		}
		cfa = v
		if e.SPReg == RegSPIndirect {
			cfa += uint64(int64(e.SPOffset))
		}
	}
	return cfa, indirect, nil
}

// caller moves to the caller's ip and sp, by a return address or a
// pt_regs; done: the kernel stack ends here (it interrupted user mode).
func (w *walker) caller(e Entry, cfa uint64) (done bool, err error) {
	switch e.Type {
	case TypeCall:
		ret, err := w.mem.ReadU64(cfa - 8)
		if err != nil {
			return false, w.stop(ErrRead, "return address at %#x: %v", cfa-8, err)
		}
		w.ip, w.sp, w.signal = ret, cfa, false
		w.regs, w.regsAddr, w.fullRegs = nil, 0, false
	case TypeRegs:
		nip, err1 := w.mem.ReadU64(cfa + ptIP)
		nsp, err2 := w.mem.ReadU64(cfa + ptSP)
		cs, err3 := w.mem.ReadU64(cfa + ptCS)
		if err := errors.Join(err1, err2, err3); err != nil {
			return false, w.stop(ErrRead, "pt_regs at %#x: %v", cfa, err)
		}
		if cs&3 != 0 { // interrupted user mode: the kernel stack ends here
			return true, nil
		}
		w.ip, w.sp, w.signal = nip, nsp, true
		w.regs, w.regsAddr, w.fullRegs = nil, cfa, true
	case TypeRegsPartial:
		nip, err1 := w.mem.ReadU64(cfa)
		nsp, err2 := w.mem.ReadU64(cfa + ptSP - ptIRET)
		cs, err3 := w.mem.ReadU64(cfa + ptCS - ptIRET)
		if err := errors.Join(err1, err2, err3); err != nil {
			return false, w.stop(ErrRead, "iret frame at %#x: %v", cfa, err)
		}
		if cs&3 != 0 {
			return true, nil
		}
		w.ip, w.sp, w.signal = nip, nsp, true
		w.regs, w.regsAddr, w.fullRegs = nil, cfa-ptIRET, false
	default:
		return false, w.stop(ErrBadEntry, "type %d", e.Type)
	}
	return false, nil
}

// callerBP restores the caller's frame pointer as e says.
func (w *walker) callerBP(e Entry, cfa uint64) error {
	switch e.BPReg {
	case RegUndefined:
		if e.Type == TypeRegs {
			if v, err := w.mem.ReadU64(w.regsAddr + ptBP); err == nil {
				w.bp = v
			}
		}
	case RegPrevSP:
		v, err := w.mem.ReadU64(cfa + uint64(int64(e.BPOffset)))
		if err != nil {
			return w.stop(ErrRead, "saved frame pointer: %v", err)
		}
		w.bp = v
	case RegBP:
		v, err := w.mem.ReadU64(w.bp + uint64(int64(e.BPOffset)))
		if err != nil {
			return w.stop(ErrRead, "saved frame pointer: %v", err)
		}
		w.bp = v
	default:
		return w.stop(ErrBadEntry, "frame pointer register %d", e.BPReg)
	}
	return nil
}
