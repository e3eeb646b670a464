// Package debuginfo maps the addresses of an ELF executable with DWARF
// (a kernel's debug vmlinux, from Debian's linux-image-…-dbg) to source
// lines, with the standard library's debug/elf and debug/dwarf.
//
// It answers, for link-time addresses: the line of one address, exactly
// as `addr2line -e FILE ADDR` prints it; the lines an address range's
// code comes from; the functions whose code comes from a source file;
// and symbol addresses. A kernel's debug vmlinux is large (Debian's is
// 600–900 MB, most of it .debug_info), so Open maps the file instead of
// reading it, and a lookup decodes only the one compilation unit that
// covers the address (found through .debug_aranges: debug/dwarf is given
// that unit's bytes alone) and its line table, which is kept.
//
// Executables and shared objects are read as they are; a relocatable
// file (a kernel module's .ko) is laid out and relocated first
// (reloc.go), so its addresses are the layout's, one slide per section
// away from the running module's.
package debuginfo

import (
	"cmp"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/internal/parallel"
)

// ErrNoDebugInfo is matched (errors.Is) by the error of Open for a file
// without DWARF line tables, and of Find when no such file is found.
var ErrNoDebugInfo = errors.New("no DWARF debug information")

// ErrNoLine is matched by the error of a lookup at an address no line
// table covers.
var ErrNoLine = errors.New("no line information")

// Line is one source line.
type Line struct {
	File string // as the line table names it (what addr2line prints)
	Line int
}

func (l Line) String() string { return l.File + ":" + strconv.Itoa(l.Line) }

// File is one ELF file with DWARF, open for lookups. Its methods are
// safe for concurrent use.
type File struct {
	Path    string
	BuildID string // GNU build id in hex; "" when the file has none

	osf    *os.File
	mapped []byte // the whole file, mapped read-only; nil if it could not be
	bo     binary.ByteOrder
	// The DWARF sections, slices of mapped: .debug_info, .debug_abbrev,
	// .debug_line, .debug_str, .debug_ranges, and DWARF 5's by name.
	info, abbrev, line, str, ranges []byte
	dwarf5                          map[string][]byte
	syms                            *elfsym.Table
	sections                        []Section // a relocatable file's layout (reloc.go)
	aranges                         []arange  // by lo

	mu     sync.Mutex
	closed bool
	// merged: a line whose rows in a function all cover no byte starts
	// at them (PlaceMergedLines); otherwise it starts no code there.
	merged  bool
	tables  map[dwarf.Offset]*lineTable // by the unit's header offset
	cus     []arange                    // every unit's ranges, when .debug_aranges does not do
	cusDone bool
}

// arange is one address range of a compilation unit.
type arange struct {
	lo, hi uint64
	cu     dwarf.Offset
}

