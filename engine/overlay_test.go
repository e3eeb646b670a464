package engine

import (
	"bytes"
	"errors"
	"testing"
)

// memText is kernel text in memory: what the overlay's reads go through.
type memText struct {
	base uint64
	b    []byte
}

func (m memText) Read(addr uint64, b []byte) error {
	if addr < m.base || addr+uint64(len(b)) > m.base+uint64(len(m.b)) {
		return errors.New("out of range")
	}
	copy(b, m.b[addr-m.base:])
	return nil
}

// The overlay gives back every entry's original bytes, short (in the map
// itself) and long (an instruction kept whole) alike, over reads that
// start before, inside and after them, through both of textView's ways
// of looking (few entries: all of them; many: by address); a failed
// write keeps nothing; dropped entries are gone.
func TestOverlayShortAndLong(t *testing.T) {
	orig := []byte("0123456789abcdefghijklmnopqrstuvwxyz")
	live := memText{base: 0x1000, b: bytes.Clone(orig)}
	var ov overlay
	v := textView{dev: live, ov: &ov}
	write := func(at int, n int) func() error {
		return func() error {
			for i := range n {
				live.b[at+i] = 0xcc
			}
			return nil
		}
	}
	if err := ov.spliced(0x1002, orig[2:3], write(2, 1)); err != nil {
		t.Fatal(err)
	}
	if err := ov.spliced(0x1010, orig[16:25], write(16, 9)); err != nil {
		t.Fatal(err)
	}
	if err := ov.spliced(0x1020, orig[32:34], func() error { return errors.New("refused") }); err == nil {
		t.Fatal("a failed write succeeded")
	}
	if n := ov.len(); n != 2 || len(ov.short) != 1 || len(ov.long) != 1 {
		t.Fatalf("%d entries (%d short, %d long), want one of each", n, len(ov.short), len(ov.long))
	}
	for _, r := range [][2]int{{0, 36}, {1, 3}, {2, 1}, {15, 4}, {20, 10}, {24, 1}} {
		b := make([]byte, r[1])
		if err := v.Read(0x1000+uint64(r[0]), b); err != nil || !bytes.Equal(b, orig[r[0]:r[0]+r[1]]) {
			t.Errorf("read [%d, +%d): %q, want %q (%v)", r[0], r[1], b, orig[r[0]:r[0]+r[1]], err)
		}
	}
	// Many entries: the lookup by address.
	for a := 0; a < 36; a += 2 {
		if a != 2 && a != 16 && a != 18 && a != 20 && a != 22 && a != 24 {
			ov.spliced(0x1000+uint64(a), orig[a:a+1], write(a, 1))
		}
	}
	b := make([]byte, 6)
	if err := v.Read(0x1010, b); err != nil || !bytes.Equal(b, orig[16:22]) {
		t.Errorf("with many entries: %q, want %q", b, orig[16:22])
	}
	ov.forget(0x1010)
	if _, ok := ov.long[0x1010]; ok || ov.long != nil {
		t.Errorf("a forgotten long entry stayed")
	}
}
