package typegraph

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"

	"github.com/cilium/ebpf/btf"
)

// Leaks: mdb's ::findleaks over the graph's heap. Every allocated slab
// object is a node; a node is reached when an aligned word of a root or
// of a reached node holds an address inside it (conservatively: any
// word, whatever its type, so a stale value keeps an object alive and a
// leak is never reported wrongly for want of a type). The allocated
// objects left unreached are the leaks. A leaked object that another
// leaked object points at is part of that leak, not one of its own: each
// leak is reported once, at its root, with the objects only it reaches.

// Range is memory whose words are roots: a CPU's per-CPU area, a task's
// stack, a module's or a vmalloc area's memory.
type Range struct {
	Lo, Hi uint64
	What   string
}

// Leak is one unreached object that no other unreached object points at.
type Leak struct {
	Addr  uint64 `json:"addr"`
	Size  uint32 `json:"size"`
	Cache string `json:"cache"`
	// Type is the graph's type for it, "" if untyped.
	Type string `json:"type,omitempty"`
	// Hidden is the unreached objects reachable only through it.
	Hidden int `json:"hidden"`
	// AllocCaller is the address that allocated it, where slub_debug
	// records owners (SLAB_STORE_USER: slub_debug=U); 0 elsewhere.
	// AllocFunction is it symbolized, by the caller of FindLeaks.
	AllocCaller   uint64 `json:"alloc_caller,omitempty"`
	AllocFunction string `json:"alloc_function,omitempty"`
}

// LeakGroup is the leaks of one cache, type and, where slub_debug
// records owners, allocating stack, as mdb's ::findleaks groups them:
// struct track keeps the caller, and the whole stack in the stack depot
// (its handle), which the group has when the depot could be read.
type LeakGroup struct {
	Cache         string `json:"cache"`
	Type          string `json:"type,omitempty"`
	AllocCaller   uint64 `json:"alloc_caller,omitempty"`
	AllocFunction string `json:"alloc_function,omitempty"`
	// AllocStack is the allocating stack, innermost frame first;
	// AllocFrames it symbolized (FUNC+0xOFF), by the caller of
	// FindLeaks.
	AllocStack  []uint64 `json:"alloc_stack,omitempty"`
	AllocFrames []string `json:"alloc_frames,omitempty"`
	Count       int      `json:"count"`
	// Bytes is the leaks' sizes and their hidden objects'.
	Bytes  uint64 `json:"bytes"`
	Hidden int    `json:"hidden"`
	Leaks  []Leak `json:"leaks,omitempty"`
}

// LeakReport is `kinst core DUMP findleaks --json`.
type LeakReport struct {
	Objects int `json:"objects"` // allocated objects
	Reached int `json:"reached"`
	// Leaked is every unreached object; Leaks, the ones reported (the
	// rest are reachable from them).
	Leaked     int    `json:"leaked"`
	Leaks      int    `json:"leaks"`
	LeakedSize uint64 `json:"leaked_bytes"`
	// RootBytes is the memory read as roots; Unreadable, the root bytes
	// the dump does not hold (whole pages, skipped).
	RootBytes  uint64 `json:"root_bytes"`
	Unreadable uint64 `json:"unreadable_bytes"`
	// RootRanges counts the roots by what they are.
	RootRanges map[string]int `json:"root_ranges"`
	// ReadFails counts slabs whose memory could not be read: their
	// objects are neither scanned nor trusted as leaks.
	ReadFails int `json:"read_fails,omitempty"`
	// Regions and RegionsLeaked count the candidate regions beside the
	// slab objects (vmalloc'd areas) and those no root reaches.
	Regions       int         `json:"regions"`
	RegionsLeaked int         `json:"regions_leaked"`
	Groups        []LeakGroup `json:"groups"`
}

// Region is memory allocated apart from the slabs (a vmalloc'd area)
// that findleaks judges as it judges a slab object: reached when a word
// of a root or of a reached object or region points anywhere into it,
// its own words read only then, and reported when nothing reaches it.
type Region struct {
	Lo, Hi uint64
	What   string // its group's "cache": "vmalloc"
	Caller uint64 // who allocated it (vm_struct.caller); 0 unknown
}

