package livecore

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/livetest"
	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/output"
)

// (In a file named to sort before core_test.go: TestCore ends by
// panicking the guest.)

// TestModuleSourceLines: coverage of a loaded module (kinst_leak.ko,
// built with DWARF beside the driver) gets source lines from the
// module's own file, found by the loaded module's build id among every
// build in the cache, its DWARF relocated against the module's sections.
// Oracle: binutils' addr2line -j SECTION at each block's offset into the
// section its function's symbol lies in, hot and .cold parts alike
// (.text and .text.unlikely, placed apart by the module loader).
func TestModuleSourceLines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gsh(t, ctx, `grep -q '^kinst_leak ' /proc/modules || insmod /lib/modules/kinst_leak.ko`)
	notes := strings.Fields(gsh(t, ctx, `od -An -v -tx1 /sys/module/kinst_leak/notes/.note.gnu.build-id`))
	if len(notes) < 16+20 {
		t.Fatalf("kinst_leak's build-id note: %q", notes)
	}
	id := strings.Join(notes[16:], "")
	ko := moduleBuild(t, id)
	remote := []string{"--addr", guest.KerninstdAddr(), "--token-file", guest.TokenFile(), "--module-debug", filepath.Join(cache, "module")}

	out, stderr := kinstErr(t, append([]string{"cover", "--module", "kinst_leak", "--duration", "2s", "--json"}, remote...)...)
	if strings.Contains(stderr, "no source lines for") {
		t.Errorf("kinst cover said: %s", stderr)
	}
	var rep api.CoverReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	checked, sections := livetest.CheckModuleLines(t, rep, "kinst_leak", ko)
	if checked < 20 || sections < 2 {
		t.Errorf("%d blocks in %d sections checked: want the module's hot and cold code", checked, sections)
	}
	t.Logf("%d blocks of kinst_leak in %d sections agree with addr2line -j (debug file %s)", checked, sections, ko)

	// --file MODULE:FILE covers the functions of the module's source
	// file: here all of the module's (its init code, freed, left out).
	fo, _ := kinstErr(t, append([]string{"cover", "--file", "kinst_leak:kinst_leak.c", "--duration", "1s", "--json"}, remote...)...)
	var frep api.CoverReport
	if err := json.Unmarshal(fo, &frep); err != nil {
		t.Fatal(err)
	}
	names := func(r api.CoverReport) []string {
		var out []string
		for _, f := range r.Functions {
			if f.Module == "kinst_leak" && f.Error == "" {
				out = append(out, f.Function)
			} else {
				out = append(out, f.Function+" ["+f.Module+"]")
			}
		}
		slices.Sort(out)
		return out
	}
	if got, want := names(frep), names(rep); !slices.Equal(got, want) {
		t.Errorf("--file kinst_leak:kinst_leak.c covers %v, --module kinst_leak %v", got, want)
	}

	// kinst lines of a module function: from the same file, with its
	// declaration (a split function: DW_AT_ranges, not low_pc).
	var lr output.LinesReport
	lo, _ := kinstErr(t, append([]string{"lines", "leak_some", "--json"}, remote...)...)
	if err := json.Unmarshal(lo, &lr); err != nil {
		t.Fatal(err)
	}
	if lr.Vmlinux != ko || lr.Declared == "" || len(lr.Lines) < 3 {
		t.Errorf("kinst lines leak_some: from %s, declared at %q, %d lines; want %s, a declaration and its lines", lr.Vmlinux, lr.Declared, len(lr.Lines), ko)
	}

	// A module's source line as a point and as a timed region: the
	// module's thread sleeps 200 ms a pass on the line
	// msleep_interruptible(200) (found in the module's source, the
	// driver's embedded one).
	line := sourceLineOf(t, filepath.Join(livetest.RepoRoot(), "driver", "linux", "kinst_leak.c"), "msleep_interruptible(200);")
	point := fmt.Sprintf("kinst_leak:kinst_leak.c:%d", line)
	co, _ := kinstErr(t, append([]string{"count", point, "--duration", "3s", "--json"}, remote...)...)
	var cr output.CountReport
	if err := json.Unmarshal(co, &cr); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, p := range cr.Probes {
		n += p.Count
	}
	if n < 8 || n > 16 {
		t.Errorf("kinst count %s: %d in 3 s, want about 15 (a pass each 200 ms)", point, n)
	}
	to, _ := kinstErr(t, append([]string{"time", point, "--duration", "3s", "--json"}, remote...)...)
	var tr output.TimeReport
	if err := json.Unmarshal(to, &tr); err != nil {
		t.Fatal(err)
	}
	// The pass under way when the timer was attached is not seen, and
	// the one under way at the end is counted with the part timed: the
	// average is a little under 200 ms.
	if len(tr.Functions) != 1 || tr.Functions[0].Calls < 8 || tr.Functions[0].AvgWallNS < 150e6 || tr.Functions[0].AvgWallNS > 300e6 {
		t.Fatalf("kinst time %s: %+v, want about 15 calls of 200 ms", point, tr.Functions)
	}
	t.Logf("%s: counted %d in 3 s; timed %d calls of %.1f ms", point, n, tr.Functions[0].Calls, tr.Functions[0].AvgWallNS/1e6)
}

// sourceLineOf is the number of the line of file holding text.
func sourceLineOf(t *testing.T, file, text string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the module's source: %v", err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, text) {
			return i + 1
		}
	}
	t.Fatalf("%s holds no %q", file, text)
	return 0
}

// moduleBuild is the kinst_leak.ko of build id id among the cache's
// module builds.
func moduleBuild(t *testing.T, id string) string {
	t.Helper()
	kos, _ := filepath.Glob(filepath.Join(cache, "module", "*", "kinst_leak.ko"))
	for _, ko := range kos {
		f, err := elf.Open(ko)
		if err != nil {
			continue
		}
		have, _ := elfsym.BuildID(f)
		f.Close()
		if have == id {
			return ko
		}
	}
	t.Fatalf("no kinst_leak.ko of build id %s among %v", id, kos)
	return ""
}

// kinstErr runs the host's kinst and returns its stdout and stderr; it
// fails the test on a non-zero status.
func kinstErr(t testing.TB, args ...string) ([]byte, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "kinst"), args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kinst %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out, errb.String()
}
