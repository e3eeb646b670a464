package livetest

import (
	"debug/elf"
	"fmt"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo/debuginfotest"
	"github.com/kinst/kinst/internal/elfsym"
)

// CheckModuleLines compares the first source line of every block of the
// module's functions in a coverage report with binutils' addr2line -j
// SECTION at the block's offset into the section its function's symbol
// lies in, in the module's debug file ko (a relocatable file: addr2line
// applies its relocations itself). It returns how many blocks had a
// line to compare and in how many sections; a difference fails the test.
func CheckModuleLines(t testing.TB, rep api.CoverReport, module, ko string) (blocks, sections int) {
	t.Helper()
	ef, err := elf.Open(ko)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	raw, err := elfsym.Open(ko) // offsets into the module's sections
	if err != nil {
		t.Fatal(err)
	}
	type block struct {
		where   string
		got     []string
		section string
		off     uint64
		want    string
	}
	bySection := map[string][]*block{}
	for _, f := range rep.Functions {
		if f.Module != module || f.Error != "" {
			continue
		}
		var sym *elfsym.Symbol
		for _, s := range raw.Symbols() {
			if s.Name == f.Function && s.Kind == elfsym.Func {
				sym = &s
				break
			}
		}
		if sym == nil {
			t.Fatalf("%s: not in %s", f.Function, ko)
		}
		sec := ef.Sections[sym.Section].Name
		for _, b := range f.Blocks {
			off := uint64(b.Start - f.Address)
			bySection[sec] = append(bySection[sec], &block{where: fmt.Sprintf("%s+%#x", f.Function, off), got: b.Lines,
				section: sec, off: sym.Addr + off})
		}
	}
	for sec, bs := range bySection {
		offs := make([]uint64, len(bs))
		for i, b := range bs {
			offs[i] = b.off
		}
		for i, l := range debuginfotest.Addr2lineIn(t, ko, sec, offs) {
			bs[i].want = l
		}
		for _, b := range bs {
			if debuginfotest.Unknown(b.want) {
				continue
			}
			blocks++
			if len(b.got) == 0 || b.got[0] != b.want {
				t.Errorf("block %s (%s+%#x): lines %q, addr2line %s", b.where, b.section, b.off, b.got, b.want)
			}
		}
	}
	return blocks, len(bySection)
}
