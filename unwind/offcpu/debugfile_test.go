package offcpu

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/unwind"
)

// TestSampleNamesLibcInternals samples a thread blocked in pthread_join,
// inside a static function of the stripped libc: with libc's debug file
// (Debian's libc6-dbg) no libc frame is left as libc.so.6+offset; without
// one (an empty debug root), they are, and the profile's notes say why.
func TestSampleNamesLibcInternals(t *testing.T) {
	libc := "/lib/x86_64-linux-gnu/libc.so.6"
	syms, err := elfsym.Open(libc)
	if err != nil {
		t.Skip(err)
	}
	id := syms.BuildID()
	if _, err := os.Stat(filepath.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug")); err != nil {
		t.Skipf("no libc debug file (apt-get install libc6-dbg): %v", err)
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	bin := filepath.Join(t.TempDir(), "joiner")
	if b, err := exec.Command("gcc", "-O2", "-pthread", "-o", bin, "../testdata/joiner.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
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
	waitBlocked(t, pid, pid, 202) // futex, in pthread_join

	sample := func(debug *unwind.DebugSearch) *Profile {
		s, err := NewSampler(Options{TID: pid, UserOnly: true}, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s.user.files.Debug = debug
		for i := 0; i < 3; i++ {
			if _, err := s.Pass(); err != nil {
				t.Fatal(err)
			}
		}
		p := s.Profile()
		if len(p.Stacks) != 1 {
			t.Fatalf("stacks %+v", p.Stacks)
		}
		return p
	}
	bare := sample(&unwind.DebugSearch{Root: t.TempDir()})
	user := strings.Join(bare.Stacks[0].User, ";")
	t.Logf("without debug files: %s; notes %v", user, bare.DebugNotes)
	if !strings.Contains(user, "libc.so.6+0x") {
		t.Fatalf("no unnamed libc frame without debug files: %s", user)
	}
	if note := bare.DebugNotes["/usr/lib/x86_64-linux-gnu/libc.so.6"] + bare.DebugNotes[libc]; !strings.Contains(note, "no separate debug file") {
		t.Errorf("notes %v: want libc's", bare.DebugNotes)
	}
	named := sample(&unwind.DebugSearch{})
	user = strings.Join(named.Stacks[0].User, ";")
	t.Logf("with libc6-dbg: %s; notes %v", user, named.DebugNotes)
	if strings.Contains(user, "libc.so.6+0x") || !strings.Contains(user, ";main;") {
		t.Errorf("with libc's debug file: %s", user)
	}
	if len(named.DebugNotes) != 0 {
		t.Errorf("notes %v", named.DebugNotes)
	}
}
