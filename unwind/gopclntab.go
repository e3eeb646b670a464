package unwind

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/kinst/kinst/internal/elfsym"
)

// Go binaries linked without DWARF (-ldflags=-w, or -s -w) have no CFI
// at all: Go's linker writes no .eh_frame, and its .debug_frame goes
// with the DWARF. They keep .gopclntab, the table the Go runtime unwinds
// its own stacks with: per function, its entry and name, and a pc-value
// table of the stack pointer's distance from its value at the entry
// (pcsp). That is all a CFA rule needs: CFA = rsp + pcsp + 8, the return
// address at CFA-8. Go keeps frame pointers: a function with a frame
// pushes rbp at its entry, so where pcsp > 0 the caller's rbp is at
// CFA-16.

// ErrNoGoPCLN is returned for a file without a .gopclntab section.
var ErrNoGoPCLN = errors.New("no .gopclntab section")

// goFunc is one function of .gopclntab.
type goFunc struct {
	entry, end uint64 // link-time addresses
	name       string
	pcsp       []byte // the pc-value table from entry on; nil: 0 throughout
	// outermost: the runtime's traceback stops here (funcFlag_TOPFRAME:
	// goexit, mstart, rt0_go; funcFlag_SPWRITE: functions that switch
	// stacks, such as mcall and systemstack, whose caller the stack
	// pointer does not lead to).
	outermost bool
}

// goPCLN reads the functions of a Go 1.18+ .gopclntab (magic 0xfffffff0
// or 0xfffffff1), ordered by entry.
func goPCLN(f *elf.File) ([]goFunc, error) {
	sec := f.Section(".gopclntab")
	if sec == nil || sec.Type == elf.SHT_NOBITS {
		return nil, ErrNoGoPCLN
	}
	b, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf(".gopclntab: %w", err)
	}
	bad := func(what string) error { return fmt.Errorf(".gopclntab: %s", what) }
	if len(b) < 72 {
		return nil, bad("too short for its header")
	}
	le := binary.LittleEndian
	flagAt := uint64(41) // _func.flag: after startLine, added in Go 1.20
	switch magic := le.Uint32(b); magic {
	case 0xfffffff1: // Go 1.20+
	case 0xfffffff0: // Go 1.18–1.19
		flagAt = 37
	default:
		return nil, fmt.Errorf(".gopclntab: magic %#x: only the tables of Go 1.18 and later are read", magic)
	}
	if b[6] != 1 || b[7] != 8 {
		return nil, bad(fmt.Sprintf("pc quantum %d, pointer size %d: want 1 and 8 (amd64)", b[6], b[7]))
	}
	word := func(i int) uint64 { return le.Uint64(b[8+8*i:]) }
	nfunc, text := word(0), word(2)
	if text == 0 {
		text = goTextStart(f, sec.Addr)
	}
	funcnames, pctab, functab := word(3), word(6), word(7)
	n := uint64(len(b))
	if funcnames > n || pctab > n || functab > n || nfunc > (n-functab)/8 {
		return nil, bad("offsets out of the section")
	}
	ftab := b[functab:]
	u32 := func(p []byte, off uint64) (uint32, bool) {
		if off+4 > uint64(len(p)) {
			return 0, false
		}
		return le.Uint32(p[off:]), true
	}
	funcs := make([]goFunc, 0, nfunc)
	for i := uint64(0); i < nfunc; i++ {
		entry, ok1 := u32(ftab, 8*i)
		foff, ok2 := u32(ftab, 8*i+4)
		next, ok3 := u32(ftab, 8*i+8) // the entry after the last is the end of text
		if !ok1 || !ok2 || !ok3 {
			return nil, bad("function table runs past the section")
		}
		nameOff, ok4 := u32(ftab, uint64(foff)+4)
		pcsp, ok5 := u32(ftab, uint64(foff)+16)
		if !ok4 || !ok5 || uint64(foff)+flagAt >= uint64(len(ftab)) {
			return nil, bad(fmt.Sprintf("function %d: record out of the section", i))
		}
		const topFrame, spWrite = 1, 2 // runtime/abi funcFlag bits
		fn := goFunc{entry: text + uint64(entry), end: text + uint64(next),
			outermost: ftab[uint64(foff)+flagAt]&(topFrame|spWrite) != 0}
		if at := funcnames + uint64(nameOff); at < n {
			name := b[at:]
			for j, c := range name {
				if c == 0 {
					name = name[:j]
					break
				}
			}
			fn.name = string(name)
		}
		if pcsp != 0 && pctab+uint64(pcsp) < n {
			fn.pcsp = b[pctab+uint64(pcsp):]
		}
		funcs = append(funcs, fn)
	}
	return funcs, nil
}

