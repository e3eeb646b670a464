package core

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/unwind/orc"
)

// orcTables is the kernel image's ORC table; each module's is read with
// the module (moduleORC).
type orcTables struct {
	kernel *orc.Table
	source string
}

// Frame is one frame of a kernel stack.
type Frame struct {
	Address  uint64 `json:"-"`
	AddrHex  string `json:"address"`
	Function string `json:"function"`
	Offset   uint64 `json:"offset"`
	Module   string `json:"module,omitempty"`
	// Exception: the frame was interrupted (its address is the
	// interrupted instruction, not a return address).
	Exception bool `json:"exception,omitempty"`
}

// Stack is a task's unwound kernel stack.
type Stack struct {
	Task   Task    `json:"task"`
	Frames []Frame `json:"frames"`
	// Stop says why the unwind ended before the outermost frame, if it
	// did.
	Stop string `json:"stop,omitempty"`
	// UserMode: the task was running user code on its CPU; it has no
	// kernel frames.
	UserMode bool `json:"user_mode,omitempty"`
}

func (k *Kernel) orcTable() (*orcTables, error) {
	return k.orc.get("ORC", k.loadORC)
}

// maxORC bounds the ORC tables read (the 6.1 kernel's are about 2 MiB).
const maxORC = 64 << 20

func (k *Kernel) loadORC() (*orcTables, error) {
	if k.opts.Vmlinux != "" {
		return k.loadORCFromELF(k.opts.Vmlinux)
	}
	s, err := k.KernelSymbols()
	if err != nil {
		return nil, err
	}
	ipStart, ok1 := s.Address("__start_orc_unwind_ip")
	ipStop, ok2 := s.Address("__stop_orc_unwind_ip")
	uStart, ok3 := s.Address("__start_orc_unwind")
	if !ok1 || !ok2 || !ok3 {
		return nil, fmt.Errorf("%w: __start_orc_unwind_ip, __stop_orc_unwind_ip or __start_orc_unwind (kernel built without CONFIG_UNWINDER_ORC?)", kernel.ErrNoSymbol)
	}
	if ipStop <= ipStart || ipStop-ipStart > maxORC {
		return nil, fmt.Errorf("orc_unwind_ip %#x-%#x is not a plausible range", ipStart, ipStop)
	}
	n := (ipStop - ipStart) / 4
	ips, err := k.ReadBytes(ipStart, int(n*4))
	if err != nil {
		return nil, err
	}
	ents, err := k.ReadBytes(uStart, int(n*orc.EntrySize))
	if err != nil {
		return nil, err
	}
	t, err := orc.ParseFormat(ips, ipStart, ents, k.orcFormat())
	if err != nil {
		return nil, err
	}
	return &orcTables{kernel: t, source: "dump memory"}, nil
}

// loadORCFromELF reads .orc_unwind_ip and .orc_unwind from a vmlinux
// and relocates them by the dump's KASLR offset.
func (k *Kernel) loadORCFromELF(path string) (*orcTables, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ipSec, uSec := f.Section(".orc_unwind_ip"), f.Section(".orc_unwind")
	if ipSec == nil || uSec == nil {
		return nil, fmt.Errorf("%s has no .orc_unwind_ip/.orc_unwind sections", path)
	}
	ips, err := ipSec.Data()
	if err != nil {
		return nil, err
	}
	ents, err := uSec.Data()
	if err != nil {
		return nil, err
	}
	t, err := orc.ParseFormat(ips, ipSec.Addr+k.Info.KernelOffset, ents, k.orcFormat())
	if err != nil {
		return nil, err
	}
	return &orcTables{kernel: t, source: path}, nil
}

// inactiveTaskFrame is the size of struct inactive_task_frame on x86-64
// (r15 r14 r13 r12 bx bp ret_addr), which __switch_to_asm leaves at
// thread.sp; bp and ret_addr are its last two words.
const inactiveTaskFrame = 7 * 8

