package cli

import (
	"math"
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// GCPercent is the collector's target kinst runs with unless GOGC says
// otherwise: heap growth over the live heap, in percent, before a
// collection (Go's default is 100).
const GCPercent = 400

// TuneGC trades memory for CPU. A command's big structures are made once
// and kept to its end: covering a process's libc decodes and plans 71,000
// blocks, allocating about 500 MB of which 200 MB stays live, and at Go's
// default the collector took a fifth of its CPU on two cores (1.5-1.8 s
// a run against 1.3-1.5 s at GCPercent). Unless GOGC or GOMEMLIMIT is
// set, the collector runs at GCPercent under a soft limit of a quarter of
// the machine's memory, past which it collects as often as it must.
func TuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		var si unix.Sysinfo_t
		if unix.Sysinfo(&si) == nil && si.Totalram > 0 {
			total := uint64(si.Totalram) * uint64(si.Unit)
			debug.SetMemoryLimit(int64(min(total/4, math.MaxInt64)))
		}
	}
}
