// Package bpfkprobe owns a BPF kprobe that counts hits: the BPF side of
// `kinst bench hit`'s comparison of per-hit costs. The program is written
// with cilium/ebpf's asm package (no clang): look up the one element of an
// array map and add 1 to it atomically, the same work as kinst's own
// counter (a `lock inc` of one shared word).
//
// Kernel caveats: needs CONFIG_KPROBES and CONFIG_BPF_EVENTS and root (or
// CAP_BPF with CAP_PERFMON). A BPF program that is already running on a
// CPU is not re-entered there: such hits are missed, not counted, so the
// count is exact only for code that no other BPF kprobe program
// interrupts.
package bpfkprobe

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// ErrUnavailable wraps every reason the counter cannot be loaded or
// attached (no BPF, no kprobes, not root, a refused point).
var ErrUnavailable = errors.New("BPF kprobe unavailable")

// Counter is a loaded and attached counting kprobe.
type Counter struct {
	counts *ebpf.Map
	prog   *ebpf.Program
	link   link.Link
}

// Attach loads the counting program and attaches it as a kprobe at
// symbol+offset. offset must be an instruction boundary the kernel's
// kprobes accept; the kernel refuses others.
func Attach(symbol string, offset uint64) (*Counter, error) {
	if symbol == "" {
		return nil, fmt.Errorf("%w: no symbol", ErrUnavailable)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: raising RLIMIT_MEMLOCK: %v (needs root)", ErrUnavailable, err)
	}
	c := &Counter{}
	var err error
	c.counts, err = ebpf.NewMap(&ebpf.MapSpec{Name: "kinst_hits", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("%w: array map: %v", ErrUnavailable, err)
	}
	c.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "kinst_hit", Type: ebpf.Kprobe, License: "GPL", Instructions: Program(c.counts.FD())})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: load: %v", ErrUnavailable, err)
	}
	c.link, err = link.Kprobe(symbol, c.prog, &link.KprobeOptions{Offset: offset})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: kprobe at %s+%#x: %v", ErrUnavailable, symbol, offset, err)
	}
	return c, nil
}

// Program is the counting program: counts[0] += 1 (atomically), return 0.
// mapFD is the array map's descriptor.
func Program(mapFD int) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, -4, 0, asm.Word), // key = 0
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, mapFD),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
}

// Count reads the number of hits so far.
func (c *Counter) Count() (uint64, error) {
	var n uint64
	if err := c.counts.Lookup(uint32(0), &n); err != nil {
		return 0, err
	}
	return n, nil
}

// Close detaches the kprobe and frees the program and map.
func (c *Counter) Close() error {
	var errs []error
	if c.link != nil {
		errs = append(errs, c.link.Close())
	}
	if c.prog != nil {
		errs = append(errs, c.prog.Close())
	}
	if c.counts != nil {
		errs = append(errs, c.counts.Close())
	}
	return errors.Join(errs...)
}
