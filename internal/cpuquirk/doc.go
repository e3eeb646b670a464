// Package cpuquirk detects CPUs, real or emulated, on which splicing the
// kernel is known to corrupt it through no fault of the splice.
//
// The one known today is an emulator's: QEMU's TCG before 8.0 computes the
// flags of cmpxchg8b and cmpxchg16b from the condition-code state that was
// current when the translation block began, not from the instructions of
// the block that ran before it. When a block begins right after a popfq or
// an iretq (which leave the whole RFLAGS value as that state) and sets
// flags before a cmpxchg16b, the flags the cmpxchg16b produces are the
// earlier instruction's operand: a kernel pointer. The next pushfq, or the
// next interrupt or exception frame, then carries that garbage into
// RFLAGS (TF, NT, IOPL, AC, ID), and the kernel takes an unexpected
// single-step #DB or a #GP at its next iretq. Stock kernels seldom meet
// it; splices meet it often, because a patch that saves the flags ends
// with popfq and a trap splice returns with iretq, and SLUB's lockless
// fast path (this_cpu_cmpxchg16b) is among the hottest code there is.
// Found by arming 182,243 blocks of Debian's 6.12 under TCG; reduced to
// two counters in __kmalloc_node_noprof (a flags-saving patch before the
// cmpxchg16b and any probe after it); QEMU 8.0 computes those flags inline
// and is not affected. KVM and real CPUs run the instruction natively.
package cpuquirk
