package process

import (
	"maps"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A command kinst started is its child, and kinst stops its threads
// (ptrace) to splice and sweep at any time: a stop's wait that finds the
// main thread exited reaps it, and cmd.Wait then finds no child. Wait
// still gives the command's own status. The reproducer: a command that
// exits at once, its threads stopped over and over while it does (the
// race took 1 run in about 50 of a coverage test, which then reported
// status 1 for a program that returned 0).
func TestWaitAfterTracerReaped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("ptrace of a child needs root here")
	}
	reaped := 0
	for i := 0; i < 20; i++ {
		cmd := exec.Command("sh", "-c", "exit 7")
		if err := Start(cmd); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid
		tr := newTracer()
		unix.Kill(pid, unix.SIGCONT)
		for Alive(pid) {
			tr.do(func() error {
				if held, err := stopAll(pid, nil); err == nil {
					resumeAll(pid, held)
				}
				return nil
			})
		}
		tr.close()
		if _, took := exits.Load(pid); took {
			reaped++
		}
		if st := Wait(cmd); st != 7 {
			t.Fatalf("run %d: status %d, want 7", i, st)
		}
	}
	t.Logf("%d of 20 exits were reaped by a stop's wait", reaped)
}

// TestExiting: a thread that has gone is exiting; a live one is not.
func TestExiting(t *testing.T) {
	if exiting(os.Getpid(), unix.Gettid()) {
		t.Error("the test's own thread is exiting")
	}
	if !exiting(os.Getpid(), 1<<22+12345) {
		t.Error("a thread that never was is not exiting")
	}
}

// TestStopAllLeaderExited: a process whose main thread has exited
// (pthread_exit) and whose other thread runs on. Its leader, a zombie,
// stays listed in /proc/PID/task and ptrace refuses it (EPERM): stopAll
// stops the thread there is, where it once failed (ErrNotTraceable) and
// then, counting the zombie as new each round, never returned (a
// coverage sweep of such a process hung).
func TestStopAllLeaderExited(t *testing.T) {
	needPtrace(t)
	w := start(t, compile(t, "gcc", "testdata/leaderexit.c", "-pthread"))
	pid := w.cmd.Process.Pid
	for i := 0; ; i++ {
		if exiting(pid, pid) {
			break
		}
		if i == 1000 {
			t.Fatal("the main thread did not exit")
		}
		time.Sleep(time.Millisecond)
	}
	type result struct {
		held map[int]*stopped
		err  error
	}
	done := make(chan result, 1)
	tr := newTracer()
	defer tr.close()
	go tr.do(func() error {
		held, err := stopAll(pid, nil)
		if err == nil {
			resumeAll(pid, held)
		}
		done <- result{held, err}
		return nil
	})
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if len(r.held) != 1 || r.held[pid] != nil {
			t.Errorf("held %v, want the one thread that runs (not %d, the exited leader)", slices.Collect(maps.Keys(r.held)), pid)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stopAll did not return in 10 s")
	}
}
