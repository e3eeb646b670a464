package unwind

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/internal/elfsym"
)

// buildCxx compiles testdata/cxxblocker.cc with g++.
func buildCxx(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ not installed")
	}
	out := filepath.Join(t.TempDir(), "cxxblocker")
	args := []string{"-O2", "-fomit-frame-pointer", "-o", out, "testdata/cxxblocker.cc"}
	if b, err := exec.Command("g++", args...).CombinedOutput(); err != nil {
		t.Fatalf("g++ %v: %v\n%s", args, err, b)
	}
	return out
}

// buildRust compiles testdata/rsblocker.rs with rustc and the given
// symbol mangling ("legacy", rustc's default for a crate's own names,
// or "v0", the mangling of the standard library).
func buildRust(t testing.TB, mangling string) string {
	t.Helper()
	rustc := rustcPath(t)
	out := filepath.Join(t.TempDir(), "rsblocker-"+mangling)
	args := []string{"-O", "-o", out, "testdata/rsblocker.rs"}
	if mangling == "v0" {
		args = append(args, "-C", "symbol-mangling-version=v0")
	}
	// Link with the system linker (GNU ld): the bias of LLD-linked
	// files, rustc's default linker, is not what this test is about.
	if b, err := exec.Command(rustc, append(args, "-C", "linker-features=-lld")...).CombinedOutput(); err != nil {
		t.Logf("rustc without LLD: %v\n%s", err, b)
		if b, err := exec.Command(rustc, args...).CombinedOutput(); err != nil {
			t.Fatalf("rustc %v: %v\n%s", args, err, b)
		}
	}
	return out
}

// cxxfilt demangles names with `c++filt -i`, the oracle: binutils
// without its verbose flag, which drops Rust hashes as rustfilt does.
func cxxfilt(t testing.TB, names []string) []string {
	t.Helper()
	if _, err := exec.LookPath("c++filt"); err != nil {
		t.Skip("c++filt (binutils) not installed")
	}
	cmd := exec.Command("c++filt", "-i")
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n") + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("c++filt: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(names) {
		t.Fatalf("c++filt gave %d lines for %d names", len(lines), len(names))
	}
	return lines
}

var demangleBinaries = []struct {
	name  string
	build func(testing.TB) string
	chain []string // demangled, innermost first; a trailing "(" is a prefix
}{
	{"c++", buildCxx, []string{"level3()", "shapes::Box<double>::level2(", "level1(std::map<", "main"}},
	{"rust-legacy", func(t testing.TB) string { return buildRust(t, "legacy") },
		[]string{"rsblocker::level3", "rsblocker::Reader<T>::level2", "rsblocker::level1", "rsblocker::main"}},
	{"rust-v0", func(t testing.TB) string { return buildRust(t, "v0") },
		[]string{"rsblocker::level3", "<rsblocker::Reader<u32>>::level2", "rsblocker::level1", "rsblocker::main"}},
}

// TestDemangleMatchesCxxfilt demangles every mangled symbol of a C++
// program and of a Rust program built with legacy and with v0 mangling,
// and compares with c++filt -i. The program's own functions must agree
// exactly. Of the rest (libstdc++'s and Rust std's instantiations), the
// demangler differs from c++filt on a few Rust v0 names of std (const
// blocks {K#0} left mangled, the numbers of nested closures, a unit type
// argument left out): at most 2% may differ, each logged.
func TestDemangleMatchesCxxfilt(t *testing.T) {
	for _, bin := range demangleBinaries {
		t.Run(bin.name, func(t *testing.T) {
			syms, err := elfsym.Open(bin.build(t))
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			var raw []string
			for _, s := range syms.Symbols() {
				if (strings.HasPrefix(s.Name, "_Z") || strings.HasPrefix(s.Name, "_R")) && !seen[s.Name] {
					seen[s.Name] = true
					raw = append(raw, s.Name)
				}
			}
			want := cxxfilt(t, raw)
			own, changed, differ := 0, 0, 0
			for i, name := range raw {
				got := Demangle(name)
				if got != name {
					changed++
				}
				mine := strings.Contains(want[i], "level") || strings.Contains(want[i], "rsblocker::main")
				if mine {
					own++
				}
				if got == want[i] {
					continue
				}
				if mine {
					t.Errorf("%s: demangled %q, c++filt -i says %q", name, got, want[i])
				} else {
					differ++
					t.Logf("%s: demangled %q, c++filt -i says %q", name, got, want[i])
				}
			}
			t.Logf("%d mangled names, %d demangled, %d differ from c++filt -i; %d of the program's own", len(raw), changed, differ, own)
			if own < 4 {
				t.Errorf("only %d of the program's own functions among the mangled names", own)
			}
			if changed < len(raw)*9/10 {
				t.Errorf("only %d of %d names demangled", changed, len(raw))
			}
			if differ*50 > len(raw) {
				t.Errorf("%d of %d names differ from c++filt -i", differ, len(raw))
			}
		})
	}
}

