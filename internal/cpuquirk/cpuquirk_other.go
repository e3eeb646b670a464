//go:build !amd64

package cpuquirk

func hasCX16() bool { return false }

func cmpxchg16bFlags(mem *[4]uint64, probe uint64) uint64 { return 0 }
