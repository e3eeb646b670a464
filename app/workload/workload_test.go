package workload

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
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
	for tid, nice := range threadNice(t) {
		if nice != "3" {
			t.Errorf("task %s: nice %s, want 3", tid, nice)
		}
	}
}

// threadNice returns each thread's nice value, by thread id.
func threadNice(t *testing.T) map[string]string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	nice := map[string]string{}
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue // gone since
		}
		// Fields after the command, which is in parentheses and may hold spaces.
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) >= 17 {
			nice[task.Name()] = f[16]
		} else {
			nice[task.Name()] = "?"
		}
	}
	return nice
}

// Nice reaches threads made while it runs: goroutines that end locked to
// their thread make the runtime start new ones throughout, some from
// threads Nice has not reached yet (CI once saw one left at 0).
func TestNiceWhileThreadsStart(t *testing.T) {
	for round, n := range []int{4, 5, 6, 7, 8} {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					done := make(chan struct{})
					go func() { runtime.LockOSThread(); close(done) }() // its thread exits with it
					<-done
				}
			}()
		}
		time.Sleep(5 * time.Millisecond)
		err := Nice(n)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		for tid, nice := range threadNice(t) {
			if nice != strconv.Itoa(n) {
				t.Errorf("round %d: task %s: nice %s, want %d", round, tid, nice, n)
			}
		}
	}
}
