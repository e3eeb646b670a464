package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/unwind"
	"github.com/kinst/kinst/unwind/offcpu"
)

// startCxxBlocker builds and runs the C++ program of the unwind tests,
// blocked in read(2) below level3() ← shapes::Box<double>::level2 ←
// level1 ← main.
func startCxxBlocker(t *testing.T) (path string, pid int) {
	t.Helper()
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ not installed")
	}
	path = filepath.Join(t.TempDir(), "cxxblocker")
	if b, err := exec.Command("g++", "-O2", "-o", path, "../../unwind/testdata/cxxblocker.cc").CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, b)
	}
	cmd := exec.Command(path)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); stdin.Close(); cmd.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("%s said %q, %v", path, line, err)
	}
	pid = cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, nr, err := unwind.SyscallRegs(pid, pid); err == nil && nr == unix.SYS_READ {
			return path, pid
		}
		if time.Now().After(deadline) {
			t.Fatal("never blocked in read")
		}
	}
}

// cxxfiltI demangles with `c++filt -i`, the oracle.
func cxxfiltI(t *testing.T, names []string) []string {
	t.Helper()
	if _, err := exec.LookPath("c++filt"); err != nil {
		t.Skip("c++filt not installed")
	}
	cmd := exec.Command("c++filt", "-i")
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n") + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
}

// wantCxxChain checks that frames hold the program's chain, demangled.
func wantCxxChain(t *testing.T, what string, frames []string) {
	t.Helper()
	s := strings.Join(frames, "\n") + "\n"
	if !strings.Contains(s, "\nlevel3()\nshapes::Box<double>::level2(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&) const\nlevel1(std::map<") {
		t.Errorf("%s: no demangled chain in %q", what, frames)
	}
}

// TestUnwindStackDemangles: `kinst unwind stack` names C++ frames as
// c++filt -i does, and as the symbol table spells them with
// --no-demangle.
func TestUnwindStackDemangles(t *testing.T) {
	_, pid := startCxxBlocker(t)
	symbols := func(so SymbolOptions) []string {
		var out bytes.Buffer
		if err := ShowUnwindStack(pid, pid, false, true, &out, so); err != nil {
			t.Fatal(err)
		}
		var rep output.UnwindStacks
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range rep.Threads[0].Frames {
			names = append(names, f.Symbol)
		}
		return names
	}
	raw, got := symbols(SymbolOptions{NoDemangle: true}), symbols(SymbolOptions{})
	if !slices.Contains(raw, "_Z6level3v") {
		t.Errorf("--no-demangle: %q lacks _Z6level3v", raw)
	}
	if want := cxxfiltI(t, raw); !slices.Equal(got, want) {
		t.Errorf("demangled %q\nc++filt -i %q", got, want)
	}
	wantCxxChain(t, "unwind stack", got)
}

// TestUnwindTableDemangles: the symbols of `kinst unwind table`.
func TestUnwindTableDemangles(t *testing.T) {
	path, _ := startCxxBlocker(t)
	rows := func(so SymbolOptions) []output.UnwindRow {
		var out bytes.Buffer
		if err := ShowUnwindTable(path, nil, true, &out, so); err != nil {
			t.Fatal(err)
		}
		var rep output.UnwindTable
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		return rep.Rows
	}
	raw, got := rows(SymbolOptions{NoDemangle: true}), rows(SymbolOptions{})
	if len(raw) != len(got) {
		t.Fatalf("%d rows raw, %d demangled", len(raw), len(got))
	}
	var names []string
	for _, r := range raw {
		names = append(names, r.Symbol)
	}
	want := cxxfiltI(t, names)
	level3 := false
	for i := range got {
		if got[i].Symbol != want[i] {
			t.Errorf("row %s: %q, c++filt -i of %q is %q", got[i].PC, got[i].Symbol, raw[i].Symbol, want[i])
		}
		level3 = level3 || strings.HasPrefix(got[i].Symbol, "level3()")
	}
	if !level3 {
		t.Error("no row names level3()")
	}
}