// Open maps the ELF file at path and reads its symbols and the index of
// its compilation units. A file without .debug_info or .debug_line gives
// an error matching ErrNoDebugInfo.
func Open(name string) (*File, error) {
	osf, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	f, err := open(name, osf)
	if err != nil {
		osf.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return f, nil
}

func open(name string, osf *os.File) (*File, error) {
	ef, err := elf.NewFile(osf)
	if err != nil {
		return nil, fmt.Errorf("not an ELF file (%w)", err)
	}
	var rel *relLayout
	switch ef.Type {
	case elf.ET_EXEC, elf.ET_DYN:
	case elf.ET_REL:
		if rel, err = newRelLayout(ef); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%v: only executables, shared objects and relocatable files (kernel modules) are read", ef.Type)
	}
	f := &File{Path: name, osf: osf, tables: map[dwarf.Offset]*lineTable{}}
	if st, err := osf.Stat(); err == nil && st.Size() > 0 {
		if m, err := syscall.Mmap(int(osf.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED); err == nil {
			f.mapped = m
		}
	}
	sec := func(n string) ([]byte, error) {
		s := ef.Section(n)
		if s == nil || s.Type == elf.SHT_NOBITS {
			return nil, nil
		}
		var b []byte
		if s.Flags&elf.SHF_COMPRESSED == 0 && f.mapped != nil && s.Offset+s.Size <= uint64(len(f.mapped)) {
			b = f.mapped[s.Offset : s.Offset+s.Size]
		} else {
			var err error                      // sec runs on several goroutines at once
			if b, err = s.Data(); err != nil { // compressed, or not mapped: read (and inflate)
				return nil, err
			}
		}
		if rel != nil {
			return rel.relocate(ef, n, b)
		}
		return b, nil
	}
	// Read at once, each on a goroutine: a debug package's sections are
	// compressed (libc's 3 MB of them inflate in about 70 ms, .debug_info
	// alone half of it).
	var aranges []byte
	sections := []struct {
		name string
		p    *[]byte
		err  error
	}{{name: ".debug_info", p: &f.info}, {name: ".debug_abbrev", p: &f.abbrev}, {name: ".debug_line", p: &f.line},
		{name: ".debug_str", p: &f.str}, {name: ".debug_ranges", p: &f.ranges}, {name: ".debug_aranges", p: &aranges},
		{name: ".debug_line_str"}, {name: ".debug_str_offsets"}, {name: ".debug_addr"}, {name: ".debug_rnglists"}}
	dwarf5 := make([][]byte, len(sections))
	var wg sync.WaitGroup
	for i := range sections {
		s := &sections[i]
		if s.p == nil {
			s.p = &dwarf5[i]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			*s.p, s.err = sec(s.name)
		}()
	}
	wg.Wait()
	for _, s := range sections {
		if s.err != nil {
			f.unmap()
			return nil, fmt.Errorf("section %s: %w", s.name, s.err)
		}
	}
	if len(f.info) == 0 || len(f.line) == 0 {
		f.unmap()
		return nil, ErrNoDebugInfo
	}
	f.dwarf5 = map[string][]byte{}
	for i, b := range dwarf5 {
		if b != nil {
			f.dwarf5[sections[i].name] = b
		}
	}
	f.bo = ef.ByteOrder
	if _, _, _, err := f.unit(0); err != nil { // the first unit reads: the sections make sense
		f.unmap()
		return nil, err
	}
	f.aranges = parseAranges(aranges, ef.ByteOrder)
	if f.syms, err = elfsym.Read(ef); err != nil && !errors.Is(err, elfsym.ErrNoSymbols) {
		f.unmap()
		return nil, err
	}
	if rel != nil {
		f.syms, f.sections = rel.rebased(f.syms), rel.sections
	}
	f.BuildID, _ = elfsym.BuildID(ef)
	return f, nil
}

func (f *File) unmap() {
	if f.mapped != nil {
		syscall.Munmap(f.mapped)
		f.mapped = nil
	}
}

// Close unmaps the file. Nothing of it may be used afterwards.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unmap()
	f.closed, f.tables = true, nil
	return f.osf.Close()
}

// PlaceMergedLines makes LineAddrs, LineRangeAddrs and FuncLines place a
// line whose rows in a function all cover no byte (its statement merged
// into the next line's: gcc -O2's folded else-if) at its first such row,
// as gdb's breakpoint on it goes there, where by default (addr2line's
// view, which never names such a line) it starts no code. A user
// program's lines take it; the kernel's keep addr2line's view, where
// inlining leaves such rows at most instructions.
func (f *File) PlaceMergedLines() {
	f.mu.Lock()
	f.merged = true
	f.mu.Unlock()
}

// Symbols are the file's function and object symbols; nil for a file
// without a symbol table (FuncSymbols names its functions from DWARF).
func (f *File) Symbols() *elfsym.Table { return f.syms }

// parseAranges reads .debug_aranges: per set, a header (unit length,
// version, the unit's .debug_info offset, address and segment sizes),
// padding to twice the address size, then (address, length) pairs up to
// a (0, 0). A malformed set ends the parse; what was read is kept.
func parseAranges(b []byte, bo binary.ByteOrder) []arange {
	var out []arange
	for len(b) >= 4 {
		length, hdr := uint64(bo.Uint32(b)), 4
		off64 := false
		if length == 0xffffffff {
			if len(b) < 12 {
				break
			}
			length, hdr, off64 = bo.Uint64(b[4:]), 12, true
		}
		if length > uint64(len(b)-hdr) {
			break
		}
		set := b[:hdr+int(length)]
		b = b[hdr+int(length):]
		p := hdr + 2 // version
		var cu uint64
		if off64 {
			if len(set) < p+8 {
				continue
			}
			cu, p = bo.Uint64(set[p:]), p+8
		} else {
			if len(set) < p+4 {
				continue
			}
			cu, p = uint64(bo.Uint32(set[p:])), p+4
		}
		if len(set) < p+2 {
			continue
		}
		asize, ssize := int(set[p]), int(set[p+1])
		p += 2
		if asize != 8 && asize != 4 || ssize != 0 {
			continue
		}
		if r := p % (2 * asize); r != 0 {
			p += 2*asize - r
		}
		for ; p+2*asize <= len(set); p += 2 * asize {
			var lo, n uint64
			if asize == 8 {
				lo, n = bo.Uint64(set[p:]), bo.Uint64(set[p+8:])
			} else {
				lo, n = uint64(bo.Uint32(set[p:])), uint64(bo.Uint32(set[p+4:]))
			}
			if lo == 0 && n == 0 {
				break
			}
			if n > 0 {
				out = append(out, arange{lo: lo, hi: lo + n, cu: dwarf.Offset(cu)})
			}
		}
	}
	slices.SortFunc(out, func(a, b arange) int { return cmp.Compare(a.lo, b.lo) })
	return out
}

// find is the range of rs containing addr. Ranges do not overlap in a
// sane index; a few earlier ones are looked at in case some do.
func find(rs []arange, addr uint64) (arange, bool) {
	i := sort.Search(len(rs), func(i int) bool { return rs[i].lo > addr }) - 1
	for stop := i - 8; i >= 0 && i > stop; i-- {
		if addr < rs[i].hi {
			return rs[i], true
		}
	}
	return arange{}, false
}

// unitEnd is the end of the unit whose header is at hdr in .debug_info.
func (f *File) unitEnd(hdr dwarf.Offset) (dwarf.Offset, error) {
	b := f.info
	if uint64(hdr)+4 > uint64(len(b)) {
		return 0, fmt.Errorf(".debug_info offset %#x out of range", hdr)
	}
	n, p := uint64(f.bo.Uint32(b[hdr:])), uint64(hdr)+4
	if n == 0xffffffff {
		if p+8 > uint64(len(b)) {
			return 0, fmt.Errorf(".debug_info offset %#x out of range", hdr)
		}
		n, p = f.bo.Uint64(b[p:]), p+8
	}
	if n > uint64(len(b))-p {
		return 0, fmt.Errorf("unit at .debug_info offset %#x runs past the section", hdr)
	}
	return dwarf.Offset(p + n), nil
}

// unit decodes the one unit whose header is at hdr: debug/dwarf over
// that unit's bytes alone (offsets into the other sections are absolute,
// so its line table, strings and ranges read the same), which parses one
// abbreviation table instead of every unit's. It returns the unit's DIE
// and the end of the unit.
func (f *File) unit(hdr dwarf.Offset) (*dwarf.Data, *dwarf.Entry, dwarf.Offset, error) {
	end, err := f.unitEnd(hdr)
	if err != nil {
		return nil, nil, 0, err
	}
	d, err := dwarf.New(f.abbrev, nil, nil, f.info[hdr:end], f.line, nil, f.ranges, f.str)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("unit at .debug_info offset %#x: %w", hdr, err)
	}
	for n, b := range f.dwarf5 {
		if err := d.AddSection(n, b); err != nil {
			return nil, nil, 0, fmt.Errorf("section %s: %w", n, err)
		}
	}
	cu, err := d.Reader().Next()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("unit at .debug_info offset %#x: %w", hdr, err)
	}
	if cu == nil {
		return nil, nil, 0, fmt.Errorf("no unit at .debug_info offset %#x", hdr)
	}
	return d, cu, end, nil
}

