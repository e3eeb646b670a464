package unwind

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestUnwindLLD unwinds every thread of programs linked by LLD, whose
// executable segment starts in the last file page of the read-only one
// (so two mappings map file offset 0 with biases a page apart), and
// compares each stack with gdb's frame by frame: the pcs of every thread,
// and the names of the frames in the program itself.
func TestUnwindLLD(t *testing.T) {
	t.Run("c-gcc-fuse-ld=lld", func(t *testing.T) {
		if _, err := exec.LookPath("ld.lld"); err != nil {
			t.Skip("ld.lld not installed (Debian package lld)")
		}
		bin := buildCFile(t, "testdata/threads.c", "-fomit-frame-pointer", "-pthread", "-fuse-ld=lld")
		compareThreadsWithGDB(t, bin, func(gdbName, ours string) bool { return gdbName == ours })
	})
	t.Run("rust", func(t *testing.T) {
		bin := buildRustLLD(t, "testdata/threads.rs")
		compareThreadsWithGDB(t, bin, sameRustName)
	})
}

// compareThreadsWithGDB runs bin (a threads program: one thread blocked
// in read on stdin below level2 → level3), unwinds all its threads from
// the registers /proc gives, and compares with gdb. sameName compares
// gdb's name of a frame in bin with ours.
func compareThreadsWithGDB(t *testing.T, bin string, sameName func(gdbName, ours string) bool) {
	t.Helper()
	checkSharedPage(t, bin)
	pid := startReady(t, bin).Process.Pid
	reader := waitThreadSyscall(t, pid, unix.SYS_READ)
	p, err := NewCache().Process(pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Missing) != 0 {
		t.Fatalf("mappings without files: %v", p.Missing)
	}
	tids, err := taskIDs(pid)
	if err != nil {
		t.Fatal(err)
	}
	ours := map[int][]uint64{}
	for _, tid := range tids {
		regs, _, err := SyscallRegs(pid, tid)
		if err != nil {
			t.Fatalf("thread %d: %v", tid, err)
		}
		p.Mem.Reset()
		ours[tid], _ = StackMethods(regs, p.Mem, p, 0)
	}
	gdb := gdbThreads(t, pid)
	if len(gdb) != len(tids) {
		t.Fatalf("gdb shows threads %v, /proc %v", gdb, tids)
	}
	level3 := false
	for _, tid := range tids {
		frames := gdb[tid]
		pcs := make([]uint64, len(frames))
		for i, f := range frames {
			pcs[i] = f.pc
		}
		got := names(p, ours[tid])
		t.Logf("thread %d: %v", tid, got)
		if !slices.Equal(ours[tid], pcs) {
			t.Errorf("thread %d: stack %#x %q\ngdb's %#x %v", tid, ours[tid], got, pcs, frames)
			continue
		}
		for i, f := range frames {
			at := f.pc
			if i > 0 {
				at-- // name the call, as gdb does
			}
			s, ok := p.Symbolize(at)
			if !ok || s.File != bin {
				continue
			}
			if !sameName(f.name, s.Name) {
				t.Errorf("thread %d frame %d at %#x: %q, gdb's %q", tid, i, f.pc, s.Name, f.name)
			}
			if tid == reader && strings.HasSuffix(stripRustHash(f.name), "level3") && i+1 < len(frames) &&
				strings.HasSuffix(stripRustHash(frames[i+1].name), "level2") {
				level3 = true
			}
		}
	}
	if !level3 {
		t.Errorf("gdb's stack of the reading thread %d lacks level3 level2: %v", reader, gdb[reader])
	}
}

var rustHash = regexp.MustCompile(`::h[0-9a-f]{16}$`)

// stripRustHash drops the hash of a legacy Rust name as gdb prints it.
func stripRustHash(name string) string { return rustHash.ReplaceAllString(name, "") }

// sameRustName compares gdb's name of a frame with ours for the test
// program's own functions ("threads::level3::h…" for gdb): ours may be
// the mangled "_ZN7threads6level317h…E" or a demangled form.
func sameRustName(gdbName, ours string) bool {
	name := stripRustHash(gdbName)
	if !strings.HasPrefix(name, "threads::") || strings.ContainsAny(name, "{<") {
		return true // std's frames: equal pcs are the check
	}
	var mangled strings.Builder
	for _, c := range strings.Split(name, "::") {
		fmt.Fprintf(&mangled, "%d%s", len(c), c)
	}
	return strings.Contains(ours, mangled.String()) || ours == name || ours == gdbName
}

// checkSharedPage fails unless bin has the layout this test is about: an
// executable PT_LOAD that starts in a file page of another segment.
func checkSharedPage(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var loads []*elf.Prog
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			loads = append(loads, p)
		}
	}
	for _, x := range loads {
		if x.Flags&elf.PF_X == 0 {
			continue
		}
		for _, o := range loads {
			if o != x && o.Filesz > 0 && o.Off <= x.Off&^4095 && x.Off&^4095 < o.Off+o.Filesz {
				return
			}
		}
	}
	t.Fatalf("%s: the executable segment shares no file page with another segment (not linked by LLD?)", bin)
}

