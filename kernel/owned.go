package kernel

import (
	"errors"
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
//   - ftrace records: each traceable function's 5-byte call site, which
//     ftrace rewrites whenever a tracer attaches or detaches.
//
// The core kernel's tables are found by their kallsyms section markers;
// each loaded module keeps its own in struct module, found by walking the
// kernel's `modules` list. ftrace's records of both hang off
// ftrace_pages_start (__mcount_loc itself is freed after boot). Module and
// ftrace structs are read with offsets from the kernel's BTF
// (KernelLayout); without it only the core kernel's tables are read, with
// the 6.1 x86-64 entry layouts, and ftrace sites fall back to the shape of
// a function's first instruction.
//
// The set is a snapshot: reload it when modules come or go.
type OwnedSites struct {
	counts OwnedCounts
	kinds  map[uint64]ownedKind
	ftrace bool // the ftrace records were read: they, not the shape, say what ftrace owns
}

// ownedKind is a bit set: one address can be named by several tables.
type ownedKind uint8

const (
	ownedExTable ownedKind = 1 << iota
	ownedJumpLabel
	ownedStaticCall
	ownedFtrace
	// ownedLanding: the kernel may send a CPU here by a table (an
	// exception fixup, an enabled static key's jump target). Not a reason
	// to refuse a splice here, but a covering splice must not run over it.
	ownedLanding
)

// ownedReasons in the order Reason reports them.
var ownedReasons = []struct {
	kind ownedKind
	why  string
}{
	{ownedExTable, "an exception-table entry (__ex_table): a fault here is fixed up by its address, a copy in a patch would oops"},
	{ownedJumpLabel, "a static-key site (__jump_table): the kernel rewrites it when the key flips"},
	{ownedStaticCall, "a static call site: the kernel rewrites it when the call's target changes"},
	{ownedFtrace, "an ftrace site (in ftrace's records): ftrace rewrites these 5 bytes when a tracer attaches"},
}

// OwnedCounts says how many sites each table named, for reports.
type OwnedCounts struct {
	ExTable     int `json:"ex_table"`
	JumpLabels  int `json:"jump_labels"`
	StaticCalls int `json:"static_calls"`
	Ftrace      int `json:"ftrace"`  // ftrace records, core kernel and modules
	Modules     int `json:"modules"` // modules whose tables were read
}

// coreTables: marker symbols, the 6.1 x86-64 entry layout (used without
// BTF), and the kind.
var coreTables = []struct {
	start, stop string
	entry       Entry
	kind        ownedKind
}{
	{"__start___ex_table", "__stop___ex_table", Entry{12, Field{0, 4}, Field{4, 4}}, ownedExTable},
	{"__start___jump_table", "__stop___jump_table", Entry{16, Field{0, 4}, Field{4, 4}}, ownedJumpLabel},
	{"__start_static_call_sites", "__stop_static_call_sites", Entry{8, Field{0, 4}, Field{}}, ownedStaticCall},
}

// Bounds on what one walk reads, so a corrupt or racing list cannot make
// it run away. The 6.1 tables are tens of KiB; ftrace has about 40,000
// records in a few hundred pages.
const (
	maxOwnedTable = 4 << 20
	maxFtracePage = 1 << 16
)

// ErrOwnedTable is matched by every OwnedTableError.
var ErrOwnedTable = errors.New("kernel table unreadable")

// OwnedTableError says which kernel table could not be read, and why.
type OwnedTableError struct {
	Table string // "__ex_table", "module virtio_net: jump_entries", "ftrace_pages_start", …
	Addr  uint64
	Err   error
}

func (e *OwnedTableError) Error() string {
	return fmt.Sprintf("%s at %#x: %v", e.Table, e.Addr, e.Err)
}

func (e *OwnedTableError) Is(t error) bool { return t == ErrOwnedTable }
func (e *OwnedTableError) Unwrap() error   { return e.Err }

// LoadOwnedSites reads the kernel's tables from live memory (r reads any
// kernel address, such as the driver). layout may be nil: see OwnedSites.
func LoadOwnedSites(r Reader, syms *Symbols, layout *KernelLayout) (*OwnedSites, OwnedCounts, error) {
	o := &OwnedSites{kinds: map[uint64]ownedKind{}}
	var n OwnedCounts
	for _, t := range coreTables {
		lo, ok1 := syms.Address(t.start)
		hi, ok2 := syms.Address(t.stop)
		if !ok1 || !ok2 || hi < lo {
			continue
		}
		entry := t.entry
		if layout != nil {
			entry = layout.entry(t.kind)
		}
		if (hi-lo)%uint64(entry.Size) != 0 {
			return nil, n, &OwnedTableError{Table: t.start, Addr: lo, Err: fmt.Errorf("%d bytes is not a table of %d-byte entries", hi-lo, entry.Size)}
		}
		k, err := o.readTable(r, t.start, lo, (hi-lo)/uint64(entry.Size), entry, t.kind)
		if err != nil {
			return nil, n, err
		}
		n.add(t.kind, k)
	}
	if layout == nil {
		o.counts = n
		return o, n, nil
	}
	if err := o.readModules(r, syms, layout, &n); err != nil {
		return nil, n, err
	}
	k, err := o.readFtrace(r, syms, layout)
	if err != nil {
		return nil, n, err
	}
	n.Ftrace = k
	o.counts = n
	return o, n, nil
}

func (n *OwnedCounts) add(k ownedKind, c int) {
	switch k {
	case ownedExTable:
		n.ExTable += c
	case ownedJumpLabel:
		n.JumpLabels += c
	case ownedStaticCall:
		n.StaticCalls += c
	}
}

func (l *KernelLayout) entry(k ownedKind) Entry {
	switch k {
	case ownedExTable:
		return l.ExTableEntry
	case ownedJumpLabel:
		return l.JumpEntry
	}
	return l.StaticCallSite
}

// readTable reads count entries at addr. Each entry's Rel field is a
// signed offset from the field itself to the instruction, as the x86-64
// kernel stores all three tables (ex_to_insn, jump_entry_code,
// static_call_addr).
func (o *OwnedSites) readTable(r Reader, name string, addr, count uint64, e Entry, kind ownedKind) (int, error) {
	if count == 0 {
		return 0, nil
	}
	size := count * uint64(e.Size)
	if e.Size == 0 || size > maxOwnedTable || size/count != uint64(e.Size) {
		return 0, &OwnedTableError{Table: name, Addr: addr, Err: fmt.Errorf("%d entries of %d bytes is implausible", count, e.Size)}
	}
	buf := make([]byte, size)
	if err := r.Read(addr, buf); err != nil {
		return 0, &OwnedTableError{Table: name, Addr: addr, Err: err}
	}
	for off := uint64(0); off < size; off += uint64(e.Size) {
		at := addr + off + uint64(e.Rel.Off)
		o.kinds[at+uint64(intAt(buf[off:], e.Rel))] |= kind
		if e.Target.Size != 0 {
			to := addr + off + uint64(e.Target.Off)
			o.kinds[to+uint64(intAt(buf[off:], e.Target))] |= ownedLanding
		}
	}
	return int(count), nil
}

// readModules walks the `modules` list and reads each formed module's
// exception, jump-label and static-call tables.
func (o *OwnedSites) readModules(r Reader, syms *Symbols, l *KernelLayout, n *OwnedCounts) error {
	head, ok := syms.Address("modules")
	if !ok {
		return nil // a kernel without modules
	}
	mods, err := ReadModules(r, head, &l.Module)
	if err != nil {
		return &OwnedTableError{Table: "modules", Addr: head, Err: err}
	}
	for _, m := range mods {
		if !m.Formed {
			continue // being loaded: its tables are not set up yet
		}
		for _, t := range []struct {
			what  string
			table Table
			kind  ownedKind
		}{
			{"extable", m.ExTable, ownedExTable},
			{"jump_entries", m.JumpEntries, ownedJumpLabel},
			{"static_call_sites", m.StaticCallSites, ownedStaticCall},
		} {
			name := "module " + m.Name + ": " + t.what
			if t.table.Count < 0 {
				return &OwnedTableError{Table: name, Addr: m.Addr, Err: fmt.Errorf("count %d", t.table.Count)}
			}
			k, err := o.readTable(r, name, t.table.Addr, uint64(t.table.Count), l.entry(t.kind), t.kind)
			if err != nil {
				return err
			}
			n.add(t.kind, k)
		}
		n.Modules++
	}
	return nil
}

// readFtrace walks ftrace_pages_start → struct ftrace_page {next,
// records, index} and marks each dyn_ftrace record's ip. The list holds
// the core kernel's records and every module's.
func (o *OwnedSites) readFtrace(r Reader, syms *Symbols, l *KernelLayout) (int, error) {
	start, ok := syms.Address("ftrace_pages_start")
	if !ok {
		return 0, nil // no dynamic ftrace: leave the shape check in charge
	}
	var p [8]byte
	if err := r.Read(start, p[:]); err != nil {
		return 0, &OwnedTableError{Table: "ftrace_pages_start", Addr: start, Err: err}
	}
	pg := uintAt(p[:], Field{0, 8})
	page := make([]byte, l.FtracePageSize)
	total := 0
	for i := 0; pg != 0; i++ {
		if i == maxFtracePage {
			return 0, &OwnedTableError{Table: "ftrace_pages_start", Addr: start, Err: errors.New("list does not end")}
		}
		if err := r.Read(pg, page); err != nil {
			return 0, &OwnedTableError{Table: "struct ftrace_page", Addr: pg, Err: err}
		}
		index := intAt(page, l.FtraceIndex)
		recs := uintAt(page, l.FtraceRecords)
		if index < 0 || uint64(index)*uint64(l.DynFtrace.Size) > maxOwnedTable {
			return 0, &OwnedTableError{Table: "struct ftrace_page", Addr: pg, Err: fmt.Errorf("index %d", index)}
		}
		if index > 0 {
			buf := make([]byte, uint64(index)*uint64(l.DynFtrace.Size))
			if err := r.Read(recs, buf); err != nil {
				return 0, &OwnedTableError{Table: "ftrace records", Addr: recs, Err: err}
			}
			for off := 0; off < len(buf); off += int(l.DynFtrace.Size) {
				o.kinds[uintAt(buf[off:], l.DynFtrace.Rel)] |= ownedFtrace
			}
			total += int(index)
		}
		pg = uintAt(page, l.FtraceNext)
	}
	o.ftrace = true
	return total, nil
}

// Reason says why the instruction at addr is owned by the kernel, or "".
// A nil set owns nothing.
func (o *OwnedSites) Reason(addr uint64) string {
	if o == nil {
		return ""
	}
	k := o.kinds[addr]
	if k == 0 {
		return ""
	}
	for _, r := range ownedReasons {
		if k&r.kind != 0 {
			return r.why
		}
	}
	return ""
}

// Landing reports whether the kernel may send a CPU to addr through one of
// its tables (exception fixups, static keys' jump targets) rather than a
// branch an instruction decoder sees.
func (o *OwnedSites) Landing(addr uint64) bool {
	return o != nil && o.kinds[addr]&ownedLanding != 0
}

// Counts says how many sites each table named when the set was read.
func (o *OwnedSites) Counts() OwnedCounts { return o.counts }

// HasFtraceRecords reports whether ftrace's own records were read.
func (o *OwnedSites) HasFtraceRecords() bool { return o != nil && o.ftrace }

// Ftrace reports whether ftrace's records name addr (false without
// records: see HasFtraceRecords).
func (o *OwnedSites) Ftrace(addr uint64) bool {
	return o.HasFtraceRecords() && o.kinds[addr]&ownedFtrace != 0
}

// FtraceSites returns the recorded ftrace sites in [lo, hi), for reports
// and tests; nil without records.
func (o *OwnedSites) FtraceSites(lo, hi uint64) []uint64 {
	if !o.HasFtraceRecords() {
		return nil
	}
	var s []uint64
	for a, k := range o.kinds {
		if k&ownedFtrace != 0 && a >= lo && a < hi {
			s = append(s, a)
		}
	}
	return s
}