// LeakInput is what findleaks reads beyond the graph: roots, candidate
// regions, and the allocator's own records of those regions.
type LeakInput struct {
	Roots   []Range
	Regions []Region
	// Metadata are the addresses of words that record a region for its
	// allocator (vmap_area.va_start and va_end, vm_struct.addr): they do
	// not reach it, or every region would be reached by its own record.
	Metadata []uint64
}

// leakChunk is how much root memory is read at a time.
const leakChunk = 1 << 20

// FindLeaks marks every allocated object reachable from the kernel
// image's data, read-only data and bss, the memory map (struct pages),
// every CPU's per-CPU area (the
// static variables and the first chunk's dynamic part), and roots (the
// caller's: tasks' stacks, vmalloc areas, modules' memory), and reports
// the allocated objects left unreached, grouped by cache and type,
// largest groups first. Objects of slabs the dump could not read are
// counted as reached (nothing can be said of them).
func (g *Graph) FindLeaks(roots []Range) *LeakReport {
	return g.FindLeaksIn(LeakInput{Roots: roots})
}

// FindLeaksIn is FindLeaks with candidate regions beside the slab
// objects: those no root reaches are reported too, grouped by what they
// are and who allocated them.
func (g *Graph) FindLeaksIn(in LeakInput) *LeakReport {
	n := int32(len(g.typ))
	ls := &leakSearch{g: g, reached: make([]bool, n), unread: make([]bool, n), taken: make([]bool, n),
		groups: map[leakKey]*LeakGroup{}, rep: &LeakReport{RootRanges: map[string]int{}}}
	ls.setRegions(in.Regions, in.Metadata)
	ls.scanRoots(append(g.builtinRoots(), in.Roots...))
	for len(ls.work) > 0 || len(ls.rwork) > 0 {
		if len(ls.rwork) > 0 {
			r := ls.regions[ls.rwork[len(ls.rwork)-1]]
			ls.rwork = ls.rwork[:len(ls.rwork)-1]
			ls.scanRange(Range{Lo: r.Lo, Hi: r.Hi}, false)
			continue
		}
		t := ls.work[len(ls.work)-1]
		ls.work = ls.work[:len(ls.work)-1]
		if b := g.bytes(t); b != nil {
			ls.reach(b, g.addr(t))
		}
	}
	rep := ls.rep
	ls.takeRegions()
	// Unreadable slabs: their objects are not accused.
	for t := int32(0); t < n; t++ {
		if g.isFree(t) {
			continue
		}
		rep.Objects++
		if ls.reached[t] {
			rep.Reached++
		} else if g.bytes(t) == nil {
			ls.unread[t] = true
			rep.ReadFails++
			rep.Reached++
		}
	}
	rep.Leaked = rep.Objects - rep.Reached
	// Each leak root takes the leaked objects it reaches that no earlier
	// root took; objects left over lie on cycles that no root reaches:
	// the first of each cycle (by address) is taken as its root.
	pointed := ls.pointedAt()
	for t := int32(0); t < n; t++ {
		if ls.leaked(t) && !pointed[t] {
			ls.take(t)
		}
	}
	for t := int32(0); t < n; t++ {
		if ls.leaked(t) && !ls.taken[t] {
			ls.take(t)
		}
	}
	for _, acc := range ls.groups {
		rep.Groups = append(rep.Groups, *acc)
	}
	sort.Slice(rep.Groups, func(i, j int) bool {
		a, b := rep.Groups[i], rep.Groups[j]
		if a.Bytes != b.Bytes {
			return a.Bytes > b.Bytes
		}
		if a.Cache != b.Cache {
			return a.Cache < b.Cache
		}
		if a.Type != b.Type {
			return a.Type < b.Type
		}
		if a.AllocCaller != b.AllocCaller {
			return a.AllocCaller < b.AllocCaller
		}
		return slices.Compare(a.AllocStack, b.AllocStack) < 0
	})
	return rep
}