// Backtrace unwinds a task's kernel stack with ORC: from the CPU's
// registers in the dump's notes if the task was running, else from the
// frame that __switch_to_asm left at thread.sp. A walk that ends before
// the outermost frame says why in Stop; the error is for what no task's
// walk can do without (the ORC table, the symbols).
func (k *Kernel) Backtrace(t Task) (*Stack, error) {
	tab, err := k.orcTable()
	if err != nil {
		return nil, err
	}
	syms, err := k.KernelSymbols()
	if err != nil {
		return nil, err
	}
	var st orc.State
	if t.Active && k.Live() {
		// Its saved thread.sp is from its last switch: stale.
		return &Stack{Task: t, Frames: []Frame{}, Stop: fmt.Sprintf("running on cpu %d when read: a live system's CPU registers are not in /proc/kcore", t.CPU)}, nil
	}
	if t.Active && t.CPU < len(k.Dump.CPUs()) {
		r := k.Dump.CPUs()[t.CPU].Regs
		st = orc.State{IP: r.RIP, SP: r.RSP, BP: r.RBP, Signal: true,
			Regs: &orc.Regs{IP: r.RIP, SP: r.RSP, BP: r.RBP, DX: r.RDX, DI: r.RDI, R10: r.R10, R13: r.R13, CS: r.CS}}
	} else {
		if t.hasStack && t.stack == 0 {
			// The kernel frees an exited task's stack when it last
			// switches out; a zombie keeps its task_struct only.
			return &Stack{Task: t, Frames: []Frame{}, Stop: "the task has exited: its kernel stack is freed"}, nil
		}
		if t.hasStack && (t.threadSP < t.stack || t.threadSP >= t.stack+threadSize) {
			return &Stack{Task: t, Frames: []Frame{}, Stop: fmt.Sprintf("the saved stack pointer %#x is outside the task's stack at %#x", t.threadSP, t.stack)}, nil
		}
		if t.threadSP == 0 {
			return &Stack{Task: t, Frames: []Frame{}, Stop: "no saved stack pointer (thread.sp is 0)"}, nil
		}
		// bp and ret_addr in one read: one error, not one per word.
		var w [16]byte
		if err := k.ReadVirt(w[:], t.threadSP+5*8); err != nil {
			return &Stack{Task: t, Frames: []Frame{}, Stop: fmt.Sprintf("switch frame at %#x: %v", t.threadSP, err)}, nil
		}
		bp, ip := binary.LittleEndian.Uint64(w[:]), binary.LittleEndian.Uint64(w[8:])
		st = orc.State{IP: ip, SP: t.threadSP + inactiveTaskFrame, BP: bp}
		if fork, ok := syms.Address("ret_from_fork"); ok && ip == fork {
			st.Signal = true // a new task that never ran: ret_from_fork is its first instruction
		}
	}
	st.MaxFrames = k.opts.MaxFrames
	frames, uerr := orc.Unwind(orcFinder{k, tab.kernel, kernelText(syms)}, k, st)
	out := &Stack{Task: t, Frames: []Frame{}}
	for _, f := range frames {
		fr := Frame{Address: f.IP, AddrHex: fmt.Sprintf("%#x", f.IP), Exception: f.Signal && len(out.Frames) > 0}
		if sym, off, ok := k.SymbolAt(f.IP); ok {
			fr.Function, fr.Offset, fr.Module = sym.Name, off, sym.Module
		}
		out.Frames = append(out.Frames, fr)
	}
	switch {
	case errors.Is(uerr, orc.ErrUserMode) && t.Active:
		out.UserMode = true
	case errors.Is(uerr, orc.ErrUserMode):
		// A switched-out task always resumes in the kernel: a saved
		// return address outside it is a corrupt switch frame.
		out.Stop = fmt.Sprintf("the switch frame at %#x is corrupt: its return address %#x is not in the kernel", t.threadSP, st.IP)
	case uerr != nil:
		out.Stop = uerr.Error()
	}
	return out, nil
}

// orcFormat is the ORC entry layout of the dump's kernel: from its BTF
// when that describes struct orc_entry (a member end: the layout before
// 6.4), else from the release.
func (k *Kernel) orcFormat() orc.Format {
	if t, err := k.Types(); err == nil {
		if s, err := t.Struct("orc_entry"); err == nil {
			// The members are bitfields, which Types.Member refuses:
			// look at the names.
			for _, m := range s.Members {
				if m.Name == "end" {
					return orc.Format414
				}
			}
			return orc.Format64
		}
	}
	return orc.FormatOf(k.Info.OSRelease)
}

// LiveStack is the live part of a task's kernel stack of size bytes:
// from its stack pointer (the saved thread.sp of a switched-out task, the
// CPU's %rsp of one running in a dump) to the top. Below it lie dead
// frames, stale words that name whatever was there once. The whole stack
// where the pointer is not known or not on it (a live kernel's running
// task, a CPU on its interrupt stack); ok is false without a stack.
func (k *Kernel) LiveStack(t Task, size uint64) (lo, hi uint64, ok bool) {
	base, ok := t.Stack()
	if !ok {
		return 0, 0, false
	}
	lo, hi = base, base+size
	sp := t.threadSP
	if t.Active {
		sp = 0
		if !k.Live() && t.CPU < len(k.Dump.CPUs()) {
			sp = k.Dump.CPUs()[t.CPU].Regs.RSP
		}
	}
	if sp > base && sp < hi {
		lo = sp &^ 7
	}
	return lo, hi, true
}
