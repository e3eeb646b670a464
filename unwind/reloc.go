package unwind

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrRelocation is matched by every RelocationError.
var ErrRelocation = errors.New("relocation not applied")

// RelocationError is a relocation of a CFI section in a relocatable
// object (gcc -c) that cannot be applied: without it the table would be
// wrong, so the file is refused.
type RelocationError struct {
	Section string // the relocation section, ".rela.eh_frame"
	Index   int    // the relocation's index in it
	Offset  uint64 // the place it patches, in the CFI section
	Msg     string
}

func (e *RelocationError) Error() string {
	return fmt.Sprintf("%s entry %d (at %#x): %s", e.Section, e.Index, e.Offset, e.Msg)
}

func (e *RelocationError) Is(target error) bool { return target == ErrRelocation }

// relocate applies, to data (the contents of section sec of the
// relocatable object f), the x86-64 relocations of the SHT_RELA sections
// that target sec, as a linker placing every section at its sh_addr
// (0 in an object) would: a symbol's value is then its st_value, as
// readelf takes it. It refuses what it cannot apply.
func relocate(f *elf.File, sec *elf.Section, data []byte) error {
	var syms []elf.Symbol
	var loaded bool
	for _, rs := range f.Sections {
		if rs.Type != elf.SHT_RELA && rs.Type != elf.SHT_REL {
			continue
		}
		if int(rs.Info) >= len(f.Sections) || f.Sections[rs.Info] != sec {
			continue
		}
		if rs.Type == elf.SHT_REL {
			return &RelocationError{Section: rs.Name, Msg: "SHT_REL relocations are not supported on x86-64"}
		}
		if !loaded {
			var err error
			if syms, err = f.Symbols(); err != nil && !errors.Is(err, elf.ErrNoSymbols) {
				return fmt.Errorf("reading .symtab for %s: %w", rs.Name, err)
			}
			loaded = true
		}
		rela, err := rs.Data()
		if err != nil {
			return fmt.Errorf("%s: %w", rs.Name, err)
		}
		if len(rela)%24 != 0 {
			return &RelocationError{Section: rs.Name, Msg: fmt.Sprintf("size %#x is not a multiple of 24", len(rela))}
		}
		for i := 0; i < len(rela)/24; i++ {
			e := rela[24*i:]
			off := binary.LittleEndian.Uint64(e)
			info := binary.LittleEndian.Uint64(e[8:])
			addend := int64(binary.LittleEndian.Uint64(e[16:]))
			typ := elf.R_X86_64(info & 0xffffffff)
			symIdx := info >> 32
			fail := func(format string, args ...any) error {
				return &RelocationError{Section: rs.Name, Index: i, Offset: off, Msg: fmt.Sprintf(format, args...)}
			}
			var s uint64
			if symIdx != 0 {
				if symIdx > uint64(len(syms)) {
					return fail("symbol index %d is outside .symtab (%d symbols)", symIdx, len(syms))
				}
				sym := syms[symIdx-1] // Symbols leaves out the null symbol 0
				if sym.Section == elf.SHN_UNDEF {
					return fail("%s against the undefined symbol %q", typ, sym.Name)
				}
				s = sym.Value
			}
			v := s + uint64(addend)
			p := sec.Addr + off
			var size uint64
			switch typ {
			case elf.R_X86_64_NONE:
				continue
			case elf.R_X86_64_64:
				size = 8
			case elf.R_X86_64_PC64:
				size, v = 8, v-p
			case elf.R_X86_64_32, elf.R_X86_64_32S:
				size = 4
			case elf.R_X86_64_PC32:
				size, v = 4, v-p
			default:
				return fail("relocation type %s is not supported", typ)
			}
			if off > uint64(len(data)) || uint64(len(data))-off < size {
				return fail("%s past the end of %s (%#x bytes)", typ, sec.Name, len(data))
			}
			if size == 8 {
				binary.LittleEndian.PutUint64(data[off:], v)
			} else {
				binary.LittleEndian.PutUint32(data[off:], uint32(v))
			}
		}
	}
	return nil
}
