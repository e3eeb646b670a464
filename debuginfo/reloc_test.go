package debuginfo

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kinst/kinst/debuginfo/debuginfotest"
	"github.com/kinst/kinst/internal/elfsym"
)

// buildRelocatable links testdata/src into one relocatable file (ld -r,
// as a kernel module is) with a section per function, so that offsets
// of different sections overlap.
func buildRelocatable(t *testing.T, flags ...string) string {
	t.Helper()
	for _, tool := range []string{"gcc", "addr2line"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	out := filepath.Join(t.TempDir(), "prog.ko")
	args := append([]string{"-g", "-O2", "-ffunction-sections", "-nostdlib", "-r"}, flags...)
	cmd := exec.Command("gcc", append(args, "-o", out, "src/main.c", "src/table.c")...)
	cmd.Dir = "testdata"
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return out
}

// A relocatable file's line of every byte of every function, at the
// layout Open gives its sections, equals addr2line's at that offset of
// that section (addr2line -j), for DWARF 4 and 5; each function lies in
// the section its symbol names.
func TestRelocatableMatchesAddr2line(t *testing.T) {
	for _, flags := range [][]string{{"-gdwarf-4"}, {"-gdwarf-5"}} {
		t.Run(flags[0], func(t *testing.T) {
			ko := buildRelocatable(t, flags...)
			ef, err := elf.Open(ko)
			if err != nil {
				t.Fatal(err)
			}
			defer ef.Close()
			if ef.Type != elf.ET_REL {
				t.Fatalf("%s is %v", ko, ef.Type)
			}
			f, err := Open(ko)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			raw, err := elfsym.Open(ko) // offsets into the sections
			if err != nil {
				t.Fatal(err)
			}
			checked, sections := 0, map[string]bool{}
			for _, s := range raw.Symbols() {
				if s.Kind != elfsym.Func || s.Size == 0 {
					continue
				}
				secName := ef.Sections[s.Section].Name
				at, ok := f.Symbols().Addr(s.Name)
				if !ok {
					t.Fatalf("%s: not in the relocated symbols", s.Name)
				}
				sec, ok := f.SectionAt(at)
				if !ok || sec.Name != secName || at-sec.Addr != s.Addr {
					t.Fatalf("%s at %#x: section %+v, want %s+%#x", s.Name, at, sec, secName, s.Addr)
				}
				var offs []uint64
				for o := s.Addr; o < s.Addr+s.Size; o++ {
					offs = append(offs, o)
				}
				want := debuginfotest.Addr2lineIn(t, ko, secName, offs)
				for i, o := range offs {
					got, err := f.LineAt(sec.Addr + o)
					if debuginfotest.Unknown(want[i]) {
						continue
					}
					if err != nil || got.String() != want[i] {
						t.Fatalf("%s+%#x (%s+%#x): %s (%v), addr2line %s", s.Name, o-s.Addr, secName, o, got, err, want[i])
					}
					checked++
				}
				sections[secName] = true
			}
			if checked == 0 || len(sections) < 3 {
				t.Fatalf("%d bytes checked in sections %v: want code in several sections", checked, sections)
			}
			t.Logf("%d bytes of code in %d sections agree with addr2line -j", checked, len(sections))
		})
	}
}

// DeclLine of a function gcc split into a hot part and a .cold one
// (DW_AT_ranges, no low_pc), in a relocatable file as a module's:
// the line of its declaration.
func TestDeclLineSplitFunction(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is not installed")
	}
	ko := filepath.Join(t.TempDir(), "cold.ko")
	cmd := exec.Command("gcc", "-g", "-O2", "-nostdlib", "-r", "-o", ko, "src/cold.c")
	cmd.Dir = "testdata"
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	f, err := Open(ko)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, ok := f.Symbols().Addr("checked.cold"); !ok {
		t.Skip("gcc did not split checked")
	}
	at, _ := f.Symbols().Addr("checked")
	got, err := f.DeclLine(at)
	if err != nil || filepath.Base(got.File) != "cold.c" || got.Line != 5 {
		t.Errorf("DeclLine(checked) = %v, %v; want cold.c:5", got, err)
	}
	fns, err := f.FuncsInFile("cold.c")
	var names []string
	for _, fn := range fns {
		names = append(names, fn.Name)
	}
	if err != nil || !slices.Contains(names, "checked") || !slices.Contains(names, "checked.cold") {
		t.Errorf("FuncsInFile(cold.c) = %v, %v; want checked and checked.cold", names, err)
	}
}
