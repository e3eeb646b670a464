package debuginfo

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/debuginfo/debuginfotest"
	"github.com/kinst/kinst/internal/elfsym"
)

// buildProg compiles testdata/src (main.c, table.c and an inline
// helper in util.h) with gcc -g -O2, from testdata so that the file names
// are relative to the compilation directory as in a kernel build.
func buildProg(t *testing.T, flags ...string) string {
	t.Helper()
	for _, tool := range []string{"gcc", "addr2line"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	out := filepath.Join(t.TempDir(), "prog")
	args := append([]string{"-g", "-O2"}, flags...)
	cmd := exec.Command("gcc", append(args, "-o", out, "src/main.c", "src/table.c")...)
	cmd.Dir = "testdata"
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return out
}

// funcs are the function symbols of the file with a size.
func funcs(t testing.TB, path string) []elfsym.Symbol {
	t.Helper()
	syms, err := elfsym.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []elfsym.Symbol
	for _, s := range syms.Symbols() {
		if s.Kind == elfsym.Func && s.Size > 0 {
			out = append(out, s)
		}
	}
	return out
}

// checkAgainstAddr2line: LineAt of every byte address of the functions
// equals addr2line's line; Lines of each function's range equals the set
// of addr2line's lines over its bytes (line 0 left out).
func checkAgainstAddr2line(t *testing.T, path string, fns []elfsym.Symbol, step uint64) {
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var addrs []uint64
	for _, s := range fns {
		for a := s.Addr; a < s.Addr+s.Size; a += step {
			addrs = append(addrs, a)
		}
	}
	want := debuginfotest.Addr2line(t, path, addrs)
	bad, known := 0, 0
	for i, a := range addrs {
		got, err := f.LineAt(a)
		if debuginfotest.Unknown(want[i]) {
			if err == nil && got.Line != 0 {
				t.Errorf("%#x: %s, addr2line %s", a, got, want[i])
				bad++
			}
			continue
		}
		known++
		if err != nil || got.String() != want[i] {
			t.Errorf("%#x: %s (%v), addr2line %s", a, got, err, want[i])
			bad++
		}
		if bad > 20 {
			t.Fatal("too many differences")
		}
	}
	if known == 0 {
		t.Fatal("addr2line knew no line")
	}
	if step != 1 {
		t.Logf("%d addresses of %d functions agree with addr2line", len(addrs), len(fns))
		return
	}
	k := 0
	for _, s := range fns {
		set := map[string]bool{}
		for ; k < len(addrs) && addrs[k] < s.Addr+s.Size; k++ {
			if !debuginfotest.Unknown(want[k]) {
				set[want[k]] = true
			}
		}
		var wantLines []string
		for l := range set {
			wantLines = append(wantLines, l)
		}
		got, err := f.Lines(s.Addr, s.Addr+s.Size)
		if err != nil {
			t.Errorf("%s: %v", s.Name, err)
			continue
		}
		var gotLines []string
		for _, l := range got {
			gotLines = append(gotLines, l.String())
		}
		slices.Sort(gotLines)
		slices.Sort(wantLines)
		if !slices.Equal(gotLines, wantLines) {
			t.Errorf("%s: Lines %v, addr2line over its bytes %v", s.Name, gotLines, wantLines)
		}
	}
	t.Logf("%d addresses of %d functions agree with addr2line", len(addrs), len(fns))
}

func TestLinesMatchAddr2line(t *testing.T) {
	for _, flags := range [][]string{nil, {"-gdwarf-4"}, {"-gdwarf-5", "-gno-as-loc-support"}} {
		t.Run(strings.Join(append([]string{"gcc"}, flags...), " "), func(t *testing.T) {
			prog := buildProg(t, flags...)
			var fns []elfsym.Symbol
			for _, s := range funcs(t, prog) {
				if slices.Contains([]string{"main", "walk", "classify", "table_sum"}, s.Name) {
					fns = append(fns, s)
				}
			}
			if len(fns) != 4 {
				t.Fatalf("functions %v", fns)
			}
			checkAgainstAddr2line(t, prog, fns, 1)
		})
	}
}

// Lines of a range is sorted by file and line, each line once, and a
// function's lines include the inline helper's (util.h) where it was
// inlined.
func TestLinesOfRange(t *testing.T) {
	prog := buildProg(t)
	f, err := Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	addr, ok := f.Symbols().Addr("table_sum")
	if !ok {
		t.Fatal("no table_sum")
	}
	var size uint64
	for _, s := range funcs(t, prog) {
		if s.Name == "table_sum" {
			size = s.Size
		}
	}
	ls, err := f.Lines(addr, addr+size)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.IsSortedFunc(ls, func(a, b Line) int {
		if a.File != b.File {
			return strings.Compare(a.File, b.File)
		}
		return a.Line - b.Line
	}) {
		t.Errorf("not sorted: %v", ls)
	}
	files := map[string]bool{}
	for _, l := range ls {
		files[filepath.Base(l.File)] = true
	}
	if !files["table.c"] || !files["util.h"] {
		t.Errorf("table_sum's lines %v: want table.c and util.h", ls)
	}
	if _, err := f.Lines(1, 2); !errors.Is(err, ErrNoLine) {
		t.Errorf("Lines(1, 2): %v, want ErrNoLine", err)
	}
	if _, err := f.LineAt(addr + size + 1<<20); !errors.Is(err, ErrNoLine) {
		t.Errorf("LineAt past the code: %v, want ErrNoLine", err)
	}
}

// Lines of a range with more lines than Lines finds again by a scan
// (32; a map past that) gives each line once, and the lines of the range
// cut into 16-byte pieces (each with a few, found by the scan), all
// together: libc's vfprintf, from libc6-dbg's debug file.
func TestLinesOfLongRange(t *testing.T) {
	f, err := OpenOrFind("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		t.Skipf("libc's debug file (libc6-dbg): %v", err)
	}
	defer f.Close()
	var fn elfsym.Symbol
	for _, s := range funcs(t, f.Path) {
		if s.Name == "__vfprintf_internal" || s.Name == "__printf_buffer" {
			fn = s
			break
		}
	}
	if fn.Size == 0 {
		t.Skip("no vfprintf in libc's debug file")
	}
	all, err := f.Lines(fn.Addr, fn.Addr+fn.Size)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) <= 32 {
		t.Fatalf("%s: %d lines, too few to pass the scan", fn.Name, len(all))
	}
	want := map[Line]bool{}
	for at := fn.Addr; at < fn.Addr+fn.Size; at += 16 {
		ls, err := f.Lines(at, min(at+16, fn.Addr+fn.Size))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			want[l] = true
		}
	}
	got := map[Line]bool{}
	for _, l := range all {
		if got[l] {
			t.Errorf("%v twice", l)
		}
		got[l] = true
	}
	if !maps.Equal(got, want) {
		t.Errorf("%s: %d lines over its bytes, %d over them in pieces", fn.Name, len(got), len(want))
	}
	t.Logf("%s: %d lines", fn.Name, len(all))
}

