package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cover"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/debuginfo/debuginfotest"
	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/kerninstd/kerninstdtest"
	"github.com/kinst/kinst/report"
)

// testdata/cover-a.json and cover-b.json are two saved reports of the
// same functions on two boots (other KASLR slides): A with source lines,
// B without, B covering filename_lookup:1 and vfs_statx:2 where A did
// not, A vfs_statx:1, each with a function the other lacks (a module's
// in A).

func TestGoldenLcov(t *testing.T) {
	rep, err := readCoverReport("testdata/cover-a.json")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteLcov(&out, rep); err != nil {
		t.Fatal(err)
	}
	golden(t, "cover-lcov", out.String(), "")
	b, _ := readCoverReport("testdata/cover-b.json")
	if err := WriteLcov(io.Discard, b); err == nil || !strings.Contains(err.Error(), "no source lines") {
		t.Errorf("a report without lines: %v", err)
	}
}

// TestCoverLcovOfSavedLines: kinst cover lcov writes a report that
// carries its lines (A, as a process's report does) as it is, with no
// debug vmlinux to look for; a process's report without lines says why
// it has none, not which vmlinux it lacks.
func TestCoverLcovOfSavedLines(t *testing.T) {
	var want bytes.Buffer
	rep, err := readCoverReport("testdata/cover-a.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteLcov(&want, rep); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	o := CoverLcovOptions{Report: "testdata/cover-a.json"}
	if err := CoverLcov(o, Env{Out: &out, Err: &errb}); err != nil || out.String() != want.String() {
		t.Errorf("lcov of a report with lines: %v (%d bytes, want %d)\n%s", err, out.Len(), want.Len(), errb.String())
	}
	b, _ := readCoverReport("testdata/cover-b.json")
	b.Session = "process 42"
	path := filepath.Join(t.TempDir(), "b.json")
	data, _ := json.Marshal(b)
	os.WriteFile(path, data, 0o644)
	err = CoverLcov(CoverLcovOptions{Report: path}, Env{Out: io.Discard, Err: io.Discard})
	if err == nil || !strings.Contains(err.Error(), "the report of process 42 has none") || strings.Contains(err.Error(), "vmlinux") {
		t.Errorf("lcov of a process report without lines: %v", err)
	}
}

func TestGoldenCoverDiff(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		var out, errb bytes.Buffer
		if err := CoverDiff("testdata/cover-a.json", "testdata/cover-b.json", asJSON, Env{Out: &out, Err: &errb}); err != nil {
			t.Fatal(err)
		}
		golden(t, map[bool]string{false: "cover-diff", true: "cover-diff-json"}[asJSON], out.String(), errb.String())
	}
	// A run against itself: no difference.
	var out bytes.Buffer
	if err := CoverDiff("testdata/cover-a.json", "testdata/cover-a.json", false, Env{Out: &out, Err: io.Discard}); err != nil ||
		!strings.Contains(out.String(), "no difference") {
		t.Errorf("A against A: %v\n%s", err, out.String())
	}
}

func TestCoverDiffErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	other := write("other.json", `{"session":"x","functions":[{"function":"schedule","address":"0xffffffff81000000","blocks":[]}]}`)
	for _, c := range []struct {
		a, b, want string
	}{
		{"testdata/cover-a.json", filepath.Join(dir, "missing.json"), "no such file"},
		{write("text.json", "hello"), "testdata/cover-a.json", "not a kinst cover --json report"},
		{write("count.json", `{"probes":[]}`), "testdata/cover-a.json", `no "functions"`},
		{"testdata/cover-a.json", other, "share no function"},
	} {
		err := CoverDiff(c.a, c.b, false, Env{Out: io.Discard, Err: io.Discard})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("diff %s %s: %v, want %q", c.a, c.b, err, c.want)
		}
	}
}

