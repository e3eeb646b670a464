package slab_test

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/slab/slabtest"
)

var (
	fuzzOnce sync.Once
	fuzzBase *slabtest.Image
)

// fuzzRegion is a part of the base image the fuzzer may overwrite.
type fuzzRegion struct{ base, size uint64 }

// fuzzImage is a copy of a consistent heap, and the regions of it that
// the allocator's state lives in.
func fuzzImage(t testing.TB) (*slabtest.Image, []fuzzRegion) {
	fuzzOnce.Do(func() {
		im := slabtest.NewImage(t, true)
		normalHeap(im)
		im.Finish()
		fuzzBase = im
	})
	im := fuzzBase
	regions := []fuzzRegion{{im.Syms["slab_caches"], 16}, {im.Syms["max_pfn"], 8}}
	for _, c := range im.Caches {
		regions = append(regions, fuzzRegion{c.Addr, im.Sizeof("kmem_cache")}, fuzzRegion{c.Node, im.Sizeof("kmem_cache_node")},
			fuzzRegion{c.SysfsKN, im.Sizeof("kernfs_node")})
		for _, off := range im.CPUs {
			regions = append(regions, fuzzRegion{c.CPUSlab + off, im.Sizeof("kmem_cache_cpu")})
		}
		for _, s := range c.Slabs {
			regions = append(regions, fuzzRegion{s.Addr, im.Sizeof("page") << c.Order}, fuzzRegion{s.Base, slabtest.PageSize << c.Order})
		}
	}
	return im.Clone(), regions
}

// FuzzWalk overwrites parts of a consistent synthetic heap (caches,
// struct pages, slab memory, per-CPU and node data, sysfs nodes) and
// walks it: the walk must end, without a panic and within a bounded
// number of reads, with counts that add up, whatever the memory says.
func FuzzWalk(f *testing.F) {
	rec := func(region byte, off uint16, size byte, v uint64) []byte {
		b := []byte{region, byte(off), byte(off >> 8), size}
		return binary.LittleEndian.AppendUint64(b, v)
	}
	f.Add([]byte{})
	f.Add(rec(0, 0, 8, 0))                                  // slab_caches.next = NULL
	f.Add(rec(2, 24, 4, 0xffffffff))                        // a huge slot size
	f.Add(rec(2, 56, 4, 0x7fff))                            // 32767 objects per slab
	f.Add(rec(9, 24, 8, 0xffff888000100000))                // a slab's freelist elsewhere
	f.Add(append(rec(10, 96, 8, 0), rec(10, 304, 8, 0)...)) // free pointers zeroed
	f.Add(rec(1, 0, 8, 1<<33))                              // max_pfn
	f.Add(rec(3, 32, 8, 0xffff888000010820))                // node partial list into itself
	f.Fuzz(func(t *testing.T, data []byte) {
		im, regions := fuzzImage(t)
		for len(data) >= 12 {
			r := regions[int(data[0])%len(regions)]
			off := uint64(binary.LittleEndian.Uint16(data[1:])) % r.size
			n := int(data[3])%8 + 1
			im.Write(r.base+off, data[4:4+n])
			data = data[12:]
		}
		h, err := slab.Open(im)
		if err != nil {
			return
		}
		if err := h.Walk(); err != nil {
			t.Fatal(err)
		}
		for _, c := range h.Caches {
			st := c.Stats
			if st.Allocated+st.Free != st.Objects || st.Free < 0 || st.FreePerCPU > st.Free ||
				st.CPUSlabs+st.CPUPartial+st.Partial+st.Full+st.Unlisted != st.Slabs {
				t.Errorf("%s: %+v", c.Name, st)
			}
		}
		for _, c := range im.Caches {
			for _, s := range c.Slabs {
				h.Lookup(s.Base + 100)
			}
		}
		if im.Reads > 1<<20 {
			t.Errorf("%d reads", im.Reads)
		}
	})
}
