package kernel

import (
	"errors"
	"strings"
	"testing"
)

const kallsymsFixture = `ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81001000 t helper
ffffffff81001040 T filename_lookup
ffffffff81001040 D not_text
ffffffff810010c0 T next_fn
ffffffffc0001000 t helper	[virtio_net]
ffffffffc0001100 t modfn	[virtio_net]
`

func TestParseKallsyms(t *testing.T) {
	s, err := ParseKallsyms(strings.NewReader(kallsymsFixture))
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 7 {
		t.Errorf("Len = %d, want 7 text symbols", s.Len())
	}
	sym, amb, err := s.Lookup("helper")
	if err != nil || sym.Module != "" || sym.Addr != 0xffffffff81001000 || amb != 2 {
		t.Errorf("Lookup(helper) = %+v, %d, %v; want the core kernel's, ambiguous 2", sym, amb, err)
	}
	sym, _, _ = s.Lookup("modfn")
	if sym.Module != "virtio_net" {
		t.Errorf("modfn module = %q", sym.Module)
	}
	fl, _, _ := s.Lookup("filename_lookup")
	if end := s.End(fl); end != 0xffffffff810010c0 {
		t.Errorf("End(filename_lookup) = %#x", end)
	}
	if got, off, ok := s.At(0xffffffff81001050); !ok || got.Name != "filename_lookup" || off != 0x10 {
		t.Errorf("At = %+v+%#x %v", got, off, ok)
	}
	_, _, err = s.Lookup("nope")
	var ue *UnknownFunctionError
	if !errors.Is(err, ErrUnknownFunction) || !errors.As(err, &ue) || ue.Name != "nope" {
		t.Errorf("Lookup(nope) err = %v", err)
	}
}

