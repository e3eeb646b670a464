package engine

import (
	"iter"
	"slices"
)

// addrMap maps kernel text addresses to values: the engine's maps that
// hold an entry per probe (its points, the overlay's original bytes). It
// keeps, per 4 KiB page, the entries' offsets and values in two sorted
// arrays: 2 bytes and the value an entry, where a Go map grown to a whole
// kernel's half a million entries took about 40 bytes for an 8-byte
// value. Lookups are a page lookup and a binary search of its entries (a
// few hundred at most: one per basic block). The zero value is empty.
type addrMap[V any] struct {
	pages map[uint64]*addrPage[V]
	n     int
}

// addrPage is one page's entries, by offset.
type addrPage[V any] struct {
	offs []uint16
	vals []V
}

// addrPageShift sizes addrMap's pages: an offset fits a uint16.
const addrPageShift = 12

func splitAddr(a uint64) (page uint64, off uint16) {
	return a >> addrPageShift, uint16(a & (1<<addrPageShift - 1))
}

// find is the page of a and the index where a's entry is or would go.
func (m *addrMap[V]) find(a uint64) (p *addrPage[V], i int, found bool) {
	pg, off := splitAddr(a)
	if p = m.pages[pg]; p == nil {
		return nil, 0, false
	}
	i, found = slices.BinarySearch(p.offs, off)
	return p, i, found
}

func (m *addrMap[V]) get(a uint64) (v V, ok bool) {
	p, i, ok := m.find(a)
	if !ok {
		return v, false
	}
	return p.vals[i], true
}

func (m *addrMap[V]) set(a uint64, v V) {
	p, i, ok := m.find(a)
	if ok {
		p.vals[i] = v
		return
	}
	if p == nil {
		if m.pages == nil {
			m.pages = make(map[uint64]*addrPage[V])
		}
		pg, _ := splitAddr(a)
		p = &addrPage[V]{}
		m.pages[pg] = p
	}
	_, off := splitAddr(a)
	p.offs, p.vals = slices.Insert(p.offs, i, off), slices.Insert(p.vals, i, v)
	m.n++
}

// del drops a's entry and reports whether there was one. A page left
// empty goes, and the page map with the last page (a map never shrinks).
func (m *addrMap[V]) del(a uint64) bool {
	p, i, ok := m.find(a)
	if !ok {
		return false
	}
	m.n--
	if len(p.offs) == 1 {
		pg, _ := splitAddr(a)
		delete(m.pages, pg)
		if m.n == 0 {
			m.pages = nil
		}
		return true
	}
	p.offs, p.vals = slices.Delete(p.offs, i, i+1), slices.Delete(p.vals, i, i+1)
	return true
}

func (m *addrMap[V]) len() int { return m.n }

// all yields every entry: pages in no order, each page's by address.
func (m *addrMap[V]) all() iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		for pg, p := range m.pages {
			for i, off := range p.offs {
				if !yield(pg<<addrPageShift|uint64(off), p.vals[i]) {
					return
				}
			}
		}
	}
}

// within yields the entries in [lo, hi), by page.
func (m *addrMap[V]) within(lo, hi uint64) iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		if lo >= hi {
			return
		}
		first, _ := splitAddr(lo)
		last, _ := splitAddr(hi - 1)
		if last-first > uint64(len(m.pages)) {
			// A range wider than the pages there are: look at each.
			for a, v := range m.all() {
				if a >= lo && a < hi && !yield(a, v) {
					return
				}
			}
			return
		}
		for pg := first; pg <= last; pg++ {
			p := m.pages[pg]
			if p == nil {
				continue
			}
			for i, off := range p.offs {
				if a := pg<<addrPageShift | uint64(off); a >= lo && a < hi && !yield(a, p.vals[i]) {
					return
				}
			}
		}
	}
}
