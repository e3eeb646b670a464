package process

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kinst/kinst/kernel"
)

// ifuncs is what a module's ELF file says of its indirect functions.
type ifuncs struct {
	err      error
	values   map[string]uint64 // an IFUNC symbol's link-time address, by name
	irelSlot map[uint64]uint64 // an IRELATIVE relocation's slot (link-time), by its resolver
}

// moduleIfuncs reads module's indirect functions and IRELATIVE
// relocations once.
func (t *Target) moduleIfuncs(module string) *ifuncs {
	if fi, ok := t.ifuncs[module]; ok {
		return fi
	}
	fi := &ifuncs{values: map[string]uint64{}, irelSlot: map[uint64]uint64{}}
	t.ifuncs[module] = fi
	f, err := elf.Open(t.paths[module])
	if err != nil {
		fi.err = err
		return fi
	}
	defer f.Close()
	for _, read := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, _ := read()
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_GNU_IFUNC {
				fi.values[s.Name] = s.Value
			}
		}
	}
	for _, s := range f.Sections {
		if s.Type != elf.SHT_RELA || s.Entsize != 24 {
			continue
		}
		b, err := s.Data()
		if err != nil {
			continue
		}
		for i := 0; i+24 <= len(b); i += 24 {
			// An Elf64_Rela: offset, info (type in the low half), addend.
			// R_X86_64_IRELATIVE: the slot gets what the resolver at the
			// addend returns.
			if elf.R_X86_64(uint32(binary.LittleEndian.Uint64(b[i+8:]))) == elf.R_X86_64_IRELATIVE {
				fi.irelSlot[binary.LittleEndian.Uint64(b[i+16:])] = binary.LittleEndian.Uint64(b[i:])
			}
		}
	}
	return fi
}

// implementation is the function an indirect function's calls run in
// this process: the dynamic loader ran its resolver (sym's code) as the
// library loaded, and stored the answer in the GOT slot of each
// IRELATIVE relocation whose addend is the resolver -- the library's own
// calls go through one (libc calls its strlen, memcpy… through its PLT).
// The slot is read from the process and named by its symbols. It fails
// where the library has no such relocation (its own code never calls the
// function) or the slot holds no function's start.
func (t *Target) implementation(sym kernel.Symbol) (kernel.Symbol, error) {
	fi := t.moduleIfuncs(sym.Module)
	if fi.err != nil {
		return kernel.Symbol{}, fi.err
	}
	link, ok := fi.values[sym.Name]
	if !ok {
		return kernel.Symbol{}, fmt.Errorf("its file has no indirect function %s", sym.Name)
	}
	off, ok := fi.irelSlot[link]
	if !ok {
		return kernel.Symbol{}, fmt.Errorf("%s never calls it through its GOT (no IRELATIVE relocation names its resolver)", moduleName(sym.Module))
	}
	if t.image == nil {
		return kernel.Symbol{}, errors.New("the process's memory is not open")
	}
	slot := sym.Addr - link + off
	var b [8]byte
	if err := t.image.read(slot, b[:]); err != nil {
		return kernel.Symbol{}, err
	}
	impl := binary.LittleEndian.Uint64(b[:])
	for _, c := range t.Syms.FunctionsAt(impl) {
		if !c.Indirect && c.Module == sym.Module {
			return c, nil
		}
	}
	return kernel.Symbol{}, fmt.Errorf("its GOT slot at %#x holds %#x, no function's start in %s", slot, impl, moduleName(sym.Module))
}

// moduleName names a module in a message: the executable is "".
func moduleName(module string) string {
	if module == "" {
		return "the executable"
	}
	return module
}

// implementations names the functions of sym's module whose names say
// they implement it (__strlen_avx2 for strlen), at most max.
func (t *Target) implementations(sym kernel.Symbol, max int) []string {
	var out []string
	prefix := "__" + sym.Name + "_"
	for _, s := range t.Syms.All() {
		if s.Module == sym.Module && !s.Indirect && strings.HasPrefix(s.Name, prefix) && !slices.Contains(out, s.Name) {
			out = append(out, s.Name)
			if len(out) == max {
				break
			}
		}
	}
	return out
}

// running is the function calls to sym run: sym itself, or, where sym is
// an indirect function, its implementation in this process
// (implementation), and an error saying so where that is not known.
func (t *Target) running(sym kernel.Symbol) (kernel.Symbol, error) {
	if !sym.Indirect {
		return sym, nil
	}
	impl, err := t.implementation(sym)
	if err != nil {
		return kernel.Symbol{}, t.indirectError(sym, err)
	}
	return impl, nil
}

// indirectError is why a point at an indirect function's symbol cannot
// be planned: its implementation in this process was not found (why).
func (t *Target) indirectError(sym kernel.Symbol, why error) error {
	hint := ""
	if impls := t.implementations(sym, 4); len(impls) > 0 {
		hint = " (" + strings.Join(impls, ", ") + "…)"
	}
	return fmt.Errorf("%s: %w (STT_GNU_IFUNC): its symbol is the resolver that picks an implementation as the library loads, not the code calls run, and which one this process runs is not known (%v); name the implementation%s",
		sym.Name, ErrIndirect, why, hint)
}
