package kernel

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
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

func TestLoadOwnedSites(t *testing.T) {
	const ex, jl, sc = 0xffffffff82000000, 0xffffffff82100000, 0xffffffff82100020
	syms, err := ParseKallsyms(strings.NewReader(kallsymsFixture +
		"ffffffff82000000 R __start___ex_table\nffffffff82000018 R __stop___ex_table\n" +
		"ffffffff82100000 D __start___jump_table\nffffffff82100020 D __stop___jump_table\n" +
		"ffffffff82100020 D __start_static_call_sites\nffffffff82100028 D __stop_static_call_sites\n"))
	if err != nil {
		t.Fatal(err)
	}
	rel := func(entry, target uint64) uint32 { return uint32(int32(int64(target - entry))) }
	exTab := make([]byte, 24)
	binary.LittleEndian.PutUint32(exTab[0:], rel(ex, 0xffffffff81001050))
	binary.LittleEndian.PutUint32(exTab[4:], rel(ex+4, 0xffffffff81001058)) // its fixup
	binary.LittleEndian.PutUint32(exTab[12:], rel(ex+12, 0xffffffff81001060))
	jumps := make([]byte, 32+8)
	binary.LittleEndian.PutUint32(jumps[0:], rel(jl, 0xffffffff81001070))
	binary.LittleEndian.PutUint32(jumps[4:], rel(jl+4, 0xffffffff810010a0)) // its jump target
	binary.LittleEndian.PutUint32(jumps[16:], rel(jl+16, 0xffffffff81001080))
	binary.LittleEndian.PutUint32(jumps[32:], rel(sc, 0xffffffff81001090))
	o, n, err := LoadOwnedSites(memReader{ex: exTab, jl: jumps}, syms, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n != (OwnedCounts{ExTable: 2, JumpLabels: 2, StaticCalls: 1}) {
		t.Errorf("counts %+v", n)
	}
	for addr, want := range map[uint64]string{
		0xffffffff81001050: "exception-table", 0xffffffff81001060: "exception-table",
		0xffffffff81001070: "static-key", 0xffffffff81001080: "static-key",
		0xffffffff81001090: "static call", 0xffffffff81001054: "",
	} {
		if got := o.Reason(addr); (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("%#x: %q, want %q", addr, got, want)
		}
	}
	// Where a fixup or an enabled static key sends a CPU: a landing, not
	// a refused site.
	for addr, want := range map[uint64]bool{0xffffffff81001058: true, 0xffffffff810010a0: true, 0xffffffff81001050: false, 0xffffffff81001070: false} {
		if o.Landing(addr) != want || (want && o.Reason(addr) != "") {
			t.Errorf("%#x: landing %v (reason %q), want %v", addr, o.Landing(addr), o.Reason(addr), want)
		}
	}
	var none *OwnedSites
	if none.Reason(0xffffffff81001050) != "" {
		t.Error("nil set owns something")
	}
}
