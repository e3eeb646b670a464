package offcpu

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSampleGoWithoutDWARF samples a Go program linked with -ldflags=-w
// (no DWARF, no CFI) blocked in read(2) on its main thread: its user
// stack is the whole chain main.level3 ← … ← runtime.goexit, unwound
// through .gopclntab, not the one frame the missing CFI left.
func TestSampleGoWithoutDWARF(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not in PATH")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("../testdata/goblocker.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "main.go"), src, 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module blocker\n\ngo 1.21\n"), 0o644)
	bin := filepath.Join(dir, "goblocker")
	build := exec.Command(goCmd, "build", "-ldflags=-w", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); stdin.Close(); cmd.Wait() }()
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("said %q", line)
	}
	pid := cmd.Process.Pid
	waitBlocked(t, pid, pid, 0) // read(2)
	s, err := NewSampler(Options{TID: pid, UserOnly: true}, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 5; i++ {
		if _, err := s.Pass(); err != nil {
			t.Fatal(err)
		}
	}
	p := s.Profile()
	if len(p.Stacks) != 1 {
		t.Fatalf("stacks %+v", p.Stacks)
	}
	user := p.Stacks[0].User
	t.Logf("user stack %q", user)
	want := "main.level3;main.level2;main.level1;main.main;runtime.main;runtime.goexit.abi0"
	if got := strings.Join(user, ";"); !strings.HasSuffix(got, ";"+want) {
		t.Errorf("user stack %q, want it to end in %s", got, want)
	}
}
