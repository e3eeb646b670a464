// Package patchheap allocates kerninst.ko's patch heap: the executable
// memory, within rel32 reach of kernel and module text, that patches are
// written into. The driver only writes it (and refuses writes that would be
// unsafe); where each patch goes is decided here, in user space.
//
// A Heap is first fit over granules: an allocation takes the lowest run of
// free granules long enough for it, so patches stay packed at the start of
// the heap. It is not safe for concurrent use.
package patchheap

import (
	"errors"
	"fmt"
	"slices"
)

var (
	// ErrFull: no run of free granules is long enough.
	ErrFull = errors.New("patch heap full")
	// ErrNotAllocated: a free of an address that does not start an
	// allocation (never allocated, already freed, inside one, or outside
	// the heap).
	ErrNotAllocated = errors.New("not the start of a patch heap allocation")
)

// Heap allocates [base, base+size) in granules of granule bytes.
type Heap struct {
	base, size, granule uint64
	free                []span // free runs by address, coalesced, none empty
	// lens[g] is the length in granules of the allocation that starts
	// at granule g, 0 where none starts. First fit keeps allocations at
	// the start of the heap, so it grows only as far as the last one: a
	// whole-kernel session's half a million patches took 24 MB as a map,
	// and take 2 MB here.
	lens []uint32
	used uint64 // bytes allocated
}

// span is the free run [start, end).
type span struct{ start, end uint64 }

// New returns an empty heap over [base, base+size). granule must be a power
// of two, base and size multiples of it, and the range must not wrap.
func New(base, size, granule uint64) (*Heap, error) {
	switch {
	case granule == 0 || granule&(granule-1) != 0:
		return nil, fmt.Errorf("patch heap granule %d is not a power of two", granule)
	case size == 0 || base%granule != 0 || size%granule != 0:
		return nil, fmt.Errorf("patch heap [%#x, +%#x) is not in whole %d-byte granules", base, size, granule)
	case base+size < base:
		return nil, fmt.Errorf("patch heap [%#x, +%#x) wraps", base, size)
	}
	return &Heap{base: base, size: size, granule: granule,
		free: []span{{base, base + size}}}, nil
}

// granuleOf is the index in lens of the granule at addr, and whether addr
// starts a granule of the heap.
func (h *Heap) granuleOf(addr uint64) (int, bool) {
	if addr < h.base || addr >= h.base+h.size || (addr-h.base)%h.granule != 0 {
		return 0, false
	}
	return int((addr - h.base) / h.granule), true
}

// Alloc allocates n bytes, rounded up to whole granules, and returns the
// address of the first. Errors: n not positive, or ErrFull.
func (h *Heap) Alloc(n int) (uint64, error) {
	if n <= 0 {
		return 0, fmt.Errorf("patch heap: allocation of %d bytes", n)
	}
	need := (uint64(n) + h.granule - 1) &^ (h.granule - 1)
	for i, f := range h.free {
		if f.end-f.start < need {
			continue
		}
		if f.end-f.start == need {
			h.free = slices.Delete(h.free, i, i+1)
		} else {
			h.free[i].start += need
		}
		g, _ := h.granuleOf(f.start)
		if g >= len(h.lens) {
			h.lens = slices.Grow(h.lens, g+1-len(h.lens))[:g+1]
		}
		h.lens[g] = uint32(need / h.granule)
		h.used += need
		return f.start, nil
	}
	return 0, fmt.Errorf("%w: %d bytes wanted, %d the longest free run (%d of %d in use)",
		ErrFull, need, h.Largest(), h.used, h.size)
}

// Len returns the length in bytes (whole granules) of the allocation that
// starts at addr, and whether there is one.
func (h *Heap) Len(addr uint64) (uint64, bool) {
	g, ok := h.granuleOf(addr)
	if !ok || g >= len(h.lens) || h.lens[g] == 0 {
		return 0, false
	}
	return uint64(h.lens[g]) * h.granule, true
}

// Free frees the allocation that starts at addr and returns its length.
// Any other address is ErrNotAllocated, and changes nothing.
func (h *Heap) Free(addr uint64) (uint64, error) {
	n, ok := h.Len(addr)
	if !ok {
		return 0, fmt.Errorf("%w: %#x", ErrNotAllocated, addr)
	}
	g, _ := h.granuleOf(addr)
	h.lens[g] = 0
	if h.used -= n; h.used == 0 {
		h.lens = nil // a session's worth of lengths goes with it
	}
	// The free runs either side of it, if adjacent, merge with it.
	i, _ := slices.BinarySearchFunc(h.free, addr, func(f span, a uint64) int {
		switch {
		case f.start < a:
			return -1
		case f.start > a:
			return 1
		}
		return 0
	})
	s := span{addr, addr + n}
	next := i < len(h.free) && h.free[i].start == s.end
	prev := i > 0 && h.free[i-1].end == s.start
	switch {
	case prev && next:
		h.free[i-1].end = h.free[i].end
		h.free = slices.Delete(h.free, i, i+1)
	case prev:
		h.free[i-1].end = s.end
	case next:
		h.free[i].start = s.start
	default:
		h.free = slices.Insert(h.free, i, s)
	}
	return n, nil
}

// Used is the number of bytes allocated (whole granules).
func (h *Heap) Used() uint64 { return h.used }

// Largest is the longest run of free bytes: the largest allocation that
// would succeed now.
func (h *Heap) Largest() uint64 {
	var m uint64
	for _, f := range h.free {
		m = max(m, f.end-f.start)
	}
	return m
}