// leakSearch is FindLeaks' state, by node.
type leakSearch struct {
	g       *Graph
	reached []bool  // a root reaches it
	work    []int32 // reached, its words not yet scanned
	unread  []bool  // unreadable: not accused
	taken   []bool  // in a leak's group
	groups  map[leakKey]*LeakGroup
	rep     *LeakReport
	// regions are the candidate regions by address (rlo, rhi their
	// span), rreached which a word reached, rwork those not yet read;
	// meta the words that do not reach them.
	regions  []Region
	rlo, rhi uint64
	rreached []bool
	rwork    []int
	meta     map[uint64]bool
	buf      []byte // a chunk of a range being read
}

// setRegions takes the candidate regions, sorted, overlapping ones
// dropped (a region must be one allocation).
func (ls *leakSearch) setRegions(rs []Region, meta []uint64) {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Region) int { return cmp.Compare(a.Lo, b.Lo) })
	for _, r := range rs {
		if r.Hi <= r.Lo || len(ls.regions) > 0 && r.Lo < ls.regions[len(ls.regions)-1].Hi {
			continue
		}
		ls.regions = append(ls.regions, r)
	}
	if len(ls.regions) > 0 {
		ls.rlo, ls.rhi = ls.regions[0].Lo, ls.regions[len(ls.regions)-1].Hi
	}
	ls.rreached = make([]bool, len(ls.regions))
	ls.meta = map[uint64]bool{}
	for _, a := range meta {
		ls.meta[a] = true
	}
	ls.rep.Regions = len(ls.regions)
}

// region is the candidate region holding v, if any.
func (ls *leakSearch) region(v uint64) (int, bool) {
	if v < ls.rlo || v >= ls.rhi {
		return 0, false
	}
	i, _ := slices.BinarySearchFunc(ls.regions, v, func(r Region, v uint64) int { return cmp.Compare(r.Lo, v) })
	if i < len(ls.regions) && ls.regions[i].Lo == v {
		return i, true
	}
	if i > 0 && v < ls.regions[i-1].Hi {
		return i - 1, true
	}
	return 0, false
}

// reach marks the objects and regions b's words point at reached; b is
// the memory at addr.
func (ls *leakSearch) reach(b []byte, addr uint64) {
	g := ls.g
	for i := 0; i+8 <= len(b); i += 8 {
		v := binary.LittleEndian.Uint64(b[i:])
		if v < g.pfnBase {
			continue
		}
		if t, _, ok := g.node(v); ok {
			if !ls.reached[t] {
				ls.reached[t] = true
				ls.work = append(ls.work, t)
			}
			continue
		}
		if r, ok := ls.region(v); ok && !ls.rreached[r] && !ls.meta[addr+uint64(i)] {
			ls.rreached[r] = true
			ls.rwork = append(ls.rwork, r)
		}
	}
}

// takeRegions reports the regions nothing reached, a leak each, grouped
// by what they are and who allocated them.
func (ls *leakSearch) takeRegions() {
	for i, r := range ls.regions {
		if ls.rreached[i] {
			continue
		}
		ls.rep.RegionsLeaked++
		size := r.Hi - r.Lo
		ls.addLeak(Leak{Addr: r.Lo, Size: uint32(min(size, 1<<32-1)), Cache: r.What, AllocCaller: r.Caller}, size, nil)
	}
}

// addLeak puts a leak in its group (cache, type, allocating caller and
// stack); bytes is its size with its hidden objects'.
func (ls *leakSearch) addLeak(l Leak, bytes uint64, stack []uint64) {
	k := leakKey{l.Cache, l.Type, l.AllocCaller, fmt.Sprint(stack)}
	acc := ls.groups[k]
	if acc == nil {
		acc = &LeakGroup{Cache: l.Cache, Type: l.Type, AllocCaller: l.AllocCaller, AllocStack: stack}
		ls.groups[k] = acc
	}
	acc.Count++
	acc.Bytes += bytes
	acc.Hidden += l.Hidden
	acc.Leaks = append(acc.Leaks, l)
	ls.rep.Leaks++
	ls.rep.LeakedSize += bytes
}

// scanRoots reaches from every root range.
func (ls *leakSearch) scanRoots(all []Range) {
	for _, r := range all {
		ls.rep.RootRanges[r.What]++
		ls.scanRange(r, true)
	}
}

