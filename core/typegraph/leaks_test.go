package typegraph

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/cilium/ebpf/btf"
	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/slab/slabtest"
	"github.com/kinst/kinst/core/typeid"
)

// FindLeaks over a heap whose reachability is known: a variable reaches
// a chain of objects and a caller's root range reaches one more; of the
// rest, one object hides another behind it, two point at each other (a
// cycle no root reaches), and one stands alone. Free objects are never
// leaks, and a pointer into the middle of an object keeps it alive.
func TestFindLeaks(t *testing.T) {
	im := slabtest.NewImage(t, false)
	c := im.AddCache("kmalloc-64", 64, 64, 0, 0)
	const used = 10
	var free []int
	for i := used; i < c.PerSlab; i++ {
		free = append(free, i)
	}
	s := im.AddSlab(c, c.PerSlab, free)
	im.Finish()
	obj := func(i int) uint64 { return c.Obj(s, i) }

	// Kernel data: a variable pointing at object 0.
	lo := im.Alloc(64)
	im.U64(lo+8, obj(0))
	im.Syms["_sdata"], im.Syms["_edata"] = lo, lo+64
	im.U64(obj(0)+16, obj(1)+24) // into the middle of 1
	im.U64(obj(1)+56, obj(2))
	im.U64(obj(2), obj(c.PerSlab-1)) // a free object: not a node
	// A stack range the caller gives reaches 3.
	const stack = 0xffffc90000010000
	im.U64(stack+4096-8, obj(3))
	// Leaks: 4 hides 5; 6 and 7 point at each other; 8 alone; 9 is
	// pointed at by 8.
	im.U64(obj(4)+8, obj(5))
	im.U64(obj(6), obj(7))
	im.U64(obj(7), obj(6))
	im.U64(obj(8)+32, obj(9))

	g := buildImageGraph(t, im)
	r := g.FindLeaks([]Range{{Lo: stack, Hi: stack + 4096, What: "stack"}, {Lo: 0xffffc90000100000, Hi: 0xffffc90000102000, What: "hole"}})
	var got []uint64
	hidden := map[uint64]int{}
	for _, gr := range r.Groups {
		for _, l := range gr.Leaks {
			got = append(got, l.Addr)
			hidden[l.Addr] = l.Hidden
		}
	}
	slices.Sort(got)
	want := []uint64{obj(4), obj(6), obj(8)}
	if !slices.Equal(got, want) {
		t.Errorf("leaks %#x, want %#x", got, want)
	}
	for a, n := range map[uint64]int{obj(4): 1, obj(6): 1, obj(8): 1} {
		if hidden[a] != n {
			t.Errorf("%#x hides %d, want %d", a, hidden[a], n)
		}
	}
	if r.Objects != used || r.Reached != 4 || r.Leaked != 6 || r.Leaks != 3 || r.LeakedSize != 6*64 {
		t.Errorf("report %+v; want %d objects, 4 reached, 6 leaked in 3 leaks of 384 bytes", r, used)
	}
	// The synthetic memory map is mostly unmapped: its holes count too.
	if r.Unreadable < 0x2000 || r.RootRanges["stack"] != 1 || r.RootRanges["kernel data"] != 1 || r.RootRanges["memory map"] != 1 {
		t.Errorf("roots: %v, %d unreadable bytes; want the stack, the data, the memory map and the 8 KiB hole", r.RootRanges, r.Unreadable)
	}
	if len(r.Groups) != 1 || r.Groups[0].Cache != "kmalloc-64" || r.Groups[0].Count != 3 || r.Groups[0].Bytes != 6*64 || r.Groups[0].Hidden != 3 {
		t.Errorf("groups %+v", r.Groups)
	}
}

