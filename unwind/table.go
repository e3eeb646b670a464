package unwind

import (
	"cmp"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"unsafe"

	"github.com/kinst/kinst/internal/elfsym"
)

// row is the compact form of a Row: 16 bytes.
type row struct {
	pc     uint32 // pc - Table.base
	cfaOff int32  // CFARegOffset and CFAPLT offset
	rbpOff int32  // RuleOffset/RuleValOffset offset, RuleRegister register
	raOff  int16  // likewise for the return address
	cfa    uint8  // CFAKind<<5 | register (CFARegOffset) or threshold (CFAPLT)
	kinds  uint8  // rbp RuleKind | return-address RuleKind<<4
}

// RowBytes is the memory one row of a Table takes.
const RowBytes = int(unsafe.Sizeof(row{}))

// Table is the unwind rows of one file, sorted by pc, at link-time
// addresses. It is immutable once compiled and safe for concurrent use.
type Table struct {
	base   uint64
	rows   []row
	starts []uint32 // FDE starts - base, sorted: function entries (4 bytes per FDE)

	// FDEs is the number of FDEs compiled; Skipped those left out
	// because their instructions could not be interpreted (the rows of
	// their range say CFANone); Unfit the rows whose offsets do not fit
	// the compact form (kept as CFAExpression).
	FDEs, Skipped, Unfit int
	// Sections are the CFI sections read, in order of precedence.
	Sections []string
}

// ErrNoFDE is matched by every NoFDEError.
var ErrNoFDE = errors.New("no FDE covers the pc")

// NoFDEError is a pc that no FDE of the table covers.
type NoFDEError struct{ PC uint64 }

func (e *NoFDEError) Error() string { return fmt.Sprintf("no FDE covers pc %#x", e.PC) }

func (e *NoFDEError) Is(target error) bool { return target == ErrNoFDE }

// ErrNoCFI is returned for a file with neither .eh_frame nor .debug_frame.
var ErrNoCFI = errors.New("no .eh_frame or .debug_frame section")

// ErrUnsupportedFile is returned for an ELF file that is not 64-bit
// little-endian x86-64.
var ErrUnsupportedFile = errors.New("not a 64-bit little-endian x86-64 ELF file")

// Len is the number of rows.
func (t *Table) Len() int { return len(t.rows) }

// Bytes is the memory the table takes: its rows and FDE starts.
func (t *Table) Bytes() int { return len(t.rows)*RowBytes + len(t.starts)*4 }

// Row returns row i in its expanded form.
func (t *Table) Row(i int) Row {
	r := t.rows[i]
	out := Row{
		PC:  t.base + uint64(r.pc),
		RBP: Rule{Kind: RuleKind(r.kinds & 0xf), Offset: int64(r.rbpOff)},
		RA:  Rule{Kind: RuleKind(r.kinds >> 4), Offset: int64(r.raOff)},
	}
	out.CFA.Kind = CFAKind(r.cfa >> 5)
	switch out.CFA.Kind {
	case CFARegOffset:
		out.CFA.Reg = Reg(r.cfa & 0x1f)
		out.CFA.Offset = int64(r.cfaOff)
	case CFAPLT:
		out.CFA.Threshold = r.cfa & 0x1f
		out.CFA.Offset = int64(r.cfaOff)
	case CFADeref:
		out.CFA.Reg = Reg(r.cfa & 0x1f)
		out.CFA.Offset = int64(r.cfaOff)
	}
	out.RBP, out.RA = expandRule(out.RBP), expandRule(out.RA)
	return out
}

// expandRule moves a register number out of the offset field.
func expandRule(r Rule) Rule {
	switch r.Kind {
	case RuleRegister:
		return Rule{Kind: r.Kind, Reg: Reg(r.Offset)}
	case RuleOffset, RuleValOffset, RuleAtSP, RuleAtBP:
		return r
	}
	return Rule{Kind: r.Kind}
}

// Lookup returns the row in effect at pc (a link-time address).
func (t *Table) Lookup(pc uint64) (Row, error) {
	if pc < t.base || pc-t.base > math.MaxUint32 {
		return Row{}, &NoFDEError{PC: pc}
	}
	off := uint32(pc - t.base)
	i := sort.Search(len(t.rows), func(i int) bool { return t.rows[i].pc > off }) - 1
	if i < 0 || CFAKind(t.rows[i].cfa>>5) == CFANone {
		return Row{}, &NoFDEError{PC: pc}
	}
	return t.Row(i), nil
}

