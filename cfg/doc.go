// Package cfg owns what kinst knows about the kernel's machine code:
// symbols (kallsyms, or ELF symbol tables), instruction boundaries of a
// function decoded from the live bytes, basic blocks, jump tables, the
// call graph, the registers and flags live at an instruction, and the
// no-splice map. Everything that decides whether a point may be spliced,
// and what the patch must preserve there, starts here.
//
// A function's extent is taken from the next symbol. The no-splice map
// combines symbol-based rules (entry and noinstr text, the int3 path, the
// driver) with the instructions the kernel's own tables name (OwnedSites:
// exception tables, static keys, static calls and ftrace records, of the
// core kernel and of every loaded module), read from live memory with
// struct layouts from the kernel's BTF (KernelLayout).
package cfg
