// Package orc unwinds x86-64 Linux kernel stacks with the kernel's ORC
// tables (.orc_unwind_ip, .orc_unwind; arch/x86/kernel/unwind_orc.c),
// reading stack memory through an interface so that the same unwinder
// serves crash dumps and live kernels.
//
// Kernel-version caveats: entries are 6 bytes in every version, but the
// last 16 bits changed (Format): sp_reg:4 bp_reg:4 type:2 end:1 from 4.14
// through 6.2 (Debian's 6.1), sp_reg:4 bp_reg:4 type:3 signal:1 from 6.4
// (Debian's 6.12), where type 0 is UNDEFINED and 1 END_OF_STACK. 6.3's
// short-lived layout (a signal bit beside type:2 and end) is not read.
package orc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// Registers that an entry's SP or BP may be based on.
const (
	RegUndefined    = 0
	RegPrevSP       = 1
	RegDX           = 2
	RegDI           = 3
	RegBP           = 4
	RegSP           = 5
	RegR10          = 6
	RegR13          = 7
	RegBPIndirect   = 8
	RegSPIndirect   = 9
	TypeCall        = 0 // a normal call frame: return address just below the CFA
	TypeRegs        = 1 // a full struct pt_regs at the CFA (interrupt/syscall entry)
	TypeRegsPartial = 2 // only the hardware iret frame at the CFA
)

// Entry is one ORC row: how to find the caller's frame from an address.
// Entries of every Format decode to the same form: an undefined entry
// has SPReg RegUndefined, and End marks the outermost frame.
type Entry struct {
	SPOffset, BPOffset int16
	SPReg, BPReg, Type uint8
	End                bool // the outermost frame of a kernel thread
}

// EntrySize is the size of one .orc_unwind entry.
const EntrySize = 6

// Format is the bit layout of an entry's last 16 bits.
type Format int

const (
	// Format414: sp_reg:4 bp_reg:4 type:2 end:1, types CALL 0, REGS 1,
	// REGS_PARTIAL 2 (Linux 4.14 through 6.2).
	Format414 Format = iota
	// Format64: sp_reg:4 bp_reg:4 type:3 signal:1, types UNDEFINED 0,
	// END_OF_STACK 1, CALL 2, REGS 3, REGS_PARTIAL 4 (Linux 6.4 on).
	Format64
)

func (f Format) String() string {
	if f == Format64 {
		return "6.4+"
	}
	return "4.14-6.2"
}

// FormatOf picks the layout for a kernel release ("6.12.117+deb12-amd64"):
// Format64 from 6.4 on. Prefer the kernel's own BTF where it describes
// struct orc_entry (a member named end: Format414).
func FormatOf(release string) Format {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err == nil && (major > 6 || major == 6 && minor >= 4) {
		return Format64
	}
	return Format414
}

// DecodeEntry decodes the 6 bytes of an .orc_unwind entry of Format414.
func DecodeEntry(b []byte) Entry { return DecodeEntryFormat(b, Format414) }

// DecodeEntryFormat decodes an .orc_unwind entry of layout f.
func DecodeEntryFormat(b []byte, f Format) Entry {
	bits := binary.LittleEndian.Uint16(b[4:])
	e := Entry{
		SPOffset: int16(binary.LittleEndian.Uint16(b)),
		BPOffset: int16(binary.LittleEndian.Uint16(b[2:])),
		SPReg:    uint8(bits & 15),
		BPReg:    uint8(bits >> 4 & 15),
	}
	if f != Format64 {
		e.Type, e.End = uint8(bits>>8&3), bits>>10&1 != 0
		return e
	}
	switch t := uint8(bits >> 8 & 7); t {
	case 0: // UNDEFINED
		e.SPReg = RegUndefined
	case 1: // END_OF_STACK
		e.SPReg, e.End = RegUndefined, true
	default: // CALL, REGS, REGS_PARTIAL: the old encoding plus 2
		e.Type = t - 2
	}
	return e
}

