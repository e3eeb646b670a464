package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
