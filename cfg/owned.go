package cfg

import (
	"encoding/binary"
	"fmt"
)

// OwnedSites are instructions the kernel itself keeps track of by address,
// read from its own tables in live memory. Relocating one into a patch
// would break that bookkeeping:
//
//   - __ex_table: a fault at the instruction is fixed up by looking its
//     address up; a copy in a patch would fault with no entry: an oops.
//   - __jump_table: static-key sites, rewritten whenever a key flips.
//   - static_call_sites: static calls, rewritten when their target changes.
//
// Only the core kernel's tables are read; modules keep theirs in struct
// module (not yet read).
type OwnedSites struct {
	reasons map[uint64]string
}

// Counts of each kind, for reports.
type OwnedCounts struct {
	ExTable, JumpLabels, StaticCalls int
}

// ownedTables: marker symbols, entry size, and the reason.
var ownedTables = []struct {
	start, stop string
	entry       int
	why         string
}{
	{"__start___ex_table", "__stop___ex_table", 12, "an exception-table entry (__ex_table): a fault here is fixed up by its address, a copy in a patch would oops"},
	{"__start___jump_table", "__stop___jump_table", 16, "a static-key site (__jump_table): the kernel rewrites it when the key flips"},
	{"__start_static_call_sites", "__stop_static_call_sites", 8, "a static call site: the kernel rewrites it when the call's target changes"},
}

// maxOwnedTable bounds one table read (the 6.1 tables are tens of KiB).
const maxOwnedTable = 4 << 20

// LoadOwnedSites reads the core kernel's tables. Each entry's first field
// is a 32-bit offset from the entry itself to the instruction (6.1 x86-64:
// exception_table_entry {int insn, fixup, data}, jump_entry {s32 code,
// target; long key}, static_call_site {s32 addr, key}).
func LoadOwnedSites(r TextReader, syms *Symbols) (*OwnedSites, OwnedCounts, error) {
	o := &OwnedSites{reasons: map[uint64]string{}}
	var n OwnedCounts
	for ti, t := range ownedTables {
		lo, ok1 := syms.marker(t.start)
		hi, ok2 := syms.marker(t.stop)
		if !ok1 || !ok2 || hi < lo {
			continue
		}
		size := hi - lo
		if size%uint64(t.entry) != 0 || size > maxOwnedTable {
			return nil, n, fmt.Errorf("%s…%s: %d bytes is not a table of %d-byte entries", t.start, t.stop, size, t.entry)
		}
		buf := make([]byte, size)
		if err := r.Read(lo, buf); err != nil {
			return nil, n, fmt.Errorf("read %s: %w", t.start, err)
		}
		for off := 0; off < len(buf); off += t.entry {
			rel := int32(binary.LittleEndian.Uint32(buf[off:]))
			addr := lo + uint64(off) + uint64(int64(rel))
			if _, dup := o.reasons[addr]; !dup {
				o.reasons[addr] = t.why
			}
		}
		switch ti {
		case 0:
			n.ExTable = len(buf) / t.entry
		case 1:
			n.JumpLabels = len(buf) / t.entry
		case 2:
			n.StaticCalls = len(buf) / t.entry
		}
	}
	return o, n, nil
}

// Reason says why the instruction at addr is owned by the kernel, or "".
// A nil set owns nothing.
func (o *OwnedSites) Reason(addr uint64) string {
	if o == nil {
		return ""
	}
	return o.reasons[addr]
}