// Table maps instruction addresses to ORC entries. Immutable. A table
// that is already sorted (the kernel's are: sorttable at build time, and
// module_finalize at load) is searched in its encoded form, so that
// parsing a few hundred thousand entries costs one pass and no copies.
type Table struct {
	n      int
	format Format
	// Encoded, sorted form: ip i is ipBase + 4i + int32 at rawIP[4i].
	rawIP, rawEntries []byte
	ipBase            uint64
	// Decoded form, only for tables that were not sorted.
	ips     []uint64
	entries []Entry
}

// ErrCorrupt: the ORC tables do not decode.
var ErrCorrupt = errors.New("corrupt ORC tables")

// Parse builds a table from .orc_unwind_ip (int32 offsets, each relative
// to its own address; ipBase is the address of the first) and
// .orc_unwind (one entry per ip). The table keeps the slices.
func Parse(ipTable []byte, ipBase uint64, unwind []byte) (*Table, error) {
	return ParseFormat(ipTable, ipBase, unwind, Format414)
}

// ParseFormat is Parse for entries of layout f.
func ParseFormat(ipTable []byte, ipBase uint64, unwind []byte, f Format) (*Table, error) {
	n := len(ipTable) / 4
	if len(ipTable)%4 != 0 || len(unwind) != n*EntrySize || n == 0 {
		return nil, fmt.Errorf("%w: %d bytes of ip table and %d of entries (want 4 and %d bytes per entry)", ErrCorrupt, len(ipTable), len(unwind), EntrySize)
	}
	t := &Table{n: n, format: f, rawIP: ipTable, rawEntries: unwind, ipBase: ipBase}
	for i := 1; i < n; i++ {
		if t.rawIPAt(i) < t.rawIPAt(i-1) {
			t.decodeSorted()
			break
		}
	}
	return t, nil
}

func (t *Table) rawIPAt(i int) uint64 {
	return t.ipBase + uint64(4*i) + uint64(int64(int32(binary.LittleEndian.Uint32(t.rawIP[4*i:]))))
}

func (t *Table) ipAt(i int) uint64 {
	if t.ips != nil {
		return t.ips[i]
	}
	return t.rawIPAt(i)
}

func (t *Table) entryAt(i int) Entry {
	if t.entries != nil {
		return t.entries[i]
	}
	return DecodeEntryFormat(t.rawEntries[EntrySize*i:], t.format)
}

// Format is the entry layout the table was parsed with.
func (t *Table) Format() Format { return t.format }

// decodeSorted decodes an unsorted table and sorts it (stably, so that
// a terminator stays before the real entry at the same address).
func (t *Table) decodeSorted() {
	ips, entries := make([]uint64, t.n), make([]Entry, t.n)
	for i := range ips {
		ips[i], entries[i] = t.rawIPAt(i), DecodeEntryFormat(t.rawEntries[EntrySize*i:], t.format)
	}
	t.ips, t.entries = ips, entries
	sort.Stable(byIP{t})
}

type byIP struct{ t *Table }

func (b byIP) Len() int           { return len(b.t.ips) }
func (b byIP) Less(i, j int) bool { return b.t.ips[i] < b.t.ips[j] }
func (b byIP) Swap(i, j int) {
	b.t.ips[i], b.t.ips[j] = b.t.ips[j], b.t.ips[i]
	b.t.entries[i], b.t.entries[j] = b.t.entries[j], b.t.entries[i]
}

// Len is the number of entries.
func (t *Table) Len() int { return t.n }

// Lookup returns the entry covering ip: the rightmost one starting at or
// below it (duplicates at one address are section terminators, which the
// real entry after them overrides).
func (t *Table) Lookup(ip uint64) (Entry, bool) {
	i := sort.Search(t.n, func(i int) bool { return t.ipAt(i) > ip })
	if i == 0 {
		return Entry{}, false
	}
	return t.entryAt(i - 1), true
}

// Range is the address range the table covers.
func (t *Table) Range() (lo, hi uint64) { return t.ipAt(0), t.ipAt(t.n - 1) }