// eachUnit calls fn with every unit of .debug_info, in order, until fn
// returns false or an error.
func (f *File) eachUnit(fn func(d *dwarf.Data, cu *dwarf.Entry, hdr dwarf.Offset) (bool, error)) error {
	for hdr := dwarf.Offset(0); int(hdr) < len(f.info); {
		d, cu, end, err := f.unit(hdr)
		if err != nil {
			return err
		}
		if more, err := fn(d, cu, hdr); err != nil || !more {
			return err
		}
		hdr = end
	}
	return nil
}

// unitAt is the compilation unit whose code holds addr: from
// .debug_aranges, else from every unit's DW_AT_ranges/low_pc (read once).
func (f *File) unitAt(addr uint64) (dwarf.Offset, error) {
	if r, ok := find(f.aranges, addr); ok {
		return r.cu, nil
	}
	if !f.cusDone {
		f.cusDone = true
		if err := f.scanUnits(); err != nil {
			return 0, err
		}
	}
	if r, ok := find(f.cus, addr); ok {
		return r.cu, nil
	}
	return 0, fmt.Errorf("%#x: no compilation unit covers it: %w", addr, ErrNoLine)
}

// scanUnits lists every unit's address ranges in f.cus, the units read
// on every CPU (libc's 1,700 units: each a debug/dwarf of its own, whose
// abbreviations are most of the cost). The caller holds f.mu.
func (f *File) scanUnits() error {
	var hdrs []dwarf.Offset
	for hdr := dwarf.Offset(0); int(hdr) < len(f.info); {
		end, err := f.unitEnd(hdr)
		if err != nil {
			return err
		}
		hdrs = append(hdrs, hdr)
		hdr = end
	}
	ranges, errs := make([][]arange, len(hdrs)), make([]error, len(hdrs))
	parallel.For(len(hdrs), func(i int) {
		d, cu, _, err := f.unit(hdrs[i])
		if err != nil {
			errs[i] = err
			return
		}
		if cu.Tag == dwarf.TagCompileUnit || cu.Tag == dwarf.TagPartialUnit {
			rs, _ := d.Ranges(cu)
			for _, r := range rs {
				if r[1] > r[0] {
					ranges[i] = append(ranges[i], arange{lo: r[0], hi: r[1], cu: hdrs[i]})
				}
			}
		}
	})
	// The units before the first that cannot be read, as a walk in
	// order would have listed them, and its error.
	for i, rs := range ranges {
		if errs[i] != nil {
			return errs[i]
		}
		f.cus = append(f.cus, rs...)
	}
	slices.SortFunc(f.cus, func(a, b arange) int { return cmp.Compare(a.lo, b.lo) })
	return nil
}

