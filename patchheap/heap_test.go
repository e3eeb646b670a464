package patchheap

import (
	"errors"
	"math/rand/v2"
	"testing"
)

const base = 0xffffffffc0a00000

// op is one step of a scenario: an allocation of alloc bytes (want: the
// offset it gets, or err) or, if isFree, a free at offset free (want: the
// length freed, or err).
type op struct {
	isFree bool
	alloc  int
	free   uint64
	want   uint64
	err    error
}

func alloc(n int, at uint64) op         { return op{alloc: n, want: at} }
func allocFails(n int, err error) op    { return op{alloc: n, err: err} }
func free(at, n uint64) op              { return op{isFree: true, free: at, want: n} }
func freeFails(at uint64, err error) op { return op{isFree: true, free: at, err: err} }

var errSize = errors.New("bad size") // any error that is neither ErrFull nor ErrNotAllocated

func TestHeap(t *testing.T) {
	tests := []struct {
		name string
		size uint64 // heap size; granule 64
		ops  []op
	}{
		{"rounds up to granules", 1024, []op{
			alloc(1, 0), alloc(64, 64), alloc(65, 128), alloc(200, 256),
		}},
		{"first fit takes the lowest hole", 1024, []op{
			alloc(64, 0), alloc(128, 64), alloc(64, 192), alloc(64, 256),
			free(64, 128),
			alloc(64, 64),  // the hole left by the free, not the end
			alloc(64, 128), // the rest of that hole
			alloc(64, 320),
		}},
		{"fragmentation: a hole too small is skipped", 512, []op{
			alloc(64, 0), alloc(64, 64), alloc(64, 128), alloc(64, 192),
			free(64, 64), free(192, 64), // holes at 64 and 192..512
			alloc(128, 192), // does not fit at 64
			alloc(64, 64),   // fits at 64
			alloc(192, 320),
			allocFails(64, ErrFull), // full
		}},
		{"fragmentation: enough free bytes, but not in a row", 256, []op{
			alloc(64, 0), alloc(64, 64), alloc(64, 128), alloc(64, 192),
			free(0, 64), free(128, 64),
			allocFails(128, ErrFull),
			free(64, 64), // coalesces 0..192
			alloc(192, 0),
		}},
		{"coalescing with the previous run", 512, []op{
			alloc(64, 0), alloc(64, 64), alloc(64, 128),
			free(0, 64), free(64, 64),
			alloc(128, 0),
		}},
		{"coalescing with the next run", 512, []op{
			alloc(64, 0), alloc(64, 64), alloc(64, 128),
			free(64, 64), free(0, 64),
			alloc(128, 0),
		}},
		{"coalescing both sides", 256, []op{
			alloc(64, 0), alloc(64, 64), alloc(64, 128), alloc(64, 192),
			free(0, 64), free(128, 64), free(64, 64),
			alloc(192, 0), allocFails(128, ErrFull),
		}},
		{"exactly full, then empty again", 256, []op{
			alloc(256, 0), allocFails(1, ErrFull),
			free(0, 256), alloc(256, 0),
		}},
		{"larger than the heap", 256, []op{
			allocFails(257, ErrFull), alloc(256, 0),
		}},
		{"bad sizes", 256, []op{
			allocFails(0, errSize), allocFails(-1, errSize), alloc(1, 0),
		}},
		{"bad frees change nothing", 512, []op{
			alloc(128, 0), alloc(64, 128),
			freeFails(64, ErrNotAllocated),  // inside an allocation
			freeFails(1, ErrNotAllocated),   // not on a granule
			freeFails(256, ErrNotAllocated), // free memory
			freeFails(512, ErrNotAllocated), // the end of the heap
			freeFails(1<<20, ErrNotAllocated),
			free(0, 128),
			freeFails(0, ErrNotAllocated), // double free
			alloc(64, 0),                  // the freed run is reused once
			alloc(64, 64),
			alloc(64, 192),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := New(base, tc.size, 64)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range tc.ops {
				var got uint64
				var err error
				what := ""
				if !o.isFree {
					what = "alloc"
					got, err = h.Alloc(o.alloc)
					if err == nil {
						got -= base
					}
				} else {
					what = "free"
					got, err = h.Free(base + o.free)
				}
				switch {
				case o.err == nil && err != nil:
					t.Fatalf("op %d (%s %+v): %v", i, what, o, err)
				case o.err == errSize && (err == nil || errors.Is(err, ErrFull) || errors.Is(err, ErrNotAllocated)):
					t.Fatalf("op %d (%s %+v): error %v, want a size error", i, what, o, err)
				case o.err != nil && o.err != errSize && !errors.Is(err, o.err):
					t.Fatalf("op %d (%s %+v): error %v, want %v", i, what, o, err, o.err)
				case o.err == nil && got != o.want:
					t.Fatalf("op %d (%s %+v): got %d, want %d", i, what, o, got, o.want)
				}
				checkInvariants(t, h)
			}
		})
	}
}

