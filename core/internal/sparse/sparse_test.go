package sparse

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// naiveRank is the oracle: count every set bit below i.
func naiveRank(bm []byte, i uint64) (uint64, bool) {
	if bm[i/8]&(1<<(i%8)) == 0 {
		return 0, false
	}
	var c uint64
	for j := uint64(0); j < i; j++ {
		if bm[j/8]&(1<<(j%8)) != 0 {
			c++
		}
	}
	return c, true
}

func TestRankMatchesNaiveCount(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name    string
		nbits   uint64
		density float64
	}{
		{"empty", 0, 0},
		{"one-word", 64, 0.5},
		{"partial-word", 77, 0.5},
		{"partial-block", BlockBits + 300, 0.3},
		{"dense", 5 * BlockBits, 0.95},
		{"sparse", 7*BlockBits + 13, 0.01},
		{"full", 3 * BlockBits, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bm := make([]byte, (tc.nbits+7)/8+3) // trailing bytes past nbits must be ignored
			for i := range bm {
				for b := 0; b < 8; b++ {
					if rng.Float64() < tc.density || uint64(i*8+b) >= tc.nbits {
						bm[i] |= 1 << b
					}
				}
			}
			x := New(bm, tc.nbits)
			if x.Len() != tc.nbits {
				t.Fatalf("Len = %d, want %d", x.Len(), tc.nbits)
			}
			var total uint64
			for i := uint64(0); i < tc.nbits; i++ {
				got, ok := x.Rank(i)
				want, wok := naiveRank(bm, i)
				if ok != wok || got != want {
					t.Fatalf("Rank(%d) = %d,%v; want %d,%v", i, got, ok, want, wok)
				}
				if x.Test(i) != wok {
					t.Fatalf("Test(%d) = %v", i, x.Test(i))
				}
				if wok {
					total++
				}
			}
			if x.Count() != total {
				t.Fatalf("Count = %d, want %d", x.Count(), total)
			}
			if _, ok := x.Rank(tc.nbits); ok {
				t.Fatalf("Rank past the end reported a set bit")
			}
			// Runs cover exactly the set bits, in order, without overlap.
			var seen uint64
			last := uint64(0)
			x.Runs(func(s, e uint64) bool {
				if s < last || e <= s || e > tc.nbits {
					t.Fatalf("bad run [%d,%d) after %d", s, e, last)
				}
				for i := s; i < e; i++ {
					if !x.Test(i) {
						t.Fatalf("run [%d,%d) holds clear bit %d", s, e, i)
					}
				}
				if s > 0 && x.Test(s-1) || x.Test(e) {
					t.Fatalf("run [%d,%d) is not maximal", s, e)
				}
				seen += e - s
				last = e
				return true
			})
			if seen != total {
				t.Fatalf("runs cover %d bits, want %d", seen, total)
			}
		})
	}
}

// bench64GiB builds the bitmap of a 64 GiB machine with 4 KiB pages where
// a quarter of the pages were dumped, in clusters as real dumps have.
func bench64GiB() (bm []byte, present []uint64) {
	const pages = 64 << 30 >> 12
	bm = make([]byte, pages/8)
	rng := rand.New(rand.NewPCG(6, 4))
	for p := uint64(0); p < pages; {
		run := 1 + rng.Uint64N(512)
		if rng.Uint64N(4) == 0 {
			for i := p; i < p+run && i < pages; i++ {
				bm[i/8] |= 1 << (i % 8)
				present = append(present, i)
			}
		}
		p += run
	}
	return bm, present
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkLookup compares page lookups through the cached-popcount index
// with a hash map from page number to position (the pre-2016 libkvm
// index), on a 64 GiB-equivalent bitmap; index-bytes is each index's
// memory (heap growth while building it; the popcount index includes
// its copy of the bitmap).
func BenchmarkLookup(b *testing.B) {
	bm, present := bench64GiB()
	rng := rand.New(rand.NewPCG(9, 9))
	queries := make([]uint64, 1<<16)
	for i := range queries {
		queries[i] = present[rng.IntN(len(present))]
	}
	b.Run("popcount", func(b *testing.B) {
		before := heapInUse()
		x := New(bm, uint64(len(bm))*8)
		mem := heapInUse() - before
		b.ResetTimer()
		var sink uint64
		for i := 0; i < b.N; i++ {
			r, _ := x.Rank(queries[i&(len(queries)-1)])
			sink += r
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
		b.ReportMetric(float64(mem), "index-bytes")
		runtime.KeepAlive(x)
		_ = sink
	})
	b.Run("hashmap", func(b *testing.B) {
		before := heapInUse()
		m := make(map[uint64]uint64)
		for i, p := range present {
			m[p] = uint64(i)
		}
		mem := heapInUse() - before
		b.ResetTimer()
		var sink uint64
		for i := 0; i < b.N; i++ {
			sink += m[queries[i&(len(queries)-1)]]
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
		b.ReportMetric(float64(mem), "index-bytes")
		b.ReportMetric(float64(len(m)), "pages")
		runtime.KeepAlive(m)
		_ = sink
	})
}