// Preload reads, on every CPU, the line tables of the units that hold
// addrs (link-time addresses), so that the lookups after it (LineAt,
// Lines) find them read: a coverage report of all of libc looks up
// 71,000 blocks in about 1,000 units' tables. An address no unit holds,
// or a table that cannot be read, is left for the lookup to report.
func (f *File) Preload(addrs []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock() // held throughout: the tables are read from the mapping Close unmaps
	if f.closed {
		return
	}
	seen := map[dwarf.Offset]bool{}
	var want []dwarf.Offset
	for _, a := range addrs {
		off, err := f.unitAt(a)
		if err != nil || seen[off] {
			continue
		}
		seen[off] = true
		if _, ok := f.tables[off]; !ok {
			want = append(want, off)
		}
	}
	tables := make([]*lineTable, len(want))
	parallel.For(len(want), func(i int) { tables[i], _ = f.readTable(want[i]) })
	for i, t := range tables {
		if t != nil {
			f.tables[want[i]] = t
		}
	}
}

// lineTable is one unit's line table as sequences of rows.
type lineTable struct {
	files []string
	seqs  []sequence // by start address
}

// sequence is a run of rows of ascending address; the last row is the
// end_sequence row, which holds no line.
type sequence struct{ rows []row }

type row struct {
	addr uint64
	file int32 // index into lineTable.files
	line int32
}

func (s *sequence) lo() uint64 { return s.rows[0].addr }
func (s *sequence) hi() uint64 { return s.rows[len(s.rows)-1].addr }

// table decodes (once) the line table of the unit at off. The caller
// holds f.mu.
func (f *File) table(off dwarf.Offset) (*lineTable, error) {
	if t, ok := f.tables[off]; ok {
		return t, nil
	}
	t, err := f.readTable(off)
	if t != nil {
		f.tables[off] = t
	}
	return t, err
}

// readTable decodes the line table of the unit at off. It reads only
// what Open set up, so tables of different units may be read at once
// (Preload). A unit without a line table gives an empty table; one whose
// table is corrupt gives the rows before the fault with the error (kept,
// as a lookup first made keeps it).
func (f *File) readTable(off dwarf.Offset) (*lineTable, error) {
	d, cu, _, err := f.unit(off)
	if err != nil {
		return nil, err
	}
	lr, err := d.LineReader(cu)
	if err != nil {
		return nil, err
	}
	t := &lineTable{}
	if lr == nil {
		return t, nil
	}
	compDir, _ := cu.Val(dwarf.AttrCompDir).(string)
	index := map[*dwarf.LineFile]int32{}
	fileOf := func(lf *dwarf.LineFile) int32 {
		if i, ok := index[lf]; ok {
			return i
		}
		name := ""
		if lf != nil {
			name = fileName(lf.Name, compDir)
		}
		i := int32(len(t.files))
		t.files = append(t.files, name)
		index[lf] = i
		return i
	}
	var e dwarf.LineEntry
	var cur []row
	for {
		if err = lr.Next(&e); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			} else {
				err = fmt.Errorf("line table of unit %#x: %w", off, err)
			}
			break
		}
		cur = append(cur, row{addr: e.Address, file: fileOf(e.File), line: int32(e.Line)})
		if e.EndSequence {
			// A sequence at address 0 is code the linker discarded.
			if len(cur) > 1 && cur[0].addr != 0 {
				t.seqs = append(t.seqs, sequence{rows: cur})
			}
			cur = nil
		}
	}
	slices.SortFunc(t.seqs, func(a, b sequence) int { return cmp.Compare(a.lo(), b.lo()) })
	return t, err
}