// scanRange reaches from the words of r, a chunk at a time, page by page
// where a chunk cannot be read (a guard page or a hole in the dump); a
// root's bytes are counted in the report.
func (ls *leakSearch) scanRange(r Range, root bool) {
	rep := ls.rep
	if ls.buf == nil {
		ls.buf = make([]byte, leakChunk)
	}
	count := func(read, unread uint64) {
		if root {
			rep.RootBytes += read
			rep.Unreadable += unread
		}
	}
	for a := r.Lo &^ 7; a < r.Hi; {
		m := min(r.Hi-a, leakChunk)
		b := ls.buf[:m]
		if ls.g.k.ReadVirt(b, a) == nil {
			count(m, 0)
			ls.reach(b, a)
			a += m
			continue
		}
		next := min((a|4095)+1, r.Hi)
		b = ls.buf[:next-a]
		if ls.g.k.ReadVirt(b, a) == nil {
			count(next-a, 0)
			ls.reach(b, a)
		} else {
			count(0, next-a)
		}
		a = next
	}
}

// leakKey groups leaks: cache, type, allocating caller and stack (its
// frames as a string: a comparable key).
type leakKey struct {
	cache, typ string
	caller     uint64
	stack      string
}

// allocTrack is the address that allocated node t and the whole stack
// that did, where its cache keeps slub_debug's tracks (the stack where
// the depot can be read); 0 and nil otherwise.
func (ls *leakSearch) allocTrack(t int32) (uint64, []uint64) {
	g := ls.g
	if g.slabs[g.nodeSlab[t]].Cache.TrackOffset() < 0 {
		return 0, nil
	}
	o, err := g.heap.Lookup(g.addr(t))
	if err != nil {
		return 0, nil
	}
	a, _, err := g.heap.Tracks(o)
	if err != nil {
		return 0, nil
	}
	stack, _ := g.heap.Stack(a.Handle)
	return a.Addr, stack
}

// leaked: t is allocated, readable, and no root reaches it.
func (ls *leakSearch) leaked(t int32) bool {
	return !ls.reached[t] && !ls.unread[t] && !ls.g.isFree(t)
}

// pointedAt marks the leaked objects that other leaked objects point
// at: they belong to those.
func (ls *leakSearch) pointedAt() []bool {
	g := ls.g
	pointed := make([]bool, len(g.typ))
	for t := int32(0); t < int32(len(g.typ)); t++ {
		if !ls.leaked(t) {
			continue
		}
		b := g.bytes(t)
		for i := 0; i+8 <= len(b); i += 8 {
			if u, _, ok := g.node(binary.LittleEndian.Uint64(b[i:])); ok && u != t && ls.leaked(u) {
				pointed[u] = true
			}
		}
	}
	return pointed
}

// take makes root a leak, with the leaked objects it reaches that are
// not taken yet, in its group by cache and type.
func (ls *leakSearch) take(root int32) {
	g := ls.g
	ls.taken[root] = true
	hidden, bytes := 0, uint64(g.slabs[g.nodeSlab[root]].Cache.ObjectSize)
	stack := []int32{root}
	for len(stack) > 0 {
		t := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		b := g.bytes(t)
		for i := 0; i+8 <= len(b); i += 8 {
			if u, _, ok := g.node(binary.LittleEndian.Uint64(b[i:])); ok && ls.leaked(u) && !ls.taken[u] {
				ls.taken[u] = true
				hidden++
				bytes += uint64(g.slabs[g.nodeSlab[u]].Cache.ObjectSize)
				stack = append(stack, u)
			}
		}
	}
	c := g.slabs[g.nodeSlab[root]].Cache
	typ := ""
	if g.mark[root] != Unmarked {
		typ = g.typeName(root)
	}
	caller, frames := ls.allocTrack(root)
	ls.addLeak(Leak{Addr: g.addr(root), Size: c.ObjectSize, Cache: c.Name, Type: typ, Hidden: hidden, AllocCaller: caller}, bytes, frames)
}

