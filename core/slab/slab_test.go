package slab_test

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/slab/slabtest"
)

// scenario builds one synthetic heap.
type scenario struct {
	name     string
	hardened bool
	build    func(im *slabtest.Image)
	// corrupt damages the finished image.
	corrupt func(im *slabtest.Image)
	// The anomalies that must be reported (substrings); every anomaly
	// must match one. None means the walk must find none, and the
	// expected counts.
	anomalies []string
	// check runs after the walk, for scenarios whose expected counts the
	// builder cannot know (corruption).
	check func(t *testing.T, h *slab.Heap, im *slabtest.Image)
}

func normalHeap(im *slabtest.Image) {
	// A cache with every kind of slab.
	c := im.AddCache("widget", 200, 208, 0, 0) // 19 per slab
	cpu0 := im.AddSlab(c, 19, []int{3, 7})
	im.SetCPUSlab(c, 0, cpu0, []int{18, 0, 5})
	cpu1 := im.AddSlab(c, 19, nil)
	im.SetCPUSlab(c, 1, cpu1, []int{1})
	p1, p2 := im.AddSlab(c, 19, []int{2, 4, 6}), im.AddSlab(c, 19, []int{10})
	im.SetCPUPartial(c, 0, p1, p2)
	n1, n2 := im.AddSlab(c, 19, []int{0, 1, 2, 3}), im.AddSlab(c, 12, []int{11}) // n2: fallback order
	im.AddToNodeList(c, false, n1, n2)
	im.AddSlab(c, 19, nil) // full, on no list
	im.AddSlab(c, 19, nil)
	// An order-1 cache with a merged alias.
	big := im.AddCache("big_thing", 1000, 1024, 0, 1) // 8 per slab
	big.Aliases = []string{"other_thing", "third"}
	s := im.AddSlab(big, 8, []int{7, 6, 5})
	im.AddToNodeList(big, false, s)
	im.AddSlab(big, 8, nil)
	// A cache with slub_debug red zones and a full list.
	dbg := im.AddCache("debugged", 64, 96, slab.FlagRedZone|slab.FlagStoreUser, 0)
	d1 := im.AddSlab(dbg, 42, nil)
	im.AddToNodeList(dbg, true, d1)
	d2 := im.AddSlab(dbg, 42, []int{41, 40})
	im.AddToNodeList(dbg, false, d2)
	im.AddCache("empty", 32, 32, 0, 0)
}