// fileName is a line table's file name as addr2line prints it: debug/dwarf
// joins a DWARF 5 file name with its directory entry but, unlike
// binutils, not a relative directory with the compilation directory.
func fileName(name, compDir string) string {
	if name == "" || compDir == "" || path.IsAbs(name) || strings.HasPrefix(name, compDir+"/") {
		return name
	}
	return compDir + "/" + name
}

// seq is the sequence of t holding addr.
func (t *lineTable) seq(addr uint64) *sequence {
	i := sort.Search(len(t.seqs), func(i int) bool { return t.seqs[i].lo() > addr }) - 1
	for ; i >= 0; i-- {
		if s := &t.seqs[i]; addr < s.hi() {
			return s
		}
		if i < len(t.seqs)-1 && t.seqs[i].hi() <= t.seqs[i+1].lo() {
			break // sorted and disjoint below here
		}
	}
	return nil
}

// LineAt is the line of the link-time address addr as addr2line prints
// it: the line-table row covering addr, of several rows at one address
// the last (binutils keeps only the last of them too).
func (f *File) LineAt(addr uint64) (Line, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, s, err := f.seqAt(addr)
	if err != nil {
		return Line{}, err
	}
	i := sort.Search(len(s.rows), func(i int) bool { return s.rows[i].addr > addr }) - 1
	r := s.rows[i]
	return Line{File: t.files[r.file], Line: int(r.line)}, nil
}

// seqAt finds the unit's table and the sequence holding addr. The
// caller holds f.mu.
func (f *File) seqAt(addr uint64) (*lineTable, *sequence, error) {
	if f.closed {
		return nil, nil, errors.New("debuginfo: file closed")
	}
	off, err := f.unitAt(addr)
	if err != nil {
		return nil, nil, err
	}
	t, err := f.table(off)
	if err != nil {
		return nil, nil, err
	}
	s := t.seq(addr)
	if s == nil {
		return nil, nil, fmt.Errorf("%#x: not in the line table of its unit: %w", addr, ErrNoLine)
	}
	return t, s, nil
}

// Lines are the lines the code of [lo, hi) comes from: every line-table
// row whose address range (up to the next row's address) overlaps it,
// with line 0 (code of no line) left out, each line once, ordered by
// file and line. A range no line table covers gives ErrNoLine.
func (f *File) Lines(lo, hi uint64) ([]Line, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// A block's lines are a handful: found again by a scan of out, with a
	// map only past 32. A map and a slice grown from nothing for each of
	// a report's 71,000 blocks cost more than the lookups.
	var seen map[Line]bool
	out := make([]Line, 0, 8)
	add := func(l Line) {
		switch {
		case seen != nil:
			if seen[l] {
				return
			}
			seen[l] = true
		case slices.Contains(out, l):
			return
		case len(out) >= 32:
			seen = make(map[Line]bool, 2*len(out))
			for _, o := range out {
				seen[o] = true
			}
			seen[l] = true
		}
		out = append(out, l)
	}
	for at := lo; at < hi; {
		t, s, err := f.seqAt(at)
		if err != nil {
			if at == lo {
				return nil, err
			}
			break // the range runs past the code the tables describe
		}
		i := sort.Search(len(s.rows), func(i int) bool { return s.rows[i].addr > at }) - 1
		for ; i < len(s.rows)-1 && s.rows[i].addr < hi; i++ {
			r := s.rows[i]
			if r.line == 0 || s.rows[i+1].addr == r.addr {
				continue
			}
			add(Line{File: t.files[r.file], Line: int(r.line)})
		}
		at = s.hi()
	}
	SortLines(out)
	return out, nil
}

// SortLines orders lines by file, then line number.
func SortLines(ls []Line) {
	slices.SortFunc(ls, func(a, b Line) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return a.Line - b.Line
	})
}

