// Package core is postmortem analysis of a Linux crash dump on the kernel
// view of it (kernel/dumpview: memory, symbols, types, modules, per-CPU
// data): tasks, the printk ring buffer, ORC-unwound kernel stacks, and
// what `kinst core` reports from them.
//
// Kernel-version caveats: the printk reader handles the lockless ring
// buffer of 5.10 and later; task walking needs BTF
// (CONFIG_DEBUG_INFO_BTF). Only x86-64 dumps are understood.
//
// A FreeBSD amd64 minidump gets a narrower view, FreeBSD: its header,
// memory through the dump's own pmap, and the message buffer; tasks,
// stacks and symbols would need the FreeBSD kernel's ELF and CTF.
package core

import (
	"fmt"
	"sync"

	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/kernel/dumpview"
	"github.com/kinst/kinst/unwind/orc"
)

// LiveBTF is the running kernel's BTF, which a live kernel's view
// (/proc/kcore) falls back on when the BTF in its memory cannot be read.
const LiveBTF = "/sys/kernel/btf/vmlinux"

// Options selects alternative sources of types and unwind tables.
type Options struct {
	// BTF is a raw BTF file or an ELF (vmlinux) with a .BTF section, used
	// instead of the BTF in the dump's memory.
	BTF string
	// Vmlinux is the kernel's ELF image: its .BTF and ORC sections are
	// used instead of the dump's copies (relocated by KERNELOFFSET).
	Vmlinux string
	// MaxFrames caps each backtrace (0: no cap; the walk still ends at a
	// cycle, and at orc.MaxFrames).
	MaxFrames int
}

// Kernel is a dump seen as a Linux kernel: the kernel view of it, and the
// unwind tables, loaded once, on first use. A Kernel is safe for
// concurrent use.
type Kernel struct {
	*dumpview.View
	opts Options

	orc loadOnce[*orcTables]

	modMu       sync.Mutex
	modORC      map[uint64]*orc.Table // by struct module address; nil: none
	taskSkipped []string              // live: what the last Tasks skipped
}

// Live says whether the kernel is the running system's (/proc/kcore):
// its memory changes while it is read, and its CPUs' registers are not
// known.
func (k *Kernel) Live() bool { return dump.IsLive(k.Dump) }

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
		return nil, fmt.Errorf("a FreeBSD minidump has no Linux kernel view: open it with OpenFreeBSD")
	}
	vo := dumpview.Options{BTF: o.BTF, Vmlinux: o.Vmlinux}
	if dump.IsLive(d) {
		// The running kernel's own BTF, if its memory's cannot be read.
		vo.FallbackBTF = LiveBTF
	}
	v, err := dumpview.New(d, vo)
	if err != nil {
		return nil, err
	}
	return &Kernel{View: v, opts: o, modORC: map[uint64]*orc.Table{}}, nil
}