func TestWalk(t *testing.T) {
	var wild, skew, lost *slabtest.Cache
	var wildSlab, skewSlab, lostSlab *slabtest.Slab
	for _, sc := range []scenario{
		{name: "plain", build: normalHeap},
		{name: "hardened", hardened: true, build: normalHeap},
		{
			name: "freelist loop", hardened: true,
			build: func(im *slabtest.Image) {
				c := im.AddCache("loopy", 64, 64, 0, 0)
				s := im.AddSlab(c, 64, []int{1, 2, 3})
				im.AddToNodeList(c, false, s)
			},
			corrupt: func(im *slabtest.Image) {
				// Object 3's free pointer back to object 1.
				c := im.Caches[0]
				fp := c.Obj(c.Slabs[0], 3) + uint64(c.Offset)
				im.U64(fp, im.FreePointer(c, c.Obj(c.Slabs[0], 1), fp))
			},
			anomalies: []string{"loopy: slab 0xffffea0000004000: freelist: object 0xffff888000100040 is free twice (a loop, or on two freelists) after 3 objects"},
			check: func(t *testing.T, h *slab.Heap, im *slabtest.Image) {
				c, _ := h.Cache("loopy")
				if c.Stats.Free != 3 || c.Stats.Allocated != 61 {
					t.Errorf("stats %+v", c.Stats)
				}
			},
		},
		{
			name: "pointer outside the slab",
			build: func(im *slabtest.Image) {
				wild = im.AddCache("wild", 64, 64, 0, 0)
				wildSlab = im.AddSlab(wild, 64, []int{5, 9})
				im.AddToNodeList(wild, false, wildSlab)
			},
			corrupt: func(im *slabtest.Image) {
				im.U64(wild.Obj(wildSlab, 9)+uint64(wild.Offset), 0xffff888000123456)
			},
			anomalies: []string{"freelist: pointer 0xffff888000123456 after 2 objects is outside the slab"},
		},
		{
			name: "misaligned pointer",
			build: func(im *slabtest.Image) {
				skew = im.AddCache("skewed", 64, 64, 0, 0)
				skewSlab = im.AddSlab(skew, 64, []int{5})
				im.AddToNodeList(skew, false, skewSlab)
			},
			corrupt: func(im *slabtest.Image) {
				im.Put(skewSlab.Addr, "slab", "freelist", skew.Obj(skewSlab, 5)+8)
			},
			anomalies: []string{"after 0 objects is not at an object's start"},
		},
		{
			name: "counters disagree",
			build: func(im *slabtest.Image) {
				c := im.AddCache("miscounted", 64, 64, 0, 0)
				s := im.AddSlab(c, 64, []int{5})
				im.AddToNodeList(c, false, s)
			},
			corrupt: func(im *slabtest.Image) {
				c := im.Caches[0]
				im.Put(c.Slabs[0].Addr, "slab", "inuse", 60)
				im.Put(c.Node, "kmem_cache_node", "nr_partial", 3)
				im.Put(c.Node, "kmem_cache_node", "nr_slabs.counter", 7)
			},
			anomalies: []string{"inuse 60 of 64 objects says 4 free, its freelist holds 1", "node 0: nr_partial is 3, its partial list holds 1 slabs",
				"the nodes count 7 slabs and 64 objects; the memory map holds 1 slabs and 64 objects"},
		},
		{
			name: "partial list loops",
			build: func(im *slabtest.Image) {
				c := im.AddCache("circular", 64, 64, 0, 0)
				a, b := im.AddSlab(c, 64, []int{1}), im.AddSlab(c, 64, []int{2})
				im.AddToNodeList(c, false, a, b)
			},
			corrupt: func(im *slabtest.Image) {
				// b's next back to a: the head is never reached again.
				a, b := im.Caches[0].Slabs[0], im.Caches[0].Slabs[1]
				im.U64(b.Addr+im.Off("slab", "slab_list"), a.Addr+im.Off("slab", "slab_list"))
			},
			anomalies: []string{"node 0 partial list at 0xffff888000010820 loops at 0xffffea0000004008"},
		},
		{
			name: "per-CPU partial chain loops and strays",
			build: func(im *slabtest.Image) {
				c := im.AddCache("chain", 64, 64, 0, 0)
				a, b := im.AddSlab(c, 64, []int{1}), im.AddSlab(c, 64, []int{2})
				im.SetCPUPartial(c, 0, a, b)
				o := im.AddCache("other", 64, 64, 0, 0)
				im.SetCPUPartial(o, 1, im.AddSlab(o, 64, []int{3}))
			},
			corrupt: func(im *slabtest.Image) {
				c, o := im.Caches[0], im.Caches[1]
				im.Put(c.Slabs[1].Addr, "slab", "next", c.Slabs[0].Addr)
				im.Put(o.Slabs[0].Addr, "slab", "next", c.Slabs[0].Addr) // into chain's slabs
			},
			anomalies: []string{"chain: cpu 0 partial chain loops at 0xffffea0000004000", "other: cpu 1 partial chain reaches 0xffffea0000004000, not a slab of this cache"},
		},
		{
			name: "slab of an unknown cache, objects beyond the cache's",
			build: func(im *slabtest.Image) {
				c := im.AddCache("odd", 64, 64, 0, 0)
				im.AddSlab(c, 64, nil)
				im.AddSlab(c, 64, nil)
			},
			corrupt: func(im *slabtest.Image) {
				c := im.Caches[0]
				im.Put(c.Slabs[0].Addr, "slab", "slab_cache", 0xffff888000999000)
				im.Put(c.Slabs[1].Addr, "slab", "objects", 70)
			},
			anomalies: []string{"slab 0xffffea0000004000: PG_slab page (pfn 0x100) names kmem_cache 0xffff888000999000, which is not on slab_caches",
				"odd: slab 0xffffea0000004040: 70 objects, but the cache has at most 64 per slab; slab skipped",
				"the nodes count 2 slabs and 128 objects; the memory map holds 0 slabs and 0 objects"},
		},
		{
			name: "lockless freelist without a slab, and slab memory unreadable",
			build: func(im *slabtest.Image) {
				lost = im.AddCache("lost", 64, 64, 0, 0)
				lostSlab = im.AddSlab(lost, 64, []int{4})
				im.AddToNodeList(lost, false, lostSlab)
			},
			corrupt: func(im *slabtest.Image) {
				im.Put(lost.CPUSlab+im.CPUs[1], "kmem_cache_cpu", "freelist", 0xffff888000400000)
				delete(im.Pages, lostSlab.Base)
			},
			anomalies: []string{"lost: cpu 1 has a freelist 0xffff888000400000 but no slab", "freelist: slab memory: virtual address 0xffff888000100000 is not mapped"},
		},
		{
			name: "slab_caches loops",
			build: func(im *slabtest.Image) {
				im.AddCache("first", 64, 64, 0, 0)
				im.AddCache("second", 64, 64, 0, 0)
			},
			corrupt: func(im *slabtest.Image) {
				head := im.Syms["slab_caches"]
				last := im.Get64(head + 8)
				im.U64(last, im.Caches[0].Addr+im.Off("kmem_cache", "list"))
			},
			anomalies: []string{"slab_caches list loops at"},
		},
		{
			name: "sysfs tree loops",
			build: func(im *slabtest.Image) {
				im.AddCache("first", 64, 64, 0, 0).Aliases = []string{"alias"}
			},
			corrupt: func(im *slabtest.Image) {
				kn := im.Caches[0].SysfsKN
				rb := kn + im.Off("kernfs_node", "rb")
				im.U64(rb+im.Off("rb_node", "rb_left"), rb) // a node its own child
				im.U64(rb+im.Off("rb_node", "rb_right"), 0xffff888077777000)
			},
			anomalies: []string{"sysfs node 0xffff888077776fe0: virtual address 0xffff888077776fe0 is not mapped"},
		},
	} {
		t.Run(sc.name, func(t *testing.T) {
			im := slabtest.NewImage(t, sc.hardened)
			sc.build(im)
			im.Finish()
			if sc.corrupt != nil {
				sc.corrupt(im)
			}
			h, err := slab.Open(im)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Walk(); err != nil {
				t.Fatal(err)
			}
			got, n := h.Anomalies()
			var all []string
			for _, a := range got {
				all = append(all, a.String())
			}
			joined := strings.Join(all, "\n")
			if sc.anomalies == nil {
				if n != 0 {
					t.Errorf("%d anomalies:\n%s", n, joined)
				}
				checkStats(t, h, im)
			}
			for _, want := range sc.anomalies {
				if !strings.Contains(joined, want) {
					t.Errorf("no anomaly %q among:\n%s", want, joined)
				}
			}
			for _, a := range all {
				ok := false
				for _, want := range sc.anomalies {
					ok = ok || strings.Contains(a, want)
				}
				if !ok {
					t.Errorf("unexpected anomaly %q", a)
				}
			}
			if n != len(all) {
				t.Errorf("%d anomalies counted, %d kept", n, len(all))
			}
			if sc.check != nil {
				sc.check(t, h, im)
			}
			if h.PagesScanned != slabtest.MapPages || h.VmemmapHoles != slabtest.MaxPFN-slabtest.MapPages {
				t.Errorf("scanned %d pages, %d holes", h.PagesScanned, h.VmemmapHoles)
			}
			for _, c := range h.Caches {
				if c.Stats.Allocated+c.Stats.Free != c.Stats.Objects || c.Stats.Free < 0 {
					t.Errorf("%s: %+v", c.Name, c.Stats)
				}
			}
		})
	}
}