// Func is a function symbol.
type Func struct {
	Name string
	Addr uint64 // link-time
	Line Line   // of its first instruction (LineAt)
}

// MatchFile reports whether the line-table file name names the source
// file given as suffix: equal, or ending in "/"+suffix, both cleaned
// ("fs/namei.c" matches "debian/build/x/fs/namei.c", not "xfs/namei.c").
func MatchFile(name, suffix string) bool {
	name, suffix = path.Clean(name), path.Clean(strings.TrimPrefix(suffix, "./"))
	return name == suffix || strings.HasSuffix(name, "/"+suffix)
}

// FuncsInFile are the functions whose code comes from the source file
// named by suffix (see MatchFile): of the units whose line tables name
// the file, every subprogram with code whose first instruction's line is
// in the file, named by the symbol table's function symbol at that
// address, in address order. Out-of-line copies of a header's inline
// functions count for the header. None gives an error matching
// ErrNoLine.
func (f *File) FuncsInFile(suffix string) ([]Func, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, errors.New("debuginfo: file closed")
	}
	var out []Func
	seen := map[uint64]bool{}
	err := f.eachUnit(func(d *dwarf.Data, cu *dwarf.Entry, _ dwarf.Offset) (bool, error) {
		if cu.Tag != dwarf.TagCompileUnit {
			return true, nil
		}
		lr, err := d.LineReader(cu)
		if err != nil || lr == nil {
			return true, nil
		}
		compDir, _ := cu.Val(dwarf.AttrCompDir).(string)
		named := false
		for _, lf := range lr.Files() {
			if lf != nil && MatchFile(fileName(lf.Name, compDir), suffix) {
				named = true
				break
			}
		}
		if !named || !cu.Children {
			return true, nil
		}
		// The unit's subprograms with code: direct children of the unit,
		// at their low_pc, or at the start of each of their ranges (a
		// function split into foo and foo.cold gives DW_AT_ranges).
		return topLevel(d, func(e *dwarf.Entry) (bool, error) {
			if e.Tag != dwarf.TagSubprogram {
				return true, nil
			}
			var starts []uint64
			if lo, ok := e.Val(dwarf.AttrLowpc).(uint64); ok {
				starts = append(starts, lo)
			} else if e.Val(dwarf.AttrRanges) != nil {
				rs, _ := d.Ranges(e)
				for _, r := range rs {
					starts = append(starts, r[0])
				}
			}
			for _, lo := range starts {
				if lo != 0 && !seen[lo] {
					seen[lo] = true
					if fn, ok := f.funcAt(lo, suffix); ok {
						out = append(out, fn)
					}
				}
			}
			return true, nil
		})
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no function's code comes from %s: %w", suffix, ErrNoLine)
	}
	slices.SortFunc(out, func(a, b Func) int { return cmp.Compare(a.Addr, b.Addr) })
	return out, nil
}

// funcAt is the function symbol starting at addr if its first line is in
// the file suffix names. The caller holds f.mu.
func (f *File) funcAt(addr uint64, suffix string) (Func, bool) {
	if f.syms == nil {
		return Func{}, false
	}
	s, off, ok := f.syms.Lookup(addr)
	if !ok || off != 0 || s.Kind != elfsym.Func {
		return Func{}, false
	}
	t, seq, err := f.seqAt(addr)
	if err != nil {
		return Func{}, false
	}
	i := sort.Search(len(seq.rows), func(i int) bool { return seq.rows[i].addr > addr }) - 1
	r := seq.rows[i]
	l := Line{File: t.files[r.file], Line: int(r.line)}
	if !MatchFile(l.File, suffix) {
		return Func{}, false
	}
	return Func{Name: s.Name, Addr: addr, Line: l}, true
}

// KernelBuildID is the GNU build id, in hex, in a kernel's notes
// (/sys/kernel/notes).
func KernelBuildID(notesPath string) (string, error) {
	b, err := os.ReadFile(notesPath)
	if err != nil {
		return "", err
	}
	id, ok := elfsym.NotesBuildID(binary.LittleEndian, b)
	if !ok {
		return "", fmt.Errorf("%s: %w", notesPath, elfsym.ErrNoBuildID)
	}
	return id, nil
}

// BuildIDPath is where a separate debug file of build id id (hex) is
// installed, /usr/lib/debug/.build-id/xx/rest.debug; "" for an id too
// short to split.
func BuildIDPath(id string) string {
	if len(id) <= 2 {
		return ""
	}
	return path.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug")
}