// checkInvariants: the free runs are sorted, disjoint, coalesced and inside
// the heap; allocations lie outside them and inside the heap; together they
// cover the heap exactly.
func checkInvariants(t *testing.T, h *Heap) {
	t.Helper()
	var free uint64
	for i, f := range h.free {
		if f.start >= f.end || f.start < h.base || f.end > h.base+h.size {
			t.Fatalf("bad free run %#x..%#x", f.start, f.end)
		}
		if i > 0 && h.free[i-1].end >= f.start {
			t.Fatalf("free runs %#x..%#x and %#x..%#x overlap or touch", h.free[i-1].start, h.free[i-1].end, f.start, f.end)
		}
		free += f.end - f.start
	}
	var used uint64
	for g, ng := range h.lens {
		if ng == 0 {
			continue
		}
		a, n := h.base+uint64(g)*h.granule, uint64(ng)*h.granule
		if n == 0 || n%h.granule != 0 || a < h.base || a+n > h.base+h.size {
			t.Fatalf("bad allocation %#x+%d", a, n)
		}
		for _, f := range h.free {
			if a < f.end && f.start < a+n {
				t.Fatalf("allocation %#x+%d overlaps free run %#x..%#x", a, n, f.start, f.end)
			}
		}
		if got, ok := h.Len(a); !ok || got != n {
			t.Fatalf("Len(%#x) = %d, %v; want %d", a, got, ok, n)
		}
		used += n
	}
	if used != h.Used() || used+free != h.size {
		t.Fatalf("%d allocated (Used %d) + %d free != %d", used, h.Used(), free, h.size)
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		base, size, granule uint64
		ok                  bool
	}{
		{base, 1 << 20, 64, true},
		{base, 1 << 20, 0, false},
		{base, 1 << 20, 48, false},
		{base + 32, 1 << 20, 64, false},
		{base, 1<<20 + 32, 64, false},
		{base, 0, 64, false},
		{^uint64(0) - 63, 128, 64, false},
	}
	for _, tc := range tests {
		_, err := New(tc.base, tc.size, tc.granule)
		if (err == nil) != tc.ok {
			t.Errorf("New(%#x, %#x, %d): %v, want ok %v", tc.base, tc.size, tc.granule, err, tc.ok)
		}
	}
}

// TestRandom allocates and frees at random against a model of the heap, a
// bitmap of granules searched first-fit as the driver once did
// (bitmap_find_next_zero_area), so the addresses must agree exactly.
func TestRandom(t *testing.T) {
	const granules = 256
	h, err := New(base, granules*64, 64)
	if err != nil {
		t.Fatal(err)
	}
	var used [granules]bool
	lens := map[uint64]int{} // start granule → granules
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		if len(lens) == 0 || r.IntN(3) > 0 {
			n := 1 + r.IntN(64*8)
			need := (n + 63) / 64
			want := -1
			for s := 0; s+need <= granules && want < 0; s++ {
				free := true
				for g := s; g < s+need && free; g++ {
					free = !used[g]
				}
				if free {
					want = s
				}
			}
			got, err := h.Alloc(n)
			if want < 0 {
				if !errors.Is(err, ErrFull) {
					t.Fatalf("step %d: alloc %d: %#x, %v; want ErrFull", i, n, got, err)
				}
				continue
			}
			if err != nil || got != base+uint64(want)*64 {
				t.Fatalf("step %d: alloc %d: %#x, %v; want %#x", i, n, got, err, base+uint64(want)*64)
			}
			for g := want; g < want+need; g++ {
				used[g] = true
			}
			lens[uint64(want)] = need
		} else {
			var s uint64
			k := r.IntN(len(lens))
			for a := range lens {
				if k == 0 {
					s = a
					break
				}
				k--
			}
			n, err := h.Free(base + s*64)
			if err != nil || n != uint64(lens[s])*64 {
				t.Fatalf("step %d: free %#x: %d, %v; want %d", i, base+s*64, n, err, lens[s]*64)
			}
			for g := s; g < s+uint64(lens[s]); g++ {
				used[g] = false
			}
			delete(lens, s)
		}
		if i%97 == 0 {
			checkInvariants(t, h)
		}
	}
}

// TestLensFollowUse: the per-granule lengths reach only as far as the
// last allocation, and go once the heap is empty again.
func TestLensFollowUse(t *testing.T) {
	h, err := New(base, 1<<20, 32)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []uint64
	for range 100 {
		a, err := h.Alloc(40) // two granules
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	if len(h.lens) != 199 {
		t.Errorf("%d lengths for 100 two-granule allocations, want 199", len(h.lens))
	}
	for _, a := range addrs {
		if _, err := h.Free(a); err != nil {
			t.Fatal(err)
		}
		checkInvariants(t, h)
	}
	if h.lens != nil || h.Used() != 0 {
		t.Errorf("empty heap keeps %d lengths, %d bytes used", len(h.lens), h.Used())
	}
	for _, a := range []uint64{base - 32, base + 1<<20, base + 1} {
		if _, err := h.Free(a); !errors.Is(err, ErrNotAllocated) {
			t.Errorf("Free(%#x) = %v, want ErrNotAllocated", a, err)
		}
	}
}