// FuncsInFile: the functions whose first line addr2line places in the
// file, by path suffix.
func TestFuncsInFile(t *testing.T) {
	prog := buildProg(t)
	f, err := Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all := funcs(t, prog)
	var addrs []uint64
	for _, s := range all {
		addrs = append(addrs, s.Addr)
	}
	first := debuginfotest.Addr2line(t, prog, addrs)
	for _, file := range []string{"src/main.c", "main.c", "table.c", "testdata/src/table.c"} {
		var want []string
		for i, s := range all {
			if MatchFile(strings.SplitN(first[i], ":", 2)[0], file) {
				want = append(want, s.Name)
			}
		}
		got, err := f.FuncsInFile(file)
		if err != nil {
			t.Errorf("%s: %v", file, err)
			continue
		}
		var names []string
		for _, fn := range got {
			names = append(names, fn.Name)
			if want, _ := f.LineAt(fn.Addr); fn.Line != want {
				t.Errorf("%s: first line %s, LineAt %s", fn.Name, fn.Line, want)
			}
		}
		slices.Sort(names)
		slices.Sort(want)
		if !slices.Equal(names, want) || len(names) == 0 {
			t.Errorf("%s: %v, addr2line says %v", file, names, want)
		}
	}
	if _, err := f.FuncsInFile("ain.c"); !errors.Is(err, ErrNoLine) {
		t.Errorf("a partial name: %v, want ErrNoLine", err)
	}
}

