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
	base uint64
	rows []row

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

// Bytes is the memory the rows take.
func (t *Table) Bytes() int { return len(t.rows) * RowBytes }

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
	}
	for _, rule := range []*Rule{&out.RBP, &out.RA} {
		if rule.Kind == RuleRegister {
			rule.Reg = Reg(rule.Offset)
		}
		if rule.Kind != RuleOffset && rule.Kind != RuleValOffset {
			rule.Offset = 0
		}
	}
	return out
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

// compact packs r, or reports that it does not fit.
func (t *Table) compact(r Row) (row, bool) {
	c := row{pc: uint32(r.PC - t.base)}
	switch r.CFA.Kind {
	case CFARegOffset:
		if r.CFA.Reg > 0x1f || r.CFA.Offset != int64(int32(r.CFA.Offset)) {
			return row{}, false
		}
		c.cfa = uint8(CFARegOffset)<<5 | uint8(r.CFA.Reg)
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

// Open compiles the unwind table of the ELF file at path.
func Open(path string) (*Table, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := Compile(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Compile reads the CFI of f (.eh_frame first; .debug_frame adds the
// functions .eh_frame does not describe) and compiles it into a table.
// Where FDEs overlap, the one that starts later takes over from its start.
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
	t := &Table{}
	var fdes []fde
	for _, name := range []string{".eh_frame", ".debug_frame"} {
		s := f.Section(name)
		if s == nil || s.Type == elf.SHT_NOBITS {
			continue
		}
		data, err := s.Data() // decompresses SHF_COMPRESSED sections
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		sec := &cfiSection{name: name, data: data, eh: name == ".eh_frame"}
		if sec.eh {
			sec.addr = s.Addr
		}
		more, err := parseCFI(sec, b)
		if err != nil {
			return nil, err
		}
		fdes = append(fdes, more...)
		t.Sections = append(t.Sections, name)
	}
	if t.Sections == nil {
		return nil, ErrNoCFI
	}
	rows, err := t.merge(fdes)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return t, nil
	}
	t.base = rows[0].PC
	t.rows = make([]row, 0, len(rows))
	for _, r := range rows {
		if r.PC-t.base > math.MaxUint32 {
			return nil, fmt.Errorf("CFI spans more than 4 GiB of text (%#x..%#x)", t.base, r.PC)
		}
		c, ok := t.compact(r)
		if !ok {
			t.Unfit++
			c, _ = t.compact(Row{PC: r.PC, CFA: CFA{Kind: CFAExpression}})
		}
		t.rows = append(t.rows, c)
	}
	return t, nil
}

// merge orders the FDEs by start (FDEs of an earlier section first at
// one start; a later duplicate is dropped), runs each, and joins their
// rows with CFANone rows over the gaps between them.
func (t *Table) merge(fdes []fde) ([]Row, error) {
	slices.SortStableFunc(fdes, func(a, b fde) int { return cmp.Compare(a.begin, b.begin) })
	var rows []Row
	var prevBegin, prevEnd uint64
	started := false
	for i := range fdes {
		f := &fdes[i]
		if f.begin >= f.end || (started && f.begin == prevBegin) {
			continue
		}
		frows, err := fdeRows(f)
		if err != nil {
			t.Skipped++
			frows = []Row{{PC: f.begin}}
		}
		t.FDEs++
		if started && prevEnd < f.begin {
			rows = appendRow(rows, Row{PC: prevEnd})
		}
		for _, r := range frows {
			rows = appendRow(rows, r)
		}
		prevBegin, prevEnd, started = f.begin, f.end, true
	}
	if started {
		rows = appendRow(rows, Row{PC: prevEnd})
	}
	return rows, nil
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
