package engine

import (
	"testing"
)

// TestSlotAllocator: every slot once, an error when full, freed slots
// handed out again, and consecutive ranges around slots in use.
func TestSlotAllocator(t *testing.T) {
	const n = 130 // not a whole number of bitmap words
	a := newSlotAllocator(n)
	seen := map[int]bool{}
	for i := 0; i < n; i++ {
		s, err := a.alloc()
		if err != nil || s < 0 || s >= n || seen[s] {
			t.Fatalf("alloc %d: slot %d, %v (seen %v)", i, s, err, seen[s])
		}
		seen[s] = true
	}
	if _, err := a.alloc(); err == nil {
		t.Fatal("alloc with every slot in use: no error")
	}
	for _, s := range []int{3, 64, 129} {
		a.free(s)
	}
	a.free(3) // twice: no effect
	if a.used != n-3 {
		t.Fatalf("%d in use after freeing 3 of %d", a.used, n)
	}
	got := map[int]bool{}
	for i := 0; i < 3; i++ {
		s, err := a.alloc()
		if err != nil {
			t.Fatal(err)
		}
		got[s] = true
	}
	if !got[3] || !got[64] || !got[129] {
		t.Errorf("reallocated %v, want 3, 64 and 129", got)
	}
	for s := 10; s < 20; s++ {
		if s != 14 && s != 15 {
			a.free(s)
		}
	}
	if base, err := a.allocRange(4); err != nil || base != 10 {
		t.Errorf("allocRange(4): %d, %v; want 10", base, err)
	}
	if _, err := a.allocRange(5); err == nil {
		t.Error("allocRange(5) with at most 4 free in a row: no error")
	}
	if len(a.inUseSlots()) != a.used {
		t.Errorf("inUseSlots %d, used %d", len(a.inUseSlots()), a.used)
	}
}

// BenchmarkSlotAllocFull: asking a full allocator (a coverage session
// over more blocks than counters) costs nothing like a scan.
func BenchmarkSlotAllocFull(b *testing.B) {
	a := newSlotAllocator(1 << 16)
	for {
		if _, err := a.alloc(); err != nil {
			break
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a.alloc()
	}
}

// BenchmarkSlotAllocChurn: alloc and free with most slots in use.
func BenchmarkSlotAllocChurn(b *testing.B) {
	a := newSlotAllocator(1 << 16)
	for i := 0; i < 1<<16-100; i++ {
		a.alloc()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, _ := a.alloc()
		a.free(s)
	}
}
