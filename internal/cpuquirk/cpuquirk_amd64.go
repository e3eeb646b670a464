package cpuquirk

import "golang.org/x/sys/cpu"

func hasCX16() bool { return cpu.X86.HasCX16 }

// cmpxchg16bFlags: popfq; add probe; cmpxchg16b on the 16-byte-aligned
// part of mem (zeros, so it succeeds); pushfq. Returns the flags pushed.
//
//go:noescape
func cmpxchg16bFlags(mem *[4]uint64, probe uint64) uint64
