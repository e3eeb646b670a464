package kernel

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// testLayoutTypes describes the structs the walkers read, with offsets
// unlike 6.1's (fields moved and padded), so a walker that used fixed
// numbers instead of the layout would read garbage.
func testLayoutTypes(dropMember string) []btf.Type {
	s32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	u64 := &btf.Int{Name: "long unsigned int", Size: 8}
	char := &btf.Int{Name: "char", Size: 1, Encoding: btf.Char}
	ptr := &btf.Pointer{Target: &btf.Void{}}
	m := func(name string, t btf.Type, byteOff uint32) btf.Member {
		return btf.Member{Name: name, Type: t, Offset: btf.Bits(byteOff * 8)}
	}
	list := &btf.Struct{Name: "list_head", Size: 16, Members: []btf.Member{m("next", ptr, 0), m("prev", ptr, 8)}}
	state := &btf.Enum{Name: "module_state", Size: 4, Values: []btf.EnumValue{
		{Name: "MODULE_STATE_LIVE", Value: 0}, {Name: "MODULE_STATE_COMING", Value: 1},
		{Name: "MODULE_STATE_GOING", Value: 2}, {Name: "MODULE_STATE_UNFORMED", Value: 3}}}
	mod := &btf.Struct{Name: "module", Size: 160, Members: []btf.Member{
		m("state", state, 0), m("list", list, 24),
		m("name", &btf.Array{Index: u32, Type: char, Nelems: 56}, 40),
		m("num_exentries", u32, 100), m("extable", ptr, 104),
		m("jump_entries", ptr, 120), m("num_jump_entries", u32, 128),
		m("num_static_call_sites", s32, 132), m("static_call_sites", ptr, 136),
		m("core_layout", &btf.Struct{Name: "module_layout", Size: 16, Members: []btf.Member{
			m("base", ptr, 0), m("size", u32, 8), m("text_size", u32, 12)}}, 144),
	}}
	var kept []btf.Member
	for _, x := range mod.Members {
		if x.Name != dropMember {
			kept = append(kept, x)
		}
	}
	mod.Members = kept
	return []btf.Type{list, state, mod,
		&btf.Struct{Name: "exception_table_entry", Size: 12, Members: []btf.Member{m("insn", s32, 0), m("fixup", s32, 4), m("data", s32, 8)}},
		&btf.Struct{Name: "jump_entry", Size: 16, Members: []btf.Member{m("code", s32, 0), m("target", s32, 4), m("key", u64, 8)}},
		&btf.Struct{Name: "static_call_site", Size: 8, Members: []btf.Member{m("addr", s32, 0), m("key", s32, 4)}},
		&btf.Struct{Name: "ftrace_page", Size: 24, Members: []btf.Member{m("order", s32, 0), m("index", s32, 4), m("next", ptr, 8), m("records", ptr, 16)}},
		&btf.Struct{Name: "dyn_ftrace", Size: 16, Members: []btf.Member{m("flags", u64, 0), m("ip", u64, 8)}},
	}
}

func testLayout(t *testing.T, dropMember string) (*KernelLayout, error) {
	t.Helper()
	return LayoutFromBTF(specFromTypes(t, testLayoutTypes(dropMember)))
}

func TestLayoutFromBTF(t *testing.T) {
	l, err := testLayout(t, "")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ got, want Field }{
		"module.list":            {l.Module.List, Field{24, 16}},
		"module.name":            {l.Module.Name, Field{40, 56}},
		"module.extable":         {l.Module.ExTable, Field{104, 8}},
		"module.num_static_call": {l.Module.NumStaticCallSites, Field{132, 4}},
		"ftrace_page.next":       {l.FtraceNext, Field{8, 8}},
		"dyn_ftrace.ip":          {l.DynFtrace.Rel, Field{8, 8}},
	} {
		if c.got != c.want {
			t.Errorf("%s = %+v, want %+v", name, c.got, c.want)
		}
	}
	if l.Module.Unformed != 3 || l.JumpEntry.Size != 16 || l.FtracePageSize != 24 {
		t.Errorf("unformed %d, jump_entry %d bytes, ftrace_page %d bytes", l.Module.Unformed, l.JumpEntry.Size, l.FtracePageSize)
	}
	_, err = testLayout(t, "jump_entries")
	var le *LayoutError
	if !errors.Is(err, ErrLayout) || !errors.As(err, &le) || le.Type != "module" || le.Member != "jump_entries" {
		t.Errorf("missing member: %v, want a LayoutError naming module.jump_entries", err)
	}
}

