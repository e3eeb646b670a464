// Package codegen emits the machine code of patches: instrumentation
// primitives, the relocated original instruction and the jump back, and
// checks a generated patch by decoding it back before it is ever spliced.
//
// A patch replaces exactly one instruction of the running kernel, so the
// relocated copy must do precisely what the original did from its own
// address: branch targets and RIP-relative operands keep their absolute
// addresses, calls return into the original code, and flags and registers
// are left as the original leaves them. Instructions whose behaviour
// depends on where they run in ways a patch cannot reproduce (traps,
// interrupt shadows, system calls, EIP-relative operands, ...) are refused
// with an *UnsupportedError that says why.
//
// RIP-relative operands are located by walking prefixes, opcode map and
// ModRM ourselves and cross-checking the walk with x86asm: x86asm's VEX
// decoder shows "disp32(%rip)" as an absolute address, and any other
// disagreement between the two is refused rather than guessed.
//
// Patches live in the driver's patch heap, in the module area within
// ±2 GiB of kernel text, so rel32 and RIP-relative displacements normally
// reach; every displacement is still checked (*ReachError).
package codegen