// buildImageGraph walks a synthetic image's heap and builds its graph,
// the caches' types from typeid.
func buildImageGraph(t *testing.T, im *slabtest.Image) *Graph {
	t.Helper()
	h, err := slab.Open(im)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Build(im, h, typeid.CacheTypes(im.Spec, h), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// A cache with slub_debug's owner tracks (SLAB_STORE_USER): its leaks
// carry the allocating caller and are grouped by it; a leak of a cache
// without tracks has none.
func TestFindLeaksByCaller(t *testing.T) {
	im := slabtest.NewImage(t, false)
	dbg := im.AddCache("debugged", 64, 96, slab.FlagRedZone|slab.FlagStoreUser, 0)
	plain := im.AddCache("kmalloc-64", 64, 64, 0, 0)
	sd := im.AddSlab(dbg, 3, nil)
	sp := im.AddSlab(plain, 1, nil)
	im.Finish()
	// inuse 64 with the free pointer inside: the alloc track at 64.
	callers := []uint64{0xffffffff81000100, 0xffffffff81000200, 0xffffffff81000100}
	for i, c := range callers {
		im.U64(dbg.Obj(sd, i)+64, c)
	}
	g := buildImageGraph(t, im)
	r := g.FindLeaks(nil)
	got := map[string]int{}
	for _, gr := range r.Groups {
		got[fmt.Sprintf("%s %#x", gr.Cache, gr.AllocCaller)] = gr.Count
		for _, l := range gr.Leaks {
			if l.AllocCaller != gr.AllocCaller {
				t.Errorf("leak %#x: caller %#x in the group of %#x", l.Addr, l.AllocCaller, gr.AllocCaller)
			}
		}
	}
	want := map[string]int{"debugged 0xffffffff81000100": 2, "debugged 0xffffffff81000200": 1, "kmalloc-64 0x0": 1}
	if !maps.Equal(got, want) {
		t.Errorf("groups %v, want %v", got, want)
	}
	_ = plain.Obj(sp, 0)
}

// Where the stack depot holds the tracks' stacks, a group is one
// allocating stack: two objects of one caller reached by different
// paths are two groups, each with its frames; one without a handle
// keeps its caller alone.
func TestFindLeaksByStack(t *testing.T) {
	im := slabtest.NewImageTypes(t, false, append(slabtest.Types(false), slabtest.DepotTypes()...))
	dbg := im.AddCache("debugged", 64, 96, slab.FlagRedZone|slab.FlagStoreUser, 0)
	sd := im.AddSlab(dbg, 4, nil)
	im.Finish()
	const caller = 0xffffffff81000100
	a := []uint64{caller, 0xffffffff81000a00, 0xffffffff81000b00}
	b := []uint64{caller, 0xffffffff81000c00}
	handles := []uint32{im.AddStack(a), im.AddStack(b), im.AddStack(a), 0}
	for i, h := range handles {
		o := dbg.Obj(sd, i) + 64
		im.U64(o, caller)
		im.Write(o+8, binary.LittleEndian.AppendUint32(nil, h))
	}
	g := buildImageGraph(t, im)
	r := g.FindLeaks(nil)
	got := map[string]int{}
	for _, gr := range r.Groups {
		got[fmt.Sprintf("%#x", gr.AllocStack)] = gr.Count
	}
	want := map[string]int{fmt.Sprintf("%#x", a): 2, fmt.Sprintf("%#x", b): 1, fmt.Sprintf("%#x", []uint64(nil)): 1}
	if !maps.Equal(got, want) {
		t.Errorf("groups by stack %v, want %v", got, want)
	}
}

// Regions (vmalloc'd areas) are judged as objects are: a root's pointer
// into the middle of one reaches it, and its words reach further
// (another region, a slab object); a region that only its allocator's
// record points at (Metadata), or that only an unreached region points
// at, is a leak with its allocating caller; an object only an unreached
// region points at is a leak of its own.
func TestFindLeaksRegions(t *testing.T) {
	im := slabtest.NewImage(t, false)
	c := im.AddCache("kmalloc-64", 64, 64, 0, 0)
	s := im.AddSlab(c, 4, nil)
	im.Finish()
	obj := func(i int) uint64 { return c.Obj(s, i) }
	const vm = 0xffffc90000200000 // regions A..E, 2 pages each, a guard page between
	region := func(i int) Region {
		lo := vm + uint64(i)*0x3000
		return Region{Lo: lo, Hi: lo + 0x3000, What: "vmalloc", Caller: 0xffffffff81000000 + uint64(i)}
	}
	for i := range 5 {
		im.U64(region(i).Lo+0x1ff8, 0) // map both pages; the guard page stays unmapped
		im.U64(region(i).Lo, 0)
	}
	data := im.Alloc(64)
	im.Syms["_sdata"], im.Syms["_edata"] = data, data+64
	im.U64(data, region(0).Lo+0x1234)         // A, reached in its middle
	im.U64(region(0).Lo+0x1ff8, region(1).Lo) // A → B
	im.U64(region(1).Lo+8, obj(0))            // B → object 0
	record := im.Alloc(16)                    // C's allocator record, in the data too
	im.Syms["_edata"] = record + 16
	im.U64(record, region(2).Lo)
	im.U64(region(3).Lo, region(4).Lo) // D → E, nothing → D
	im.U64(region(4).Lo, obj(1))       // E → object 1
	im.U64(data+8, obj(2))             // object 2 reached; 3 alone

	g := buildImageGraph(t, im)
	var regions []Region
	for i := range 5 {
		regions = append(regions, region(i))
	}
	r := g.FindLeaksIn(LeakInput{Regions: regions, Metadata: []uint64{record}})
	got := map[uint64]string{}
	for _, gr := range r.Groups {
		for _, l := range gr.Leaks {
			got[l.Addr] = fmt.Sprintf("%s %#x", l.Cache, l.AllocCaller)
		}
	}
	want := map[uint64]string{
		region(2).Lo: "vmalloc 0xffffffff81000002", region(3).Lo: "vmalloc 0xffffffff81000003", region(4).Lo: "vmalloc 0xffffffff81000004",
		obj(1): "kmalloc-64 0x0", obj(3): "kmalloc-64 0x0",
	}
	if !maps.Equal(got, want) {
		t.Errorf("leaks %v, want %v", got, want)
	}
	if r.Regions != 5 || r.RegionsLeaked != 3 || r.Objects != 4 || r.Reached != 2 {
		t.Errorf("report: %d regions, %d leaked, %d objects, %d reached; want 5, 3, 4, 2", r.Regions, r.RegionsLeaked, r.Objects, r.Reached)
	}
}

// TestFindLeaksFreedImage: the tail of the bss x86 frees after boot
// (__start_bss_decrypted_unused to __end_bss_decrypted) is not the
// image's: a stale pointer there (a slab's free object now) does not
// reach a region, which is reported; a pointer in the bss proper does.
func TestFindLeaksFreedImage(t *testing.T) {
	im := slabtest.NewImage(t, false)
	c := im.AddCache("kmalloc-64", 64, 64, 0, 0)
	im.AddSlab(c, 4, nil)
	im.Finish()
	region := testRegion
	for i := range 2 {
		im.U64(region(i).Lo, 0)
	}
	bss := im.Alloc(128)
	im.Syms["__bss_start"], im.Syms["__bss_stop"] = bss, bss+128
	im.Syms["__start_bss_decrypted_unused"], im.Syms["__end_bss_decrypted"] = bss+64, bss+128
	im.U64(bss+8, region(0).Lo)  // held
	im.U64(bss+72, region(1).Lo) // freed memory's stale word
	g := buildImageGraph(t, im)
	r := g.FindLeaksIn(LeakInput{Regions: []Region{region(0), region(1)}})
	leaked := vmallocLeaks(r) // the slab's four objects are leaks too
	if len(leaked) != 1 || leaked[0] != region(1).Lo {
		t.Errorf("leaks %#x, want only %#x (the region only freed image memory points at)", leaked, region(1).Lo)
	}
}

// Each CPU's per-CPU area is a root only as far as the first chunk uses
// it: the kernel gives the rest of each unit (pcpu_unit_size, 1 MiB in a
// 6.12 guest, of which it used about 240 KiB) back to the page allocator
// at boot. A stale word there does not reach anything; one in the part
// in use does.
func TestFindLeaksPerCPUTail(t *testing.T) {
	i32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	chunk := &btf.Struct{Name: "pcpu_chunk", Size: 24, Members: []btf.Member{
		{Name: "nr_pages", Type: i32, Offset: 0},
		{Name: "end_offset", Type: i32, Offset: 32},
		{Name: "base_addr", Type: &btf.Pointer{Target: &btf.Void{}}, Offset: 128},
	}}
	im := slabtest.NewImageTypes(t, false, append(slabtest.Types(false), chunk))
	im.AddSlab(im.AddCache("kmalloc-64", 64, 64, 0, 0), 4, nil)
	im.Finish()
	region := testRegion
	for i := range 3 {
		im.U64(region(i).Lo, 0)
	}
	// Static variables 0x100 bytes, units of 0x10000, the first chunk
	// ending 0x100 bytes short of its second page.
	unit0, _ := im.PerCPUOffsets()
	im.Syms["__per_cpu_start"], im.Syms["__per_cpu_end"] = 0, 0x100
	im.Syms["pcpu_unit_size"] = im.Alloc(4)
	im.Write(im.Syms["pcpu_unit_size"], []byte{0, 0, 1, 0})
	im.Syms["pcpu_base_addr"] = im.Alloc(8)
	im.U64(im.Syms["pcpu_base_addr"], unit0[0])
	fc := im.Alloc(24)
	im.Write(fc, []byte{2, 0, 0, 0, 0, 1, 0, 0})
	im.U64(fc+16, unit0[0])
	im.Syms["pcpu_first_chunk"] = im.Alloc(8)
	im.U64(im.Syms["pcpu_first_chunk"], fc)
	im.U64(unit0[0]+0x80, region(0).Lo)   // a static variable
	im.U64(unit0[1]+0x1e00, region(1).Lo) // the dynamic part, in use
	im.U64(unit0[0]+0x3000, region(2).Lo) // given back at boot
	g := buildImageGraph(t, im)
	r := g.FindLeaksIn(LeakInput{Regions: []Region{region(0), region(1), region(2)}})
	leaked := vmallocLeaks(r)
	if len(leaked) != 1 || leaked[0] != region(2).Lo {
		t.Errorf("leaks %#x, want only %#x (the region only a freed unit's tail points at)", leaked, region(2).Lo)
	}
	if used, ok := g.perCPUUsed(); !ok || used != 0x1f00 {
		t.Errorf("perCPUUsed %#x, %v; want 0x1f00", used, ok)
	}
}

// testRegion is the i'th of a row of vmalloc'd areas of a page each.
func testRegion(i int) Region {
	lo := 0xffffc90000200000 + uint64(i)*0x2000
	return Region{Lo: lo, Hi: lo + 0x1000, What: "vmalloc", Caller: 0xffffffff81000000 + uint64(i)}
}

// vmallocLeaks are the addresses of the vmalloc'd areas r reports.
func vmallocLeaks(r *LeakReport) []uint64 {
	var out []uint64
	for _, gr := range r.Groups {
		for _, l := range gr.Leaks {
			if l.Cache == "vmalloc" {
				out = append(out, l.Addr)
			}
		}
	}
	return out
}