// fakeKernel lays out, in memReader memory, a modules list with a live
// module, an unformed one and our layout's tables, and two ftrace pages.
type fakeKernel struct {
	mem  memReader
	syms *Symbols
}

const (
	fkModules = 0xffffffff83000000 // LIST_HEAD(modules)
	fkFtrace  = 0xffffffff83000100 // ftrace_pages_start
	fkMod1    = 0xffffffffc0100000 // struct module of "evdev"
	fkMod2    = 0xffffffffc0200000 // struct module of an unformed module
	fkTables  = 0xffffffffc0110000 // evdev's tables
	fkPage1   = 0xffff888000100000
	fkPage2   = 0xffff888000200000
	fkRecs1   = 0xffff888000300000
	fkRecs2   = 0xffff888000400000
)

func newFakeKernel(t *testing.T, l *KernelLayout) *fakeKernel {
	syms, err := ParseKallsyms(strings.NewReader(kallsymsFixture +
		"ffffffff83000000 D modules\nffffffff83000100 b ftrace_pages_start\n" +
		"ffffffffc0002000 t evdev_read	[evdev]\nffffffffc0002100 t evdev_ioctl	[evdev]\n"))
	if err != nil {
		t.Fatal(err)
	}
	put64 := func(b []byte, f Field, v uint64) { binary.LittleEndian.PutUint64(b[f.Off:], v) }
	put32 := func(b []byte, f Field, v uint32) { binary.LittleEndian.PutUint32(b[f.Off:], v) }
	mem := memReader{}
	// The list: head → evdev → unformed → head.
	head := make([]byte, 16)
	binary.LittleEndian.PutUint64(head, fkMod1+uint64(l.Module.List.Off))
	mem[fkModules] = head
	mod := func(name string, state uint32, next uint64) []byte {
		b := make([]byte, 160)
		put32(b, l.Module.State, state)
		copy(b[l.Module.Name.Off:], name)
		binary.LittleEndian.PutUint64(b[l.Module.List.Off:], next)
		return b
	}
	m1 := mod("evdev", 0, fkMod2+uint64(l.Module.List.Off))
	put64(m1, l.Module.ExTable, fkTables)
	put32(m1, l.Module.NumExTable, 2)
	put64(m1, l.Module.JumpEntries, fkTables+0x100)
	put32(m1, l.Module.NumJumpEntries, 1)
	put64(m1, l.Module.StaticCallSites, fkTables+0x200)
	put32(m1, l.Module.NumStaticCallSites, 1)
	mem[fkMod1] = m1
	m2 := mod("coming", uint32(l.Module.Unformed), fkModules)
	put64(m2, l.Module.ExTable, 0xdead0000) // unreadable: must not be read
	put32(m2, l.Module.NumExTable, 5)
	mem[fkMod2] = m2
	tables := make([]byte, 0x300)
	rel := func(e Entry, at uint64, target uint64) {
		field := at + uint64(e.Rel.Off)
		binary.LittleEndian.PutUint32(tables[at-fkTables+uint64(e.Rel.Off):], uint32(int32(int64(target-field))))
	}
	rel(l.ExTableEntry, fkTables, 0xffffffffc0002010)
	rel(l.ExTableEntry, fkTables+uint64(l.ExTableEntry.Size), 0xffffffffc0002020)
	rel(l.JumpEntry, fkTables+0x100, 0xffffffffc0002110)
	rel(l.StaticCallSite, fkTables+0x200, 0xffffffffc0002120)
	mem[fkTables] = tables
	// ftrace: start → page1 (2 records) → page2 (1 record, 1 unused slot).
	start := make([]byte, 8)
	binary.LittleEndian.PutUint64(start, fkPage1)
	mem[fkFtrace] = start
	page := func(next, recs uint64, index uint32) []byte {
		b := make([]byte, l.FtracePageSize)
		put64(b, l.FtraceNext, next)
		put64(b, l.FtraceRecords, recs)
		put32(b, l.FtraceIndex, index)
		return b
	}
	mem[fkPage1] = page(fkPage2, fkRecs1, 2)
	mem[fkPage2] = page(0, fkRecs2, 1)
	recs := func(ips ...uint64) []byte {
		b := make([]byte, 2*l.DynFtrace.Size)
		for i, ip := range ips {
			binary.LittleEndian.PutUint64(b[uint32(i)*l.DynFtrace.Size+l.DynFtrace.Rel.Off:], ip)
			binary.LittleEndian.PutUint64(b[uint32(i)*l.DynFtrace.Size:], 0x1234) // flags
		}
		return b
	}
	mem[fkRecs1] = recs(0xffffffff81001040, 0xffffffff810010c0)
	mem[fkRecs2] = recs(0xffffffffc0002000, 0xffffffffc0002100) // the second is past index: not a record
	return &fakeKernel{mem: mem, syms: syms}
}

