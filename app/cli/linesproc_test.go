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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/output"
)

// Source lines as points in a process, from the executable's DWARF:
// lines.c:6 (y += 7, run for the 500 odd x of 1000 calls) and work:+4
// (work is declared at line 2) both count 500, named by the line; a line
// without code is refused before anything is spliced.
func TestCountProcessSourceLines(t *testing.T) {
	bin := rootAndGCC(t, "lines", "-O0", "-g")
	var out, errb bytes.Buffer
	env := Env{Out: &out, Err: &errb, CmdIn: strings.NewReader(""), CmdOut: io.Discard, CmdErr: io.Discard}
	status, err := CountProcess(context.Background(), 0, CountOptions{Points: []string{"lines.c:6", "work:+4", "work"},
		Interval: 50 * time.Millisecond, Command: []string{bin}, JSON: true}, env)
	if err != nil || status != 0 {
		t.Fatalf("status %d, %v\n%s", status, err, errb.String())
	}
	var rep output.CountReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"lines.c:6": 500, "work:+4": 500, "work": 1000}
	if len(rep.Probes) != len(want) {
		t.Fatalf("probes %+v, want one per point\n%s", rep.Probes, errb.String())
	}
	for _, p := range rep.Probes {
		if n, ok := want[p.Point]; !ok || p.Count != n || p.Function != "work" {
			t.Errorf("%s: %d in %s, want %d in work\n%s", p.Point, p.Count, p.Function, n, errb.String())
		}
	}
	if rep.Probes[0].Offset != rep.Probes[1].Offset {
		t.Errorf("lines.c:6 at work+%#x, work:+4 at +%#x: want the same place", rep.Probes[0].Offset, rep.Probes[1].Offset)
	}
	errb.Reset()
	if _, err := CountProcess(context.Background(), 0, CountOptions{Points: []string{"lines.c:9"}, Command: []string{bin}}, env); err == nil || !strings.Contains(err.Error(), "starts no code") {
		t.Errorf("lines.c:9 (a blank line): %v, want a no-code refusal", err)
	}
}

// kinst cover --user --file lines.c --lines 6-7 -- CMD: only work holds
// lines 6 and 7, and only their blocks are reported, each covered or
// refused (line 6's 4-byte addl takes only a trap splice); the whole
// function has more. A bad range, or --lines without one --file, is
// refused before anything starts; a range without code names the
// nearest lines that have some.
func TestCoverProcessLineRange(t *testing.T) {
	bin := rootAndGCC(t, "lines", "-O0", "-g")
	want, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	whole := coverCommand(t, CoverOptions{Targets: []string{"work"}, Command: []string{bin}, AllBlocks: true}, "", string(want))
	rep := coverCommand(t, CoverOptions{Files: []string{"lines.c"}, Lines: "6-7", Command: []string{bin}, AllBlocks: true}, "", string(want))
	if len(rep.Functions) != 1 || rep.Functions[0].Function != "work" || rep.FunctionCount != 1 {
		t.Fatalf("functions %+v, want work alone", rep.Functions)
	}
	f := rep.Functions[0]
	if f.Total < 2 || f.Total >= whole.Functions[0].Total || rep.TotalBlocks != f.Total || f.Covered == 0 ||
		f.Covered+f.Refused != f.Total || rep.CoveredBlocks != f.Covered || rep.RefusedBlocks != f.Refused {
		t.Errorf("lines 6-7: %d of %d blocks covered, %d refused (report %d, %d of %d); the whole of work has %d blocks",
			f.Covered, f.Total, f.Refused, rep.CoveredBlocks, rep.RefusedBlocks, rep.TotalBlocks, whole.Functions[0].Total)
	}
	for _, b := range f.Blocks {
		if !slices.ContainsFunc(b.Lines, func(l string) bool { return strings.HasSuffix(l, "lines.c:6") || strings.HasSuffix(l, "lines.c:7") }) {
			t.Errorf("block %d has lines %v: neither 6 nor 7", b.Index, b.Lines)
		}
	}
	for _, tc := range []struct {
		o      CoverOptions
		status int
		err    string
	}{
		{CoverOptions{Lines: "6", Targets: []string{"work"}}, 2, "name the one source file"},
		{CoverOptions{Lines: "7-5", Files: []string{"lines.c"}}, 2, "want A-B"},
		{CoverOptions{Lines: "9", Files: []string{"lines.c"}}, 1, "lines.c:9 starts no code; the nearest lines that do: 8, 11"},
	} {
		tc.o.Command = []string{bin}
		status, err := CoverProcess(context.Background(), 0, tc.o, Env{Out: io.Discard, Err: io.Discard, CmdIn: strings.NewReader(""), CmdOut: io.Discard, CmdErr: io.Discard})
		if status != tc.status || err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("--lines %s %v: status %d, %v; want %d and %q", tc.o.Lines, tc.o.Files, status, err, tc.status, tc.err)
		}
	}
}

