package debuginfo

import (
	"debug/elf"
	"errors"
	"fmt"

	"github.com/kinst/kinst/internal/elfsym"
)

// A relocatable file (a kernel module's .ko, or its separate debug file
// from Debian's linux-image-…-dbg) has every section at address 0 and
// DWARF whose addresses are relocations against its code sections. Open
// lays the allocated sections out one after another from relBase, as a
// linker would, applies the DWARF sections' relocations against that
// layout, and moves the symbols with their sections, so that a
// "link-time" address names one byte of one section. The module loader
// puts each section somewhere else, so a runtime address maps back by
// the slide of its own section (report.AnnotateModule votes one per
// section), not one slide for the file.

// relBase is where the first allocated section of a relocatable file is
// laid out: not 0, which a line table's sequence start reserves for code
// a linker discarded.
const relBase = 0x10000

// Section is one allocated section of a relocatable file as Open laid it
// out.
type Section struct {
	Name      string
	Index     elf.SectionIndex
	Addr, End uint64
}

// relLayout is a relocatable file's layout: where each allocated section
// starts, and the symbols (without the null symbol 0) to relocate with.
type relLayout struct {
	sections []Section
	base     map[elf.SectionIndex]uint64
	syms     []elf.Symbol
}

func newRelLayout(ef *elf.File) (*relLayout, error) {
	l := &relLayout{base: map[elf.SectionIndex]uint64{}}
	next := uint64(relBase)
	for i, s := range ef.Sections {
		if s.Flags&elf.SHF_ALLOC == 0 || s.Size == 0 {
			continue
		}
		align := max(s.Addralign, 16)
		if align&(align-1) != 0 {
			align = 16
		}
		next = (next + align - 1) &^ (align - 1)
		l.base[elf.SectionIndex(i)] = next
		l.sections = append(l.sections, Section{Name: s.Name, Index: elf.SectionIndex(i), Addr: next, End: next + s.Size})
		next += s.Size
	}
	syms, err := ef.Symbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("reading .symtab: %w", err)
	}
	l.syms = syms
	return l, nil
}

// symValue is S of a relocation against symbol index i: the symbol's
// value moved with its section (an undefined symbol is 0).
func (l *relLayout) symValue(i uint32) (uint64, error) {
	if i == 0 {
		return 0, nil
	}
	if int(i) > len(l.syms) {
		return 0, fmt.Errorf("relocation names symbol %d of %d", i, len(l.syms))
	}
	s := l.syms[i-1]
	return s.Value + l.base[s.Section], nil
}

// relocate is a copy of data, the section called name, with the
// relocations of .rela<name> applied (x86-64's R_X86_64_64, _32, _32S
// and _PC32 against the layout); data itself when there are none.
func (l *relLayout) relocate(ef *elf.File, name string, data []byte) ([]byte, error) {
	rs := ef.Section(".rela" + name)
	if rs == nil || data == nil {
		return data, nil
	}
	if ef.Machine != elf.EM_X86_64 || ef.Class != elf.ELFCLASS64 {
		return nil, fmt.Errorf("relocations of %v are not read (only x86-64's)", ef.Machine)
	}
	raw, err := rs.Data()
	if err != nil {
		return nil, fmt.Errorf("section %s: %w", rs.Name, err)
	}
	out := append([]byte(nil), data...)
	bo := ef.ByteOrder
	for o := 0; o+24 <= len(raw); o += 24 {
		off := bo.Uint64(raw[o:])
		info := bo.Uint64(raw[o+8:])
		addend := int64(bo.Uint64(raw[o+16:]))
		s, err := l.symValue(uint32(info >> 32))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rs.Name, err)
		}
		v := s + uint64(addend)
		var size uint64
		switch t := elf.R_X86_64(info & 0xffffffff); t {
		case elf.R_X86_64_NONE:
			continue
		case elf.R_X86_64_64:
			size = 8
		case elf.R_X86_64_32, elf.R_X86_64_32S:
			size = 4
		case elf.R_X86_64_PC32:
			size, v = 4, v-off // the debug section itself sits at 0
		default:
			return nil, fmt.Errorf("%s: relocation type %v is not read", rs.Name, t)
		}
		if off+size > uint64(len(out)) || off+size < off {
			return nil, fmt.Errorf("%s: relocation at %#x is outside %s (%d bytes)", rs.Name, off, name, len(out))
		}
		if size == 8 {
			bo.PutUint64(out[off:], v)
		} else {
			bo.PutUint32(out[off:], uint32(v))
		}
	}
	return out, nil
}

// rebased is the symbol table moved with its sections.
func (l *relLayout) rebased(t *elfsym.Table) *elfsym.Table {
	if t == nil {
		return nil
	}
	return t.Rebased(func(i elf.SectionIndex) uint64 { return l.base[i] })
}

// Sections are the allocated sections of a relocatable file as Open laid
// them out; nil for an executable, whose addresses are its own.
func (f *File) Sections() []Section { return f.sections }

// SectionAt is the section of a relocatable file holding addr.
func (f *File) SectionAt(addr uint64) (Section, bool) {
	for _, s := range f.sections {
		if addr >= s.Addr && addr < s.End {
			return s, true
		}
	}
	return Section{}, false
}
