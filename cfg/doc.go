// Package cfg owns what kinst knows about the kernel's machine code:
// symbols, instruction boundaries of a function decoded from the live
// bytes, its entry block, and the registers and flags live at an
// instruction. Everything that decides whether a point may be spliced, and
// what the patch must preserve there, starts here.
//
// The analysis is deliberately per function for now: liveness is a
// conservative forward scan of the flags inside straight-line code, and a
// function's extent is taken from the next kallsyms symbol.
package cfg
