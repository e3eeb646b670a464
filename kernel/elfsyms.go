package kernel

import (
	"debug/elf"
	"errors"
	"fmt"

	"github.com/kinst/kinst/internal/elfsym"
)

// ELFOptions place an ELF file's symbols at the addresses the running
// kernel uses.
type ELFOptions struct {
	// Module is the module the file is ("" for a vmlinux).
	Module string
	// Slide is added to every address of an executable (a vmlinux with
	// symbols): KASLR's offset, the running _text minus the file's.
	Slide uint64
	// SectionBase gives where a relocatable file's (a module .ko's)
	// section was loaded, by name: /sys/module/NAME/sections/ lists them.
	// Required for relocatable files; symbols of sections it does not
	// place are left out (init sections, freed after loading).
	SectionBase func(section string) (uint64, bool)
	// Sizes keeps each function's st_size (Symbol.Size), so that a
	// function ends where its symbol says rather than at the next symbol:
	// a stripped binary's .dynsym names only exported functions, and the
	// static functions between them would be taken for their code. An
	// unsized function ends with its section.
	Sizes bool
}

// ErrNoSectionBase is returned for a relocatable file without
// ELFOptions.SectionBase: its symbols have no addresses until placed.
var ErrNoSectionBase = errors.New("a relocatable file's symbols need section load addresses (ELFOptions.SectionBase)")

// SymbolsFromELF makes a Symbols, what kallsyms gives, from an ELF file's
// symbol table (internal/elfsym: .symtab, else .dynsym): its functions as
// text symbols and its data objects as data symbols ('T'/'D' global,
// 't'/'d' local, as nm and kallsyms print them). Linker-script markers
// such as _text or __init_begin are untyped symbols that elfsym does not
// keep, so init text is not recognised as freed and portable names are
// unavailable with ELF symbols alone.
func SymbolsFromELF(path string, o ELFOptions) (*Symbols, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := elfsym.Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	rel := f.Type == elf.ET_REL
	if rel && o.SectionBase == nil {
		return nil, fmt.Errorf("%s: %w", path, ErrNoSectionBase)
	}
	var syms []Symbol
	funcs := 0
	for _, sym := range t.Symbols() {
		addr := sym.Addr + o.Slide
		if rel {
			if int(sym.Section) >= len(f.Sections) {
				continue
			}
			base, ok := o.SectionBase(f.Sections[sym.Section].Name)
			if !ok {
				continue
			}
			addr = base + sym.Addr
		}
		var typ byte
		switch sym.Kind {
		case elfsym.Func:
			typ = 't'
			funcs++
		case elfsym.Object:
			typ = 'd'
		default:
			continue
		}
		if sym.Bind != elf.STB_LOCAL {
			typ -= 'a' - 'A'
		}
		s := Symbol{Addr: addr, Type: typ, Name: sym.Name, Module: o.Module, Indirect: sym.Indirect}
		if o.Sizes && sym.Kind == elfsym.Func {
			s.Size = sym.Size
			// An unsized function (crt's _init and _fini) ends with its
			// section: the next symbol may lie past the PLT.
			if s.Size == 0 && !rel && int(sym.Section) < len(f.Sections) {
				if sec := f.Sections[sym.Section]; sym.Addr >= sec.Addr && sym.Addr < sec.Addr+sec.Size {
					s.Size = sec.Addr + sec.Size - sym.Addr
				}
			}
		}
		syms = append(syms, s)
	}
	if funcs == 0 {
		return nil, fmt.Errorf("%s: no function symbols placed", path)
	}
	return NewSymbols(syms), nil
}