// rootAndGCC skips the test unless it runs as root (kinst splices a
// process through ptrace) and gcc builds testdata/NAME.c with flags; it
// returns the program.
func rootAndGCC(t *testing.T, name string, flags ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kinst splices a process as root")
	}
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("gcc", append(flags, "-o", bin, "testdata/"+name+".c")...).CombinedOutput(); err != nil {
		t.Skipf("gcc: %v\n%s", err, out)
	}
	return bin
}

// kinst lines -p 0 work -- CMD: every line listed is where addr2line
// (binutils, from the same DWARF) says the instruction at its offset
// comes from; the body's lines are all there, each with a splice class,
// and the declaration is lines.c:2.
func TestLinesProcess(t *testing.T) {
	bin := rootAndGCC(t, "lines", "-O0", "-g")
	var out, errb bytes.Buffer
	env := Env{Out: &out, Err: &errb, CmdIn: strings.NewReader(""), CmdOut: io.Discard, CmdErr: io.Discard}
	if err := LinesProcess(context.Background(), 0, "work", []string{bin}, true, env); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var rep output.LinesReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Vmlinux != bin || !strings.HasSuffix(rep.Declared, "lines.c:2") {
		t.Errorf("lines from %q, declared at %q; want %s and lines.c:2", rep.Vmlinux, rep.Declared, bin)
	}
	link := symbolAddr(t, bin, "work")
	seen := map[int]bool{}
	for _, l := range rep.Lines {
		seen[l.Line] = true
		got := fmt.Sprintf("%s:%d", filepath.Base(l.File), l.Line)
		if want := addr2line(t, bin, link+l.Offset); got != want {
			t.Errorf("%s at work+%#x; addr2line says %s", got, l.Offset, want)
		}
		if l.SpliceClass == "" || l.Point != fmt.Sprintf("work+%#x", l.Offset) {
			t.Errorf("line %d: point %q, class %q", l.Line, l.Point, l.SpliceClass)
		}
	}
	for _, n := range []int{4, 5, 6, 7} {
		if !seen[n] {
			t.Errorf("line %d not listed: %+v", n, rep.Lines)
		}
	}
}

