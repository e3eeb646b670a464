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

func TestPortableNames(t *testing.T) {
	s, err := ParseKallsyms(strings.NewReader(kallsymsFixture))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"filename_lookup", "modfn"} {
		sym, _, _ := s.Lookup(name)
		p, ok := s.Portable(sym.Addr)
		if !ok {
			t.Fatalf("%s: no portable name", name)
		}
		if a, ok := s.FromPortable(p); !ok || a != sym.Addr {
			t.Errorf("%s → %q → %#x, %v", name, p, a, ok)
		}
	}
	if _, ok := s.Portable(0xffffffff81001041); ok {
		t.Error("mid-function address got a portable name")
	}
}
