// Package codegen emits the machine code of patches: instrumentation
// primitives, the relocated original instruction and the jump back, and
// checks a generated patch by decoding it back before it is ever spliced.
//
// Patches live in the driver's patch heap, in the module area within
// ±2 GiB of kernel text, so rel32 and RIP-relative displacements normally
// reach; every displacement is still checked.
package codegen