func TestLookup(t *testing.T) {
	for _, walk := range []bool{false, true} {
		im := slabtest.NewImage(t, true)
		normalHeap(im)
		im.Finish()
		h, err := slab.Open(im)
		if err != nil {
			t.Fatal(err)
		}
		if walk {
			h.Walk()
		}
		c := im.Caches[0]
		cpu0, p1 := c.Slabs[0], c.Slabs[2]
		dbg := im.Caches[2]
		for _, tc := range []struct {
			addr   uint64
			cache  string
			obj    uint64
			off    int64
			free   bool
			region slab.Region
			list   slab.ListKind
		}{
			{c.Obj(cpu0, 4) + 17, "widget", c.Obj(cpu0, 4), 17, false, slab.InObject, slab.CPUSlab},
			{c.Obj(cpu0, 5), "widget", c.Obj(cpu0, 5), 0, true, slab.InObject, slab.CPUSlab},     // on the lockless freelist
			{c.Obj(cpu0, 7) + 1, "widget", c.Obj(cpu0, 7), 1, true, slab.InObject, slab.CPUSlab}, // on the slab's freelist
			{c.Obj(cpu0, 7) + 203, "widget", c.Obj(cpu0, 7), 203, true, slab.Metadata, slab.CPUSlab},
			{c.Obj(p1, 2), "widget", c.Obj(p1, 2), 0, true, slab.InObject, slab.Unlisted},
			{dbg.Obj(dbg.Slabs[1], 40) - 3, "debugged", dbg.Obj(dbg.Slabs[1], 40), -3, true, slab.LeftRedZone, slab.Unlisted},
		} {
			o, err := h.Lookup(tc.addr)
			if err != nil {
				t.Errorf("%#x: %v", tc.addr, err)
				continue
			}
			if walk && tc.list == slab.Unlisted && o.Slab.Cache.Name == "widget" {
				tc.list = slab.CPUPartial
			}
			if walk && o.Slab.Cache.Name == "debugged" {
				tc.list = slab.NodePartial
			}
			if o.Slab.Cache.Name != tc.cache || o.Addr != tc.obj || o.Offset != tc.off || o.Free != tc.free || o.Region != tc.region || o.Slab.List != tc.list {
				t.Errorf("walk %v, %#x: %s object %#x%+d free %v %s %s; want %s %#x%+d free %v %s %s", walk, tc.addr,
					o.Slab.Cache.Name, o.Addr, o.Offset, o.Free, o.Region, o.Slab.List, tc.cache, tc.obj, tc.off, tc.free, tc.region, tc.list)
			}
		}
		// The tail of a slab past its last object; a page that is no
		// slab; an address outside memory; a hole in the memory map.
		n2 := c.Slabs[5] // 12 objects of 208 bytes
		if o, err := h.Lookup(n2.Base + 12*208 + 5); err != nil || o.Region != slab.SlabTail || o.Index != -1 {
			t.Errorf("slab tail: %+v %v", o, err)
		}
		for _, a := range []uint64{slabtest.PageOffset + 20*slabtest.PageSize + 8, 0xffff888000000000 + slabtest.MaxPFN*slabtest.PageSize, 0xffffffff81000000} {
			if _, err := h.Lookup(a); !errors.Is(err, slab.ErrNotSlab) {
				t.Errorf("%#x: %v, want ErrNotSlab", a, err)
			}
		}
		if _, err := h.Lookup(slabtest.PageOffset + 5000*slabtest.PageSize); err == nil || errors.Is(err, slab.ErrNotSlab) {
			t.Errorf("a page whose struct page is absent: %v", err)
		}
		if pg, err := h.PageAt(c.Obj(cpu0, 3)); err != nil || !pg.Slab || pg.Free {
			t.Errorf("PageAt: %+v %v", pg, err)
		}
	}
}