func TestParseKallsymsErrors(t *testing.T) {
	for name, in := range map[string]string{
		"hidden":    "0000000000000000 T _text\n0000000000000000 t foo\n",
		"malformed": "ffffffff81000000 T\n",
		"badaddr":   "zzzz T foo\n",
		"empty":     "",
	} {
		if _, err := ParseKallsyms(strings.NewReader(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	_, err := ParseKallsyms(strings.NewReader("0000000000000000 T _text\n"))
	if !errors.Is(err, ErrHiddenAddresses) {
		t.Errorf("zero addresses: %v, want ErrHiddenAddresses", err)
	}
}

// TestSymbolsEveryType: the table keeps symbols of every type; the
// function view (Lookup, At, Len) holds types t and T only.
func TestSymbolsEveryType(t *testing.T) {
	s, err := ParseKallsyms(strings.NewReader(kallsymsFixture +
		"000000000001fb80 A current_task\nffffffff82000000 D modules\nffffffff81001080 W weak_fn\n" +
		"ffffffffc0002000 d modules\t[virtio_net]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 7 || len(s.Every()) != 12 {
		t.Errorf("%d functions of %d symbols, want 7 of 12", s.Len(), len(s.Every()))
	}
	for _, tc := range []struct {
		name string
		addr uint64
		ok   bool
	}{
		{"current_task", 0x1fb80, true},        // per-CPU: an offset
		{"modules", 0xffffffff82000000, true},  // the core kernel's, not the module's
		{"not_text", 0xffffffff81001040, true}, // data at a function's address
		{"filename_lookup", 0xffffffff81001040, true},
		{"modfn", 0, false}, // a module's only
	} {
		if a, ok := s.Address(tc.name); a != tc.addr || ok != tc.ok {
			t.Errorf("Address(%s) = %#x %v, want %#x %v", tc.name, a, ok, tc.addr, tc.ok)
		}
	}
	if _, _, err := s.Lookup("modules"); !errors.Is(err, ErrUnknownFunction) || !errors.Is(err, ErrNoSymbol) {
		t.Errorf("Lookup of a data symbol: %v", err)
	}
	if _, _, err := s.Lookup("weak_fn"); err == nil {
		t.Error("a weak symbol in the function view")
	}
	// The weak symbol is text, but its bytes count in the extent of the
	// function before it, as kinst has always counted them.
	if got, _, _ := s.At(0xffffffff81001084); got.Name != "filename_lookup" {
		t.Errorf("At(weak_fn+4) = %s", got.Name)
	}
	if n := s.Named("modules"); len(n) != 2 || n[0].Module != "" || n[1].Module != "virtio_net" {
		t.Errorf("Named(modules) = %+v", n)
	}
	if b, ok := s.Before(0xffffffffc0001110, "virtio_net", 0x1000); !ok || b.Name != "modfn" {
		t.Errorf("Before = %+v %v", b, ok)
	}
	if a, ok := s.After(Symbol{Addr: 0xffffffffc0001000, Module: "virtio_net"}); !ok || a.Name != "modfn" {
		t.Errorf("After = %+v %v", a, ok)
	}
}

func TestIsPrefix(t *testing.T) {
	for name, want := range map[string]bool{"__pfx_vfs_read": true, "__cfi_vfs_read": true, "vfs_read": false, "__pfx": false, "_pfx_x": false} {
		if got := (Symbol{Name: name, Type: 't'}).IsPrefix(); got != want {
			t.Errorf("%s: IsPrefix %v, want %v", name, got, want)
		}
	}
}

// A weak definition (W) is live code of its own: the function before it
// ends where it starts, so its body is never taken for that function's
// padding (springboard space).
func TestEndAtWeakDefinition(t *testing.T) {
	s, err := ParseKallsyms(strings.NewReader("ffffffff81000000 T get_kprobe\nffffffff81000040 W kprobe_exceptions_notify\nffffffff81000050 t kprobe_seq_start\nffffffff81000060 d some_data\n"))
	if err != nil {
		t.Fatal(err)
	}
	gk, _, err := s.Lookup("get_kprobe")
	if err != nil {
		t.Fatal(err)
	}
	if end := s.End(gk); end != 0xffffffff81000040 {
		t.Errorf("get_kprobe ends at %#x, want the weak definition's start 0xffffffff81000040", end)
	}
	seq, _, _ := s.Lookup("kprobe_seq_start")
	if end := s.End(seq); end != 0xffffffff81000050+maxFunctionSize {
		t.Errorf("the last function ends at %#x: data symbols do not end it", end)
	}
}

// TestLookupModule: MODULE:FUNC finds the module's function where the
// core kernel (and another module) has one of the same name, which
// Lookup prefers; a name the module lacks is an unknown function.
func TestLookupModule(t *testing.T) {
	s, err := ParseKallsyms(strings.NewReader("ffffffff81000000 T _text\nffffffff81001000 t probe\nffffffff81001040 T other\n" +
		"ffffffffc0001000 t probe\t[evdev]\nffffffffc0001100 t other2\t[evdev]\nffffffffc0002000 t probe\t[psmouse]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if sym, amb, err := s.Lookup("probe"); err != nil || sym.Addr != 0xffffffff81001000 || amb != 3 {
		t.Errorf("Lookup(probe) = %#x (%d named so), %v; want the core kernel's of 3", sym.Addr, amb, err)
	}
	for mod, want := range map[string]uint64{"evdev": 0xffffffffc0001000, "psmouse": 0xffffffffc0002000} {
		if sym, err := s.LookupModule("probe", mod); err != nil || sym.Addr != want || sym.Module != mod {
			t.Errorf("LookupModule(probe, %s) = %#x [%s], %v; want %#x", mod, sym.Addr, sym.Module, err, want)
		}
	}
	if _, err := s.LookupModule("other", "evdev"); !errors.Is(err, ErrUnknownFunction) || strings.Contains(err.Error(), "no module") {
		t.Errorf("LookupModule of the core kernel's function in a module: %v, want ErrUnknownFunction", err)
	}
	// A module not loaded is said to be, not its function unknown.
	if _, err := s.LookupModule("probe", "nomod"); !errors.Is(err, ErrUnknownFunction) || !strings.Contains(err.Error(), `no module "nomod" is loaded`) {
		t.Errorf("LookupModule in a module not loaded: %v", err)
	}
}
