package debuginfo

import (
	"debug/dwarf"
	"debug/elf"
	"errors"

	"github.com/kinst/kinst/internal/elfsym"
)

// FuncSymbols are the functions the DWARF describes, as symbols: every
// subprogram with code (DW_AT_low_pc and DW_AT_high_pc, or
// DW_AT_ranges), named by its DW_AT_linkage_name (the mangled name a
// symbol table would hold) or DW_AT_name, following DW_AT_specification
// and DW_AT_abstract_origin for out-of-line definitions. It is for debug
// files without a symbol table; it reads every unit, so it costs more
// than Symbols.
func (f *File) FuncSymbols() (*elfsym.Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, errors.New("debuginfo: file closed")
	}
	var syms []elfsym.Symbol
	err := f.eachUnit(func(d *dwarf.Data, cu *dwarf.Entry, _ dwarf.Offset) (bool, error) {
		err := everyEntry(d, func(e *dwarf.Entry) bool {
			if e.Tag != dwarf.TagSubprogram {
				return false
			}
			name := subprogramName(d, e, 4)
			if name == "" {
				return false
			}
			rs, err := d.Ranges(e)
			if err != nil {
				return false
			}
			for _, r := range rs {
				if r[1] > r[0] && r[0] != 0 {
					syms = append(syms, elfsym.Symbol{Name: name, Addr: r[0], Size: r[1] - r[0], Kind: elfsym.Func, Bind: elf.STB_GLOBAL})
				}
			}
			return false
		})
		return err == nil, err
	})
	if err != nil {
		return nil, err
	}
	if len(syms) == 0 {
		return nil, elfsym.ErrNoSymbols
	}
	return elfsym.New(syms), nil
}

// subprogramName is a subprogram's linkage name, else its name, looked
// for through the declarations it refers to (depth bounds the chain).
func subprogramName(d *dwarf.Data, e *dwarf.Entry, depth int) string {
	if n, ok := e.Val(dwarf.AttrLinkageName).(string); ok && n != "" {
		return n
	}
	if n, ok := e.Val(dwarf.AttrName).(string); ok && n != "" {
		return n
	}
	if depth == 0 {
		return ""
	}
	for _, a := range []dwarf.Attr{dwarf.AttrSpecification, dwarf.AttrAbstractOrigin} {
		off, ok := e.Val(a).(dwarf.Offset)
		if !ok {
			continue
		}
		rd := d.Reader()
		rd.Seek(off)
		if ref, err := rd.Next(); err == nil && ref != nil {
			if n := subprogramName(d, ref, depth-1); n != "" {
				return n
			}
		}
	}
	return ""
}
