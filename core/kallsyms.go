package core

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync"
)

// Symbol is one kallsyms entry.
type Symbol struct {
	Addr   uint64
	Type   byte // kallsyms type letter: T/t text, D/d data, B/b bss, R/r rodata, A absolute…
	Name   string
	Module string `json:",omitempty"` // "" for the kernel image
}

// IsText reports whether the symbol is in a text section.
func (s Symbol) IsText() bool {
	return s.Type == 't' || s.Type == 'T' || s.Type == 'w' || s.Type == 'W'
}

// Symbols is the kernel's symbol table, sorted by address. Immutable.
type Symbols struct {
	byAddr []Symbol

	// A command looks up a handful of names: each is found by a scan and
	// remembered, instead of hashing a hundred thousand names up front.
	mu     sync.Mutex
	byName map[string]int // name → first index, -1 if absent
}

// maxKallsymsNames bounds the compressed names table we read.
const maxKallsymsNames = 64 << 20

// Symbols decodes kallsyms from the dump's memory (kernel/kallsyms.c):
// each name is a length byte (two bytes when the first has its top bit
// set, since 6.1) followed by token indexes into kallsyms_token_table;
// the first character of the expansion is the type letter. Addresses are
// kallsyms_relative_base plus kallsyms_offsets[i], where a negative
// offset means an absolute per-CPU address (KALLSYMS_ABSOLUTE_PERCPU).
func (k *Kernel) Symbols() (*Symbols, error) {
	return k.syms.get("kallsyms", k.loadKallsyms)
}

func (k *Kernel) loadKallsyms() (*Symbols, error) {
	a, err := k.Info.need("kallsyms_names", "kallsyms_num_syms", "kallsyms_token_table", "kallsyms_token_index", "kallsyms_offsets", "kallsyms_relative_base")
	if err != nil {
		return nil, fmt.Errorf("%w (VMCOREINFO exports the kallsyms tables since Linux 6.0)", err)
	}
	names, numSyms, tokTable, tokIndex, offsets, relBase := a[0], a[1], a[2], a[3], a[4], a[5]
	n32, err := k.ReadU32(numSyms)
	if err != nil {
		return nil, err
	}
	n := int(n32)
	if n == 0 || n > 4<<20 {
		return nil, fmt.Errorf("kallsyms_num_syms = %d is not plausible", n)
	}
	base, err := k.ReadU64(relBase)
	if err != nil {
		return nil, err
	}
	offs, err := k.ReadBytes(offsets, 4*n)
	if err != nil {
		return nil, err
	}
	idxb, err := k.ReadBytes(tokIndex, 256*2)
	if err != nil {
		return nil, err
	}
	// The token table lies between kallsyms_token_table and
	// kallsyms_token_index; the names before the token table (the
	// markers sit between them).
	if tokIndex <= tokTable || tokIndex-tokTable > 1<<20 || tokTable <= names || tokTable-names > maxKallsymsNames {
		return nil, fmt.Errorf("kallsyms tables out of the expected order (names %#x, token table %#x, token index %#x)", names, tokTable, tokIndex)
	}
	tt, err := k.ReadBytes(tokTable, int(tokIndex-tokTable))
	if err != nil {
		return nil, err
	}
	nb, err := k.ReadBytes(names, int(tokTable-names))
	if err != nil {
		return nil, err
	}
	var tokens [256][]byte
	for i := range tokens {
		o := int(binary.LittleEndian.Uint16(idxb[2*i:]))
		if o >= len(tt) {
			return nil, fmt.Errorf("token %d at %d is outside the %d-byte token table", i, o, len(tt))
		}
		end := o
		for end < len(tt) && tt[end] != 0 {
			end++
		}
		tokens[i] = tt[o:end]
	}
	// Expand every name into one buffer, then cut the symbols' names
	// out of a single string: two allocations instead of one per symbol.
	all := make([]byte, 0, 2*len(nb))
	ends := make([]int, n)
	off := 0
	for i := 0; i < n; i++ {
		if off >= len(nb) {
			return nil, fmt.Errorf("names table ends after %d of %d symbols", i, n)
		}
		l := int(nb[off])
		off++
		if l&0x80 != 0 {
			if off >= len(nb) {
				return nil, fmt.Errorf("names table ends inside symbol %d", i)
			}
			l = l&0x7f | int(nb[off])<<7
			off++
		}
		if off+l > len(nb) || l == 0 {
			return nil, fmt.Errorf("symbol %d: length %d runs past the names table", i, l)
		}
		start := len(all)
		for _, t := range nb[off : off+l] {
			all = append(all, tokens[t]...)
		}
		if len(all) == start {
			return nil, fmt.Errorf("symbol %d expands to nothing", i)
		}
		off += l
		ends[i] = len(all)
	}
	strs := string(all)
	s := &Symbols{byAddr: make([]Symbol, n)}
	sorted := true
	prev := 0
	for i := 0; i < n; i++ {
		rel := int32(binary.LittleEndian.Uint32(offs[4*i:]))
		addr := uint64(rel)
		if rel < 0 {
			addr = base - 1 - uint64(int64(rel))
		}
		s.byAddr[i] = Symbol{Addr: addr, Type: strs[prev], Name: strs[prev+1 : ends[i]]}
		prev = ends[i]
		if i > 0 && addr < s.byAddr[i-1].Addr {
			sorted = false
		}
	}
	if !sorted { // the kernel sorts them at build time; be safe anyway
		sort.SliceStable(s.byAddr, func(i, j int) bool { return s.byAddr[i].Addr < s.byAddr[j].Addr })
	}
	return s, nil
}

// Len is the number of symbols.
func (s *Symbols) Len() int { return len(s.byAddr) }

// Lookup finds a symbol by name (the first, by address, if several
// static symbols share it).
func (s *Symbols) Lookup(name string) (Symbol, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.byName[name]
	if !ok {
		if s.byName == nil {
			s.byName = map[string]int{}
		}
		i = -1
		for j := range s.byAddr {
			if s.byAddr[j].Name == name {
				i = j
				break
			}
		}
		s.byName[name] = i
	}
	if i < 0 {
		return Symbol{}, fmt.Errorf("%q: %w", name, ErrNoSymbol)
	}
	return s.byAddr[i], nil
}

// Addr returns the address of a symbol or an error naming it.
func (s *Symbols) Addr(name string) (uint64, error) {
	sym, err := s.Lookup(name)
	return sym.Addr, err
}

// At returns the symbol at or below addr and the offset into it. Per-CPU
// offsets (small absolute values) never match a kernel address.
func (s *Symbols) At(addr uint64) (Symbol, uint64, bool) {
	i := sort.Search(len(s.byAddr), func(i int) bool { return s.byAddr[i].Addr > addr })
	if i == 0 {
		return Symbol{}, 0, false
	}
	sym := s.byAddr[i-1]
	if addr-sym.Addr > 1<<20 {
		return Symbol{}, 0, false
	}
	return sym, addr - sym.Addr, true
}

// Size is the distance to the next symbol at a higher address (0 for
// the last).
func (s *Symbols) Size(sym Symbol) uint64 {
	i := sort.Search(len(s.byAddr), func(i int) bool { return s.byAddr[i].Addr > sym.Addr })
	if i == len(s.byAddr) {
		return 0
	}
	return s.byAddr[i].Addr - sym.Addr
}
