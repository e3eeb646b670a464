package engine

import (
	"fmt"
	"slices"
)

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
	for s := base; s < base+n; s++ {
		e.checkFree(s)
	}
	if err := e.dev.ClearCounters(base, n); err != nil {
		for i := base; i < base+n; i++ {
			e.slots.free(i)
		}
		return 0, err
	}
	return base, nil
}

// ReleaseCounters returns n slots from first, zeroed, at once: for a
// caller that knows nothing can write them any more (a BPF program's,
// once its link is closed). Slots that spliced patches wrote go back
// with RetireCounters.
func (e *Engine) ReleaseCounters(first, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.dev.ClearCounters(first, n); err != nil {
		e.log.Warn("counter slots not cleared", "first", first, "n", n, "err", err)
	}
	for i := first; i < first+n; i++ {
		e.slots.free(i)
	}
}

// RetireCounters returns n slots from first that patches wrote, once the
// requests whose patches did are removed: like a removed request's own
// slots they go back after the grace period that frees those patches (a
// task preempted in one may still write them).
func (e *Engine) RetireCounters(first, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	slots := make([]int, n)
	for i := range slots {
		slots[i] = first + i
	}
	e.retireCounters(slots)
}

// takeCounter hands out a free counter slot. Slots go back to the
// allocator zeroed, and only after the grace period that freed the last
// patch writing them (reclaimLocked), so a slot is zero when taken: one
// that is not was written by code that no longer owns it. That is a bug
// (a patch left running after its request went); it is counted and
// logged, and the slot cleared, so the new owner starts from zero. The
// caller holds e.mu.
func (e *Engine) takeCounter() (int, error) {
	slot, err := e.slots.alloc()
	if err != nil && e.retiredCounters() {
		// Removed requests' slots wait for reclaim: reclaim now.
		e.reclaimLocked()
		slot, err = e.slots.alloc()
	}
	if err != nil {
		return 0, err
	}
	if e.checkFree(slot) {
		if err := e.dev.ClearCounters(slot, 1); err != nil {
			e.slots.free(slot)
			return 0, err
		}
	}
	return slot, nil
}

// checkFree reports whether slot, just taken, was written while free;
// if so it counts and logs the stale write. The caller holds e.mu.
func (e *Engine) checkFree(slot int) bool {
	v := e.dev.Counter(slot)
	if v != 0 {
		e.staleWrites++
		e.log.Warn("counter slot written while free", "slot", slot, "addr", hex(e.dev.CounterAddr(slot)), "value", hex(v))
	}
	return v != 0
}

// clearRuns zeroes slots (any order; sorted here) with one ClearCounters
// a run of adjacent slots: a whole-kernel session gives back half a
// million, mostly in long runs.
func (e *Engine) clearRuns(slots []int) error {
	slices.Sort(slots)
	for i := 0; i < len(slots); {
		j := i + 1
		for j < len(slots) && slots[j] <= slots[j-1]+1 {
			j++
		}
		if err := e.dev.ClearCounters(slots[i], slots[j-1]-slots[i]+1); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// StaleCounterWrites counts the counter slots found written while free
// when handed out again (takeCounter, ReserveCounters) since the engine
// started: 0 unless some patch outlived its request.
func (e *Engine) StaleCounterWrites() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.staleWrites
}

// counterReader is a device that loads many counter slots in one call
// (driver.Device): a scan of the million slots then takes milliseconds.
type counterReader interface {
	ReadCounters(first int, dst []uint64) int
}

// DirtyFreeCounters scans the free counter slots for any that is not
// zero (a slot is cleared when it goes back to the allocator) and
// returns how many are, with the first few. Nothing but a patch that
// outlived its request writes a free slot, so anything but 0 is a bug;
// kerninstd reports the count (api.Info) and the live tests check it.
func (e *Engine) DirtyFreeCounters() (n int, first []int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := &e.slots
	bulk, _ := e.dev.(counterReader)
	var vals [64]uint64
	for w, bits := range a.bits {
		if bits == ^uint64(0) {
			continue
		}
		lo, hi := w*64, min(w*64+64, a.n)
		if bulk != nil {
			if bulk.ReadCounters(lo, vals[:hi-lo]) < hi-lo {
				break
			}
		} else {
			for s := lo; s < hi; s++ {
				vals[s-lo] = e.dev.Counter(s)
			}
		}
		for s := lo; s < hi; s++ {
			if !a.inUse(s) && vals[s-lo] != 0 {
				n++
				if len(first) < 8 {
					first = append(first, s)
				}
			}
		}
	}
	return n, first
}
