package engine

import (
	"bytes"
	"errors"
	"math/rand/v2"
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

// The overlay gives back every entry's original bytes, short (8 bytes
// an entry) and long (an instruction kept whole) alike, over reads that
// start before, inside and after them, with few entries and with many;
// a failed write keeps nothing; dropped entries are gone.
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
	if n := ov.len(); n != 2 || ov.short.len() != 1 || ov.long.len() != 1 {
		t.Fatalf("%d entries (%d short, %d long), want one of each", n, ov.short.len(), ov.long.len())
	}
	for _, r := range [][2]int{{0, 36}, {1, 3}, {2, 1}, {15, 4}, {20, 10}, {24, 1}} {
		b := make([]byte, r[1])
		if err := v.Read(0x1000+uint64(r[0]), b); err != nil || !bytes.Equal(b, orig[r[0]:r[0]+r[1]]) {
			t.Errorf("read [%d, +%d): %q, want %q (%v)", r[0], r[1], b, orig[r[0]:r[0]+r[1]], err)
		}
	}
	// Many entries.
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
	if _, ok := ov.long.get(0x1010); ok || ov.long.pages != nil {
		t.Errorf("a forgotten long entry stayed")
	}
}

// Thousands of short entries over several pages, put, replaced and
// dropped in random order, read back as a map of every address would
// give them: the paged store's sorted insertion and deletion, and page
// bounds (entries near the end of a page overlapping the next).
func TestOverlayPages(t *testing.T) {
	const base, size = 0x10000 - 64, 3 * 4096
	rng := rand.New(rand.NewPCG(1, 2))
	orig := make([]byte, size)
	for i := range orig {
		orig[i] = byte(rng.IntN(256))
	}
	live := memText{base: base, b: make([]byte, size)}
	for i := range live.b {
		live.b[i] = 0xcc
	}
	var ov overlay
	v := textView{dev: live, ov: &ov}
	want := map[uint64][]byte{}
	for range 20000 {
		at := rng.IntN(size - shortOrig)
		a := uint64(base + at)
		if rng.IntN(3) == 0 {
			ov.forget(a)
			delete(want, a)
			continue
		}
		// Entries never overlap in the engine: keep them apart here too.
		n := 1 + rng.IntN(5)
		clash := false
		for b := a - shortOrig; b < a+uint64(n); b++ {
			if w, ok := want[b]; ok && b != a && b+uint64(len(w)) > a {
				clash = true
			}
		}
		if clash {
			continue
		}
		ov.spliced(a, orig[at:at+n], func() error { return nil })
		want[a] = orig[at : at+n]
	}
	if ov.len() != len(want) {
		t.Fatalf("%d entries, want %d", ov.len(), len(want))
	}
	exp := bytes.Repeat([]byte{0xcc}, size)
	for a, w := range want {
		copy(exp[a-base:], w)
	}
	for _, r := range [][2]int{{0, size}, {4096 - 70, 80}, {64, 1}, {8191, 9}, {size - 20, 20}} {
		b := make([]byte, r[1])
		if err := v.Read(base+uint64(r[0]), b); err != nil || !bytes.Equal(b, exp[r[0]:r[0]+r[1]]) {
			t.Errorf("read [%#x, +%d) differs from the reference (%v)", r[0], r[1], err)
		}
	}
	for a := range want {
		ov.forget(a)
	}
	if ov.len() != 0 || ov.short.pages != nil {
		t.Errorf("%d entries left after every one was dropped", ov.len())
	}
}
