package cli

import (
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// GCPercent is the collector's target kinst runs with unless GOGC says
// otherwise: heap growth over the live heap, in percent, before a
// collection (Go's default is 100).
const GCPercent = 400

// tuneGCMin is the least memory a machine has for TuneGC to trade any.
const tuneGCMin = 4 << 30

// TuneGC trades memory for CPU on a machine with memory to spare. A
// command's big structures are made once and kept to its end: covering a
// process's libc decodes and plans 71,000 blocks, allocating about
// 500 MB of which 200 MB stays live, and at Go's default the collector
// took a fifth of its CPU on two cores (BenchmarkCoverProcessLibc: 1.80 s
// a run, 1.50 s at GCPercent). Unless GOGC or GOMEMLIMIT is set, on a
// machine of at least 4 GiB, the collector runs at GCPercent under a
// soft limit of a quarter of the memory, past which it collects as often
// as it must. A smaller machine (the 1 GiB test guest, where kinst runs
// beside kerninstd, which sizes its own limit by what is free) keeps
// Go's defaults.
func TuneGC() {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return
	}
	total := uint64(si.Totalram) * uint64(max(si.Unit, 1))
	if total < tuneGCMin {
		return
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(int64(total / 4))
	}
}