func TestOpenErrors(t *testing.T) {
	prog := buildProg(t)
	stripped := filepath.Join(t.TempDir(), "stripped")
	if b, err := exec.Command("objcopy", "--strip-debug", prog, stripped).CombinedOutput(); err != nil {
		t.Skipf("objcopy: %v %s", err, b)
	}
	if _, err := Open(stripped); !errors.Is(err, ErrNoDebugInfo) {
		t.Errorf("stripped: %v, want ErrNoDebugInfo", err)
	}
	notELF := filepath.Join(t.TempDir(), "text")
	os.WriteFile(notELF, []byte("hello"), 0o600)
	if _, err := Open(notELF); err == nil || !strings.Contains(err.Error(), "not an ELF file") {
		t.Errorf("not ELF: %v", err)
	}
	obj := filepath.Join(t.TempDir(), "table.o")
	cmd := exec.Command("gcc", "-g", "-O2", "-c", "-o", obj, "src/table.c")
	cmd.Dir = "testdata"
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, b)
	}
	f, err := Open(obj) // a relocatable file is read (reloc.go)
	if err != nil {
		t.Fatalf("relocatable: %v", err)
	}
	f.Close()
	// A relocation that points outside its section is refused, not
	// written past the copy.
	ef, err := elf.Open(obj)
	if err != nil {
		t.Fatal(err)
	}
	rs := ef.Section(".rela.debug_info")
	ef.Close()
	if rs == nil {
		t.Fatal("no .rela.debug_info")
	}
	b, _ := os.ReadFile(obj)
	binary.LittleEndian.PutUint64(b[rs.Offset:], 1<<40)
	bad := filepath.Join(t.TempDir(), "bad.o")
	os.WriteFile(bad, b, 0o600)
	if _, err := Open(bad); err == nil || !strings.Contains(err.Error(), "outside .debug_info") {
		t.Errorf("a relocation outside its section: %v", err)
	}
}

