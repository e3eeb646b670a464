// Package core is the kernel's view of a crash dump: it turns the
// physical memory and notes a core/dump reader provides into kernel
// virtual memory (x86-64 4- and 5-level page walks, the kernel image
// mapping, KASLR and phys_base from VMCOREINFO), symbols (kallsyms
// decoded from the dump's memory), types (BTF from __start_BTF…
// __stop_BTF, or a vmlinux / BTF file), tasks, the printk ring buffer and
// ORC-unwound kernel stacks.
//
// Kernel-version caveats: the kallsyms tables are located through
// VMCOREINFO, which exports them since Linux 6.0; the printk reader
// handles the lockless ring buffer of 5.10 and later; task walking needs
// BTF (CONFIG_DEBUG_INFO_BTF). Only x86-64 dumps are understood.
//
// A FreeBSD amd64 minidump gets a narrower view, FreeBSD: its header,
// memory through the dump's own pmap, and the message buffer; tasks,
// stacks and symbols would need the FreeBSD kernel's ELF and CTF.
package core

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kinst/kinst/core/dump"
)

var (
	// ErrMissing: the dump lacks information a request needs.
	ErrMissing = errors.New("missing from the dump")
	// ErrNoSymbol: no kernel symbol of that name or at that address.
	ErrNoSymbol = errors.New("no such kernel symbol")
)

// MissingError names what the dump lacks and where it was looked for; it
// matches ErrMissing.
type MissingError struct{ What, Where string }

func (e *MissingError) Error() string {
	return fmt.Sprintf("%s not found in %s", e.What, e.Where)
}
func (e *MissingError) Is(t error) bool { return t == ErrMissing }

// Options selects alternative sources of types and unwind tables.
type Options struct {
	// BTF is a raw BTF file or an ELF (vmlinux) with a .BTF section, used
	// instead of the BTF in the dump's memory.
	BTF string
	// Vmlinux is the kernel's ELF image: its .BTF and ORC sections are
	// used instead of the dump's copies (relocated by KERNELOFFSET).
	Vmlinux string
}

// Kernel is a dump seen as a Linux kernel. Symbols, types, unwind tables
// and modules are loaded once, on first use; mu protects the translation
// cache. A Kernel is safe for concurrent use.
type Kernel struct {
	Dump dump.Dump
	Info *VMCoreInfo
	opts Options

	physBase uint64 // NUMBER(phys_base), two's complement
	imageEnd uint64 // end of the kernel image mapping
	pgd      uint64 // physical address of the kernel's top-level page table
	levels   int    // 4 or 5

	mu  sync.Mutex        // protects tlb
	tlb map[uint64]uint64 // virtual page → physical page (or notMapped)

	syms  loadOnce[*Symbols]
	types loadOnce[*Types]
	orc   loadOnce[*orcTables]
	mods  loadOnce[[]*Module]
}

// loadOnce computes a value on first use and keeps it, error included:
// the dump does not change, so a second attempt would fail the same way.
type loadOnce[T any] struct {
	once sync.Once
	v    T
	err  error
}

func (l *loadOnce[T]) get(what string, load func() (T, error)) (T, error) {
	l.once.Do(func() {
		if l.v, l.err = load(); l.err != nil {
			l.err = fmt.Errorf("%s: %w", what, l.err)
		}
	})
	return l.v, l.err
}

// Open opens a dump and prepares its kernel view. The dump must carry
// VMCOREINFO (QEMU's -device vmcoreinfo with the guest's qemu_fw_cfg
// module, or kdump).
func Open(path string, o Options) (*Kernel, error) {
	d, err := dump.Open(path)
	if err != nil {
		return nil, err
	}
	k, err := New(d, o)
	if err != nil {
		d.Close()
		return nil, err
	}
	return k, nil
}

// New builds the kernel view of an opened dump; the Kernel owns d.
func New(d dump.Dump, o Options) (*Kernel, error) {
	if _, ok := d.(*dump.Minidump); ok {
		return nil, errors.New("a FreeBSD minidump has no Linux kernel view: open it with OpenFreeBSD")
	}
	text := d.VMCoreInfo()
	if text == "" {
		return nil, &MissingError{What: "VMCOREINFO", Where: "the dump's notes (boot QEMU with -device vmcoreinfo and load qemu_fw_cfg in the guest, or take the dump with kdump)"}
	}
	info, err := ParseVMCoreInfo(text)
	if err != nil {
		return nil, err
	}
	k := &Kernel{Dump: d, Info: info, opts: o, tlb: map[uint64]uint64{}, levels: 4}
	k.physBase = uint64(info.Numbers["phys_base"])
	size := uint64(info.Numbers["KERNEL_IMAGE_SIZE"])
	if size == 0 {
		size = 1 << 30
	}
	k.imageEnd = startKernelMap + size
	if info.Numbers["pgtable_l5_enabled"] == 1 {
		k.levels = 5
	}
	// The kernel's own top-level table, not a CPU's CR3: an idle CPU runs
	// on a borrowed user mm (lazy TLB), whose kernel half is the same but
	// whose pages a dumper may have excluded. CR3 is the fallback.
	top, ok := info.Symbols["init_top_pgt"]
	if !ok {
		top, ok = info.Symbols["swapper_pg_dir"]
	}
	switch {
	case ok:
		k.pgd = top - startKernelMap + k.physBase
	case len(d.CPUs()) > 0 && d.CPUs()[0].Regs.CR3 != 0:
		k.pgd = d.CPUs()[0].Regs.CR3 & pteAddrMask
	default:
		return nil, &MissingError{What: "the kernel page table (SYMBOL(init_top_pgt) or CR3)", Where: "VMCOREINFO and the CPU notes"}
	}
	return k, nil
}

// Close closes the dump.
func (k *Kernel) Close() error { return k.Dump.Close() }

// Release is the kernel release (uname -r) the dump says it is.
func (k *Kernel) Release() string { return k.Info.OSRelease }
