package cpuquirk

import (
	"errors"
	"fmt"
)

// ErrStaleCmpxchg16bFlags: the CPU computes cmpxchg16b's flags from stale
// state (QEMU TCG before 8.0); splicing the kernel would corrupt RFLAGS.
var ErrStaleCmpxchg16bFlags = errors.New("this CPU computes the flags of cmpxchg16b from stale state (QEMU's TCG before 8.0): " +
	"a splice's popfq or iretq before the kernel's cmpxchg16b (SLUB's fast path) puts a kernel pointer into RFLAGS and oopses the kernel; " +
	"run the guest under KVM or QEMU 8.0 or later, or without cmpxchg16b (-cpu qemu64,-cx16)")

// probeBits are RFLAGS bits that read as zero on every x86-64 CPU (bits 3,
// 5 and 15 are reserved) and that neither popfq nor iretq can set: if the
// emulator leaks them into RFLAGS through the bug being checked for, no
// behaviour of this process changes.
const probeBits = 1<<3 | 1<<5 | 1<<15

// Check runs the instruction sequence that shows the stale-flags bug: a
// popfq (which ends an emulator's translation block), an add whose source
// operand is probeBits, a cmpxchg16b, a pushfq. It returns
// ErrStaleCmpxchg16bFlags when probeBits show in the flags pushed, nil
// when they do not or when the CPU has no cmpxchg16b (nor then does the
// kernel use it).
func Check() error {
	if !hasCX16() {
		return nil
	}
	var mem [4]uint64 // 16 aligned bytes within it
	// A few runs, so that one the emulator happens to split differently
	// (a signal or interrupt between popfq and cmpxchg16b) does not decide.
	for i := 0; i < 4; i++ {
		if flags := cmpxchg16bFlags(&mem, probeBits); flags&probeBits != 0 {
			return fmt.Errorf("%w (pushfq after cmpxchg16b read %#x)", ErrStaleCmpxchg16bFlags, flags)
		}
	}
	return nil
}