// Search says where Find looks and what it must match.
type Search struct {
	Root    string // prepended to every path ("" for /); tests use a directory
	Release string // the kernel release (uname -r); "" skips the release paths
	BuildID string // the kernel's build id; "" skips the build-id path and the check
}

// Paths are the files Find tries, in order: the build-id link
// /usr/lib/debug/.build-id/xx/rest.debug, then Debian's
// linux-image-…-dbg files /usr/lib/debug/boot/vmlinux-RELEASE and
// /usr/lib/debug/lib/modules/RELEASE/vmlinux.
func (s Search) Paths() []string {
	var ps []string
	if p := BuildIDPath(s.BuildID); p != "" {
		ps = append(ps, p)
	}
	if s.Release != "" {
		ps = append(ps, "/usr/lib/debug/boot/vmlinux-"+s.Release, path.Join("/usr/lib/debug/lib/modules", s.Release, "vmlinux"))
	}
	for i := range ps {
		ps[i] = s.Root + ps[i]
	}
	return ps
}

// NotFoundError is Find's error: the files it tried and why each was
// not taken. It matches ErrNoDebugInfo.
type NotFoundError struct {
	Search Search
	Module string   // FindModule's: the module's name
	Tried  []string // "path: why"
}

func (e *NotFoundError) Error() string {
	if e.Module != "" {
		return e.moduleMessage()
	}
	what := "the running kernel"
	if e.Search.Release != "" {
		what = e.Search.Release
	}
	if e.Search.BuildID != "" {
		what += " (build id " + e.Search.BuildID + ")"
	}
	return e.message("no debug vmlinux of "+what+" found", "--vmlinux PATH")
}

// message is what was not found, the files tried, and how to fix it:
// the release's -dbg package, or the flag flag.
func (e *NotFoundError) message(what, flag string) string {
	if len(e.Tried) > 0 {
		what += "; tried " + strings.Join(e.Tried, "; ")
	}
	rel := e.Search.Release
	if rel == "" {
		rel = "RELEASE"
	}
	return what + " (install linux-image-" + rel + "-dbg, or give " + flag + ")"
}

// Brief says the same in one short line, without the files tried.
func (e *NotFoundError) Brief() string {
	if e.Module != "" {
		return "no debug file of module " + e.Module + " (install linux-image-" + e.Search.Release + "-dbg, or give --module-debug DIR)"
	}
	rel := e.Search.Release
	if rel == "" {
		rel = "RELEASE"
	}
	return "no debug vmlinux of " + rel + " under /usr/lib/debug (install linux-image-" + rel + "-dbg, or give --vmlinux PATH)"
}

func (e *NotFoundError) Is(target error) bool { return target == ErrNoDebugInfo }

// BuildIDMismatchError is a debug file of another build than the kernel's.
type BuildIDMismatchError struct {
	Path, Have, Want string
	Whose            string // whose build id Want is; "" the kernel's
}

func (e *BuildIDMismatchError) Error() string {
	have, whose := e.Have, e.Whose
	if have == "" {
		have = "none"
	}
	if whose == "" {
		whose = "the kernel's"
	}
	return fmt.Sprintf("%s: build id %s, %s is %s", e.Path, have, whose, e.Want)
}

// Find opens the first of s.Paths() that has DWARF and, when s.BuildID
// is known, the same build id. Nothing found gives a *NotFoundError.
func Find(s Search) (*File, error) {
	nf := &NotFoundError{Search: s}
	for _, p := range s.Paths() {
		if _, err := os.Stat(p); err != nil {
			nf.Tried = append(nf.Tried, p+": not there")
			continue
		}
		if f := nf.open(p, s.BuildID); f != nil {
			return f, nil
		}
	}
	return nil, nf
}

// open opens p when it has DWARF and build id id ("": any), else says
// in e.Tried why not and gives nil.
func (e *NotFoundError) open(p, id string) *File {
	f, err := Open(p)
	if err == nil {
		if err = f.Check(id); err != nil {
			f.Close()
			if m := (*BuildIDMismatchError)(nil); errors.As(err, &m) && e.Module != "" {
				m.Whose = "the loaded module's"
			}
		}
	}
	if err != nil {
		e.Tried = append(e.Tried, err.Error())
		return nil
	}
	return f
}