// buildRust compiles one Rust file with rustc -O, linked by LLD (rustc's
// default linker on x86_64 Linux since 1.90; else through cc -fuse-ld=lld).
func buildRustLLD(t testing.TB, src string) string {
	t.Helper()
	rustc := rustcPath(t)
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".rs"))
	build := func(extra ...string) {
		args := append([]string{"-O", "--edition", "2021", "-o", out, src}, extra...)
		if b, err := exec.Command(rustc, args...).CombinedOutput(); err != nil {
			t.Fatalf("rustc %v: %v\n%s", args, err, b)
		}
	}
	build()
	if !linkedByLLD(t, out) {
		build("-C", "link-arg=-fuse-ld=lld")
		if !linkedByLLD(t, out) {
			t.Fatalf("%s: not linked by LLD even with -fuse-ld=lld", out)
		}
	}
	return out
}

// linkedByLLD reports whether LLD signed the .comment section of path.
func linkedByLLD(t testing.TB, path string) bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := f.Section(".comment")
	if s == nil {
		return false
	}
	b, err := s.Data()
	return err == nil && strings.Contains(string(b), "Linker: LLD")
}

// waitThreadSyscall waits until every thread of pid sleeps in a system
// call, one of them in nr, and returns the id of that one.
func waitThreadSyscall(t testing.TB, pid, nr int) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		tids, err := taskIDs(pid)
		if err != nil {
			t.Fatal(err)
		}
		found, blocked := 0, 0
		for _, tid := range tids {
			if _, n, err := SyscallRegs(pid, tid); err == nil && n >= 0 {
				blocked++
				if n == nr {
					found = tid
				}
			}
		}
		if found != 0 && blocked == len(tids) {
			return found
		}
	}
	t.Fatalf("the threads of process %d never all slept in system calls, one in %d", pid, nr)
	return 0
}

func taskIDs(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	slices.Sort(tids)
	return tids, nil
}

type gdbFrame struct {
	pc   uint64
	name string
}

func (f gdbFrame) String() string { return fmt.Sprintf("%#x %s", f.pc, f.name) }

// gdbScript prints gdb's backtrace of every thread (thread apply all bt),
// one "frame TID PC NAME" line per frame, without the frames of inlined
// calls (which share the pc of the function they are inlined into) and
// the tail-call frames gdb infers from DWARF call sites (not on the
// stack: glibc's __futex_abstimed_wait_cancelable64 jumps to
// __futex_abstimed_wait_common).
const gdbScript = `import gdb
for t in gdb.selected_inferior().threads():
    t.switch()
    f = gdb.newest_frame()
    while f is not None:
        if f.type() not in (gdb.INLINE_FRAME, gdb.TAILCALL_FRAME):
            print("frame %d %#x %s" % (t.ptid[1], f.pc(), f.name()))
        f = f.older()
`

// gdbThreads attaches gdb to pid and returns the frames of each thread,
// past main and the entry point. It skips the test without gdb.
func gdbThreads(t *testing.T, pid int) map[int][]gdbFrame {
	t.Helper()
	if _, err := exec.LookPath("gdb"); err != nil {
		t.Skip("gdb not installed: no oracle for the stacks")
	}
	script := filepath.Join(t.TempDir(), "bt.py")
	if err := os.WriteFile(script, []byte(gdbScript), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("gdb", "-p", strconv.Itoa(pid), "-batch", "-nx",
		"-iex", "set debuginfod enabled off",
		"-ex", "set backtrace past-main on", "-ex", "set backtrace past-entry on",
		"-x", script).CombinedOutput()
	if err != nil {
		t.Fatalf("gdb: %v\n%s", err, out)
	}
	frames := map[int][]gdbFrame{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.SplitN(line, " ", 4) // a Rust name may hold spaces
		if len(f) != 4 || f[0] != "frame" {
			continue
		}
		tid, err1 := strconv.Atoi(f[1])
		pc, err2 := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 64)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("gdb line %q: %v", line, err)
		}
		frames[tid] = append(frames[tid], gdbFrame{pc: pc, name: f[3]})
	}
	if len(frames) == 0 {
		t.Fatalf("no frames in gdb's output:\n%s", out)
	}
	return frames
}

// rustcPath finds rustc in PATH or in ~/.cargo/bin (rustup's place, often
// not in a CI job's PATH), or skips the test.
func rustcPath(t testing.TB) string {
	t.Helper()
	if rustc, err := exec.LookPath("rustc"); err == nil {
		return rustc
	}
	if home, _ := os.UserHomeDir(); home != "" {
		rustc := filepath.Join(home, ".cargo", "bin", "rustc")
		if _, err := os.Stat(rustc); err == nil {
			return rustc
		}
	}
	t.Skip("rustc not installed (neither in PATH nor in ~/.cargo/bin): Rust binaries not tested")
	return ""
}
