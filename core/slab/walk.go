package slab

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// Walk finds every slab and the state of every object.
func (h *Heap) Walk() error {
	if h.walked {
		return nil
	}
	h.walked = true
	h.bySlab = map[uint64]*Slab{}
	if err := h.scanMemoryMap(); err != nil {
		return err
	}
	for _, c := range h.Caches {
		h.walkCache(c)
	}
	return nil
}

// vmemmapChunk is how many struct pages the scan reads at once.
const vmemmapChunk = 512

// sectionPages is the pages of one memory section (x86-64
// SECTION_SIZE_BITS 27: 128 MiB). The memory map of a section is
// populated whole or not at all, so a section whose map's first and last
// pages cannot be read is skipped without probing the pages between.
const sectionPages = 1 << (27 - pageShift)

// scanMemoryMap reads every struct page and keeps the slabs.
func (h *Heap) scanMemoryMap() error {
	ps := uint64(h.l.pageSize)
	buf := make([]byte, vmemmapChunk*ps)
	for sec := uint64(0); sec < h.MaxPFN; sec += sectionPages {
		end := min(sec+sectionPages, h.MaxPFN)
		if !h.readable(h.Vmemmap+sec*ps) && !h.readable(h.Vmemmap+end*ps-1) {
			h.VmemmapHoles += int(end - sec)
			continue
		}
		for pfn := sec; pfn < end; {
			n := min(uint64(vmemmapChunk), end-pfn)
			b := buf[:n*ps]
			if err := h.k.ReadVirt(b, h.Vmemmap+pfn*ps); err != nil {
				h.scanSlow(pfn, n)
			} else {
				for i := uint64(0); i < n; i++ {
					h.scanPage(pfn+i, b[i*ps:(i+1)*ps])
				}
				h.PagesScanned += n
			}
			pfn += n
		}
	}
	return nil
}

func (h *Heap) readable(a uint64) bool {
	var b [1]byte
	return h.k.ReadVirt(b[:], a) == nil
}

// scanSlow reads struct pages one at a time around the holes of a
// partly readable chunk, probing each page of the memory map once.
func (h *Heap) scanSlow(pfn, n uint64) {
	ps := uint64(h.l.pageSize)
	b := make([]byte, ps)
	lastPage, lastOK := ^uint64(0), false
	for i := uint64(0); i < n; i++ {
		a := h.Vmemmap + (pfn+i)*ps
		if p := a / pageSize; p != lastPage {
			lastPage, lastOK = p, h.readable(a)
		}
		if !lastOK || h.k.ReadVirt(b, a) != nil {
			h.VmemmapHoles++
			continue
		}
		h.PagesScanned++
		h.scanPage(pfn+i, b)
	}
}

// scanPage takes a struct page that heads a slab.
func (h *Heap) scanPage(pfn uint64, b []byte) {
	l := h.l
	if !l.isSlab(b) || l.compoundHead.U64(b)&1 != 0 {
		return
	}
	addr := h.Vmemmap + pfn*uint64(l.pageSize)
	cp := l.slabCache.U64(b)
	c, ok := h.byAddr[cp]
	if !ok {
		h.anomaly(Anomaly{Slab: addr, What: fmt.Sprintf("PG_slab page (pfn %#x) names kmem_cache %#x, which is not on slab_caches", pfn, cp)})
		return
	}
	s := h.newSlab(c, addr, pfn, b)
	if s == nil {
		return
	}
	c.Slabs = append(c.Slabs, s)
	h.bySlab[addr] = s
}

// newSlab reads a slab's counters from its struct slab bytes.
func (h *Heap) newSlab(c *Cache, addr, pfn uint64, b []byte) *Slab {
	l := h.l
	s := &Slab{Addr: addr, PFN: pfn, Base: h.PageOffset + pfn<<pageShift, Cache: c,
		Objects: int(l.slabObjects.U64(b)), Inuse: int(l.slabInuse.U64(b)), Frozen: l.slabFrozen.U64(b) != 0,
		Freelist: l.slabFreelist.U64(b)}
	if s.Objects == 0 || s.Objects > c.PerSlab {
		// A slab of the fallback order (s->min) holds fewer objects than
		// s->oo says, never more.
		h.cacheAnomaly(c, s, "%d objects, but the cache has at most %d per slab; slab skipped", s.Objects, c.PerSlab)
		return nil
	}
	s.free = make([]uint64, (s.Objects+63)/64)
	return s
}

// maxListLen bounds list and chain walks.
const maxListLen = 1 << 24