// goTextStart is where the Go code of f starts, which recent linkers
// leave out of the .gopclntab header for the runtime to fill in: the
// runtime.text symbol (an externally linked cgo binary has C code before
// it), else the start of .text, as cmd/internal/objfile takes it.
func goTextStart(f *elf.File, pclntab uint64) uint64 {
	if syms, err := f.Symbols(); err == nil {
		for _, s := range syms {
			if s.Name == "runtime.text" {
				return s.Value
			}
		}
	}
	if text, ok := moduledataText(f, pclntab); ok {
		return text
	}
	if t := f.Section(".text"); t != nil {
		return t.Addr
	}
	return 0
}

// moduledataText reads the text start from the runtime's moduledata
// (in .go.module since Go 1.26, .noptrdata before) of a binary without
// symbols: the record that starts with the address of .gopclntab,
// followed by six slices, findfunctab, minpc, maxpc and text. It is
// taken only when it lies in an executable section, at or below minpc,
// and maxpc is above minpc.
func moduledataText(f *elf.File, pclntab uint64) (uint64, bool) {
	for _, name := range []string{".go.module", ".noptrdata"} {
		sec := f.Section(name)
		if sec == nil || sec.Type == elf.SHT_NOBITS {
			continue
		}
		b, err := sec.Data()
		if err != nil {
			continue
		}
		if text, ok := findModuledataText(f, b, pclntab); ok {
			return text, true
		}
	}
	return 0, false
}

func findModuledataText(f *elf.File, b []byte, pclntab uint64) (uint64, bool) {
	le := binary.LittleEndian
	const minpcAt, maxpcAt, textAt = 8 + 6*24 + 8, 8 + 6*24 + 16, 8 + 6*24 + 24
	for i := 0; i+textAt+8 <= len(b); i += 8 {
		if le.Uint64(b[i:]) != pclntab {
			continue
		}
		minpc, maxpc, text := le.Uint64(b[i+minpcAt:]), le.Uint64(b[i+maxpcAt:]), le.Uint64(b[i+textAt:])
		if text == 0 || text > minpc || maxpc <= minpc {
			continue
		}
		for _, s := range f.Sections {
			if s.Flags&elf.SHF_EXECINSTR != 0 && text >= s.Addr && maxpc <= s.Addr+s.Size {
				return text, true
			}
		}
	}
	return 0, false
}

// spDeltas calls fn for each run [pc, next) of the function where the
// stack pointer is delta bytes below its value at the entry, in order.
func (g *goFunc) spDeltas(fn func(pc uint64, delta int64)) {
	pc, val := g.entry, int64(-1)
	p := g.pcsp
	for first := true; len(p) > 0; first = false {
		uv, n := binary.Uvarint(p)
		if n <= 0 || (uv == 0 && !first) {
			break
		}
		p = p[n:]
		if uv&1 != 0 {
			val += int64(^(uv >> 1))
		} else {
			val += int64(uv >> 1)
		}
		dpc, n := binary.Uvarint(p)
		if n <= 0 {
			break
		}
		p = p[n:]
		if pc >= g.end {
			break
		}
		fn(pc, val)
		pc += dpc
	}
	if g.pcsp == nil {
		fn(g.entry, 0)
	}
}