// FuncStart returns the start of the FDE that covers pc (a link-time
// address): for compiled code, the entry of the function containing pc.
func (t *Table) FuncStart(pc uint64) (uint64, error) {
	if _, err := t.Lookup(pc); err != nil {
		return 0, err
	}
	off := uint32(pc - t.base)
	i := sort.Search(len(t.starts), func(i int) bool { return t.starts[i] > off }) - 1
	if i < 0 {
		return 0, &NoFDEError{PC: pc}
	}
	return t.base + uint64(t.starts[i]), nil
}

// compact packs r, or reports that it does not fit.
func (t *Table) compact(r Row) (row, bool) {
	c := row{pc: uint32(r.PC - t.base)}
	switch r.CFA.Kind {
	case CFARegOffset, CFADeref:
		if r.CFA.Reg > 0x1f || r.CFA.Offset != int64(int32(r.CFA.Offset)) {
			return row{}, false
		}
		c.cfa = uint8(r.CFA.Kind)<<5 | uint8(r.CFA.Reg)
		c.cfaOff = int32(r.CFA.Offset)
	case CFAPLT:
		if r.CFA.Threshold > 0x1f || r.CFA.Offset != int64(int32(r.CFA.Offset)) {
			return row{}, false
		}
		c.cfa = uint8(CFAPLT)<<5 | r.CFA.Threshold
		c.cfaOff = int32(r.CFA.Offset)
	default:
		c.cfa = uint8(r.CFA.Kind) << 5
	}
	rbp := r.RBP.Offset
	if r.RBP.Kind == RuleRegister {
		rbp = int64(r.RBP.Reg)
	}
	ra := r.RA.Offset
	if r.RA.Kind == RuleRegister {
		ra = int64(r.RA.Reg)
	}
	if rbp != int64(int32(rbp)) || ra != int64(int16(ra)) {
		return row{}, false
	}
	c.rbpOff, c.raOff = int32(rbp), int16(ra)
	c.kinds = uint8(r.RBP.Kind) | uint8(r.RA.Kind)<<4
	return c, true
}

// Open compiles the unwind table of the ELF file at path: its CFI, as
// readelf shows it, or for a Go binary without any (linked with
// -ldflags=-w), the rows of its .gopclntab (see CompileGo). The unwinder
// of a process (Cache) also fills the gaps of a cgo binary's .eh_frame
// with .gopclntab rows (see WithGo).
func Open(path string) (*Table, error) {
	f, err := elfsym.OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := Compile(f)
	if errors.Is(err, ErrNoCFI) {
		if gt := WithGo(nil, f); gt != nil {
			t, err = gt, nil // a Go binary without DWARF: .gopclntab
		}
	}
	if err != nil {
		return nil, elfsym.WithPath(path, err)
	}
	return t, nil
}

// Compile reads the CFI of f (.eh_frame first; .debug_frame adds the
// functions .eh_frame does not describe) and compiles it into a table.
// Where FDEs overlap, the one that starts later takes over from its start.
// In a relocatable object the relocations of the CFI sections are applied
// first (see relocate).
func Compile(f *elf.File) (*Table, error) {
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Machine != elf.EM_X86_64 {
		return nil, ErrUnsupportedFile
	}
	b := bases{readPtr: imageReader(f)}
	if s := f.Section(".text"); s != nil {
		b.text = s.Addr
	}
	if s := f.Section(".got"); s != nil {
		b.data = s.Addr
	}
	var secs []*cfiSection
	for _, name := range []string{".eh_frame", ".debug_frame"} {
		s := f.Section(name)
		if s == nil || s.Type == elf.SHT_NOBITS {
			continue
		}
		data, err := elfsym.SectionData(s) // decompresses SHF_COMPRESSED sections
		if err != nil {
			return nil, err
		}
		if f.Type == elf.ET_REL {
			if err := relocate(f, s, data); err != nil {
				return nil, err
			}
		}
		sec := &cfiSection{name: name, data: data, eh: name == ".eh_frame"}
		if sec.eh {
			sec.addr = s.Addr
		}
		secs = append(secs, sec)
	}
	if secs == nil {
		return nil, ErrNoCFI
	}
	return compile(secs, b)
}

