package kerninstd

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// liveHeapMetric is the heap the last collection found live.
const liveHeapMetric = "/gc/heap/live:bytes"

// MemoryLimit is the soft limit on the Go heap that TrackMemoryLimit sets:
// base, or a quarter more than the heap the last collection found live,
// whichever is larger. Below base it keeps a small daemon small (the
// collector runs before the heap doubles); above, it never sits below the
// live heap. A fixed limit did: a session of 200,000 probes holds more
// than 192 MiB live, and with the limit under it the collector ran
// without pause, each cycle scanning the whole heap, so arming took 122 s
// instead of 54.
func MemoryLimit(base, live uint64) uint64 { return max(base, live+live/4) }

// TrackMemoryLimit sets the Go heap's soft limit to MemoryLimit(base,
// live) now and every interval until ctx ends.
func TrackMemoryLimit(ctx context.Context, base uint64, every time.Duration) {
	sample := []metrics.Sample{{Name: liveHeapMetric}}
	set := func() {
		metrics.Read(sample)
		var live uint64
		if sample[0].Value.Kind() == metrics.KindUint64 {
			live = sample[0].Value.Uint64()
		}
		debug.SetMemoryLimit(int64(MemoryLimit(base, live)))
	}
	set()
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				set()
			}
		}
	}()
}

// bigSession is the number of probes past which arming or ending a
// session hands the freed memory back to the kernel at once.
const bigSession = 10000

// releaseHeapAfter returns the freed heap to the kernel a second after a
// session of n probes ended (once the request that ended it has let go
// of it), rather than over the minutes the runtime's scavenger takes: a
// whole-kernel session leaves 400 MB behind otherwise.
func releaseHeapAfter(n int) {
	if n >= bigSession {
		time.AfterFunc(time.Second, debug.FreeOSMemory)
	}
}

// PeakRSS is this process's peak resident set (VmHWM of
// /proc/self/status) in bytes, or 0: what Config.Info reports as
// api.Info.PeakRSS.
func PeakRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
