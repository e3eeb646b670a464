package engine

import "time"

// reclaimDelay is how long retired patches wait to be freed in one batch:
// each free waits for an RCU-tasks grace period (tens of milliseconds),
// but one wait covers every patch and slot retired before it.
const reclaimDelay = 50 * time.Millisecond

// retired is a patch (and a springboard slot) no splice leads to any more
// but that a preempted task may still be running in; hooks are those of
// the request whose change retired it.
type retired struct {
	patch, slot uint64
	slotFor     uint64 // the instruction whose jmp rel8 led to slot
	hooks       Hooks
	counters    []int // counter slots a removed request's patch wrote
}

// maxRetired bounds the retired queue: a removal of a whole-kernel
// coverage session retires a patch and a counter slot per probe, half a
// million of each, and the timed reclaim cannot run until it returns (it
// holds e.mu); past the bound the queue is reclaimed at once.
const maxRetired = 1 << 15

// retire queues a replaced or removed patch and slot (which the jmp rel8
// at slotFor led to) for reclaim. The caller holds e.mu.
func (e *Engine) retire(patch, slot, slotFor uint64, h Hooks) {
	if patch == 0 && slot == 0 {
		return
	}
	e.retired = append(e.retired, retired{patch: patch, slot: slot, slotFor: slotFor, hooks: h})
	e.armReclaim()
	e.reclaimIfLong()
}

// reclaimIfLong reclaims now once the queue reaches maxRetired. The
// caller holds e.mu.
func (e *Engine) reclaimIfLong() {
	if len(e.retired) >= maxRetired {
		e.reclaimLocked()
	}
}

// retireCounters queues a removed request's counter slots: they are
// free for another request only after the grace period that frees the
// patch that wrote them (a late write would land in the new owner's
// count or flag). The caller holds e.mu and has retired the patch.
func (e *Engine) retireCounters(slots []int) {
	if len(slots) == 0 {
		return
	}
	e.retired = append(e.retired, retired{counters: slots})
	e.armReclaim()
	e.reclaimIfLong()
}

// retiredCounters reports whether counter slots wait for reclaim. The
// caller holds e.mu.
func (e *Engine) retiredCounters() bool {
	for _, r := range e.retired {
		if r.counters != nil {
			return true
		}
	}
	return false
}

// armReclaim schedules a reclaim of retired. The caller holds e.mu.
func (e *Engine) armReclaim() {
	if !e.reclaimArmed {
		e.reclaimArmed = true
		time.AfterFunc(reclaimDelay, e.Reclaim)
	}
}

// takeSlot takes a springboard slot within rel8 reach of the instruction
// at addr: the one a removed springboard splice of that same instruction
// left waiting for reclaim, if there is one, else a free one from the
// heap. Taking back its own slot before the grace period is safe: a task
// stopped on the slot's jmp came from this instruction, and the slot
// rewritten sends it to the instruction's new patch, which runs the
// instruction as the old one did (another instruction's patch would not).
// reused says which it was. The caller holds e.mu.
func (e *Engine) takeSlot(addr uint64) (slot uint64, reused bool, err error) {
	if r := e.retiredSlot(addr); r != nil {
		slot, r.slot = r.slot, 0
		return slot, true, nil
	}
	slot, err = e.spring.Alloc(addr)
	return slot, false, err
}

// retiredSlot is the retired entry whose slot a jmp at addr led to and
// that still holds it, or nil. The caller holds e.mu.
func (e *Engine) retiredSlot(addr uint64) *retired {
	for i := range e.retired {
		if r := &e.retired[i]; r.slot != 0 && r.slotFor == addr {
			return r
		}
	}
	return nil
}

// Reclaim frees every retired patch and returns the slots now, rather
// than after the batching delay.
func (e *Engine) Reclaim() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reclaimLocked()
}

// reclaimLocked frees every retired patch and returns the slots. The
// driver's first free waits for RCU-tasks (a splice was removed or
// re-pointed since the last wait), which covers every retirement before
// it: only then do the slots go back to the heap. The caller holds e.mu.
func (e *Engine) reclaimLocked() {
	e.reclaimArmed = false
	// Kept entries move down in place: the queue refills to maxRetired
	// many times over while a whole-kernel session is removed.
	kept := e.retired[:0]
	// The patches first, in as few driver calls as the device allows;
	// one wait for RCU-tasks (at the first free) covers every entry.
	freed := e.freeRetired()
	waited := false // a patch was freed this round: the driver waited for RCU-tasks
	for _, ok := range freed {
		waited = waited || ok
	}
	var counters []int
	for i, r := range e.retired {
		if r.counters != nil {
			// Retired after their patch, which an earlier round or this
			// one freed; without a free this round there has been no
			// wait since: keep them for the next.
			if !waited {
				kept = append(kept, r)
				continue
			}
			counters = append(counters, r.counters...)
			continue
		}
		if r.patch != 0 && !freed[i] {
			kept = append(kept, r)
			continue
		}
		if r.slot != 0 {
			e.spring.Release(r.slot)
		}
	}
	clear(e.retired[len(kept):])
	e.retired = kept
	// The slots go back zeroed, so that one found written when handed
	// out again is known to be a stale write (takeCounter).
	if err := e.clearRuns(counters); err != nil {
		e.log.Warn("retired counter slots not cleared", "slots", len(counters), "err", err)
	}
	for _, sl := range counters {
		e.slots.free(sl)
	}
}

// freeMany is a device that frees many patches in one call
// (driver.Device); others free them one at a time.
type freeMany interface {
	PatchFreeMany(addrs []uint64) []error
}

// freeRetired frees the patch of every retired entry that has one;
// freed[i] reports whether e.retired[i]'s was. Entries whose request
// has hooks are freed alone, timed. The caller holds e.mu.
func (e *Engine) freeRetired() (freed []bool) {
	freed = make([]bool, len(e.retired))
	fm, many := e.dev.(freeMany)
	var batch []uint64
	var at []int
	for i, r := range e.retired {
		if r.patch == 0 {
			continue
		}
		if !many || r.hooks != nil {
			err := timed(r.hooks, StepFree, func() error { return e.freePatch(r.patch) })
			e.noteFree(r.patch, err)
			freed[i] = err == nil
			continue
		}
		batch, at = append(batch, r.patch), append(at, i)
	}
	if len(batch) > 0 {
		for j, err := range fm.PatchFreeMany(batch) {
			e.noteFree(batch[j], err)
			freed[at[j]] = err == nil
		}
	}
	return freed
}

// noteFree logs a retired patch that could not be freed (it is kept for
// the next round).
func (e *Engine) noteFree(patch uint64, err error) {
	if err != nil {
		e.log.Error("free retired patch", "patch", hex(patch), "err", err)
	}
}

// retireRequest retires a removed request's counter slots, first taking
// its count for RemoveCounted. The caller holds e.mu.
func (e *Engine) retireRequest(r *Request) {
	if slots := r.Slots(); e.finals != nil && len(slots) > 0 {
		e.finals[r] = e.dev.Counter(slots[0])
	}
	e.retireCounters(r.Slots())
}
