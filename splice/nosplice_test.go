package splice

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
)

type memReader map[uint64][]byte // base → bytes

func (m memReader) Read(addr uint64, b []byte) error {
	for base, data := range m {
		if addr >= base && addr+uint64(len(b)) <= base+uint64(len(data)) {
			copy(b, data[addr-base:])
			return nil
		}
	}
	return errors.New("unmapped")
}

// TestFtraceSiteByRecords: with ftrace's records read, the records decide;
// a first instruction shaped like an ftrace nop but not recorded is not
// ftrace's. Without them the shape decides.
func TestFtraceSiteByRecords(t *testing.T) {
	const start, page, recs = 0xffffffff83000100, 0xffff888000100000, 0xffff888000200000
	syms, err := kernel.ParseKallsyms(strings.NewReader(kallsymsFixture + "ffffffff83000100 b ftrace_pages_start\n"))
	if err != nil {
		t.Fatal(err)
	}
	// Only ftrace's structs matter here: no module list, no core tables.
	l := &kernel.KernelLayout{
		FtracePageSize: 24, FtraceIndex: kernel.Field{Off: 4, Size: 4},
		FtraceNext: kernel.Field{Off: 8, Size: 8}, FtraceRecords: kernel.Field{Off: 16, Size: 8},
		DynFtrace: kernel.Entry{Size: 16, Rel: kernel.Field{Off: 8, Size: 8}},
	}
	head := binary.LittleEndian.AppendUint64(nil, page)
	pg := make([]byte, 24)
	binary.LittleEndian.PutUint32(pg[4:], 1)
	binary.LittleEndian.PutUint64(pg[16:], recs)
	rec := make([]byte, 16)
	binary.LittleEndian.PutUint64(rec[8:], 0xffffffff81001040)
	o, _, err := kernel.LoadOwnedSites(memReader{start: head, page: pg, recs: rec}, syms, l)
	if err != nil {
		t.Fatal(err)
	}
	nop := []byte{0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3} // the ftrace nop, ret
	recorded, _ := cfg.Decode("filename_lookup", "", 0xffffffff81001040, nop)
	unrecorded, _ := cfg.Decode("modfn", "virtio_net", 0xffffffffc0001100, nop)
	if !IsFtraceSite(o, recorded, 0) || IsFtraceSite(o, unrecorded, 0) || InstructionNoSplice(o, unrecorded, 0) != "" {
		t.Errorf("with records: recorded %v, unrecorded %v (%q)", IsFtraceSite(o, recorded, 0), IsFtraceSite(o, unrecorded, 0), InstructionNoSplice(o, unrecorded, 0))
	}
	if !strings.Contains(InstructionNoSplice(o, recorded, 0), "ftrace") {
		t.Errorf("recorded site: %q", InstructionNoSplice(o, recorded, 0))
	}
	var none *kernel.OwnedSites
	if !IsFtraceSite(none, unrecorded, 0) || !strings.Contains(InstructionNoSplice(none, unrecorded, 0), "ftrace") {
		t.Error("without records the shape of the first instruction should decide")
	}
}