// kinst cover report NAME while the session runs: the coverage so far,
// as the final report prints it; the session goes on.
func TestGoldenCoverReport(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			f := newFixture(t, asJSON)
			var mid, midErr buffer
			f.workloads["opens"] = func(stdout io.Writer) int {
				f.streaming(2)
				// Block 2's probe: block 0, inferred, is covered with it.
				f.must(f.s.Kernel.Count(kerninstdtest.Addr("filename_lookup", 0x1f), 5))
				f.s.Clock.Advance(cover.Poll)
				f.covered(2)
				f.must(CoverReport(context.Background(), f.c, CoverReportOptions{Session: "cov", JSON: asJSON}, Env{Out: &mid, Err: &midErr}))
				if err := CoverReport(context.Background(), f.c, CoverReportOptions{Session: "nosuch"}, Env{Out: io.Discard, Err: io.Discard}); err == nil ||
					!strings.Contains(err.Error(), `no session "nosuch"`) {
					t.Errorf("an unknown session: %v", err)
				}
				return 0
			}
			if _, err := Cover(context.Background(), f.c, CoverOptions{Targets: []string{"filename_lookup"}, Name: "cov",
				Command: []string{"opens"}}, f.env); err != nil {
				t.Fatal(err)
			}
			golden(t, map[bool]string{false: "cover-report", true: "cover-report-json"}[asJSON], mid.String(), midErr.String())
		})
	}
}

// lineProg compiles a small C program with gcc -g -O2.
func lineProg(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"gcc", "addr2line"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	dir := t.TempDir()
	src := `#include <stdio.h>
static int __attribute__((noinline)) step(int x)
{
	if (x & 1)
		return 3 * x + 1;
	return x / 2;
}

int __attribute__((noinline)) collatz(int x)
{
	int n = 0;

	while (x != 1) {
		x = step(x);
		n++;
	}
	return n;
}

int main(int argc, char **argv)
{
	printf("%d\n", collatz(argc + 26));
	return 0;
}
`
	os.WriteFile(filepath.Join(dir, "prog.c"), []byte(src), 0o644)
	cmd := exec.Command("gcc", "-g", "-O2", "-o", "prog", "prog.c")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return filepath.Join(dir, "prog")
}