// TestOffCPUDemangles profiles the blocked C++ program and checks every
// output names its frames demangled (JSON, text, folded, SVG, pprof),
// and mangled with --no-demangle.
func TestOffCPUDemangles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	_, pid := startCxxBlocker(t)
	dir := t.TempDir()
	run := func(o OffCPUOptions) string {
		o.Options.PID = pid
		o.Options.UserOnly = true
		o.Fold.UserOnly = true
		o.Frequency, o.Duration, o.Top = 100, 200*time.Millisecond, 5
		var out, errOut bytes.Buffer
		if err := OffCPU(context.Background(), o, &out, &errOut); err != nil {
			t.Fatalf("%v\n%s", err, errOut.String())
		}
		return out.String()
	}
	user := func(js string) []string {
		var r output.OffCPUReport
		if err := json.Unmarshal([]byte(js), &r); err != nil || len(r.Top) != 1 {
			t.Fatalf("JSON %v: %s", err, js)
		}
		return r.Top[0].User
	}
	raw := user(run(OffCPUOptions{JSON: true, NoDemangle: true}))
	got := user(run(OffCPUOptions{JSON: true, SVG: filepath.Join(dir, "off.svg"), Pprof: filepath.Join(dir, "off.pb.gz")}))
	if !slices.Contains(raw, "_Z6level3v") {
		t.Errorf("--no-demangle: %q lacks _Z6level3v", raw)
	}
	if want := cxxfiltI(t, raw); !slices.Equal(got, want) {
		t.Errorf("--json user frames %q\nc++filt -i %q", got, want)
	}
	wantCxxChain(t, "--json", got)

	text := run(OffCPUOptions{})
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		lines = append(lines, strings.TrimSpace(l))
	}
	wantCxxChain(t, "text", lines)
	if !strings.Contains(text, "    level3()\n") || strings.Contains(text, "_Z6level3v") {
		t.Errorf("text report:\n%s", text)
	}
	folded := run(OffCPUOptions{Folded: true})
	if !strings.Contains(folded, ";level1(std::map<") || !strings.Contains(folded, ";level3()") || strings.Contains(folded, "_Z") {
		t.Errorf("folded: %s", folded)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "off.svg"))
	if err != nil || !bytes.Contains(svg, []byte("level3()")) || bytes.Contains(svg, []byte("_Z6level3v")) {
		t.Errorf("SVG lacks level3() (%v)", err)
	}
	f, err := os.Open(filepath.Join(dir, "off.pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pp, err := profile.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	var fns []string
	for _, fn := range pp.Function {
		fns = append(fns, fn.Name)
	}
	if !slices.Contains(fns, "level3()") || slices.Contains(fns, "_Z6level3v") {
		t.Errorf("pprof functions %q", fns)
	}
}

// TestProfileDemangleMerges: two stacks that differ only in a Rust
// legacy hash become one stack once demangled, their counts added.
func TestProfileDemangleMerges(t *testing.T) {
	p := &offcpu.Profile{Mode: "sample", Stacks: []offcpu.Stack{
		{Group: "a", User: []string{"_ZN3foo3bar17h0123456789abcdefE", "main"}, Samples: 2, OffCPU: 2},
		{Group: "a", User: []string{"_ZN3foo3bar17hfedcba9876543210E", "main"}, Samples: 3, OffCPU: 3},
		{Group: "a", User: []string{"_Z6level3v"}, Samples: 1, OffCPU: 1},
	}}
	p.Demangle()
	if len(p.Stacks) != 2 || !slices.Equal(p.Stacks[0].User, []string{"foo::bar", "main"}) || p.Stacks[0].Samples != 5 ||
		p.Stacks[0].OffCPU != 5 || !slices.Equal(p.Stacks[1].User, []string{"level3()"}) {
		t.Errorf("demangled profile %+v", p.Stacks)
	}
}