func TestTracks(t *testing.T) {
	im := slabtest.NewImage(t, false)
	dbg := im.AddCache("debugged", 64, 96, slab.FlagRedZone|slab.FlagStoreUser, 0)
	s := im.AddSlab(dbg, 42, nil)
	im.Finish()
	o := dbg.Obj(s, 3)
	// inuse is 64 and the free pointer inside the object: tracks at 64.
	im.U64(o+64, 0xffffffff81234567) // alloc track: addr
	im.Write(o+64+16, []byte{42, 0, 0, 0})
	im.U64(o+64+uint64(im.Sizeof("track")), 0xffffffff81111111) // free track
	h, err := slab.Open(im)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := h.Lookup(o + 5)
	if err != nil {
		t.Fatal(err)
	}
	a, f, err := h.Tracks(obj)
	if err != nil || a.Addr != 0xffffffff81234567 || a.PID != 42 || f.Addr != 0xffffffff81111111 {
		t.Errorf("tracks %+v %+v %v", a, f, err)
	}
}

func TestOpenErrors(t *testing.T) {
	im := slabtest.NewImage(t, false)
	if _, err := slab.Open(im); err == nil || !strings.Contains(err.Error(), "lists no readable cache") {
		t.Errorf("no caches: %v", err)
	}
	im.U64(im.Syms["max_pfn"], 1<<50)
	im.AddCache("x", 64, 64, 0, 0)
	if _, err := slab.Open(im); err == nil || !strings.Contains(err.Error(), "max_pfn") {
		t.Errorf("absurd max_pfn: %v", err)
	}
	delete(im.Syms, "slab_caches")
	if _, err := slab.Open(im); err == nil || !strings.Contains(err.Error(), "slab_caches") {
		t.Errorf("no slab_caches: %v", err)
	}
}

