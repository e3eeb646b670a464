package kernel

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// testProgram is a kernel of two CPUs with one module ("evdev", its text
// at 0xffffffffc0100000, 0x1000 bytes of which 0x800 text), whose
// symbol table lists the image's symbols only, as a dump's does.
func testProgram(t *testing.T) (*Program, memReader) {
	t.Helper()
	const (
		percpu  = 0xffffffff82000000 // __per_cpu_offset
		ncpu    = 0xffffffff82000100 // nr_cpu_ids
		modules = 0xffffffff83000000
		mod     = 0xffffffffc0010000
		ks      = 0xffffffffc0030000
		text    = 0xffffffffc0100000
	)
	le := binary.LittleEndian
	mem := memReader{
		percpu:  le.AppendUint64(le.AppendUint64(nil, 0xffff888100000000), 0xffff888200000000),
		ncpu:    le.AppendUint32(nil, 2),
		modules: le.AppendUint64(nil, mod+8),
		// CPU 1's copy of runqueues (per-CPU offset 0x2c000).
		0xffff88820002c000: []byte("cpu1's rq"),
	}
	b := make([]byte, 136)
	le.PutUint64(b[8:], modules)
	copy(b[24:], "evdev")
	le.PutUint64(b[80:], ks)
	le.PutUint64(b[96:], text) // core_layout
	le.PutUint32(b[104:], 0x1000)
	le.PutUint32(b[108:], 0x800)
	mem[mod] = b
	kb := make([]byte, 32)
	le.PutUint64(kb, ks+0x100)
	le.PutUint32(kb[8:], 3)
	le.PutUint64(kb[16:], ks+0x1000)
	le.PutUint64(kb[24:], ks+0x3000)
	mem[ks] = kb
	symtab := make([]byte, 3*24)
	for i, s := range []struct {
		name  uint32
		value uint64
	}{{0, 0}, {1, text + 0x40}, {12, text + 0x100}} {
		le.PutUint32(symtab[i*24:], s.name)
		le.PutUint16(symtab[i*24+6:], 1)
		le.PutUint64(symtab[i*24+8:], s.value)
	}
	mem[ks+0x100] = symtab
	mem[ks+0x1000] = append([]byte("\x00evdev_read\x00helper\x00"), make([]byte, 0x1000)...)
	mem[ks+0x3000] = []byte("?tt")

	types := &Types{Spec: specFromTypes(t, moduleTypes("core_layout"))}
	image := kallsymsFixture + "000000000002c000 A runqueues\nffffffff82000000 D __per_cpu_offset\n" +
		"ffffffff82000100 D nr_cpu_ids\nffffffff83000000 d modules\nffffffff84000000 B _end\n"
	p := New(Source{
		Memory:        mem,
		Symbols:       func() (*Symbols, error) { return ParseKallsyms(strings.NewReader(image)) },
		Types:         func(*Program) (*Types, error) { return types, nil },
		ModuleSymbols: true,
	})
	return p, mem
}

func TestProgramPerCPU(t *testing.T) {
	p, _ := testProgram(t)
	if n, err := p.NumCPUs(); n != 2 || err != nil {
		t.Errorf("NumCPUs = %d, %v", n, err)
	}
	for cpu, want := range []uint64{0xffff888100000000, 0xffff888200000000} {
		if got, err := p.PerCPUOffset(cpu); got != want || err != nil {
			t.Errorf("PerCPUOffset(%d) = %#x, %v", cpu, got, err)
		}
	}
	if _, err := p.PerCPUOffset(2); !errors.Is(err, ErrNoCPU) {
		t.Errorf("CPU 2 of 2: %v", err)
	}
	b := make([]byte, 9)
	if err := p.ReadPerCPU("runqueues", 1, b); err != nil || string(b) != "cpu1's rq" {
		t.Errorf("ReadPerCPU(runqueues, 1) = %q, %v", b, err)
	}
	if _, err := p.PerCPUVar("nosuch", 0); !errors.Is(err, ErrNoSymbol) {
		t.Errorf("PerCPUVar(nosuch): %v", err)
	}
}

