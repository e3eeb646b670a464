package workload

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A counted workload stops when its context ends (kinst's does on
// SIGTERM) instead of running its count out: a test that killed a
// ten-million-stat loop waited 160 s for it in the emulated guest.
func TestCountedWorkloadsStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := t.TempDir()
	for name, run := range map[string]func() error{
		"stat":  func() error { return Stat(ctx, "/", 10_000_000) },
		"files": func() error { return Files(ctx, dir, 10_000_000) },
		"creat": func() error { return Creat(ctx, dir, 10_000_000) },
	} {
		err := run()
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "stopped after 0 of 10000000") {
			t.Errorf("%s with its context ended: %v", name, err)
		}
	}
	if n := Spin(ctx, time.Hour); n > checkEvery {
		t.Errorf("spin with its context ended made %d calls", n)
	}
	if err := Stat(context.Background(), "/", 3); err != nil {
		t.Errorf("stat: %v", err)
	}
}
