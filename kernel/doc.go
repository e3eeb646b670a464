// Package kernel owns kinst's facts about a kernel, as opposed to its
// machine code: text symbols (kallsyms, or ELF symbol tables), function
// prototypes and struct layouts from the kernel's BTF, where the running
// task's identity lies (TaskLayout), and the instructions the kernel's own
// tables name (OwnedSites: exception tables, static keys, static calls and
// ftrace records, of the core kernel and of every loaded module), read from
// kernel memory with struct layouts from BTF (KernelLayout).
//
// It imports nothing of kinst's analysis: control flow (package cfg) and
// everything above it build on these facts.
package kernel
