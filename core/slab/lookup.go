package slab

import (
	"errors"
	"fmt"
)

// ErrNotSlab says an address is in no slab.
var ErrNotSlab = errors.New("not in a slab")

// Page is what the memory map says of the page holding an address.
type Page struct {
	PFN      uint64
	Head     uint64 // struct page of the compound head (the page itself if not compound)
	Compound bool   // part of a higher-order allocation
	Slab     bool   // the head has PG_slab
	Free     bool   // the head's _refcount is 0: in the page allocator's free lists (or on its way there)
	Flags    uint64 // the head's flags
}

// InDirectMap says whether addr is in the direct map of memory that
// has struct pages.
func (h *Heap) InDirectMap(addr uint64) bool {
	return addr >= h.PageOffset && (addr-h.PageOffset)>>pageShift < h.MaxPFN
}

// PageAt reads the struct page of a direct-map address.
func (h *Heap) PageAt(addr uint64) (Page, error) {
	if !h.InDirectMap(addr) {
		return Page{}, fmt.Errorf("%#x is not in the direct map of memory (%#x + %d pages): %w", addr, h.PageOffset, h.MaxPFN, ErrNotSlab)
	}
	pfn := (addr - h.PageOffset) >> pageShift
	l := h.l
	b := make([]byte, l.pageSize)
	sp := h.Vmemmap + pfn*uint64(l.pageSize)
	if err := h.k.ReadVirt(b, sp); err != nil {
		return Page{}, fmt.Errorf("struct page of pfn %#x at %#x: %w", pfn, sp, err)
	}
	pg := Page{PFN: pfn, Head: sp}
	if ch := l.compoundHead.U64(b); ch&1 != 0 {
		pg.Compound, pg.Head = true, ch-1
		if pg.Head < h.Vmemmap || (pg.Head-h.Vmemmap)/uint64(l.pageSize) >= h.MaxPFN || (pg.Head-h.Vmemmap)%uint64(l.pageSize) != 0 {
			return pg, fmt.Errorf("struct page %#x (pfn %#x) names %#x as its compound head, outside the memory map", sp, pfn, pg.Head)
		}
		if err := h.k.ReadVirt(b, pg.Head); err != nil {
			return pg, fmt.Errorf("compound head %#x of pfn %#x: %w", pg.Head, pfn, err)
		}
	}
	pg.Flags = l.pageFlags.U64(b)
	pg.Slab = l.isSlab(b)
	pg.Free = l.pageRefcount.U64(b) == 0
	return pg, nil
}

// Region names the part of a slab slot an address falls in.
type Region uint8

const (
	InObject    Region = iota // the object proper: [object, object+object_size)
	LeftRedZone               // before the object (slub_debug red zone)
	Metadata                  // after object_size: red zone, free pointer, tracks, alignment
	SlabTail                  // after the last object: the slab's unused end
)

func (r Region) String() string {
	return [...]string{"object", "left red zone", "metadata", "slab tail"}[r]
}

// Object is where an address falls in a slab.
type Object struct {
	Slab   *Slab
	Index  int    // -1 in the slab's tail
	Addr   uint64 // the object's start (after any left red zone)
	Offset int64  // the address less Addr
	Region Region
	Free   bool
}

// Lookup finds the slab object holding addr. Without a Walk it reads
// only that slab and its cache's per-CPU data, so the slab's list is
// known only if a CPU holds it (List is Unlisted otherwise). An address
// in no slab gives an error matching ErrNotSlab.
func (h *Heap) Lookup(addr uint64) (*Object, error) {
	pg, err := h.PageAt(addr)
	if err != nil {
		return nil, err
	}
	if !pg.Slab {
		return nil, fmt.Errorf("%#x: pfn %#x is not a slab page: %w", addr, pg.PFN, ErrNotSlab)
	}
	s, err := h.slabAt(pg.Head)
	if err != nil {
		return nil, err
	}
	if addr < s.Base {
		return nil, fmt.Errorf("%#x is before its slab %#x-%#x (compound page %#x): %w", addr, s.Base, s.End(), pg.Head, ErrNotSlab)
	}
	if addr >= s.End() {
		return &Object{Slab: s, Index: -1, Region: SlabTail}, nil
	}
	c := s.Cache
	slot := int((addr - s.Base) / uint64(c.Size))
	o := &Object{Slab: s, Index: slot, Addr: s.Object(slot), Free: s.Free(slot)}
	o.Offset = int64(addr - o.Addr)
	switch {
	case addr < o.Addr:
		o.Region = LeftRedZone
	case o.Offset >= int64(c.ObjectSize):
		o.Region = Metadata
	default:
		o.Region = InObject
	}
	return o, nil
}