// Annotate maps a report of runtime addresses (the program's, slid as
// KASLR slides a kernel) to the lines addr2line gives at the link-time
// addresses; WriteLcov's tracefile of it is one genhtml renders with the
// sources.
func TestAnnotateAgainstAddr2line(t *testing.T) {
	prog := lineProg(t)
	syms, err := elfsym.Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	const slide = 0x7f0000000000
	rep := api.CoverReport{Session: "prog", Functions: []api.CoverFunction{}}
	var addrs []uint64 // link-time address of every byte of the blocks
	for _, name := range []string{"main", "collatz", "step"} {
		var s elfsym.Symbol
		for _, x := range syms.Symbols() {
			if x.Name == name {
				s = x
			}
		}
		if s.Size == 0 {
			t.Fatalf("no %s in %v", name, prog)
		}
		f := api.CoverFunction{Function: name, Address: api.Addr(s.Addr + slide)}
		// Blocks of 5 bytes, covered alternately (not real basic blocks:
		// the mapping does not care).
		for at, i := s.Addr, 0; at < s.Addr+s.Size; at, i = at+5, i+1 {
			end := min(at+5, s.Addr+s.Size)
			f.Blocks = append(f.Blocks, api.CoverBlock{Index: i, Start: api.Addr(at + slide), End: api.Addr(end + slide), Covered: i%2 == 0})
			for a := at; a < end; a++ {
				addrs = append(addrs, a)
			}
		}
		rep.Functions = append(rep.Functions, f)
	}
	rep.Functions = append(rep.Functions,
		api.CoverFunction{Function: "ext4_getattr", Module: "ext4", Address: 0xffffffffc0000000, Blocks: []api.CoverBlock{{Start: 0xffffffffc0000000}}},
		api.CoverFunction{Function: "collatz", Address: rep.Functions[1].Address + 1, Blocks: []api.CoverBlock{{Start: rep.Functions[1].Address + 1}}})
	dbg, err := debuginfo.Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer dbg.Close()
	a, err := report.Annotate(&rep, dbg)
	if err != nil {
		t.Fatal(err)
	}
	if a.Slide != slide || a.Functions != 3 || !slices.Equal(a.Modules, []string{"ext4_getattr [ext4]"}) || !slices.Equal(a.Unmatched, []string{"collatz"}) {
		t.Errorf("annotation %+v", a)
	}

	want := debuginfotest.Addr2line(t, prog, addrs)
	k := 0
	for _, f := range rep.Functions[:3] {
		for _, b := range f.Blocks {
			set := map[string]bool{}
			first := want[k]
			for a := uint64(b.Start) - slide; a < uint64(b.End)-slide; a, k = a+1, k+1 {
				if !debuginfotest.Unknown(want[k]) {
					set[want[k]] = true
				}
			}
			if debuginfotest.Unknown(first) {
				continue // a line addr2line does not know: kinst gives none first either
			}
			if len(b.Lines) == 0 || b.Lines[0] != first {
				t.Errorf("%s:%d: lines %v, addr2line %s at the start", f.Function, b.Index, b.Lines, first)
				continue
			}
			got := map[string]bool{}
			for _, l := range b.Lines {
				if got[l] {
					t.Errorf("%s:%d: %s twice in %v", f.Function, b.Index, l, b.Lines)
				}
				got[l] = true
			}
			if len(got) != len(set) {
				t.Errorf("%s:%d: lines %v, addr2line over its bytes %v", f.Function, b.Index, b.Lines, set)
			}
			for l := range set {
				if !got[l] {
					t.Errorf("%s:%d: lines %v lack %s", f.Function, b.Index, b.Lines, l)
				}
			}
		}
	}

	// A block without an end (an older kerninstd): its first line only.
	step := rep.Functions[2]
	old := &api.CoverReport{Functions: []api.CoverFunction{{Function: "step", Address: step.Address, Blocks: []api.CoverBlock{{Start: step.Address}}}}}
	if _, err := report.Annotate(old, dbg); err != nil || !slices.Equal(old.Functions[0].Blocks[0].Lines, step.Blocks[0].Lines[:1]) {
		t.Errorf("a block without an end: %v, %v (want %v)", old.Functions[0].Blocks[0].Lines, err, step.Blocks[0].Lines[:1])
	}

	// Another program's debug information has none of these functions.
	other := &api.CoverReport{Functions: []api.CoverFunction{{Function: "no_such_function", Address: 0x1000}}}
	if _, err := report.Annotate(other, dbg); err == nil {
		t.Error("a report of other functions annotated")
	}

	lcov := filepath.Join(t.TempDir(), "prog.info")
	if err := writeLcovFile(lcov, rep); err != nil {
		t.Fatal(err)
	}
	genhtml(t, lcov, filepath.Dir(prog))
}

// genhtml renders the tracefile (from dir, where relative source paths
// are), or skips saying why it cannot.
func genhtml(t *testing.T, tracefile, dir string) {
	t.Helper()
	path, err := exec.LookPath("genhtml")
	if err != nil {
		t.Skip("genhtml is not installed (apt-get install lcov): the tracefile is not checked with it")
	}
	out := filepath.Join(t.TempDir(), "html")
	cmd := exec.Command(path, "-q", "-o", out, tracefile)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("genhtml: %v\n%s", err, b)
	}
	if _, err := os.Stat(filepath.Join(out, "index.html")); err != nil {
		t.Fatal(err)
	}
}

// The golden tracefile, checked by genhtml without sources.
func TestGenhtmlAcceptsGolden(t *testing.T) {
	rep, err := readCoverReport("testdata/cover-a.json")
	if err != nil {
		t.Fatal(err)
	}
	lcov := filepath.Join(t.TempDir(), "a.info")
	if err := writeLcovFile(lcov, rep); err != nil {
		t.Fatal(err)
	}
	path, err := exec.LookPath("genhtml")
	if err != nil {
		t.Skip("genhtml is not installed (apt-get install lcov)")
	}
	if b, err := exec.Command(path, "--no-source", "-q", "-o", filepath.Join(t.TempDir(), "html"), lcov).CombinedOutput(); err != nil {
		t.Fatalf("genhtml: %v\n%s", err, b)
	}
}

// The text report of a report with lines shows each block's first line.
func TestGoldenCoverWithLines(t *testing.T) {
	rep, err := readCoverReport("testdata/cover-a.json")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := writeCover(&out, rep); err != nil {
		t.Fatal(err)
	}
	golden(t, "cover-lines", out.String(), "")
}