// A function the kernel's kprobe blacklist names is refused whole; the
// kinst lists still refuse theirs when the blacklist was not read; other
// functions pass.
func TestFunctionNoSpliceLists(t *testing.T) {
	syms := kernel.NewSymbols([]kernel.Symbol{{Name: "foo", Addr: 0xffffffff81000000, Type: 't'}})
	bl := kernel.KprobeBlacklist{0xffffffff81000000: true}
	die := NewDieNotifiers([]kernel.DieNotifier{{Func: 0xffffffff81000600, Priority: 0x7fffffff}})
	for _, c := range []struct {
		fn   cfg.Function
		bl   kernel.KprobeBlacklist
		die  DieNotifiers
		want string
	}{
		{cfg.Function{Name: "foo", Addr: 0xffffffff81000000}, bl, nil, "kprobes blacklist"},
		// By address, whatever its name: a module's notifier is one too.
		{cfg.Function{Name: "hw_breakpoint_exceptions_notify", Addr: 0xffffffff81000600}, nil, die, "die notifier"},
		{cfg.Function{Name: "hw_breakpoint_exceptions_notify", Addr: 0xffffffff81000600}, nil, nil, ""},
		{cfg.Function{Name: "bar", Addr: 0xffffffff81000300}, nil, die, ""},
		{cfg.Function{Name: "foo", Addr: 0xffffffff81000000}, nil, nil, ""},
		{cfg.Function{Name: "notify_die", Addr: 0xffffffff81000100}, nil, nil, "int3"},
		{cfg.Function{Name: "multi_cpu_stop", Addr: 0xffffffff81000200}, bl, nil, "stop_machine"},
		{cfg.Function{Name: "bar", Addr: 0xffffffff81000300}, bl, nil, ""},
		{cfg.Function{Name: "srso_safe_ret", Addr: 0xffffffff81000400}, nil, nil, "thunk"},
		{cfg.Function{Name: "entry_untrain_ret", Addr: 0xffffffff81000500}, nil, nil, "thunk"},
	} {
		got := FunctionNoSplice(syms, &c.fn, DriverModule, c.bl, c.die)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s (blacklist %v): %q, want %q", c.fn.Name, c.bl != nil, got, c.want)
		}
	}
	// With the text's bounds known, a "function" at or past _etext (the
	// marker itself, freed init text) is refused; one inside, and a
	// module's, are not. (A whole-kernel bench planned _etext+0x2ce, in
	// a page the driver found not executable: EPERM.)
	bounded := kernel.NewSymbols([]kernel.Symbol{{Name: "_stext", Addr: 0xffffffff81000000, Type: 'T'}, {Name: "foo", Addr: 0xffffffff81000000, Type: 't'},
		{Name: "_etext", Addr: 0xffffffff82000000, Type: 'T'}, {Name: "init_fn", Addr: 0xffffffff83000000, Type: 't'}})
	for _, c := range []struct {
		fn   cfg.Function
		want string
	}{
		{cfg.Function{Name: "foo", Addr: 0xffffffff81000000}, ""},
		{cfg.Function{Name: "_etext", Addr: 0xffffffff82000000}, "outside the kernel's text"},
		{cfg.Function{Name: "init_fn", Addr: 0xffffffff83000000}, "outside the kernel's text"},
		{cfg.Function{Name: "modfn", Module: "virtio_net", Addr: 0xffffffffc0001100}, ""},
	} {
		got := FunctionNoSplice(bounded, &c.fn, DriverModule, nil, nil)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.fn.Name, got, c.want)
		}
	}
}

// On IBT kernels (6.12) a function starts with endbr64, or the osp-nop3
// the kernel seals it into; that instruction is refused and the ftrace
// site is the one after it.
func TestLandingPadRefused(t *testing.T) {
	for _, c := range []struct {
		name  string
		code  []byte
		pad   bool
		ftrLo int // the instruction the shape rule calls the ftrace site
	}{
		{"endbr64", []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55, 0xc3}, true, 1},
		{"sealed", []byte{0x66, 0x0f, 0x1f, 0x00, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55, 0xc3}, true, 1},
		{"no IBT", []byte{0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55, 0xc3}, false, 0},
	} {
		f, err := cfg.Decode("fn", "", 0xffffffff81001000, c.code)
		if err != nil {
			t.Fatal(err)
		}
		var none *kernel.OwnedSites
		why := InstructionNoSplice(none, f, 0)
		if c.pad != strings.Contains(why, "endbr64") {
			t.Errorf("%s: instruction 0: %q; landing pad %v", c.name, why, c.pad)
		}
		if !f.IsFtraceSite(c.ftrLo) || f.IsFtraceSite(c.ftrLo+1) {
			t.Errorf("%s: ftrace site not instruction %d", c.name, c.ftrLo)
		}
		if got := InstructionNoSplice(none, f, c.ftrLo+1); got != "" {
			t.Errorf("%s: push refused: %q", c.name, got)
		}
	}
}

func TestEndbrPrintsAsObjdump(t *testing.T) {
	f, err := cfg.Decode("fn", "", 0xffffffff81001000, []byte{0xf3, 0x0f, 0x1e, 0xfa, 0xc3})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Insns) != 2 || f.Insns[0].String() != "endbr64" || f.Insns[0].Len() != 4 {
		t.Errorf("decoded %d instructions, first %q", len(f.Insns), f.Insns[0].String())
	}
}
