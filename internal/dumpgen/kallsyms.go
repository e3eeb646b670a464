package dumpgen

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// KallsymsSymbol is one symbol of a kernel's compressed symbol table.
type KallsymsSymbol struct {
	Addr uint64
	Type byte // kallsyms type letter; 'A' is an absolute (per-CPU) value
	Name string
}

// Kallsyms lays out the tables scripts/kallsyms.c writes into a kernel
// image (6.1's: token-compressed names with the type letter first, a
// two-byte length above 127, offsets from a relative base with absolute
// per-CPU values), from address at on, through put. It returns the
// VMCOREINFO lines that locate them. Tokens: every byte stands for
// itself, except 0xf0 = "sch" and 0xf1 = "ed" (multi-byte tokens).
func Kallsyms(syms []KallsymsSymbol, base, at uint64, put func(addr uint64, b []byte)) string {
	var tokTable, tokIndex []byte
	for i := 0; i < 256; i++ {
		tokIndex = binary.LittleEndian.AppendUint16(tokIndex, uint16(len(tokTable)))
		switch i {
		case 0xf0:
			tokTable = append(tokTable, "sch"...)
		case 0xf1:
			tokTable = append(tokTable, "ed"...)
		default:
			tokTable = append(tokTable, byte(i))
		}
		tokTable = append(tokTable, 0)
	}
	var names, offsets []byte
	for _, s := range syms {
		full := string(s.Type) + s.Name
		enc := []byte(strings.Replace(strings.Replace(full, "sch", "\xf0", 1), "ed", "\xf1", 1))
		if len(enc) > 127 {
			names = append(names, byte(len(enc)&0x7f|0x80), byte(len(enc)>>7))
		} else {
			names = append(names, byte(len(enc)))
		}
		names = append(names, enc...)
		// KALLSYMS_ABSOLUTE_PERCPU: a non-negative offset is the value
		// itself (per-CPU symbols); others are -1 - (addr - base).
		rel := int32(-1 - int64(s.Addr-base))
		if s.Type == 'A' {
			rel = int32(s.Addr)
		}
		offsets = binary.LittleEndian.AppendUint32(offsets, uint32(rel))
	}
	align := func(a uint64) uint64 { return (a + 15) &^ 15 }
	offsAt := at
	baseAt := align(offsAt + uint64(len(offsets)))
	numAt := baseAt + 8
	namesAt := align(numAt + 4)
	tokTableAt := align(namesAt + uint64(len(names)))
	tokIndexAt := align(tokTableAt + uint64(len(tokTable)))
	put(offsAt, offsets)
	put(baseAt, binary.LittleEndian.AppendUint64(nil, base))
	put(numAt, binary.LittleEndian.AppendUint32(nil, uint32(len(syms))))
	put(namesAt, names)
	put(tokTableAt, tokTable)
	put(tokIndexAt, tokIndex)
	return fmt.Sprintf("SYMBOL(kallsyms_offsets)=%x\nSYMBOL(kallsyms_relative_base)=%x\nSYMBOL(kallsyms_num_syms)=%x\n"+
		"SYMBOL(kallsyms_names)=%x\nSYMBOL(kallsyms_token_table)=%x\nSYMBOL(kallsyms_token_index)=%x\n",
		offsAt, baseAt, numAt, namesAt, tokTableAt, tokIndexAt)
}
