package springboard

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
)

// SlotLen is the size of a springboard slot: one jmp rel32 to a patch.
const SlotLen = JmpRel32Len

// JmpRel8Len is the length of the jmp rel8 a springboard splice writes.
const JmpRel8Len = 2

// Range is [Start, End) of kernel text.
type Range struct{ Start, End uint64 }

func (r Range) Len() uint64 { return r.End - r.Start }

// Reach is where a slot may start for a jmp rel8 at addr: the rel8 counts
// from the end of the 2-byte jump, so [addr+2-128, addr+2+127].
func Reach(addr uint64) (lo, hi uint64) {
	return addr + JmpRel8Len - 128, addr + JmpRel8Len + 127
}

// JmpRel8 encodes "jmp rel8" at from, jumping to to.
func JmpRel8(from, to uint64) ([]byte, error) {
	d := int64(to - (from + JmpRel8Len))
	if d < -128 || d > 127 {
		return nil, fmt.Errorf("%#x is out of rel8 reach of %#x", to, from)
	}
	return []byte{0xeb, byte(int8(d))}, nil
}

// ErrNoSlot: no free springboard slot lies within rel8 reach.
var ErrNoSlot = errors.New("no free springboard slot within rel8 reach")

// Heap is the springboard space: runs of kernel text the analysis proves
// are never executed (padding after unconditional transfers), from which
// 5-byte slots are handed out to short instructions within rel8 reach.
//
// A slot given back with Release must no longer be reachable by any task:
// the caller releases it only after the splice that jumped to it and the
// slot's own bytes were restored and an RCU-tasks grace period passed (the
// driver waits for one when the patch is freed), since a task preempted on
// the slot's jmp would otherwise resume into a reused slot.
type Heap struct {
	mu   sync.Mutex      // protects the fields below
	runs []Range         // sorted by Start, disjoint
	used map[uint64]bool // slot start → allocated
	seen map[uint64]bool // functions whose runs were added (by address)
	// adding: functions AddFunction is adding, each with a channel
	// closed once its runs are in (and it is seen).
	adding map[uint64]chan struct{}
}

// NewHeap returns an empty heap.
func NewHeap() *Heap {
	return &Heap{used: make(map[uint64]bool), seen: make(map[uint64]bool), adding: make(map[uint64]chan struct{})}
}

// Seen reports whether the runs of the function at fn were added
// (AddFunction).
func (h *Heap) Seen(fn uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[fn]
}

// AddFunction adds the runs space gives for the function at fn, once:
// fn is seen only with its runs in. A caller that finds fn added returns
// at once; one that comes while another goroutine adds fn waits for that
// add, so a Find or Reserve made after AddFunction returns sees fn's
// runs. Functions are added beside each other. (Seen then Add let a
// concurrent planner, finding fn seen but its runs not yet there,
// reserve padding for a covering run that a springboard slot was later
// handed out inside: two splices over the same bytes.)
func (h *Heap) AddFunction(fn uint64, space func() []Range) {
	h.mu.Lock()
	if h.seen[fn] {
		h.mu.Unlock()
		return
	}
	if done, ok := h.adding[fn]; ok {
		h.mu.Unlock()
		<-done
		return
	}
	done := make(chan struct{})
	h.adding[fn] = done
	h.mu.Unlock()
	runs := space()
	h.mu.Lock()
	h.add(runs)
	h.seen[fn] = true
	delete(h.adding, fn)
	h.mu.Unlock()
	close(done)
}

// Add puts runs into the heap; parts overlapping runs already there are
// dropped, runs shorter than a slot are ignored.
func (h *Heap) Add(runs ...Range) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.add(runs)
}

// add is Add with h.mu held.
func (h *Heap) add(runs []Range) {
	for _, r := range runs {
		if r.End < r.Start+SlotLen {
			continue
		}
		i := sort.Search(len(h.runs), func(i int) bool { return h.runs[i].End > r.Start })
		if i < len(h.runs) && h.runs[i].Start < r.End {
			continue // overlaps: the same run added twice
		}
		h.runs = append(h.runs, Range{})
		copy(h.runs[i+1:], h.runs[i:])
		h.runs[i] = r
	}
}

// Runs returns a copy of the heap's runs.
func (h *Heap) Runs() []Range {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Range(nil), h.runs...)
}

// Find returns a free slot within rel8 reach of a jmp at addr without
// taking it.
func (h *Heap) Find(addr uint64) (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.find(addr)
}

// Alloc takes a free slot within rel8 reach of a jmp at addr.
func (h *Heap) Alloc(addr uint64) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.find(addr)
	if !ok {
		return 0, fmt.Errorf("%w of %#x", ErrNoSlot, addr)
	}
	h.used[s] = true
	return s, nil
}

// Release returns a slot (see Heap for when that is allowed).
func (h *Heap) Release(slot uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.used, slot)
}

// InUse is the number of slots allocated.
func (h *Heap) InUse() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.used)
}

