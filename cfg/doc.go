// Package cfg owns what kinst knows about the kernel's machine code as
// control flow: instruction boundaries of a function decoded from the live
// bytes, basic blocks, jump tables, the call graph, the registers and
// flags live at an instruction, and the no-splice rules that follow from
// the code. Everything that decides whether a point may be spliced, and
// what the patch must preserve there, starts here.
//
// Facts about the kernel itself (symbols, BTF prototypes and layouts, the
// instructions the kernel's own tables name) come from package kernel. A
// function's extent is taken from the next symbol. The no-splice rules
// combine symbol-based ones (entry and noinstr text, the int3 path, the
// driver) with kernel.OwnedSites: exception tables, static keys, static
// calls and ftrace records, of the core kernel and of every loaded module.
package cfg
