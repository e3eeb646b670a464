// Package elfsym owns the symbols of one ELF file: its function and object
// symbols in an array sorted by address, searched in O(log n) both ways
// (address → name+offset, name → address), and the file's GNU build id,
// which callers use as the key of per-file caches.
//
// Addresses in a Table are link-time addresses (st_value). For a
// position-independent executable or shared object mapped into a process,
// subtract the load bias (see LoadBias) from a runtime address before a
// lookup. A Table is immutable once built and safe for concurrent use.
package elfsym

import (
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
)

// Kind says what a symbol names.
type Kind uint8

const (
	Func   Kind = iota + 1 // STT_FUNC, or STT_GNU_IFUNC (an indirect-function resolver)
	Object                 // STT_OBJECT: data
)

func (k Kind) String() string {
	switch k {
	case Func:
		return "func"
	case Object:
		return "object"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Symbol is one function or object.
type Symbol struct {
	Name string // without a symbol version ("memcpy", not "memcpy@@GLIBC_2.14")
	Addr uint64 // link-time address
	Size uint64 // 0 when the symbol table gives none
	Kind Kind
	Bind elf.SymBind
	// Section is the index of the section the symbol lies in. In a
	// relocatable file (a kernel module .ko) Addr is an offset into it.
	Section elf.SectionIndex
	// Indirect: an STT_GNU_IFUNC, whose code is the resolver that picks
	// the implementation when the program is loaded, not the function.
	Indirect bool
}

// ErrNoSymbols is returned for a file with neither .symtab nor .dynsym
// function or object symbols.
var ErrNoSymbols = errors.New("no function or object symbols")

// Table is the symbols of one file (or another source, see New), sorted by
// address.
type Table struct {
	syms    []Symbol // by Addr, then by preference (see better)
	byName  []int32  // indices into syms, by Name, then by preference
	buildID string
	source  string
	segs    Segments // for LoadBias
}

// Open reads the symbols of the ELF file at path.
func Open(path string) (*Table, error) {
	f, err := OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// OpenFile opens an ELF file with an error that says so when path is not
// one.
func OpenFile(path string) (*elf.File, error) {
	f, err := elf.Open(path)
	if err != nil {
		if _, serr := os.Stat(path); serr != nil {
			return nil, err
		}
		if derr := diagnose(path); derr != nil {
			return nil, derr
		}
		var fe *elf.FormatError
		if errors.As(err, &fe) {
			return nil, fmt.Errorf("%s: not an ELF file (%w)", path, err)
		}
		return nil, fmt.Errorf("%s: reading the ELF headers: %w", path, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
		if err := checkSections(path, f, fi.Size()); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// Read takes the symbols from .symtab, or from .dynsym when the file is
// stripped. Undefined, absolute and TLS symbols are left out: they are not
// addresses in the file's image.
func Read(f *elf.File) (*Table, error) {
	source := ".symtab"
	raw, err := f.Symbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("reading .symtab: %w", err)
	}
	syms := convert(raw)
	if len(syms) == 0 {
		source = ".dynsym"
		raw, err = f.DynamicSymbols()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return nil, fmt.Errorf("reading .dynsym: %w", err)
		}
		syms = convert(raw)
	}
	if len(syms) == 0 {
		return nil, ErrNoSymbols
	}
	t := New(syms)
	t.source = source
	t.buildID, _ = BuildID(f)
	t.segs = LoadSegments(f)
	return t, nil
}

func convert(raw []elf.Symbol) []Symbol {
	var syms []Symbol
	for _, s := range raw {
		var kind Kind
		switch elf.ST_TYPE(s.Info) {
		case elf.STT_FUNC, elf.STT_GNU_IFUNC:
			kind = Func
		case elf.STT_OBJECT:
			kind = Object
		default:
			continue
		}
		if s.Section == elf.SHN_UNDEF || s.Section == elf.SHN_ABS || s.Section == elf.SHN_COMMON {
			continue
		}
		name := s.Name
		if i := strings.IndexByte(name, '@'); i > 0 { // versioned names in old-style symtabs
			name = name[:i]
		}
		syms = append(syms, Symbol{Name: name, Addr: s.Value, Size: s.Size, Kind: kind, Bind: elf.ST_BIND(s.Info), Section: s.Section,
			Indirect: elf.ST_TYPE(s.Info) == elf.STT_GNU_IFUNC})
	}
	return syms
}

// New builds a table from symbols of any source (a kernel's kallsyms, for
// instance). It takes ownership of syms.
func New(syms []Symbol) *Table {
	slices.SortStableFunc(syms, func(a, b Symbol) int {
		if a.Addr != b.Addr {
			if a.Addr < b.Addr {
				return -1
			}
			return 1
		}
		return better(a, b)
	})
	byName := make([]int32, len(syms))
	for i := range byName {
		byName[i] = int32(i)
	}
	slices.SortStableFunc(byName, func(i, j int32) int {
		if c := strings.Compare(syms[i].Name, syms[j].Name); c != 0 {
			return c
		}
		return better(syms[i], syms[j])
	})
	return &Table{syms: syms, byName: byName}
}

// better orders aliases: functions before objects, sized before unsized,
// global before weak before local, then by name. The first alias is the
// one Lookup reports.
func better(a, b Symbol) int {
	rank := func(s Symbol) int {
		r := 0
		if s.Kind != Func {
			r += 8
		}
		if s.Size == 0 {
			r += 4
		}
		switch s.Bind {
		case elf.STB_GLOBAL:
		case elf.STB_WEAK:
			r++
		default:
			r += 2
		}
		return r
	}
	if ra, rb := rank(a), rank(b); ra != rb {
		return ra - rb
	}
	return strings.Compare(a.Name, b.Name)
}

// Len is the number of symbols.
func (t *Table) Len() int { return len(t.syms) }

// Symbols returns the symbols sorted by address. The caller must not
// modify the slice.
func (t *Table) Symbols() []Symbol { return t.syms }

// Source is the section the symbols came from: ".symtab" or ".dynsym"
// ("" for a table built by New).
func (t *Table) Source() string { return t.source }

// BuildID is the file's GNU build id in hex, or "" when it has none.
func (t *Table) BuildID() string { return t.buildID }

// Lookup finds the symbol containing the link-time address addr and the
// offset of addr in it. A symbol contains [Addr, Addr+Size); one without a
// size extends to the next symbol's address. Of several aliases, the one
// that better reports is returned.
func (t *Table) Lookup(addr uint64) (sym Symbol, off uint64, ok bool) {
	i := sort.Search(len(t.syms), func(i int) bool { return t.syms[i].Addr > addr }) - 1
	if i < 0 {
		return Symbol{}, 0, false
	}
	start := t.syms[i].Addr
	for i > 0 && t.syms[i-1].Addr == start {
		i--
	}
	for ; i < len(t.syms) && t.syms[i].Addr == start; i++ {
		s := t.syms[i]
		if s.Size == 0 || addr-s.Addr < s.Size {
			return s, addr - s.Addr, true
		}
	}
	return Symbol{}, 0, false
}

// Addr returns the address of the symbol called name (of several symbols
// with one name, the global one).
func (t *Table) Addr(name string) (uint64, bool) {
	i := sort.Search(len(t.byName), func(i int) bool { return t.syms[t.byName[i]].Name >= name })
	if i == len(t.byName) || t.syms[t.byName[i]].Name != name {
		return 0, false
	}
	return t.syms[t.byName[i]].Addr, true
}

// ErrNotMapped is matched by every NotMappedError.
var ErrNotMapped = errors.New("file offset is not in a loadable segment")

// NotMappedError is a file offset that no PT_LOAD segment covers.
type NotMappedError struct{ Offset uint64 }

func (e *NotMappedError) Error() string {
	return fmt.Sprintf("file offset %#x is not in a loadable segment", e.Offset)
}

func (e *NotMappedError) Is(target error) bool { return target == ErrNotMapped }

// LoadBias returns the difference between runtime and link-time addresses
// for a mapping of this file that starts at runtime address start and maps
// the file from offset (the first and third fields of a /proc/PID/maps
// line). It is 0 for a non-PIE executable.
func (t *Table) LoadBias(start, offset uint64) (uint64, error) {
	return t.segs.LoadBias(start, offset)
}

// Segments are the PT_LOAD program headers of a file: how its file
// offsets map to link-time addresses.
type Segments []elf.ProgHeader

// LoadSegments returns the PT_LOAD segments of f.
func LoadSegments(f *elf.File) Segments {
	var segs Segments
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			segs = append(segs, p.ProgHeader)
		}
	}
	return segs
}

// LoadBias is Table.LoadBias for the file of these segments. Knowing
// neither the mapping's end and permissions nor the file's other
// mappings, it may be wrong where segments share a file page (see
// MappingBias).
func (segs Segments) LoadBias(start, offset uint64) (uint64, error) {
	return segs.MappingBias(Mapping{Start: start, Offset: offset}, nil)
}

// Mapping is what MappingBias needs of a line of /proc/PID/maps: the
// runtime range [Start, End), the file offset it maps from and its
// permissions ("r-xp"). End 0 and Perms "" mean unknown.
type Mapping struct {
	Start, End, Offset uint64
	Perms              string
}

// MappingBias returns the load bias of mapping m of this file; others
// are the file's other mappings in the same process (nil if unknown).
//
// A segment is mapped from its page-aligned file offset, so several
// segments can map the same file page: LLD starts the executable segment
// in the last file page of the read-only one (file offset 0x7f0, address
// 0x17f0, both mapped from file offset 0), and the biases they give
// differ by a page. Each segment whose pages hold m's offset gives a
// candidate bias; the one chosen is, in this order: that of a segment
// whose execute permission is m's (the kernel maps PF_X segments, and
// only them, executable), the one most of the file's other mappings
// agree with (ld.so maps every segment of a file with one bias; RELRO
// takes the write permission away from part of a writable segment, so
// that alone cannot tell the segments of read-only mappings apart), that
// of a segment whose memory range holds all of m, that of a segment
// whose write permission is m's, the first in the file. Segments without
// file bytes are skipped (their offsets are arbitrary).
func (segs Segments) MappingBias(m Mapping, others []Mapping) (uint64, error) {
	type score struct{ exec, support, extent, write int }
	better := func(a, b score) bool {
		if a.exec != b.exec {
			return a.exec > b.exec
		}
		if a.support != b.support {
			return a.support > b.support
		}
		if a.extent != b.extent {
			return a.extent > b.extent
		}
		return a.write > b.write
	}
	var best score
	var bias uint64
	found := false
	for _, p := range segs {
		b, ok := segmentBias(p, m.Start, m.Offset)
		if !ok {
			continue
		}
		var sc score
		if len(m.Perms) >= 3 {
			if (m.Perms[2] == 'x') == (p.Flags&elf.PF_X != 0) {
				sc.exec = 1
			}
			if (m.Perms[1] == 'w') == (p.Flags&elf.PF_W != 0) {
				sc.write = 1
			}
		}
		if fits(p, b, m.End) {
			sc.extent = 1
		}
		for _, o := range others {
			if o.Start == m.Start {
				continue
			}
			for _, q := range segs {
				if ob, ok := segmentBias(q, o.Start, o.Offset); ok && ob == b && fits(q, ob, o.End) {
					sc.support++
					break
				}
			}
		}
		if !found || better(sc, best) {
			best, bias, found = sc, b, true
		}
	}
	if !found {
		return 0, &NotMappedError{Offset: m.Offset}
	}
	return bias, nil
}

const pageSize = 4096

// segmentBias returns the bias a mapping at start from file offset
// offset has if it maps segment p, and whether p's pages hold offset.
func segmentBias(p elf.ProgHeader, start, offset uint64) (uint64, bool) {
	// The kernel maps a segment from its page-aligned offset.
	if p.Filesz == 0 || offset < p.Off&^(pageSize-1) || offset >= p.Off+p.Filesz {
		return 0, false
	}
	// runtime(X) = start + X - offset; link(X) = Vaddr + X - Off.
	return start - offset + p.Off - p.Vaddr, true
}

// fits reports whether a mapping ending at end lies in the pages of
// segment p loaded with bias b (end 0: unknown, it does).
func fits(p elf.ProgHeader, b, end uint64) bool {
	return end == 0 || end <= b+(p.Vaddr+p.Memsz+pageSize-1)&^(pageSize-1)
}

// BuildID returns the GNU build id of f in hex, from its
// .note.gnu.build-id section or, failing that, any PT_NOTE segment.
func BuildID(f *elf.File) (string, error) {
	var notes [][]byte
	if s := f.Section(".note.gnu.build-id"); s != nil {
		b, err := s.Data()
		if err != nil {
			return "", err
		}
		notes = append(notes, b)
	} else {
		for _, p := range f.Progs {
			if p.Type != elf.PT_NOTE {
				continue
			}
			// Read what the file has rather than allocate p_filesz bytes,
			// which a corrupt header may make enormous.
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return "", err
			}
			if uint64(len(b)) < p.Filesz {
				return "", &TruncatedError{What: "PT_NOTE segment", Off: p.Off, Need: p.Filesz, Size: -1}
			}
			notes = append(notes, b)
		}
	}
	for _, b := range notes {
		if id, ok := findBuildID(f.ByteOrder, b); ok {
			return hex.EncodeToString(id), nil
		}
	}
	return "", ErrNoBuildID
}

// ErrNoBuildID is returned by BuildID for a file without a GNU build id.
var ErrNoBuildID = errors.New("no GNU build id note")

// NotesBuildID finds the GNU build id, in hex, in raw ELF notes (a
// PT_NOTE segment, or a kernel's /sys/kernel/notes).
func NotesBuildID(bo interface{ Uint32([]byte) uint32 }, notes []byte) (string, bool) {
	id, ok := findBuildID(bo, notes)
	return hex.EncodeToString(id), ok
}

// findBuildID walks ELF notes (namesz, descsz, type, name, desc; name and
// desc padded to 4 bytes) for an NT_GNU_BUILD_ID note of owner "GNU".
func findBuildID(bo interface{ Uint32([]byte) uint32 }, b []byte) ([]byte, bool) {
	const ntGNUBuildID = 3
	align := func(n uint64) uint64 { return (n + 3) &^ 3 }
	for len(b) >= 12 {
		namesz, descsz, typ := uint64(bo.Uint32(b)), uint64(bo.Uint32(b[4:])), bo.Uint32(b[8:])
		b = b[12:]
		if align(namesz)+descsz > uint64(len(b)) { // the last desc may lack its padding
			return nil, false
		}
		name := b[:namesz]
		desc := b[align(namesz) : align(namesz)+descsz]
		if typ == ntGNUBuildID && string(name) == "GNU\x00" {
			return desc, true
		}
		b = b[min(uint64(len(b)), align(namesz)+align(descsz)):]
	}
	return nil, false
}

// Rebased is a copy of the table with every symbol moved by base of its
// section: a relocatable file's symbols (offsets into their sections)
// placed where a layout of the sections puts them.
func (t *Table) Rebased(base func(elf.SectionIndex) uint64) *Table {
	syms := slices.Clone(t.syms)
	for i := range syms {
		syms[i].Addr += base(syms[i].Section)
	}
	n := New(syms)
	n.buildID, n.source, n.segs = t.buildID, t.source, t.segs
	return n
}
