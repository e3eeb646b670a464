// Package proctest runs the process engine's test program
// (process/testdata/work.c) for the tests of what hosts sessions over a
// process: procsession's and the web view's.
package proctest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Program is the process engine's test program (process/testdata/work.c):
// on each "go" line its 4 threads call work() and mix() 100,000 times
// each.
type Program struct {
	Cmd *exec.Cmd
	Bin string // the executable, built with -g
	in  *os.File
	out *bufio.Reader
}

// CallsPerRound is how many times a round calls work(), and mix().
const CallsPerRound = 4 * 100000

// Start builds and starts the program (the test skips without root or
// gcc); it is killed with the test.
func Start(t testing.TB) *Program {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("process sessions need root (ptrace of a child, /proc/PID/mem)")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	bin := filepath.Join(t.TempDir(), "work")
	if out, err := exec.Command("gcc", "-O2", "-g", "-pthread", "-o", bin, filepath.Join(RepoRoot(), "process/testdata/work.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	in, w, _ := os.Pipe()
	cmd.Stdin = in
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	in.Close()
	p := &Program{Cmd: cmd, Bin: bin, in: w, out: bufio.NewReader(out)}
	t.Cleanup(func() { w.Close(); cmd.Process.Kill(); cmd.Wait() })
	if l, _ := p.out.ReadString('\n'); l != "ready\n" {
		t.Fatalf("the program said %q", l)
	}
	return p
}

// Round runs one round of calls.
func (p *Program) Round(t testing.TB) {
	t.Helper()
	fmt.Fprintln(p.in, "go")
	if _, err := p.out.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
}