// walkCache classifies the cache's slabs by the lists that hold them,
// walks every freelist and adds up the counts.
func (h *Heap) walkCache(c *Cache) {
	st := &c.Stats
	st.NodeSlabs, st.NodeObjects, st.NodePartial = -1, -1, 0
	if h.l.nrSlabs.OK {
		st.NodeSlabs, st.NodeObjects = 0, 0
	}
	w := &cacheWalk{h: h, c: c, mine: map[uint64]*Slab{}, lockless: map[*Slab][]cpuFree{}}
	for _, s := range c.Slabs {
		w.mine[s.Addr] = s
	}
	w.cpus()
	w.nodes()
	// Every slab's own freelist, and the lockless freelist of the CPU
	// that allocates from it.
	for _, s := range c.Slabs {
		var mem []byte
		n := h.walkFreelist(s, s.Freelist, "freelist", &mem)
		if want := s.Objects - s.Inuse; n >= 0 && n != want {
			h.cacheAnomaly(c, s, "inuse %d of %d objects says %d free, its freelist holds %d", s.Inuse, s.Objects, want, n)
		}
		for _, f := range w.lockless[s] {
			h.walkFreelist(s, f.head, fmt.Sprintf("cpu %d lockless freelist", f.cpu), &mem)
		}
		s.walked = true
	}
	h.countSlabs(c)
}

// cacheWalk is walkCache's state: the cache's slabs by address, and the
// lockless freelists the CPUs hold on them.
type cacheWalk struct {
	h        *Heap
	c        *Cache
	mine     map[uint64]*Slab
	lockless map[*Slab][]cpuFree
}

// cpuFree is a CPU's lockless freelist.
type cpuFree struct {
	head uint64
	cpu  int
}

// place puts s on a list, or reports it on two.
func (w *cacheWalk) place(s *Slab, kind ListKind, where int) {
	if s.List != Unlisted {
		w.h.cacheAnomaly(w.c, s, "on the %s list of %d and on the %s list of %d", s.List, s.Where, kind, where)
		return
	}
	s.List, s.Where = kind, where
}

// cpus walks the per-CPU state: the CPU slab with its lockless freelist,
// and the partial chain (slab->next).
func (w *cacheWalk) cpus() {
	h, c, l := w.h, w.c, w.h.l
	cb := make([]byte, l.cpuSize)
	for cpu, off := range h.cpuOffs {
		pc := c.cpuSlab + off
		if err := h.k.ReadVirt(cb, pc); err != nil {
			h.cacheAnomaly(c, nil, "kmem_cache_cpu of cpu %d at %#x: %v", cpu, pc, err)
			continue
		}
		sa, fl := l.cpuSlabSlab.U64(cb), l.cpuFreelist.U64(cb)
		if sa != 0 {
			if s, ok := w.mine[sa]; ok {
				w.place(s, CPUSlab, cpu)
				w.lockless[s] = append(w.lockless[s], cpuFree{fl, cpu})
			} else {
				h.cacheAnomaly(c, nil, "cpu %d slab %#x is not a slab of this cache", cpu, sa)
			}
		} else if fl != 0 {
			h.cacheAnomaly(c, nil, "cpu %d has a freelist %#x but no slab", cpu, fl)
		}
		if l.cpuPartialSl.OK && l.slabNext.OK {
			w.cpuPartial(cpu, l.cpuPartialSl.U64(cb))
		}
	}
}

// cpuPartial walks a CPU's partial chain from p.
func (w *cacheWalk) cpuPartial(cpu int, p uint64) {
	h, c := w.h, w.c
	seen := map[uint64]bool{}
	for p != 0 {
		if seen[p] || len(seen) > len(c.Slabs) {
			h.cacheAnomaly(c, nil, "cpu %d partial chain loops at %#x", cpu, p)
			return
		}
		seen[p] = true
		s, ok := w.mine[p]
		if !ok {
			h.cacheAnomaly(c, nil, "cpu %d partial chain reaches %#x, not a slab of this cache", cpu, p)
			return
		}
		w.place(s, CPUPartial, cpu)
		next, err := h.readU64(p + uint64(h.l.slabNext.Off))
		if err != nil {
			h.cacheAnomaly(c, s, "cpu %d partial chain: %v", cpu, err)
			return
		}
		p = next
	}
}

// nodes walks each node's partial list and, with slub_debug, its full
// list, and adds up the nodes' counters.
func (w *cacheWalk) nodes() {
	h, c, l, st := w.h, w.c, w.h.l, &w.c.Stats
	nb := make([]byte, l.nodeSize)
	for node, na := range c.nodes {
		if na == 0 {
			continue
		}
		if err := h.k.ReadVirt(nb, na); err != nil {
			h.cacheAnomaly(c, nil, "kmem_cache_node %d at %#x: %v", node, na, err)
			continue
		}
		nrPartial := int(l.nrPartial.I64(nb))
		st.NodePartial += nrPartial
		if l.nrSlabs.OK {
			st.NodeSlabs += int(l.nrSlabs.I64(nb))
			st.NodeObjects += int(l.totalObjects.I64(nb))
		}
		n := h.walkSlabList(c, w.mine, na+uint64(l.partial.Off), fmt.Sprintf("node %d partial", node), func(s *Slab) { w.place(s, NodePartial, node) })
		if n >= 0 && n != nrPartial {
			h.cacheAnomaly(c, nil, "node %d: nr_partial is %d, its partial list holds %d slabs", node, nrPartial, n)
		}
		if l.full.OK {
			h.walkSlabList(c, w.mine, na+uint64(l.full.Off), fmt.Sprintf("node %d full", node), func(s *Slab) { w.place(s, NodeFull, node) })
		}
	}
}

