package workload

import (
	"bytes"
	"context"
	"errors"
	"os"
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

// Nice reaches every thread: each task's nice value (field 19 of
// /proc/self/task/TID/stat) is the one set.
func TestNice(t *testing.T) {
	if err := Nice(3); err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue // gone since
		}
		// Fields after the command, which is in parentheses and may hold spaces.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 17 || f[16] != "3" {
			t.Errorf("task %s: nice %v, want 3", task.Name(), f[16:17])
		}
	}
}
