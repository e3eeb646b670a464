package unwind

import (
	"debug/elf"
	"debug/gosym"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// buildGoBlocker builds testdata/goblocker.go.txt with the given
// -ldflags ("" keeps the DWARF, whose .debug_frame is the oracle); with
// cgo, as a cgo program (linked by gcc, with .eh_frame for its C code).
func buildGoBlocker(t testing.TB, ldflags string, cgo bool) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not in PATH")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("testdata/goblocker.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"main.go": string(src), "go.mod": "module blocker\n\ngo 1.21\n"}
	env := "CGO_ENABLED=0"
	if cgo {
		if _, err := exec.LookPath("gcc"); err != nil {
			t.Skip("gcc not installed")
		}
		files["cgo.go"] = "package main\n\n// #include <unistd.h>\nimport \"C\"\n"
		env = "CGO_ENABLED=1"
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "goblocker")
	cmd := exec.Command(goCmd, "build", "-ldflags="+ldflags, "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env, "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// goStack runs a goblocker build and unwinds its main thread, blocked in
// read(2), from the registers of /proc/PID/task/TID/syscall.
func goStack(t *testing.T, path string) ([]string, []Method) {
	t.Helper()
	pid := startReady(t, path).Process.Pid
	waitSyscall(t, pid, unix.SYS_READ)
	_, _, methods, frames := procStack(t, pid)
	return frames, methods
}

// TestGoWithoutDWARFUnwinds: a Go program linked with -ldflags=-w (no
// DWARF, hence no CFI) or -s -w (no symbol table either) sampled while
// blocked in read(2) unwinds through its .gopclntab to the whole call
// chain, the same frames as the build with DWARF unwound by its
// .debug_frame, named as debug/gosym names them.
func TestGoWithoutDWARFUnwinds(t *testing.T) {
	want, wantMethods := goStack(t, buildGoBlocker(t, "", false))
	t.Logf("with DWARF: %q", want)
	chain := []string{"main.level3", "main.level2", "main.level1", "main.main", "runtime.main", "runtime.goexit.abi0"}
	if !hasNames(want, chain) {
		t.Fatalf("the DWARF build's stack %q lacks %q", want, chain)
	}
	for _, tc := range []struct {
		flags string
		cgo   bool
	}{{"-w", false}, {"-s -w", false}, {"-w", true}, {"-s -w", true}} {
		flags := tc.flags
		name := strings.ReplaceAll(flags, " ", "")
		if tc.cgo {
			name = "cgo" + name
		}
		t.Run(name, func(t *testing.T) {
			path := buildGoBlocker(t, flags, tc.cgo)
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if s := f.Section(".debug_frame"); s != nil {
				t.Fatalf("%s build has .debug_frame", flags)
			}
			if cfi, err := Compile(f); err == nil && !tc.cgo {
				t.Fatalf("%s build has CFI", flags)
			} else if tc.cgo && (err != nil || cfi.Sections[0] != ".eh_frame") {
				t.Fatalf("cgo %s build: CFI %v (%v), want .eh_frame for its C code", flags, cfi, err)
			}
			got, methods := goStack(t, path)
			t.Logf("%s: %q via %v", flags, got, methods)
			// .gopclntab names assembly functions without the ".abi0"
			// of their ELF symbols.
			trim := func(ns []string) []string {
				out := make([]string, len(ns))
				for i, n := range ns {
					out[i] = strings.TrimSuffix(n, ".abi0")
				}
				return out
			}
			if !slices.Equal(trim(got), trim(want)) || !slices.Equal(methods, wantMethods) {
				t.Errorf("stack %q via %v, the DWARF build's %q via %v", got, methods, want, wantMethods)
			}
			if last := strings.TrimSuffix(got[len(got)-1], ".abi0"); last != "runtime.goexit" {
				t.Errorf("outermost frame %q, want runtime.goexit (the runtime's top frame)", last)
			}
			// The names of -s -w come from .gopclntab alone: as gosym's,
			// given where Go's code starts: runtime.text, from the
			// symbols of the same program built with them.
			withSyms := f
			if strings.Contains(flags, "-s") {
				if withSyms, err = elf.Open(buildGoBlocker(t, "-w", tc.cgo)); err != nil {
					t.Fatal(err)
				}
				defer withSyms.Close()
			}
			tab := goSymtab(t, f, runtimeText(t, withSyms))
			syms, err := goSymbols(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, fn := range tab.Funcs {
				s, off, ok := syms.Lookup(fn.Entry)
				if !ok || s.Name != fn.Name || off != 0 || s.Addr+s.Size != fn.End {
					t.Fatalf("%#x: %s+%d (%v) size %d, gosym says %s to %#x", fn.Entry, s.Name, off, ok, s.Size, fn.Name, fn.End)
				}
			}
		})
	}
}

func runtimeText(t *testing.T, f *elf.File) uint64 {
	t.Helper()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == "runtime.text" {
			return s.Value
		}
	}
	t.Fatal("no runtime.text symbol")
	return 0
}

func goSymtab(t *testing.T, f *elf.File, text uint64) *gosym.Table {
	t.Helper()
	data, err := f.Section(".gopclntab").Data()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := gosym.NewTable(nil, gosym.NewLineTable(data, text))
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// TestGoPCLNRowsMatchDebugFrame compares the rows compiled from
// .gopclntab with those of the same program's .debug_frame (Go's linker
// writes both from the same pcsp tables): at every pc where either
// changes, the same CFA and return-address rule, except where the
// runtime's traceback stops (there the return address is undefined).
func TestGoPCLNRowsMatchDebugFrame(t *testing.T) {
	f, err := elf.Open(buildGoBlocker(t, "", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dw, err := Compile(f)
	if err != nil {
		t.Fatal(err)
	}
	gt, err := CompileGo(f)
	if err != nil {
		t.Fatal(err)
	}
	if dw.Sections[0] != ".debug_frame" || gt.Sections[0] != ".gopclntab" {
		t.Fatalf("sections %v and %v", dw.Sections, gt.Sections)
	}
	t.Logf(".debug_frame: %d FDEs, %d rows; .gopclntab: %d functions, %d rows", dw.FDEs, dw.Len(), gt.FDEs, gt.Len())
	outermost := 0
	compared := 0
	check := func(pc uint64) {
		a, errA := dw.Lookup(pc)
		b, errB := gt.Lookup(pc)
		if errA != nil {
			return // .debug_frame leaves out a few assembly functions
		}
		if errB != nil {
			t.Errorf("%#x: .debug_frame row %v, none from .gopclntab", pc, a)
			return
		}
		compared++
		if a.CFA != b.CFA {
			t.Errorf("%#x: CFA %v from .debug_frame, %v from .gopclntab", pc, a.CFA, b.CFA)
		}
		if b.RA.Kind == RuleUndefined {
			outermost++
		} else if a.RA != b.RA {
			t.Errorf("%#x: RA %v from .debug_frame, %v from .gopclntab", pc, a.RA, b.RA)
		}
	}
	for i := 0; i < dw.Len(); i++ {
		check(dw.Row(i).PC)
	}
	for i := 0; i < gt.Len(); i++ {
		check(gt.Row(i).PC)
	}
	t.Logf("%d pcs compared, %d in functions where the traceback stops", compared, outermost)
	if compared < 1000 {
		t.Errorf("only %d pcs compared", compared)
	}
}
