package cfg

import (
	"errors"
	"strings"
	"testing"

	"github.com/kinst/kinst/kernel"
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

type zeroText struct{}

func (zeroText) Read(addr uint64, b []byte) error {
	for i := range b {
		b[i] = 0x90
	}
	return nil
}

func TestFreedInitText(t *testing.T) {
	s, err := kernel.ParseKallsyms(strings.NewReader(kallsymsFixture + "ffffffff82000000 D __init_begin\nffffffff82000100 T init_fn\nffffffff82001000 R __init_end\n"))
	if err != nil {
		t.Fatal(err)
	}
	sym, _, _ := s.Lookup("init_fn")
	if _, err := ReadFunction(zeroText{}, s, sym); !errors.Is(err, ErrFreedInit) {
		t.Errorf("init function: %v, want ErrFreedInit", err)
	}
	sym, _, _ = s.Lookup("filename_lookup")
	if _, err := ReadFunction(zeroText{}, s, sym); err != nil {
		t.Errorf("ordinary function: %v", err)
	}
}
