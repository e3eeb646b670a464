// Package dump reads kernel crash dumps and gives uniform access to the
// memory and CPU state they hold: ELF vmcores (QEMU dump-guest-memory,
// kdump's /proc/vmcore), the running kernel's /proc/kcore, kdump-compressed files (standard "KDUMP   " and
// makedumpfile's flattened stream) and FreeBSD amd64 minidumps.
//
// The format is detected from the file's content, never its name. Each
// format registers itself (see register); Open tries them in turn.
// Interpreting the memory (page tables, symbols, tasks) belongs to the
// parent package core.
package dump

import (
	"errors"
	"fmt"
	"io"
	"os"
)

var (
	// ErrUnknownFormat: no reader recognised the file's content.
	ErrUnknownFormat = errors.New("not a kernel dump this reader knows (ELF vmcore, kdump-compressed, flattened kdump, FreeBSD amd64 minidump)")
	// ErrNotPresent: the page is not in the dump (excluded by the dumper
	// or outside the recorded memory).
	ErrNotPresent = errors.New("page not present in the dump")
	// ErrCorrupt: the file claims a format but its structure is broken.
	ErrCorrupt = errors.New("corrupt dump")
)

// CorruptError says where and why a dump is broken; it matches ErrCorrupt.
type CorruptError struct {
	Format string
	Offset int64 // file offset of the offending structure, -1 if none
	Reason string
}

func (e *CorruptError) Error() string {
	if e.Offset >= 0 {
		return fmt.Sprintf("%s: corrupt at file offset %#x: %s", e.Format, e.Offset, e.Reason)
	}
	return fmt.Sprintf("%s: corrupt: %s", e.Format, e.Reason)
}

func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// NotPresentError names the address that could not be read; it matches
// ErrNotPresent.
type NotPresentError struct {
	Addr     uint64
	Physical bool
	// Excluded: the page was in memory but the dumper left it out (a
	// kdump filtered with makedumpfile -d), as opposed to memory the
	// dump never covered. Only formats that record it set it.
	Excluded bool
}

func (e *NotPresentError) Error() string {
	kind := "virtual"
	if e.Physical {
		kind = "physical"
	}
	if e.Excluded {
		return fmt.Sprintf("%s address %#x: page excluded from the dump by the dumper's filter", kind, e.Addr)
	}
	return fmt.Sprintf("%s address %#x: page not present in the dump", kind, e.Addr)
}

func (e *NotPresentError) Is(target error) bool { return target == ErrNotPresent }

// Regs is the x86-64 register state of one CPU at dump time, in the
// order of the kernel's struct pt_regs / the ELF NT_PRSTATUS user_regs.
type Regs struct {
	R15, R14, R13, R12, RBP, RBX, R11, R10 uint64
	R9, R8, RAX, RCX, RDX, RSI, RDI        uint64
	OrigRAX, RIP, CS, EFLAGS, RSP, SS      uint64
	FSBase, GSBase                         uint64
	// Control registers, when the dumper recorded them (QEMU's own
	// notes do; NT_PRSTATUS does not). Zero when unknown.
	CR0, CR2, CR3, CR4 uint64
}

// CPU is one processor's state as the dump recorded it.
type CPU struct {
	Index int
	PID   int // the task running there, from NT_PRSTATUS (0 if unknown)
	Regs  Regs
}

// Dump is an opened crash dump.
type Dump interface {
	// Format names the container, e.g. "elf", "kdump", "kdump-flattened",
	// "freebsd-minidump".
	Format() string
	// ReadPhys reads physical memory at addr. A page the dump does not
	// hold gives an error matching ErrNotPresent.
	ReadPhys(p []byte, addr uint64) (int, error)
	// VMCoreInfo returns the raw VMCOREINFO text ("KEY=value" lines), or
	// "" when the dump has none.
	VMCoreInfo() string
	// CPUs returns the per-CPU register state recorded in the dump's
	// notes; it may be empty.
	CPUs() []CPU
	// PhysRanges lists the physical ranges the dump covers, sorted.
	PhysRanges() []Range
	Close() error
}

// VirtReader is implemented by dumps whose format maps kernel virtual
// addresses itself (FreeBSD minidumps carry the kernel pmap).
type VirtReader interface {
	ReadVirt(p []byte, addr uint64) (int, error)
}

// MessageBufferReader is implemented by dumps that carry the kernel's
// message buffer beside memory (FreeBSD minidumps' msgbuf). Linux dumps
// do not: their log is in memory, read through the kernel's printk ring.
type MessageBufferReader interface {
	MessageBuffer() []byte
}

// RAMSizer is implemented by dumps that know how much memory the machine
// had beside what they hold: a filtered kdump's first bitmap marks every
// page in RAM, its second only the pages dumped.
type RAMSizer interface {
	RAMBytes() uint64
}

// Range is a half-open physical address range [Start, End).
type Range struct{ Start, End uint64 }

type format struct {
	name  string
	probe func(head []byte) bool // head holds the file's first bytes
	open  func(f *os.File) (Dump, error)
}

var formats []format

// register adds a format; call it from the format file's init.
func register(name string, probe func([]byte) bool, open func(*os.File) (Dump, error)) {
	formats = append(formats, format{name, probe, open})
}

// probeLen is how many leading bytes a probe may look at.
const probeLen = 4096

// Open detects the dump's format from its content and opens it. On
// success the Dump owns the file.
func Open(path string) (Dump, error) {
	f, err := os.Open(path)
	if err != nil {
		if isKcorePath(path) {
			return nil, kcoreErr(err)
		}
		return nil, err
	}
	if isKcorePath(path) {
		d, err := openKcore(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return d, nil
	}
	head := make([]byte, probeLen)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		f.Close()
		return nil, err
	}
	head = head[:n]
	for _, fm := range formats {
		if fm.probe(head) {
			d, err := fm.open(f)
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return d, nil
		}
	}
	f.Close()
	return nil, fmt.Errorf("%s: %w", path, ErrUnknownFormat)
}
