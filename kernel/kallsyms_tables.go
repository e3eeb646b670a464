package kernel

import (
	"encoding/binary"
	"fmt"
)

// KallsymsTables are the addresses of the kernel's compressed symbol
// tables (kernel/kallsyms.c), which VMCOREINFO exports since Linux 6.0.
type KallsymsTables struct {
	Names, NumSyms, TokenTable, TokenIndex, Offsets, RelativeBase uint64
}

// maxKallsymsNames bounds the compressed names table read.
const maxKallsymsNames = 64 << 20

// ReadKallsyms decodes the kernel image's symbols from its own tables in
// memory: each name is a length byte (two bytes when the first has its
// top bit set, since 6.1) followed by token indexes into
// kallsyms_token_table; the first character of the expansion is the type
// letter. Addresses are kallsyms_relative_base plus kallsyms_offsets[i],
// where a negative offset means an absolute per-CPU address
// (KALLSYMS_ABSOLUTE_PERCPU). Module symbols are not in these tables.
func ReadKallsyms(r Reader, t KallsymsTables) (*Symbols, error) {
	read := func(addr uint64, n int) ([]byte, error) {
		b := make([]byte, n)
		return b, r.Read(addr, b)
	}
	nb4, err := read(t.NumSyms, 4)
	if err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(nb4))
	if n == 0 || n > 4<<20 {
		return nil, fmt.Errorf("kallsyms_num_syms = %d is not plausible", n)
	}
	bb, err := read(t.RelativeBase, 8)
	if err != nil {
		return nil, err
	}
	base := binary.LittleEndian.Uint64(bb)
	offs, err := read(t.Offsets, 4*n)
	if err != nil {
		return nil, err
	}
	idxb, err := read(t.TokenIndex, 256*2)
	if err != nil {
		return nil, err
	}
	// The token table lies between kallsyms_token_table and
	// kallsyms_token_index; the names before the token table (the
	// markers sit between them).
	if t.TokenIndex <= t.TokenTable || t.TokenIndex-t.TokenTable > 1<<20 || t.TokenTable <= t.Names || t.TokenTable-t.Names > maxKallsymsNames {
		return nil, fmt.Errorf("kallsyms tables out of the expected order (names %#x, token table %#x, token index %#x)", t.Names, t.TokenTable, t.TokenIndex)
	}
	tt, err := read(t.TokenTable, int(t.TokenIndex-t.TokenTable))
	if err != nil {
		return nil, err
	}
	nb, err := read(t.Names, int(t.TokenTable-t.Names))
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
	syms := make([]Symbol, n)
	prev := 0
	for i := 0; i < n; i++ {
		rel := int32(binary.LittleEndian.Uint32(offs[4*i:]))
		addr := uint64(rel)
		if rel < 0 {
			addr = base - 1 - uint64(int64(rel))
		}
		syms[i] = Symbol{Addr: addr, Type: strs[prev], Name: strs[prev+1 : ends[i]]}
		prev = ends[i]
	}
	// The kernel sorts them at build time; NewSymbols checks.
	return NewSymbols(syms), nil
}
