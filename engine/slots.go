package engine

import "fmt"

// slotAllocator hands out counter slots: a bitmap, so that a full
// allocator says so at once (a coverage session over more blocks than
// there are counters asks for a slot for every block it cannot arm).
// Protected by Engine.mu.
type slotAllocator struct {
	n    int
	bits []uint64 // slot s is in use when bit s%64 of bits[s/64] is set
	used int      // slots in use
	next int      // where the next search starts
}

func newSlotAllocator(n int) slotAllocator {
	return slotAllocator{n: n, bits: make([]uint64, (n+63)/64)}
}

func (a *slotAllocator) inUse(s int) bool { return a.bits[s/64]&(1<<(s%64)) != 0 }

func (a *slotAllocator) take(s int) { a.bits[s/64] |= 1 << (s % 64); a.used++ }

func (a *slotAllocator) alloc() (int, error) {
	if a.used >= a.n {
		return 0, fmt.Errorf("all %d counter slots in use: probe fewer blocks at once", a.n)
	}
	for i := 0; i < a.n; {
		s := (a.next + i) % a.n
		if s%64 == 0 && a.bits[s/64] == ^uint64(0) && s+64 <= a.n {
			i += 64 // a full word
			continue
		}
		if !a.inUse(s) {
			a.take(s)
			a.next = s + 1
			return s, nil
		}
		i++
	}
	return 0, fmt.Errorf("all %d counter slots in use: probe fewer blocks at once", a.n)
}

func (a *slotAllocator) free(s int) {
	if s >= 0 && s < a.n && a.inUse(s) {
		a.bits[s/64] &^= 1 << (s % 64)
		a.used--
	}
}

// inUseSlots lists the slots in use.
func (a *slotAllocator) inUseSlots() []int {
	var out []int
	for s := 0; s < a.n; s++ {
		if a.inUse(s) {
			out = append(out, s)
		}
	}
	return out
}

// allocRange takes n consecutive free slots.
func (a *slotAllocator) allocRange(n int) (int, error) {
	for start := 0; start+n <= a.n; start++ {
		ok := true
		for i := start; i < start+n; i++ {
			if a.inUse(i) {
				ok, start = false, i
				break
			}
		}
		if ok {
			for i := start; i < start+n; i++ {
				a.take(i)
			}
			return start, nil
		}
	}
	return 0, fmt.Errorf("no %d consecutive counter slots free", n)
}

// ReserveCounters takes n consecutive counter slots (a task table must be
// contiguous), zeroed, for snippets that address them directly rather
// than through a request's own slots. ReleaseCounters gives them back.
func (e *Engine) ReserveCounters(n int) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	base, err := e.slots.allocRange(n)
	if err != nil {
		return 0, err
	}
	if err := e.dev.ClearCounters(base, n); err != nil {
		for i := base; i < base+n; i++ {
			e.slots.free(i)
		}
		return 0, err
	}
	return base, nil
}

// ReleaseCounters returns n slots from first, once no request's snippet
// writes them any more.
func (e *Engine) ReleaseCounters(first, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := first; i < first+n; i++ {
		e.slots.free(i)
	}
}
