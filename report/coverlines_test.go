package report

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/internal/elfsym"
)

// AnnotateModule over a relocatable file whose sections a loader put far
// apart, each at its own slide (a module's .text, .text.unlikely, …): a
// report of every function, at runtime addresses, gets for each block
// the line of its first byte at the layout's address, as if one slide
// per section had been known; a function of another module is left to
// that module.
func TestAnnotateModuleSlidePerSection(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is not installed")
	}
	ko := filepath.Join(t.TempDir(), "m.ko")
	cmd := exec.Command("gcc", "-g", "-O2", "-ffunction-sections", "-nostdlib", "-r", "-o", ko, "src/main.c", "src/table.c", "src/cold.c")
	cmd.Dir = filepath.Join("..", "debuginfo", "testdata")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	dbg, err := debuginfo.Open(ko)
	if err != nil {
		t.Fatal(err)
	}
	defer dbg.Close()
	// The "loader": each section 1 MiB further than the one before,
	// from a module area address.
	load := map[string]uint64{}
	for i, s := range dbg.Sections() {
		load[s.Name] = 0xffffffffc0000000 + uint64(i)<<20
	}
	rep := api.CoverReport{}
	want := map[string]string{} // function → its first line
	sections := map[string]bool{}
	for _, s := range dbg.Symbols().Symbols() {
		if s.Kind != elfsym.Func || s.Size == 0 {
			continue
		}
		sec, ok := dbg.SectionAt(s.Addr)
		if !ok {
			t.Fatalf("%s at %#x: in no section", s.Name, s.Addr)
		}
		at := load[sec.Name] + s.Addr - sec.Addr
		l, err := dbg.LineAt(s.Addr)
		if err != nil {
			continue
		}
		want[s.Name] = l.String()
		sections[sec.Name] = true
		rep.Functions = append(rep.Functions, api.CoverFunction{Function: s.Name, Module: "m", Address: api.Addr(at),
			Blocks: []api.CoverBlock{{Start: api.Addr(at), End: api.Addr(at + 1)}}})
	}
	rep.Functions = append(rep.Functions, api.CoverFunction{Function: "ext4_getattr", Module: "ext4", Address: 0xffffffffc1000000,
		Blocks: []api.CoverBlock{{Start: 0xffffffffc1000000, End: 0xffffffffc1000001}}})
	if len(sections) < 3 {
		t.Fatalf("functions in %d sections, want several", len(sections))
	}
	a, err := AnnotateModule(&rep, dbg, "m")
	if err != nil {
		t.Fatal(err)
	}
	if a.Functions != len(want) || len(a.Unmatched) > 0 || len(a.Modules) != 1 {
		t.Errorf("annotated %d of %d functions, unmatched %v, other modules %v", a.Functions, len(want), a.Unmatched, a.Modules)
	}
	for _, f := range rep.Functions {
		if f.Module != "m" {
			if len(f.Blocks[0].Lines) != 0 {
				t.Errorf("%s [%s]: lines %v from another module's file", f.Function, f.Module, f.Blocks[0].Lines)
			}
			continue
		}
		if got := f.Blocks[0].Lines; len(got) == 0 || got[0] != want[f.Function] {
			t.Errorf("%s: lines %v, want %s first", f.Function, got, want[f.Function])
		}
	}
	t.Logf("%d functions in %d sections, each at its section's slide", len(want), len(sections))
}