// Check compares the file's build id with want (skipped when want is "").
func (f *File) Check(want string) error {
	if want != "" && !strings.EqualFold(f.BuildID, want) {
		return &BuildIDMismatchError{Path: f.Path, Have: f.BuildID, Want: want}
	}
	return nil
}

// ErrNoVariable is matched by Variable's error for a name no unit
// defines.
var ErrNoVariable = errors.New("no such variable in the DWARF")

// Variable is the declared type of the global variable name, from the
// unit that defines it, else from a declaration (an alias the linker
// script makes, as jiffies, is never defined in C): where the
// kernel's BTF, which types per-CPU variables only, cannot say. It scans
// every unit's top-level entries, a few seconds for a kernel's.
func (f *File) Variable(name string) (dwarf.Type, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, errors.New("debuginfo: file closed")
	}
	var found, declared dwarf.Type
	err := f.eachUnit(func(d *dwarf.Data, cu *dwarf.Entry, _ dwarf.Offset) (bool, error) {
		if !cu.Children {
			return true, nil
		}
		// A definition of a variable declared extern in the same unit
		// names its declaration (DW_AT_specification), which has the
		// name and the type.
		decls := map[dwarf.Offset]*dwarf.Entry{}
		return topLevel(d, func(e *dwarf.Entry) (bool, error) {
			if e.Tag != dwarf.TagVariable {
				return true, nil
			}
			n, _ := e.Val(dwarf.AttrName).(string)
			def := e
			if spec, ok := e.Val(dwarf.AttrSpecification).(dwarf.Offset); ok && decls[spec] != nil {
				def, n = decls[spec], name
			}
			switch {
			case n != name:
			case e.Val(dwarf.AttrDeclaration) != nil:
				decls[e.Offset] = e
				if declared == nil {
					// Kept in case no unit defines it: a linker
					// script's alias (jiffies) has declarations only.
					if off, ok := e.Val(dwarf.AttrType).(dwarf.Offset); ok {
						declared, _ = d.Type(off)
					}
				}
			case e.Val(dwarf.AttrLocation) != nil:
				off, ok := def.Val(dwarf.AttrType).(dwarf.Offset)
				if !ok {
					return false, fmt.Errorf("variable %s has no type in its DWARF", name)
				}
				t, err := d.Type(off)
				if err != nil {
					return false, fmt.Errorf("variable %s: %w", name, err)
				}
				found = t
				return false, nil
			}
			return true, nil
		})
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		found = declared
	}
	if found == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoVariable, name)
	}
	return found, nil
}

// topLevel calls fn with each entry directly under d's unit, until fn
// returns false or an error; it returns fn's last answer (true when the
// unit ran out).
func topLevel(d *dwarf.Data, fn func(e *dwarf.Entry) (bool, error)) (bool, error) {
	rd := d.Reader()
	rd.Next()
	for {
		e, err := rd.Next()
		if err != nil {
			return false, err
		}
		if e == nil || e.Tag == 0 {
			return true, nil
		}
		if more, err := fn(e); err != nil || !more {
			return more, err
		}
		if e.Children {
			rd.SkipChildren()
		}
	}
}

// everyEntry calls fn with each entry of the one unit d holds, the unit's
// own first, and goes into an entry's children unless fn says to skip
// them.
func everyEntry(d *dwarf.Data, fn func(e *dwarf.Entry) (skipChildren bool)) error {
	rd := d.Reader()
	for {
		e, err := rd.Next()
		if err != nil || e == nil {
			return err
		}
		if fn(e) && e.Children {
			rd.SkipChildren()
		}
	}
}

// OpenOrFind opens the DWARF of the ELF file at path: its own, else its
// separate debug file by build id (Find, which checks the id): a user
// binary or library as a distribution ships it.
func OpenOrFind(path string) (*File, error) {
	dbg, err := Open(path)
	if err == nil || !errors.Is(err, ErrNoDebugInfo) {
		return dbg, err
	}
	f, ferr := elfsym.OpenFile(path)
	if ferr != nil {
		return nil, ferr
	}
	id, _ := elfsym.BuildID(f)
	f.Close()
	if id == "" {
		return nil, fmt.Errorf("%w, and no build id to find a separate debug file by", err)
	}
	if dbg, ferr := Find(Search{BuildID: id}); ferr == nil {
		return dbg, nil
	}
	return nil, fmt.Errorf("%w, and no %s of build id %s (install its package's -dbg or -dbgsym package, or build it with -g)", err, BuildIDPath(id), id)
}