// find picks the free slot nearest the start of reach: the lowest address
// T in [lo, hi] with [T, T+5) inside a run and clear of used slots.
func (h *Heap) find(addr uint64) (uint64, bool) {
	lo, hi := Reach(addr)
	i := sort.Search(len(h.runs), func(i int) bool { return h.runs[i].End > lo })
	for ; i < len(h.runs) && h.runs[i].Start <= hi; i++ {
		r := h.runs[i]
		for t := max(r.Start, lo); t <= hi && t+SlotLen <= r.End; t++ {
			if u, ok := h.overlapping(t); ok {
				t = u + SlotLen - 1 // continue after the used slot
				continue
			}
			return t, true
		}
	}
	return 0, false
}

// overlapping returns a used slot overlapping [t, t+5).
func (h *Heap) overlapping(t uint64) (uint64, bool) {
	for u := t - SlotLen + 1; u != t+SlotLen; u++ {
		if h.used[u] {
			return u, true
		}
	}
	return 0, false
}

// Census is the springboard space of a set of runs and how many short
// instructions can reach it (in `kinst cfg --stats --json`).
type Census struct {
	Runs     int    `json:"runs"`      // padding runs of at least one slot
	Bytes    uint64 `json:"bytes"`     // bytes in those runs
	Slots    int    `json:"slots"`     // disjoint 5-byte slots they hold
	Short    int    `json:"short"`     // 2–4-byte instructions counted
	InReach  int    `json:"in_reach"`  // of those, with a slot within rel8 reach
	Assigned int    `json:"assigned"`  // given a slot each at once, greedily in address order
	Trap     int    `json:"trap"`      // Short - InReach: no slot in reach
	Covering int    `json:"covering"`  // of Short, those a covering splice can take
	TrapOnly int    `json:"trap_only"` // of Short, neither in reach of a slot nor coverable
}

// TakeCensus counts, over runs (sorted, disjoint) and the addresses of
// short instructions, the space and reach of springboards; covering
// (sorted) are the short instructions a covering splice can take.
func TakeCensus(runs []Range, shorts, covering []uint64) Census {
	var c Census
	for _, r := range runs {
		if r.Len() >= SlotLen {
			c.Runs++
			c.Bytes += r.Len()
			c.Slots += int(r.Len() / SlotLen)
		}
	}
	h := NewHeap()
	h.Add(runs...)
	c.Short = len(shorts)
	for _, a := range shorts {
		k := sort.Search(len(covering), func(k int) bool { return covering[k] >= a })
		cover := k < len(covering) && covering[k] == a
		if cover {
			c.Covering++
		}
		if !inReach(runs, a) {
			c.Trap++
			if !cover {
				c.TrapOnly++
			}
			continue
		}
		c.InReach++
		if s, ok := h.find(a); ok { // Alloc without its error for the many that find none
			h.used[s] = true
			c.Assigned++
		}
	}
	return c
}

// inReach: some run holds a whole slot within rel8 reach of a jmp at a.
func inReach(runs []Range, a uint64) bool {
	lo, hi := Reach(a)
	i := sort.Search(len(runs), func(i int) bool { return runs[i].End > lo })
	for ; i < len(runs) && runs[i].Start <= hi; i++ {
		if t := max(runs[i].Start, lo); t <= hi && t+SlotLen <= runs[i].End {
			return true
		}
	}
	return false
}

// Forget drops the runs, and the record of functions seen, in [lo, hi):
// text that went (a module unloaded), where other code may come. Slots
// in use there stay allocated until released.
func (h *Heap) Forget(lo, hi uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	kept := h.runs[:0]
	for _, r := range h.runs {
		if r.End <= lo || r.Start >= hi {
			kept = append(kept, r)
		}
	}
	clear(h.runs[len(kept):])
	h.runs = kept
	for fn := range h.seen {
		if fn >= lo && fn < hi {
			delete(h.seen, fn)
		}
	}
}

// Reserve reports whether no slot in use overlaps r; with take it also
// drops r from the runs, so that no slot is handed out there again (the
// bytes go to a covering splice's jmp, Func.CoverRun's run into padding).
// The runs on either side stay.
func (h *Heap) Reserve(r Range, take bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for u := r.Start - SlotLen + 1; u < r.End; u++ {
		if h.used[u] {
			return false
		}
	}
	if !take {
		return true
	}
	i := sort.Search(len(h.runs), func(i int) bool { return h.runs[i].End > r.Start })
	j := i
	for j < len(h.runs) && h.runs[j].Start < r.End {
		j++
	}
	if i == j {
		return true
	}
	var cut []Range // what is left of the first and last runs met
	if h.runs[i].Start < r.Start {
		cut = append(cut, Range{h.runs[i].Start, r.Start})
	}
	if r.End < h.runs[j-1].End {
		cut = append(cut, Range{r.End, h.runs[j-1].End})
	}
	h.runs = slices.Replace(h.runs, i, j, cut...)
	return true
}