// builtinRoots are the roots the graph finds itself: the image's data
// ranges, the memory map (every struct page) and every CPU's per-CPU
// area. A CPU's area runs from __per_cpu_start over what the first chunk
// uses (perCPUUsed: the static variables, then the reserved and dynamic
// parts, where alloc_percpu's early allocations live); where that cannot
// be read, over pcpu_unit_size bytes, or to __per_cpu_end.
func (g *Graph) builtinRoots() []Range {
	var rs []Range
	for _, r := range g.static.ranges {
		rs = append(rs, Range{Lo: r[0], Hi: r[1], What: "kernel data"})
	}
	// The memory map: struct pages point into the heap too (a page
	// table's split lock, page->ptl, is a slab object only it points at
	// where spinlock_t is large, as on PREEMPT_RT; page->mapping).
	var page *btf.Struct
	if h := g.heap; h.Vmemmap != 0 && h.MaxPFN > 0 && g.structByName("page", &page) == nil && page.Size > 0 {
		rs = append(rs, Range{Lo: h.Vmemmap, Hi: h.Vmemmap + h.MaxPFN*uint64(page.Size), What: "memory map"})
	}
	lo, err1 := g.k.SymbolAddr("__per_cpu_start")
	hi, err2 := g.k.SymbolAddr("__per_cpu_end")
	if err1 != nil || err2 != nil || hi <= lo {
		return rs
	}
	size := hi - lo
	if a, err := g.k.SymbolAddr("pcpu_unit_size"); err == nil {
		var b [4]byte
		if g.k.ReadVirt(b[:], a) == nil {
			if u := uint64(binary.LittleEndian.Uint32(b[:])); u >= size && u <= 64<<20 {
				size = u
			}
		}
	}
	if used, ok := g.perCPUUsed(); ok && used >= hi-lo && used <= size {
		size = used
	}
	offs, _ := g.k.PerCPUOffsets()
	for _, off := range offs {
		rs = append(rs, Range{Lo: lo + off, Hi: lo + off + size, What: "per-CPU area"})
	}
	return rs
}

// perCPUUsed is how much of each CPU's unit the first chunk uses, from
// its start: the static variables, the reserved part and the dynamic
// part, up to the end of pcpu_first_chunk (its base_addr, nr_pages and
// end_offset, relative to pcpu_base_addr, unit 0's start). The rest of
// each unit, up to pcpu_unit_size, the kernel gives back to the page
// allocator at boot (pcpu_embed_first_chunk), which hands it out again:
// read as a root, a stale word there (a 6.12 guest's freed vmap_area)
// reached a leaked vmalloc area.
func (g *Graph) perCPUUsed() (uint64, bool) {
	var chunk *btf.Struct
	if g.structByName("pcpu_chunk", &chunk) != nil {
		return 0, false
	}
	off := map[string]uint32{}
	for _, m := range chunk.Members {
		off[m.Name] = m.Offset.Bytes()
	}
	fcSym, err1 := g.k.SymbolAddr("pcpu_first_chunk")
	baseSym, err2 := g.k.SymbolAddr("pcpu_base_addr")
	bo, ok1 := off["base_addr"]
	no, ok2 := off["nr_pages"]
	eo, ok3 := off["end_offset"]
	if err1 != nil || err2 != nil || !ok1 || !ok2 || !ok3 {
		return 0, false
	}
	i32 := func(a uint64) (uint64, bool) {
		var b [4]byte
		if g.k.ReadVirt(b[:], a) != nil {
			return 0, false
		}
		v := int32(binary.LittleEndian.Uint32(b[:]))
		return uint64(v), v >= 0
	}
	fc, ok1 := g.readU64(fcSym)
	base, ok2 := g.readU64(baseSym)
	if !ok1 || !ok2 || fc == 0 {
		return 0, false
	}
	cbase, ok1 := g.readU64(fc + uint64(bo))
	pages, ok2 := i32(fc + uint64(no))
	endOff, ok3 := i32(fc + uint64(eo))
	if !ok1 || !ok2 || !ok3 || cbase < base {
		return 0, false
	}
	end := cbase + pages*4096 - endOff
	if end <= base {
		return 0, false
	}
	return end - base, true
}
