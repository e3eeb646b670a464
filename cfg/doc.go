// Package cfg owns what kinst knows about the kernel's machine code as
// control flow: instruction boundaries of a function decoded from the live
// bytes, basic blocks, jump tables, the registers and flags live at an
// instruction, and the runs of whole instructions a covering splice may
// overwrite. Its functions are pure: they decide nothing about splicing.
//
// Facts about the kernel itself (symbols, BTF prototypes and layouts, the
// instructions the kernel's own tables name) come from package kernel; a
// function's extent is taken from the next symbol. What may be spliced,
// and how, is the splice planner's (package splice), which builds on this
// package.
package cfg