// kinst annotate -p 0 work -- CMD: the program calls work 1000 times and
// takes line 6 for the 500 odd x, so the entry block counts 1000 and the
// block of line 6 counts 500; every block with a count has its source
// lines. With --from, a saved coverage report of the same program marks
// each block as the report does (matched by name: the addresses moved).
func TestAnnotateProcess(t *testing.T) {
	bin := rootAndGCC(t, "lines", "-O0", "-g")
	annotateRun := func(o AnnotateOptions) output.AnnotateReport {
		t.Helper()
		var out, errb bytes.Buffer
		env := Env{Out: &out, Err: &errb, CmdIn: strings.NewReader(""), CmdOut: io.Discard, CmdErr: io.Discard}
		o.Function, o.Command, o.JSON = "work", []string{bin}, true
		if status, err := AnnotateProcess(context.Background(), 0, o, env); err != nil || status != 0 {
			t.Fatalf("status %d, %v\n%s", status, err, errb.String())
		}
		var rep output.AnnotateReport
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		return rep
	}
	rep := annotateRun(AnnotateOptions{})
	if rep.From != "live" || len(rep.Blocks) < 3 || rep.Vmlinux != bin {
		t.Fatalf("from %q, %d blocks, lines from %q", rep.From, len(rep.Blocks), rep.Vmlinux)
	}
	if c := rep.Blocks[0].Count; c == nil || *c != 1000 {
		t.Errorf("entry block count %v, want 1000", c)
	}
	line6 := false
	for _, b := range rep.Blocks {
		if b.Count == nil {
			t.Errorf("block %d: no count (%s)", b.Index, b.Refused)
			continue
		}
		if slices.ContainsFunc(b.Instructions, func(in output.AnnotateInsn) bool { return strings.HasSuffix(in.Line, "lines.c:6") }) {
			line6 = true
			if *b.Count != 500 {
				t.Errorf("block %d (line 6) counted %d, want 500", b.Index, *b.Count)
			}
		}
		if !slices.ContainsFunc(b.Instructions, func(in output.AnnotateInsn) bool { return in.Line != "" }) {
			t.Errorf("block %d has no source line", b.Index)
		}
	}
	if !line6 {
		t.Errorf("no block holds lines.c:6: %+v", rep.Blocks)
	}

	want, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	cov := coverCommand(t, CoverOptions{Targets: []string{"work"}, Command: []string{bin}, AllBlocks: true}, "", string(want))
	saved := filepath.Join(t.TempDir(), "cover.json")
	data, err := json.Marshal(cov)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(saved, data, 0o644); err != nil {
		t.Fatal(err)
	}
	marked := annotateRun(AnnotateOptions{From: saved})
	if marked.From != saved || len(marked.Blocks) != len(cov.Functions[0].Blocks) {
		t.Fatalf("from %q with %d blocks; the report has %d", marked.From, len(marked.Blocks), len(cov.Functions[0].Blocks))
	}
	for i, b := range marked.Blocks {
		if cb := cov.Functions[0].Blocks[i]; b.Covered == nil || *b.Covered != cb.Covered {
			t.Errorf("block %d marked %v, the report says %v", b.Index, b.Covered, cb.Covered)
		}
	}
	var errb bytes.Buffer
	o := AnnotateOptions{Function: "main", From: saved, Command: []string{bin}}
	if _, err := AnnotateProcess(context.Background(), 0, o, Env{Out: io.Discard, Err: &errb, CmdIn: strings.NewReader(""), CmdOut: io.Discard, CmdErr: io.Discard}); err == nil || !strings.Contains(err.Error(), "no coverage of main") {
		t.Errorf("main from a report of work alone: %v, want no coverage of main", err)
	}
}

// symbolAddr is name's address in the symbol table of bin (nm).
func symbolAddr(t *testing.T, bin, name string) uint64 {
	t.Helper()
	out, err := exec.Command("nm", bin).Output()
	if err != nil {
		t.Skipf("nm: %v", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[2] == name {
			a, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return a
		}
	}
	t.Fatalf("nm: no %s in %s", name, bin)
	return 0
}

// addr2line is FILE:LINE of addr in bin as binutils' addr2line prints it
// (the file's base name, no discriminator).
func addr2line(t *testing.T, bin string, addr uint64) string {
	t.Helper()
	out, err := exec.Command("addr2line", "-e", bin, fmt.Sprintf("%#x", addr)).Output()
	if err != nil {
		t.Skipf("addr2line: %v", err)
	}
	l, _, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	return filepath.Base(l)
}

// TestMergedLinePoint: a process's line whose only row covers no byte
// (testdata/merged.c:10, an else-if gcc -O2 folds into the next line's
// code) is counted where gdb would break on it: 501 of 1,000 calls (a <=
// b). It said the line started no code.
func TestMergedLinePoint(t *testing.T) {
	bin := buildC(t, "testdata/merged.c")
	var out, errb, cmdOut bytes.Buffer
	env := Env{Out: &out, Err: &errb, CmdOut: &cmdOut, CmdErr: &cmdOut}
	status, err := CountProcess(context.Background(), 0, CountOptions{Points: []string{"merged.c:10"}, Command: []string{bin}, JSON: true}, env)
	var rep output.CountReport
	if err != nil || status != 0 || json.Unmarshal(out.Bytes(), &rep) != nil || len(rep.Probes) != 1 || rep.Probes[0].Count != 501 {
		t.Errorf("count merged.c:10: status %d, %v: %s\n%s", status, err, out.String(), errb.String())
	}
}