// Slab is the slab whose struct slab is at addr, found by Walk or an
// earlier Lookup.
func (h *Heap) Slab(addr uint64) (*Slab, bool) {
	s, ok := h.bySlab[addr]
	return s, ok
}

// slabAt returns the walked slab at a struct slab address, or reads it
// and its free objects alone.
func (h *Heap) slabAt(addr uint64) (*Slab, error) {
	if s, ok := h.bySlab[addr]; ok {
		return s, nil
	}
	l := h.l
	b := make([]byte, l.pageSize)
	if err := h.k.ReadVirt(b, addr); err != nil {
		return nil, fmt.Errorf("struct slab %#x: %w", addr, err)
	}
	cp := l.slabCache.U64(b)
	c, ok := h.byAddr[cp]
	if !ok {
		return nil, fmt.Errorf("slab %#x names kmem_cache %#x, which is not on slab_caches", addr, cp)
	}
	pfn := (addr - h.Vmemmap) / uint64(l.pageSize)
	before := h.nAnomalies
	s := h.newSlab(c, addr, pfn, b)
	if s == nil {
		return nil, fmt.Errorf("slab %#x of %s: %s", addr, c.Name, h.anomalies[len(h.anomalies)-1].What)
	}
	var mem []byte
	h.walkFreelist(s, s.Freelist, "freelist", &mem)
	cb := make([]byte, l.cpuSize)
	for cpu, off := range h.cpuOffs {
		if err := h.k.ReadVirt(cb, c.cpuSlab+off); err != nil || l.cpuSlabSlab.U64(cb) != addr {
			continue
		}
		s.List, s.Where = CPUSlab, cpu
		h.walkFreelist(s, l.cpuFreelist.U64(cb), fmt.Sprintf("cpu %d lockless freelist", cpu), &mem)
	}
	if h.nAnomalies > before {
		return s, fmt.Errorf("slab %#x of %s: %s", addr, c.Name, h.anomalies[len(h.anomalies)-1].What)
	}
	if h.bySlab == nil {
		h.bySlab = map[uint64]*Slab{}
	}
	h.bySlab[addr] = s
	return s, nil
}

// Track is one of slub_debug's allocation or free records (struct
// track, SLAB_STORE_USER).
type Track struct {
	Addr   uint64 // the caller
	Handle uint32 // stack depot handle of the whole stack, 0 if none
	CPU    int
	PID    int
	When   uint64 // jiffies
}

// Tracks reads the allocation and free records after an object of a
// cache with SLAB_STORE_USER.
func (h *Heap) Tracks(o *Object) (alloc, free Track, err error) {
	c := o.Slab.Cache
	to := c.TrackOffset()
	l := h.l
	if to < 0 || l.trackSize == 0 {
		return alloc, free, fmt.Errorf("%s keeps no tracks (slub_debug=U is off)", c.Name)
	}
	b := make([]byte, 2*l.trackSize)
	if err := h.k.ReadVirt(b, o.Addr+uint64(to)); err != nil {
		return alloc, free, err
	}
	rd := func(t []byte) Track {
		return Track{Addr: l.trackAddr.U64(t), Handle: uint32(l.trackHandle.U64(t)), CPU: int(l.trackCPU.I64(t)),
			PID: int(l.trackPID.I64(t)), When: l.trackWhen.U64(t)}
	}
	return rd(b[:l.trackSize]), rd(b[l.trackSize:]), nil
}

// Objects calls f for every object of every walked slab of c, in
// address order within each slab.
func (c *Cache) Objects(f func(s *Slab, i int, addr uint64, free bool)) {
	for _, s := range c.Slabs {
		for i := 0; i < s.Objects; i++ {
			f(s, i, s.Object(i), s.Free(i))
		}
	}
}
