package engine

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// addrMap against a Go map under random sets and deletes over a few
// pages: the same entries, the same answers to get, within giving the
// range's entries only, and nothing kept once all are gone.
func TestAddrMap(t *testing.T) {
	const base, span = 0xffffffff81000000 - 100, 5 * 4096
	rng := rand.New(rand.NewPCG(3, 4))
	var m addrMap[int]
	ref := map[uint64]int{}
	for i := range 50000 {
		a := base + uint64(rng.IntN(span))
		if rng.IntN(3) == 0 {
			_, had := ref[a]
			if m.del(a) != had {
				t.Fatalf("del(%#x) = %v, want %v", a, !had, had)
			}
			delete(ref, a)
			continue
		}
		m.set(a, i)
		ref[a] = i
	}
	if m.len() != len(ref) {
		t.Fatalf("len %d, want %d", m.len(), len(ref))
	}
	got := maps.Collect(m.all())
	if !maps.Equal(got, ref) {
		t.Fatalf("all() differs from the reference: %d entries, want %d", len(got), len(ref))
	}
	for a := uint64(base); a < base+span; a++ {
		v, ok := m.get(a)
		if w, has := ref[a]; ok != has || v != w {
			t.Fatalf("get(%#x) = %d, %v; want %d, %v", a, v, ok, w, has)
		}
	}
	for _, r := range [][2]uint64{{base, base + span}, {base + 4000, base + 4200}, {base + 7, base + 8}, {0, ^uint64(0)}, {base + 10, base + 10}} {
		want := 0
		for a := range ref {
			if a >= r[0] && a < r[1] {
				want++
			}
		}
		n := 0
		for a := range m.within(r[0], r[1]) {
			if a < r[0] || a >= r[1] {
				t.Fatalf("within(%#x, %#x) gave %#x", r[0], r[1], a)
			}
			n++
		}
		if n != want {
			t.Errorf("within(%#x, %#x): %d entries, want %d", r[0], r[1], n, want)
		}
	}
	for a := range ref {
		m.del(a)
	}
	if m.len() != 0 || m.pages != nil {
		t.Errorf("%d entries (%d pages) left after every one was deleted", m.len(), len(m.pages))
	}
}