// TestDemangledLiveStacks unwinds each program blocked in read(2) and
// checks the demangled call chain, each frame as c++filt -i prints its
// raw name.
func TestDemangledLiveStacks(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc")
	}
	for _, bin := range demangleBinaries {
		t.Run(bin.name, func(t *testing.T) {
			path := bin.build(t)
			pid := startReady(t, path).Process.Pid
			waitSyscall(t, pid, unix.SYS_READ)
			// Registers from ptrace: Rust's std keeps frame pointers,
			// and a thread's rbp is not in /proc/PID/task/TID/syscall.
			regs, err := PtraceRegs(pid)
			if err != nil {
				t.Skipf("ptrace: %v", err)
			}
			c := NewCache()
			c.Debug = &DebugSearch{}
			p, err := c.Process(pid)
			if err != nil {
				t.Fatal(err)
			}
			raw := names(p, p.Unwind(regs, 0))
			want := cxxfilt(t, raw)
			got := make([]string, len(raw))
			for i, r := range raw {
				got[i] = Demangle(r)
				if got[i] != want[i] {
					t.Errorf("frame %d %s: demangled %q, c++filt -i says %q", i, r, got[i], want[i])
				}
			}
			t.Logf("raw %q\ndemangled %q", raw, got)
			if !hasNames(got, bin.chain) {
				t.Errorf("stack %q lacks the chain %q", got, bin.chain)
			}
		})
	}
}

// hasNames reports whether chain appears as consecutive frames; a
// chain entry ending in "(" or "<" matches as a prefix.
func hasNames(frames, chain []string) bool {
	for i := 0; i+len(chain) <= len(frames); i++ {
		ok := true
		for j, c := range chain {
			f := frames[i+j]
			if strings.HasSuffix(c, "(") || strings.HasSuffix(c, "<") {
				ok = ok && strings.HasPrefix(f, c)
			} else {
				ok = ok && f == c
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func TestDemangleEdges(t *testing.T) {
	for in, want := range map[string]string{
		"":                                 "",
		"main":                             "main",
		"_Z6level3v":                       "level3()",
		"_Z6level3v@GLIBCXX_3.4":           "level3()@GLIBCXX_3.4",
		"_ZN1r6level317h3cf9f1a1f55eb11aE": "r::level3",
		"_ZN3std3sys9backtrace28__rust_begin_short_backtrace17hb400d4f9e9ef86dfE": "std::sys::backtrace::__rust_begin_short_backtrace",
		"_ZN4core3ptr13drop_in_place17h0123456789abcdefE":                         "core::ptr::drop_in_place",
		"_RNvCs1234_9rsblocker6level3":                                            "rsblocker::level3",
		"_Znot-a-name":                                                            "_Znot-a-name",
		"_R":                                                                      "_R",
		"libc.so.6+0x85f16":                                                       "libc.so.6+0x85f16",
		"_ZN3foo3bar17h0123456789abcdefE.llvm.1":                                  "foo::bar",
	} {
		if got := Demangle(in); got != want {
			t.Errorf("Demangle(%q) = %q, want %q", in, got, want)
		}
	}
}