// checkStats compares the walk with what the image holds: each cache's
// fields, counts and aliases, and every object's state.
func checkStats(t *testing.T, h *slab.Heap, im *slabtest.Image) {
	t.Helper()
	for _, tc := range im.Caches {
		c, ok := h.CacheAt(tc.Addr)
		if !ok {
			t.Errorf("cache %s not found", tc.Name)
			continue
		}
		if c.Name != tc.Name || c.ObjectSize != tc.ObjSize || c.Size != tc.Size || c.Offset != tc.Offset || c.Random != tc.Random ||
			c.Hardened != im.Hardened || c.RedLeftPad != tc.RedLeft || c.PerSlab != tc.PerSlab || c.Order != tc.Order {
			t.Errorf("cache %+v, want %+v", c, tc)
		}
		if c.Stats != tc.Want {
			t.Errorf("%s: stats\n got %+v\nwant %+v", tc.Name, c.Stats, tc.Want)
		}
		a := append([]string(nil), tc.Aliases...)
		sort.Strings(a)
		if fmt.Sprint(c.Aliases) != fmt.Sprint(a) {
			t.Errorf("%s: aliases %q, want %q", tc.Name, c.Aliases, a)
		}
		for _, ts := range tc.Slabs {
			s, ok := h.Slab(ts.Addr)
			if !ok {
				t.Errorf("%s: slab %#x not found", tc.Name, ts.Addr)
				continue
			}
			free := map[int]bool{}
			for _, i := range append(append([]int(nil), ts.Free...), ts.CPUFree...) {
				free[i] = true
			}
			for i := 0; i < ts.Objects; i++ {
				if s.Free(i) != free[i] {
					t.Errorf("%s: slab %#x object %d free %v, want %v", tc.Name, ts.Addr, i, s.Free(i), free[i])
				}
			}
		}
	}
}

// The layout is read from BTF: the synthetic kernel's offsets are not the
// real kernel's, and a kernel whose BTF lacks the structs is refused with
// the missing ones named.
func TestLayoutErrors(t *testing.T) {
	types := slabtest.Types(false)
	for _, typ := range types {
		if s, ok := typ.(*btf.Struct); ok && s.Name == "kmem_cache" {
			s.Name = "kmem_cache_renamed"
		}
	}
	im := slabtest.NewImageTypes(t, false, types)
	if _, err := slab.Open(im); err == nil || !strings.Contains(err.Error(), "struct kmem_cache: not in BTF") {
		t.Errorf("layout without kmem_cache: %v", err)
	}
}

// TestCacheBeforeUnmappedMemory: a kmem_cache is as long as the nodes the
// kernel has (nr_node_ids pointers), not its type's MAX_NUMNODES (1024 in
// Debian's kernels). One in the last bytes before a page the direct map
// lacks (the top of memory, below firmware's reserved range) was read
// whole, failed, and every object of its cache went unseen: on 6.12,
// after a burst of splices, kinst_leak's cache, so findleaks missed its
// ten leaks.
func TestCacheBeforeUnmappedMemory(t *testing.T) {
	types := slabtest.Types(false)
	for _, typ := range types {
		s, ok := typ.(*btf.Struct)
		if !ok || s.Name != "kmem_cache" {
			continue
		}
		for i := range s.Members {
			if s.Members[i].Name == "node" {
				arr := *s.Members[i].Type.(*btf.Array)
				arr.Nelems = 1024
				s.Members[i].Type = &arr
				s.Size = uint32(s.Members[i].Offset.Bytes()) + 8*1024
			}
		}
	}
	im := slabtest.NewImageTypes(t, false, types)
	c := im.AddCache("top_of_memory", 64, 64, 0, 0)
	next := c.Addr + slabtest.PageSize
	if c.CPUSlab&^(slabtest.PageSize-1) == next || c.Node&^(slabtest.PageSize-1) == next {
		t.Fatalf("the cache's own data is on the page after it, %#x", next)
	}
	delete(im.Pages, next) // the top of memory
	h, err := slab.Open(im)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, x := range h.Caches {
		found = found || x.Name == "top_of_memory"
	}
	if an, _ := h.Anomalies(); !found || len(an) > 0 {
		t.Errorf("cache read: %v; anomalies %v", found, an)
	}
}