// compile parses the sections, in order of precedence, and merges their
// FDEs into a table.
func compile(secs []*cfiSection, b bases) (*Table, error) {
	t := &Table{}
	var fdes []fde
	for _, sec := range secs {
		more, err := parseCFI(sec, b)
		if err != nil {
			return nil, err
		}
		if fdes == nil {
			fdes = more
		} else {
			fdes = append(fdes, more...)
		}
		t.Sections = append(t.Sections, sec.name)
	}
	t.merge(fdes)
	return t, nil
}

// merge orders the FDEs by start (FDEs of an earlier section first at
// one start; a later duplicate is dropped), runs each, and joins their
// rows with CFANone rows over the gaps between them.
func (t *Table) merge(fdes []fde) {
	// Sort keys without pointers: moving the FDEs themselves would cost
	// a write barrier per move.
	type key struct {
		begin uint64
		i     int32
	}
	keys := make([]key, len(fdes))
	for i := range fdes {
		keys[i] = key{fdes[i].begin, int32(i)}
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := cmp.Compare(a.begin, b.begin); c != 0 {
			return c
		}
		return cmp.Compare(a.i, b.i) // section order, then file order
	})
	kept := make([]*fde, 0, len(fdes))
	for _, k := range keys {
		f := &fdes[k.i]
		if f.begin >= f.end || (len(kept) > 0 && f.begin == kept[len(kept)-1].begin) {
			continue
		}
		if len(kept) > 0 && f.end-kept[0].begin > math.MaxUint32 {
			t.Skipped++ // beyond the 4 GiB a table spans
			continue
		}
		kept = append(kept, f)
	}
	if len(kept) == 0 {
		return
	}
	t.base = kept[0].begin
	// A row per location an FDE's program reaches: at most one per two
	// bytes of instructions (an advance and a rule), plus a gap row each.
	est := 2 * len(kept)
	for _, f := range kept {
		est += len(f.insns) / 2
	}
	t.rows = make([]row, 0, est)
	t.starts = make([]uint32, 0, len(kept))
	in := &interp{}
	var prevEnd uint64
	for i, f := range kept {
		frows, err := in.fdeRows(f)
		if err != nil {
			t.Skipped++
			frows = append(frows[:0], Row{PC: f.begin})
		}
		t.FDEs++
		t.starts = append(t.starts, uint32(f.begin-t.base))
		if i > 0 && prevEnd < f.begin {
			t.add(Row{PC: prevEnd})
		}
		for _, r := range frows {
			t.add(r)
		}
		prevEnd = f.end
	}
	t.add(Row{PC: prevEnd})
	t.rows = slices.Clone(t.rows) // the table lives long: no spare capacity
}

// add appends r to the rows with the rules of appendRow.
func (t *Table) add(r Row) {
	c, ok := t.compact(r)
	if !ok {
		t.Unfit++
		c, _ = t.compact(Row{PC: r.PC, CFA: CFA{Kind: CFAExpression}})
	}
	for n := len(t.rows); n > 0 && t.rows[n-1].pc >= c.pc; n = len(t.rows) {
		t.rows = t.rows[:n-1]
	}
	if n := len(t.rows); n > 0 {
		last := t.rows[n-1]
		last.pc = c.pc
		if last == c {
			return
		}
	}
	t.rows = append(t.rows, c)
}

// imageReader reads 8-byte words of f's loaded image (for indirect
// pointers).
func imageReader(f *elf.File) func(addr uint64) (uint64, bool) {
	return func(addr uint64) (uint64, bool) {
		for _, s := range f.Sections {
			if s.Flags&elf.SHF_ALLOC == 0 || s.Type == elf.SHT_NOBITS || addr < s.Addr || addr+8 > s.Addr+s.Size {
				continue
			}
			var b [8]byte
			if _, err := s.ReadAt(b[:], int64(addr-s.Addr)); err != nil {
				return 0, false
			}
			return binary.LittleEndian.Uint64(b[:]), true
		}
		return 0, false
	}
}
