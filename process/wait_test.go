package process

import (
	"os"
	"os/exec"
	"testing"

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
				if held, err := stopAll(pid); err == nil {
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
