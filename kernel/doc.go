// Package kernel owns kinst's one view of a kernel, live or from a crash
// dump (Program, modelled on drgn's program): memory reads; symbols of
// the kernel image and its modules (Symbols: kallsyms, ELF symbol tables,
// or the compressed tables in kernel memory); types from BTF (Types: the
// one place that says where a member lies) and the layouts derived from
// them (KernelLayout, ModuleLayout, TaskLayout, function Prototypes); the
// module list (one walk of struct module, ReadModules); per-CPU data; and
// the instructions the kernel's own tables name (OwnedSites: exception
// tables, static keys, static calls and ftrace records, of the core
// kernel and of every loaded module).
//
// Live constructs the view of the running kernel; the dump backend is
// package kernel/dumpview. This package imports nothing of kinst's
// analysis or of the dump formats: control flow (package cfg), the
// daemon and postmortem analysis (package core) build on it.
//
// Kernel-version caveats: layouts come from BTF, never from numbers
// written down, and where kernels differ the choice is made by what BTF
// has (struct module's core_layout before 6.4, mem[MOD_TEXT] from 6.4;
// current_task up to 6.1, pcpu_hot.current_task from 6.2). Without BTF,
// only the core kernel's owned-site tables are read, with 6.1's x86-64
// entry layouts. x86-64 only.
package kernel