// CompileGo compiles the pcsp tables of a Go binary's .gopclntab into
// rows: for each function, CFA rsp+(pcsp+8), the return address at c-8
// (undefined, the end of the stack, in the functions where the runtime's
// traceback stops), and rbp at c-16 where the stack pointer has moved
// (the pushed frame pointer). Sections is [".gopclntab"]. Files without the section give
// ErrNoGoPCLN.
func CompileGo(f *elf.File) (*Table, error) {
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Machine != elf.EM_X86_64 {
		return nil, ErrUnsupportedFile
	}
	funcs, err := goPCLN(f)
	if err != nil {
		return nil, err
	}
	t := &Table{Sections: []string{".gopclntab"}}
	if len(funcs) == 0 {
		return t, nil
	}
	t.base = funcs[0].entry
	var prevEnd uint64
	for i := range funcs {
		g := &funcs[i]
		if g.entry < prevEnd || g.end <= g.entry || g.end-t.base > 1<<32-1 {
			t.Skipped++
			continue
		}
		if i > 0 && prevEnd < g.entry {
			t.add(Row{PC: prevEnd})
		}
		t.FDEs++
		t.starts = append(t.starts, uint32(g.entry-t.base))
		g.spDeltas(func(pc uint64, delta int64) {
			r := Row{PC: pc, CFA: CFA{Kind: CFARegOffset, Reg: RegRSP, Offset: delta + 8},
				RA: Rule{Kind: RuleOffset, Offset: -8}, RBP: Rule{Kind: RuleSameValue}}
			if delta > 0 {
				r.RBP = Rule{Kind: RuleOffset, Offset: -16}
			}
			if g.outermost {
				r.RA = Rule{Kind: RuleUndefined}
			}
			t.add(r)
		})
		prevEnd = g.end
	}
	t.add(Row{PC: prevEnd})
	return t, nil
}

// goSymbols names the functions of a Go binary stripped of its symbol
// table too (-ldflags="-s -w") from .gopclntab.
func goSymbols(f *elf.File) (*elfsym.Table, error) {
	funcs, err := goPCLN(f)
	if err != nil {
		return nil, err
	}
	syms := make([]elfsym.Symbol, 0, len(funcs))
	for _, g := range funcs {
		syms = append(syms, elfsym.Symbol{Name: g.name, Addr: g.entry, Size: g.end - g.entry, Kind: elfsym.Func, Bind: elf.STB_GLOBAL})
	}
	if len(syms) == 0 {
		return nil, elfsym.ErrNoSymbols
	}
	return elfsym.New(syms), nil
}

// WithGo completes t (nil: no CFI) with the rows of f's .gopclntab where
// t has none: a Go binary without DWARF has no CFI at all, and a cgo
// binary linked with -ldflags=-w has .eh_frame for its C code only. t is
// returned as it is for a file without .gopclntab.
func WithGo(t *Table, f *elf.File) *Table {
	if f.Section(".gopclntab") == nil {
		return t
	}
	gt, err := CompileGo(f)
	if err != nil || gt.Len() == 0 {
		return t
	}
	if t == nil || t.Len() == 0 {
		return gt
	}
	return combineTables(t, gt)
}

// combineTables is a's rows, and b's where a has none (CFA u).
func combineTables(a, b *Table) *Table {
	pcs := make([]uint64, 0, a.Len()+b.Len())
	for _, t := range []*Table{a, b} {
		for i := 0; i < t.Len(); i++ {
			pcs = append(pcs, t.Row(i).PC)
		}
	}
	slices.Sort(pcs)
	pcs = slices.Compact(pcs)
	out := &Table{base: min(a.base, b.base), FDEs: a.FDEs + b.FDEs, Skipped: a.Skipped + b.Skipped,
		Sections: append(slices.Clone(a.Sections), b.Sections...)}
	if pcs[len(pcs)-1]-out.base > 1<<32-1 {
		return a // the two do not fit one table's 4 GiB span
	}
	for _, pc := range pcs {
		r, err := a.Lookup(pc)
		if err != nil {
			if r, err = b.Lookup(pc); err != nil {
				r = Row{} // neither covers pc
			}
		}
		r.PC = pc
		out.add(r)
	}
	for _, t := range []*Table{a, b} {
		for _, s := range t.starts {
			out.starts = append(out.starts, uint32(t.base+uint64(s)-out.base))
		}
	}
	slices.Sort(out.starts)
	out.starts = slices.Compact(out.starts)
	return out
}
