package kernel

import (
	"errors"

	"github.com/cilium/ebpf/btf"
)

// Field is where one struct member lies: byte offset and size.
type Field struct{ Off, Size uint32 }

// Entry is the layout of one table entry: its size, and the 32-bit field
// holding the offset from that field to the instruction it names. Target,
// when its Size is not 0, is a second such field naming where the kernel
// may send a CPU by the table (an exception fixup, a static key's jump
// target): code that is entered without a branch the decoder sees.
type Entry struct {
	Size   uint32
	Rel    Field
	Target Field
}

// KernelLayout is where the fields the owned-site walkers read lie in
// the running kernel's structs. It comes from the kernel's BTF, never
// from numbers written down here: struct module in particular changes
// with the kernel version and configuration.
type KernelLayout struct {
	Module                                  ModuleLayout
	ExTableEntry, JumpEntry, StaticCallSite Entry // exception_table_entry.insn, jump_entry.code, static_call_site.addr
	FtracePageSize                          uint32
	FtraceNext, FtraceRecords, FtraceIndex  Field // struct ftrace_page
	DynFtrace                               Entry // struct dyn_ftrace; Rel is its (absolute) ip
}

// LayoutFromBTF reads the layout from a kernel BTF spec (vmlinux's: struct
// module, struct ftrace_page and the table entry types all live there).
// Unlike a module walk for symbols, it requires every module table: the
// owned sites are a safety rule, read whole or not at all.
func LayoutFromBTF(spec *btf.Spec) (*KernelLayout, error) {
	return KernelLayoutFrom(&Types{Spec: spec})
}

// KernelLayoutFrom is LayoutFromBTF over Types.
func KernelLayoutFrom(t *Types) (*KernelLayout, error) {
	ml, err := ModuleLayoutFromBTF(t)
	if err != nil {
		return nil, err
	}
	l := &KernelLayout{Module: *ml}
	var errs []error
	for _, f := range []struct {
		f    Field
		name string
		want uint32
	}{
		{ml.ExTable, "extable", 8}, {ml.NumExTable, "num_exentries", 0},
		{ml.JumpEntries, "jump_entries", 8}, {ml.NumJumpEntries, "num_jump_entries", 0},
		{ml.StaticCallSites, "static_call_sites", 8}, {ml.NumStaticCallSites, "num_static_call_sites", 0},
	} {
		if f.f.Size == 0 {
			// The module walk left it out: ask again for the reason.
			_, err := t.Field("module", f.name, f.want)
			errs = append(errs, err)
		}
	}
	field := func(dst *Field, st, path string, want uint32) {
		f, err := t.Field(st, path, want)
		errs = append(errs, err)
		*dst = f
	}
	size := func(name string) uint32 {
		n, err := t.Size(name)
		errs = append(errs, err)
		return n
	}
	entry := func(name, member string, want uint32) Entry {
		e := Entry{Size: size(name)}
		field(&e.Rel, name, member, want)
		return e
	}
	l.ExTableEntry = entry("exception_table_entry", "insn", 4)
	field(&l.ExTableEntry.Target, "exception_table_entry", "fixup", 4)
	l.JumpEntry = entry("jump_entry", "code", 4)
	field(&l.JumpEntry.Target, "jump_entry", "target", 4)
	l.StaticCallSite = entry("static_call_site", "addr", 4)
	l.FtracePageSize = size("ftrace_page")
	field(&l.FtraceNext, "ftrace_page", "next", 8)
	field(&l.FtraceRecords, "ftrace_page", "records", 8)
	field(&l.FtraceIndex, "ftrace_page", "index", 0)
	l.DynFtrace = entry("dyn_ftrace", "ip", 8)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return l, nil
}
