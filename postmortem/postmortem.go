// Package postmortem reads a Linux kernel by its own types, from a crash
// dump or from the running kernel: the library under `kinst core`, for Go
// programs that analyse dumps (drgn's role, for Go). Open a dump (an ELF
// vmcore from kdump or QEMU's dump-guest-memory, a kdump-compressed or
// flattened file) or "/proc/kcore"; look up symbols; evaluate C
// expressions over the kernel's variables ("init_task.comm",
// "per_cpu(runqueues, 1).nr_running"); read typed objects member by
// member and walk the kernel's lists and trees; list the tasks.
//
// Types come from the kernel's BTF (in the dump's memory, or a file given
// with Options): every struct, and the per-CPU variables. Other variables
// need a cast ("*(struct task_struct *)ADDR"), or a debug vmlinux
// (Options.Vmlinux) whose DWARF types them, as 6.1's BTF types only
// per-CPU variables.
//
// A Kernel is safe for concurrent use; an Object is a value.
package postmortem

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/kernel/typed"
)

// Live is the path that opens the running kernel (as root; Linux 4.19 or
// later, whose /proc/kcore carries VMCOREINFO).
const Live = dump.KcorePath

// Options are where types and symbols come from, beyond the dump.
type Options struct {
	// BTF is a raw BTF file, or an ELF with a .BTF section, used instead
	// of the BTF in the dump's memory.
	BTF string
	// Vmlinux is the kernel's image: its BTF and ORC are used instead of
	// the dump's, and with DWARF (a debug vmlinux) it types the variables
	// BTF does not.
	Vmlinux string
}

// Kernel is an opened dump or live kernel.
type Kernel struct {
	k    *core.Kernel
	env  *typed.Env
	done func()
}

// ErrNotLinux is matched by Open's error for a dump of another kernel
// (a FreeBSD minidump: `kinst core` reads those, this package does not).
var ErrNotLinux = errors.New("not a Linux kernel dump")

// Open opens the dump at path (Live: the running kernel).
func Open(path string, o Options) (*Kernel, error) {
	d, err := dump.Open(path)
	if err != nil {
		return nil, err
	}
	if _, ok := core.OpenFreeBSD(d); ok {
		d.Close()
		return nil, fmt.Errorf("%s: %w", path, ErrNotLinux)
	}
	k, err := core.New(d, core.Options{BTF: o.BTF, Vmlinux: o.Vmlinux})
	if err != nil {
		d.Close()
		return nil, err
	}
	e, done, err := k.TypedEnv(o.Vmlinux)
	if err != nil {
		k.Close()
		return nil, err
	}
	return &Kernel{k: k, env: e, done: done}, nil
}

// Close releases the dump.
func (k *Kernel) Close() error {
	k.done()
	return k.k.Close()
}

// Release is the kernel's release (uname -r).
func (k *Kernel) Release() string { return k.k.Release() }

// Symbol is a kernel or module symbol's address.
func (k *Kernel) Symbol(name string) (uint64, bool) { return k.env.Symbol(name) }

// SymbolAt names an address as SYMBOL+0xOFF [MODULE].
func (k *Kernel) SymbolAt(addr uint64) (string, bool) { return k.env.SymbolAt(addr) }

// Read reads kernel virtual memory.
func (k *Kernel) Read(addr uint64, b []byte) error { return k.k.Read(addr, b) }

// Tasks lists every task (thread), from init_task's list.
func (k *Kernel) Tasks() ([]core.Task, error) { return k.k.Tasks() }

// Eval evaluates a C expression over the kernel's variables: members (.
// ->), indexing, *, &, casts to struct and pointer types, container_of,
// per_cpu(VAR, CPU), sizeof, + and -.
func (k *Kernel) Eval(expr string) (Object, error) {
	v, err := k.env.Eval(expr)
	if err != nil {
		return Object{}, err
	}
	return Object{k: k, v: v}, nil
}

// Object is the object of type typ ("struct task_struct", or
// "task_struct") at addr.
func (k *Kernel) Object(typ string, addr uint64) (Object, error) {
	t, err := k.lookup(typ)
	if err != nil {
		return Object{}, err
	}
	return Object{k: k, v: typed.Object(t, addr)}, nil
}

func (k *Kernel) lookup(typ string) (btf.Type, error) {
	if t, err := k.env.LookupType(typ); err == nil {
		return t, nil
	}
	return k.env.LookupType("struct " + typ)
}

// maxEntries bounds a list walk: a corrupt list ends there with an error.
const maxEntries = 1 << 20

// Entries are the structs of type typ linked through member from head,
// the address of what starts the walk: a list_head (the walk ends back
// at it), an hlist_head (to NULL) or an rb_root (in order), as member's
// type says, as list_for_each_entry and its kin walk them. A list that
// loops or breaks ends with an error, with the entries read up to there.
func (k *Kernel) Entries(head uint64, typ, member string) ([]Object, error) {
	t, err := k.lookup(typ)
	if err != nil {
		return nil, err
	}
	addrs, err := k.env.ListEntries(head, t, member, maxEntries)
	out := make([]Object, len(addrs))
	for i, a := range addrs {
		out[i] = Object{k: k, v: typed.Object(t, a)}
	}
	return out, err
}

// XArray are the structs of type typ an xarray points to, in index
// order (xa_for_each): xa is the address of a struct xarray (an IDR's
// idr_rt, a radix tree's root). Value and internal entries are left out.
func (k *Kernel) XArray(xa uint64, typ string) ([]Object, error) {
	t, err := k.lookup(typ)
	if err != nil {
		return nil, err
	}
	addrs, err := k.env.XArrayEntries(xa, maxEntries)
	out := make([]Object, len(addrs))
	for i, a := range addrs {
		out[i] = Object{k: k, v: typed.Object(t, a)}
	}
	return out, err
}

// Object is a typed value in the kernel's memory (or, for the result of
// arithmetic, a computed scalar).
type Object struct {
	k *Kernel
	v typed.Value
}

// Type is the object's C type, as "struct task_struct *".
func (o Object) Type() string { return typed.TypeString(o.v.Type) }

// Address is where the object lies; an error for a computed value.
func (o Object) Address() (uint64, error) { return o.k.env.Address(o.v) }

// Member is the member at path ("comm", "se.vruntime").
func (o Object) Member(path string) (Object, error) {
	v, err := o.k.env.Member(o.v, path)
	return Object{k: o.k, v: v}, err
}

// Deref is what a pointer points to.
func (o Object) Deref() (Object, error) {
	v, err := o.k.env.Deref(o.v)
	return Object{k: o.k, v: v}, err
}

// Uint is an integer, enum, bool or pointer's value.
func (o Object) Uint() (uint64, error) { return o.k.env.Uint(o.v) }

// Int is Uint read as signed, for signed types.
func (o Object) Int() (int64, error) {
	u, err := o.Uint()
	return int64(u), err
}

// String is a char array's string, up to its NUL.
func (o Object) String() (string, error) { return o.k.env.String(o.v, 4096) }

// Format prints the object as crash's print does: structs nested, enums
// by name, char arrays as strings, pointers with their symbol.
func (o Object) Format(name string) string {
	var b strings.Builder
	typed.Write(&b, o.k.env.Tree(name, o.v))
	return b.String()
}