// countSlabs adds up c's slabs by list, and checks them against the
// nodes' counters.
func (h *Heap) countSlabs(c *Cache) {
	st := &c.Stats
	for _, s := range c.Slabs {
		st.Slabs++
		st.Objects += s.Objects
		st.Free += s.NFree
		switch s.List {
		case CPUSlab:
			st.CPUSlabs++
			st.FreePerCPU += s.NFree
		case CPUPartial:
			st.CPUPartial++
			st.FreePerCPU += s.NFree
		case NodePartial:
			st.Partial++
		case NodeFull:
			st.Full++
		default:
			st.Unlisted++
			if s.NFree > 0 && !s.Frozen {
				h.cacheAnomaly(c, s, "%d free objects on a slab on no list", s.NFree)
			}
			st.FreePerCPU += s.NFree
		}
	}
	st.Allocated = st.Objects - st.Free
	if st.NodeSlabs >= 0 && (st.NodeSlabs != st.Slabs || st.NodeObjects != st.Objects) {
		h.cacheAnomaly(c, nil, "the nodes count %d slabs and %d objects; the memory map holds %d slabs and %d objects", st.NodeSlabs, st.NodeObjects, st.Slabs, st.Objects)
	}
}

// walkSlabList walks a list of struct slab (slab_list) at head, calling
// f for each; it returns the list's length, or -1 if it is broken.
func (h *Heap) walkSlabList(c *Cache, mine map[uint64]*Slab, head uint64, what string, f func(*Slab)) int {
	l := h.l
	p, err := h.readU64(head + uint64(l.listNext.Off))
	if err != nil {
		h.cacheAnomaly(c, nil, "%s list at %#x: %v", what, head, err)
		return -1
	}
	seen := map[uint64]bool{}
	for p != head {
		if seen[p] || len(seen) > len(c.Slabs) || len(seen) >= maxListLen {
			h.cacheAnomaly(c, nil, "%s list at %#x loops at %#x without returning to its head (or holds more slabs than the cache has)", what, head, p)
			return -1
		}
		seen[p] = true
		sa := p - uint64(l.slabList.Off)
		if s, ok := mine[sa]; ok {
			f(s)
		} else {
			h.cacheAnomaly(c, nil, "%s list holds %#x, not a slab of this cache", what, sa)
		}
		next, err := h.readU64(p + uint64(l.listNext.Off))
		if err != nil {
			h.cacheAnomaly(c, nil, "%s list broken at %#x: %v", what, p, err)
			return -1
		}
		p = next
	}
	return len(seen)
}

// freePointer decodes the free pointer stored at ptrAddr (freelist_ptr).
func (c *Cache) freePointer(stored, ptrAddr uint64) uint64 {
	if c.Hardened {
		return stored ^ c.Random ^ bits.ReverseBytes64(ptrAddr)
	}
	return stored
}

// walkFreelist marks the objects on the freelist starting at head as
// free; it returns how many, or -1 if the list is broken (each problem
// counted as an anomaly).
func (h *Heap) walkFreelist(s *Slab, head uint64, what string, memp *[]byte) int {
	c := s.Cache
	n := 0
	mem := *memp
	for p := head; p != 0; {
		i, ok := s.index(p)
		if !ok {
			where := "outside the slab"
			if p >= s.Base && p < s.End() {
				where = "not at an object's start"
			}
			h.cacheAnomaly(c, s, "%s: pointer %#x after %d objects is %s (%#x-%#x)", what, p, n, where, s.Base, s.End())
			return -1
		}
		if s.Free(i) {
			h.cacheAnomaly(c, s, "%s: object %#x is free twice (a loop, or on two freelists) after %d objects", what, p, n)
			return -1
		}
		if mem == nil {
			mem = make([]byte, s.End()-s.Base)
			if err := h.k.ReadVirt(mem, s.Base); err != nil {
				h.cacheAnomaly(c, s, "%s: slab memory: %v", what, err)
				return -1
			}
			*memp = mem
		}
		s.free[i/64] |= 1 << (i % 64)
		s.NFree++
		n++
		fp := p + uint64(c.Offset)
		o := fp - s.Base
		p = c.freePointer(binary.LittleEndian.Uint64(mem[o:o+8]), fp)
	}
	return n
}