func TestLoadOwnedSitesModulesAndFtrace(t *testing.T) {
	l, err := testLayout(t, "")
	if err != nil {
		t.Fatal(err)
	}
	k := newFakeKernel(t, l)
	o, n, err := LoadOwnedSites(k.mem, k.syms, l)
	if err != nil {
		t.Fatal(err)
	}
	if want := (OwnedCounts{ExTable: 2, JumpLabels: 1, StaticCalls: 1, Ftrace: 3, Modules: 1}); n != want {
		t.Errorf("counts %+v, want %+v", n, want)
	}
	for addr, want := range map[uint64]string{
		0xffffffffc0002010: "exception-table", 0xffffffffc0002020: "exception-table",
		0xffffffffc0002110: "static-key", 0xffffffffc0002120: "static call",
		0xffffffff81001040: "ftrace", 0xffffffffc0002000: "ftrace",
		0xffffffffc0002100: "", 0xffffffffc0002014: "",
	} {
		if got := o.Reason(addr); (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("%#x: %q, want %q", addr, got, want)
		}
	}
	got := o.FtraceSites(0xffffffff81000000, 0xffffffff82000000)
	slices.Sort(got)
	if !slices.Equal(got, []uint64{0xffffffff81001040, 0xffffffff810010c0}) {
		t.Errorf("core ftrace sites %x", got)
	}

	// With records, the records decide what ftrace owns.
	if !o.HasFtraceRecords() || !o.Ftrace(0xffffffff81001040) || o.Ftrace(0xffffffffc0002100) {
		t.Errorf("records %v: recorded %v, unrecorded %v", o.HasFtraceRecords(), o.Ftrace(0xffffffff81001040), o.Ftrace(0xffffffffc0002100))
	}
	var none *OwnedSites
	if none.Ftrace(0xffffffff81001040) || none.HasFtraceRecords() {
		t.Error("nil set has ftrace records")
	}

	// A list that never comes back to its head is an error, not a hang.
	binary.LittleEndian.PutUint64(k.mem[fkMod2][l.Module.List.Off:], fkMod1+uint64(l.Module.List.Off))
	if _, _, err := LoadOwnedSites(k.mem, k.syms, l); !errors.Is(err, ErrOwnedTable) {
		t.Errorf("cyclic module list: %v, want ErrOwnedTable", err)
	}
}