func TestProgramSymbols(t *testing.T) {
	p, _ := testProgram(t)
	kern, err := p.KernelSymbols()
	if err != nil {
		t.Fatal(err)
	}
	all, err := p.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	// The fixture's own virtio_net symbols are in both; evdev's come
	// from its struct module.
	if got, want := len(all.Every())-len(kern.Every()), 2; got != want {
		t.Errorf("%d module symbols read, want %d", got, want)
	}
	for _, tc := range []struct {
		addr     uint64
		name     string
		module   string
		off      uint64
		size     uint64
		notFound bool
	}{
		{addr: 0xffffffffc0100044, name: "evdev_read", module: "evdev", off: 4, size: 0xc0},
		{addr: 0xffffffffc0100180, name: "helper", module: "evdev", off: 0x80, size: 0x700}, // its last: to the text's end
		{addr: 0xffffffffc0100010, notFound: true},                                          // in evdev, before its first symbol
		{addr: 0xffffffff81001010, name: "helper", off: 0x10, size: 0x40},
	} {
		sym, off, ok := p.SymbolAt(tc.addr)
		if ok == tc.notFound || (ok && (sym.Name != tc.name || sym.Module != tc.module || off != tc.off || p.SymbolSize(sym) != tc.size)) {
			t.Errorf("SymbolAt(%#x) = %+v+%#x %v (size %#x); want %s [%s] +%#x size %#x", tc.addr, sym, off, ok, p.SymbolSize(sym), tc.name, tc.module, tc.off, tc.size)
		}
	}
	for name, want := range map[string]string{"helper": "", "evdev:helper": "evdev", "evdev_read": "evdev", "virtio_net:helper": "virtio_net"} {
		if s, err := p.LookupSymbol(name); err != nil || s.Module != want {
			t.Errorf("LookupSymbol(%s) = %+v, %v; want module %q", name, s, err, want)
		}
	}
	if _, err := p.LookupSymbol("evdev:filename_lookup"); !errors.Is(err, ErrNoSymbol) {
		t.Errorf("a kernel symbol looked up in a module: %v", err)
	}
	if m := p.ModuleAt(0xffffffffc0100fff); m == nil || m.Name != "evdev" {
		t.Errorf("ModuleAt(evdev's last byte) = %+v", m)
	}
	if m := p.ModuleAt(0xffffffffc0101000); m != nil {
		t.Errorf("ModuleAt(past evdev) = %+v", m)
	}
}

func TestProgramWithoutBTF(t *testing.T) {
	p := New(Source{Memory: memReader{}, Symbols: func() (*Symbols, error) { return ParseKallsyms(strings.NewReader(kallsymsFixture)) }})
	if _, err := p.Types(); !errors.Is(err, ErrNoBTF) {
		t.Errorf("Types: %v", err)
	}
	if _, err := p.TaskLayout(); !errors.Is(err, ErrNoTaskLayout) || !errors.Is(err, ErrNoBTF) {
		t.Errorf("TaskLayout: %v", err)
	}
	if _, err := p.Modules(); !errors.Is(err, ErrNoBTF) {
		t.Errorf("Modules: %v", err)
	}
	// The core kernel's tables are still read (none here), with the
	// reason the rest were not.
	if o, _, err := p.OwnedSites(); o == nil || !errors.Is(err, ErrNoBTF) {
		t.Errorf("OwnedSites: %v, %v", o, err)
	}
}

func TestProgramReload(t *testing.T) {
	table := kallsymsFixture
	p := New(Source{Memory: memReader{}, Symbols: func() (*Symbols, error) { return ParseKallsyms(strings.NewReader(table)) }})
	old, err := p.KernelSymbols()
	if err != nil {
		t.Fatal(err)
	}
	table += "ffffffffc0200000 t newfn\t[newmod]\n"
	if _, _, err := old.Lookup("newfn"); !errors.Is(err, ErrUnknownFunction) {
		t.Fatalf("newfn before the reload: %v", err)
	}
	s, err := p.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if cur, _ := p.KernelSymbols(); cur != s || cur == old {
		t.Error("Reload did not replace the snapshot")
	}
	if sym, _, err := s.Lookup("newfn"); err != nil || sym.Module != "newmod" {
		t.Errorf("newfn after the reload: %+v, %v", sym, err)
	}
	table = "garbage"
	if _, err := p.Reload(); err == nil {
		t.Error("a bad table reloaded")
	}
	if cur, _ := p.KernelSymbols(); cur != s {
		t.Error("a failed reload replaced the snapshot")
	}
}
