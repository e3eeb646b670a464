// Package workload generates kernel activity whose shape is known in
// advance, for tests, benchmarks and the demo: a known number of calls into
// a known kernel function, or a syscall-heavy load on every CPU.
package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stat calls stat(2) on path n times, or until ctx ends (an error that
// says how far it got). On Linux 6.1 each call enters
// filename_lookup exactly once (vfs_statx → filename_lookup).
func Stat(ctx context.Context, path string, n int) error {
	var st unix.Stat_t
	for i := 0; i < n; i++ {
		if i%checkEvery == 0 && ctx.Err() != nil {
			return stopped(ctx, i, n)
		}
		if err := unix.Stat(path, &st); err != nil {
			return fmt.Errorf("stat %s: %w", path, err)
		}
	}
	return nil
}

// checkEvery is how many calls a counted workload makes between looks
// at its context: a kill (SIGTERM ends kinst's context) stops it at
// once, not after its ten million calls.
const checkEvery = 256

// stopped is the error of a workload whose context ended after done of
// n rounds.
func stopped(ctx context.Context, done, n int) error {
	return fmt.Errorf("stopped after %d of %d: %w", done, n, context.Cause(ctx))
}

// Files creates, stats, reads and removes files under dir, rounds times:
// a small file-system workload for demos.
func Files(ctx context.Context, dir string, rounds int) error {
	buf := make([]byte, 4096)
	for r := 0; r < rounds; r++ {
		if ctx.Err() != nil {
			return stopped(ctx, r, rounds)
		}
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

// Spin keeps one thread on the CPU for d (or until ctx ends), calling
// getppid(2) in a loop, and returns the number of calls: a CPU-bound path
// through the kernel.
func Spin(ctx context.Context, d time.Duration) uint64 {
	runtime.LockOSThread()
	var n uint64
	for end := time.Now().Add(d); time.Now().Before(end) && (n%checkEvery != 0 || ctx.Err() == nil); n++ {
		syscall.Getppid()
	}
	return n
}

// Creat opens n times one of 16 files under dir with
// O_CREAT|O_TRUNC|O_WRONLY, writes 4 KiB and closes it: every open after
// the first round truncates a file that holds data (the workload of
// KernInst's §5 investigation of copen).
func Creat(ctx context.Context, dir string, n int) error {
	buf := make([]byte, 4096)
	for i := 0; i < n; i++ {
		if i%checkEvery == 0 && ctx.Err() != nil {
			return stopped(ctx, i, n)
		}
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

// MixedCounts is what Mixed did.
type MixedCounts struct {
	Files, Execs, Signals, Timers, Pipes, TCP, Hotplugs uint64
	// HotplugErr says why no CPU was taken offline, if none was.
	HotplugErr string
	// Modules counts the module's unload-and-load cycles; ModuleErr says
	// why the last one failed, if one did.
	Modules   uint64
	ModuleErr string
}

// Mixed runs, side by side until ctx ends, the kinds of kernel work a
// whole-kernel coverage session must survive: files created, written,
// read and removed in dir; processes created and reaped (self, argv[0]
// with no arguments, or /bin/true); signals sent to itself and handled;
// timers slept on; bytes through pipes; loopback TCP connections; and,
// where cpu/online exists and it is allowed (root, more than one CPU),
// the last CPU taken offline and brought back; and, when module names a
// module file (.ko), that module unloaded and loaded again every half
// second, left loaded or not as it was found.
func Mixed(ctx context.Context, dir, module string) MixedCounts {
	var c MixedCounts
	var wg sync.WaitGroup
	loop := func(n *uint64, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if f() == nil {
					*n++
				}
			}
		}()
	}
	buf := make([]byte, 8192)
	loop(&c.Files, func() error {
		p := filepath.Join(dir, "kinst-mixed")
		if err := os.WriteFile(p, buf, 0o600); err != nil {
			return err
		}
		_, err := os.ReadFile(p)
		os.Remove(p)
		return err
	})
	loop(&c.Execs, func() error {
		return exec.CommandContext(ctx, "/bin/true").Run()
	})
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGUSR1)
	defer signal.Stop(sigs)
	loop(&c.Signals, func() error {
		if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
			return err
		}
		select {
		case <-sigs:
		case <-ctx.Done():
		}
		return nil
	})
	loop(&c.Timers, func() error {
		t := time.NewTimer(time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		return nil
	})
	loop(&c.Pipes, func() error {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		defer r.Close()
		go func() { w.Write(buf); w.Close() }()
		_, err = io.ReadAll(r)
		return err
	})
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		defer ln.Close()
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(conn, conn); conn.Close() }()
			}
		}()
		loop(&c.TCP, func() error {
			conn, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			if _, err := conn.Write(buf[:512]); err != nil {
				return err
			}
			_, err = io.ReadFull(conn, buf[:512])
			return err
		})
	}
	if module != "" {
		cycle, restore, err := moduleCycle(module)
		if err != nil {
			c.ModuleErr = err.Error()
		} else {
			defer restore()
			loop(&c.Modules, func() error {
				select {
				case <-time.After(500 * time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
				err := cycle()
				if err != nil {
					c.ModuleErr = err.Error()
				}
				return err
			})
		}
	}
	online := fmt.Sprintf("/sys/devices/system/cpu/cpu%d/online", runtime.NumCPU()-1)
	if runtime.NumCPU() < 2 {
		c.HotplugErr = "one CPU"
	} else if err := os.WriteFile(online, []byte("0"), 0); err != nil {
		c.HotplugErr = err.Error()
	} else {
		os.WriteFile(online, []byte("1"), 0)
		c.Hotplugs++
		loop(&c.Hotplugs, func() error {
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			if err := os.WriteFile(online, []byte("0"), 0); err != nil {
				return err
			}
			return os.WriteFile(online, []byte("1"), 0)
		})
	}
	wg.Wait()
	return c
}

// moduleCycle returns a cycle that unloads the module of file ko if it is
// loaded and loads it again, and restore, which leaves it loaded or not
// as it was found. Loading the file and reading its name happen here, so
// a bad file fails before the workload starts.
func moduleCycle(ko string) (cycle func() error, restore func(), err error) {
	image, err := os.ReadFile(ko)
	if err != nil {
		return nil, nil, err
	}
	name := strings.TrimSuffix(filepath.Base(ko), ".ko")
	name = strings.ReplaceAll(name, "-", "_")
	loaded := func() bool {
		b, _ := os.ReadFile("/proc/modules")
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] == name {
				return true
			}
		}
		return false
	}
	load := func() error {
		if err := unix.InitModule(image, ""); err != nil && err != unix.EEXIST {
			return fmt.Errorf("load %s: %w", ko, err)
		}
		return nil
	}
	unload := func() error {
		if err := unix.DeleteModule(name, unix.O_NONBLOCK); err != nil && err != unix.ENOENT {
			return fmt.Errorf("unload %s: %w", name, err)
		}
		return nil
	}
	was := loaded()
	// One cycle now: a module that cannot be unloaded (in use) or
	// loaded is said before the workload starts.
	if was {
		if err := unload(); err != nil {
			return nil, nil, err
		}
	}
	if err := load(); err != nil {
		return nil, nil, err
	}
	cycle = func() error {
		if err := unload(); err != nil {
			return err
		}
		return load()
	}
	restore = func() {
		if was {
			load()
		} else {
			unload()
		}
	}
	return cycle, restore, nil
}

// Nice sets the nice value of every thread of this process (Linux keeps
// it per thread; threads and children made later inherit it from the
// thread that makes them). A thread not yet set can make a new thread
// while the others are set, so the threads are listed again until a
// listing shows none that was not set.
func Nice(n int) error {
	done := map[int]bool{}
	for {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("nice: %w", err)
		}
		fresh := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || done[tid] {
				continue
			}
			fresh = true
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("nice %d: %w", n, err)
			}
			done[tid] = true
		}
		if !fresh {
			return nil
		}
	}
}
