package kerninstd

import (
	"context"
	"runtime/debug"
	"testing"
	"time"
)

func TestMemoryLimit(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct{ base, live, want uint64 }{
		{192 * mib, 0, 192 * mib},
		{192 * mib, 100 * mib, 192 * mib}, // 125 MiB is under the base
		{192 * mib, 160 * mib, 200 * mib}, // a big session: never under the live heap
		{192 * mib, 200 * mib, 250 * mib},
		{192 * mib, 400 * mib, 500 * mib},
	} {
		if got := MemoryLimit(tc.base, tc.live); got != tc.want {
			t.Errorf("MemoryLimit(%d MiB, %d MiB) = %d MiB, want %d", tc.base/mib, tc.live/mib, got/mib, tc.want/mib)
		}
	}
}

func TestTrackMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const base = 1 << 40 // far above any live heap of this test
	TrackMemoryLimit(ctx, base, time.Hour)
	if got := debug.SetMemoryLimit(-1); got != base {
		t.Errorf("limit %d, want the base %d", got, int64(base))
	}
}