// Find: the build-id path first, then Debian's -dbg paths; a file of
// another build is passed over and named in the error.
func TestFind(t *testing.T) {
	prog := buildProg(t, "-Wl,--build-id")
	f, err := Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	id := f.BuildID
	f.Close()
	if id == "" {
		t.Skip("gcc made no build id")
	}
	root := t.TempDir()
	put := func(p string) {
		p = filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		b, _ := os.ReadFile(prog)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := Search{Root: root, Release: "6.1.0-test", BuildID: id}
	if _, err := Find(s); !errors.Is(err, ErrNoDebugInfo) || !strings.Contains(err.Error(), "linux-image-6.1.0-test-dbg") {
		t.Errorf("empty root: %v", err)
	}
	put("/usr/lib/debug/lib/modules/6.1.0-test/vmlinux")
	f, err = Find(s)
	if err != nil || f.Path != root+"/usr/lib/debug/lib/modules/6.1.0-test/vmlinux" {
		t.Fatalf("Find: %v, %v", f, err)
	}
	f.Close()
	put("/usr/lib/debug/.build-id/" + id[:2] + "/" + id[2:] + ".debug")
	f, err = Find(s)
	if err != nil || !strings.Contains(f.Path, ".build-id") {
		t.Fatalf("Find: %v, %v", f, err)
	}
	f.Close()
	other := s
	other.BuildID = strings.Repeat("ab", 20)
	_, err = Find(other)
	var mm *BuildIDMismatchError
	if !errors.Is(err, ErrNoDebugInfo) || !strings.Contains(err.Error(), "the kernel's is "+other.BuildID) {
		t.Errorf("other build: %v", err)
	}
	if f, err := Open(prog); err != nil || !errors.As(f.Check(other.BuildID), &mm) {
		t.Errorf("Check: %v", err)
	}
}

// With KINST_VMLINUX=PATH (a kernel's debug vmlinux), every 7th byte of
// a sample of its functions against addr2line, and the cost of opening
// it and of a first and a repeated lookup.
func TestVmlinux(t *testing.T) {
	path := os.Getenv("KINST_VMLINUX")
	if path == "" {
		t.Skip("KINST_VMLINUX is not set (a kernel's debug vmlinux to check against addr2line)")
	}
	start := time.Now()
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("open: %v (build id %s)", time.Since(start), f.BuildID)
	a, _ := f.Symbols().Addr("filename_lookup")
	start = time.Now()
	l, err := f.LineAt(a)
	t.Logf("first lookup %s: %v, %v", l, time.Since(start), err)
	start = time.Now()
	l, err = f.LineAt(a + 4)
	t.Logf("second lookup in the same unit %s: %v, %v", l, time.Since(start), err)
	start = time.Now()
	fs, err := f.FuncsInFile("fs/namei.c")
	t.Logf("FuncsInFile(fs/namei.c): %d functions in %v, %v", len(fs), time.Since(start), err)
	f.Close()

	re := regexp.MustCompile(`^(vfs_|path_|filename_|ext4_|do_sys|__x64_sys_|tcp_v4|schedule|kmem_cache_)`)
	var fns []elfsym.Symbol
	for _, s := range funcs(t, path) {
		if re.MatchString(s.Name) && len(fns) < 400 {
			fns = append(fns, s)
		}
	}
	checkAgainstAddr2line(t, path, fns, 7)
}

// With KINST_VMLINUX (a kernel's debug vmlinux): global variables' types
// from the units that define them, as the kernel's sources declare them.
func TestVariable(t *testing.T) {
	path := os.Getenv("KINST_VMLINUX")
	if path == "" {
		t.Skip("KINST_VMLINUX is not set (a kernel's debug vmlinux)")
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, want := range map[string]string{
		"init_task":   "struct task_struct",
		"jiffies":     "volatile long unsigned int",
		"init_uts_ns": "struct uts_namespace",
		"nr_cpu_ids":  "unsigned int",
	} {
		start := time.Now()
		typ, err := f.Variable(name)
		if err != nil || typ.String() != want {
			t.Errorf("%s: %v, %v; want %s", name, typ, err, want)
		}
		t.Logf("%s: %v in %v", name, typ, time.Since(start))
	}
	if _, err := f.Variable("no_such_variable_anywhere"); !errors.Is(err, ErrNoVariable) {
		t.Errorf("an unknown name: %v", err)
	}
}

// libcPieces opens libc's debug file and cuts every function of it into
// 16-byte pieces, about as many as a coverage report of libc has blocks.
func libcPieces(tb testing.TB) (path string, pieces [][2]uint64) {
	f, err := OpenOrFind("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		tb.Skipf("libc's debug file (libc6-dbg): %v", err)
	}
	f.Close()
	for _, s := range funcs(tb, f.Path) {
		for at := s.Addr; at < s.Addr+s.Size; at += 16 {
			pieces = append(pieces, [2]uint64{at, min(at+16, s.Addr+s.Size)})
		}
	}
	return f.Path, pieces
}

// linesOf is every piece's LineAt and Lines, as text.
func linesOf(f *File, pieces [][2]uint64) []string {
	out := make([]string, 0, len(pieces))
	for _, p := range pieces {
		first, err := f.LineAt(p[0])
		ls, err2 := f.Lines(p[0], p[1])
		out = append(out, fmt.Sprint(first, err, ls, err2))
	}
	return out
}

// TestPreload: the line tables read on every CPU give every lookup the
// answer it gets without them (libc: every function in 16-byte pieces),
// and a second Preload reads nothing again.
func TestPreload(t *testing.T) {
	path, pieces := libcPieces(t)
	plain, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	want := linesOf(plain, pieces)
	pre, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer pre.Close()
	starts := make([]uint64, len(pieces))
	for i, p := range pieces {
		starts[i] = p[0]
	}
	pre.Preload(starts)
	n := len(pre.tables)
	if n == 0 {
		t.Fatal("Preload read no table")
	}
	pre.Preload(starts)
	if len(pre.tables) != n {
		t.Errorf("a second Preload: %d tables, %d after the first", len(pre.tables), n)
	}
	got := linesOf(pre, pieces)
	if len(pre.tables) != n {
		t.Errorf("lookups after Preload read %d more tables", len(pre.tables)-n)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("piece %#x-%#x: %s with Preload, %s without", pieces[i][0], pieces[i][1], got[i], want[i])
		}
	}
	t.Logf("%d pieces, %d units' tables", len(pieces), n)
	pre.Close()
	pre.Preload(starts) // closed: nothing, no fault
}

// BenchmarkLinesOfLibc: every line of libc in 16-byte pieces (about a
// coverage report's blocks), from a file just opened, with the tables
// read as the lookups come (serial) or first on every CPU (preload).
func BenchmarkLinesOfLibc(b *testing.B) {
	path, pieces := libcPieces(b)
	starts := make([]uint64, len(pieces))
	for i, p := range pieces {
		starts[i] = p[0]
	}
	for _, preload := range []bool{false, true} {
		b.Run(map[bool]string{false: "serial", true: "preload"}[preload], func(b *testing.B) {
			for range b.N {
				f, err := Open(path)
				if err != nil {
					b.Fatal(err)
				}
				if preload {
					f.Preload(starts)
				}
				for _, p := range pieces {
					f.LineAt(p[0])
					f.Lines(p[0], p[1])
				}
				f.Close()
			}
		})
	}
}
