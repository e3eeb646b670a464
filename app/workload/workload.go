// Package workload generates kernel activity whose shape is known in
// advance, for tests, benchmarks and the demo: a known number of calls into
// a known kernel function, or a syscall-heavy load on every CPU.
package workload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stat calls stat(2) on path n times. On Linux 6.1 each call enters
// filename_lookup exactly once (vfs_statx → filename_lookup).
func Stat(path string, n int) error {
	var st unix.Stat_t
	for i := 0; i < n; i++ {
		if err := unix.Stat(path, &st); err != nil {
			return fmt.Errorf("stat %s: %w", path, err)
		}
	}
	return nil
}

// Files creates, stats, reads and removes files under dir, rounds times:
// a small file-system workload for demos.
func Files(dir string, rounds int) error {
	buf := make([]byte, 4096)
	for r := 0; r < rounds; r++ {
		p := filepath.Join(dir, fmt.Sprintf("kinst-demo-%d", r%16))
		if err := os.WriteFile(p, buf, 0o600); err != nil {
			return err
		}
		if _, err := os.Stat(p); err != nil {
			return err
		}
		if _, err := os.ReadFile(p); err != nil {
			return err
		}
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	return nil
}

// Syscalls keeps every CPU busy with cheap syscalls (getppid, and stat of
// path, which enters the path-lookup code) until ctx ends. It returns the
// number of stat calls made.
func Syscalls(ctx context.Context, path string) (stats uint64) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := 0; i < runtime.NumCPU(); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			var st unix.Stat_t
			var n uint64
			for ctx.Err() == nil {
				for j := 0; j < 64; j++ {
					syscall.Getppid()
					unix.Stat(path, &st)
					n++
				}
			}
			mu.Lock()
			stats += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	return stats
}

// Spin keeps one thread on the CPU for d, calling getppid(2) in a loop, and
// returns the number of calls: a CPU-bound path through the kernel.
func Spin(d time.Duration) uint64 {
	runtime.LockOSThread()
	var n uint64
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		syscall.Getppid()
	}
	return n
}

// Creat opens n times one of 16 files under dir with
// O_CREAT|O_TRUNC|O_WRONLY, writes 4 KiB and closes it: every open after
// the first round truncates a file that holds data (the workload of
// KernInst's §5 investigation of copen).
func Creat(dir string, n int) error {
	buf := make([]byte, 4096)
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, fmt.Sprintf("kinst-creat-%d", i%16))
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("open %s: %w", p, err)
		}
		_, err = unix.Write(fd, buf)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nil
}
