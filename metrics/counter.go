// Package metrics turns the raw slots of the counter heap into what users
// read: totals since a probe was attached and per-interval deltas. Patches
// only ever increment their slot; every derived figure is computed here,
// in user space.
package metrics

import "time"

// CounterSource is the counter heap as seen from user space (the driver's
// read-only mmap). Counter must be an atomic 64-bit load.
type CounterSource interface {
	Counter(slot int) uint64
}

// Sample is one reading of a set of counters.
type Sample struct {
	Time   time.Time `json:"time"`
	Totals []uint64  `json:"totals"` // since the sampler was created
	Deltas []uint64  `json:"deltas"` // since the previous sample
}

// CounterSet samples a fixed set of counter slots. Slots are not assumed to
// start at zero: the first reading is the baseline.
//
// A CounterSet is not safe for concurrent use.
type CounterSet struct {
	src   CounterSource
	slots []int
	base  []uint64
	last  []uint64
}

// NewCounterSet records the current value of each slot as its baseline.
func NewCounterSet(src CounterSource, slots []int) *CounterSet {
	s := &CounterSet{src: src, slots: append([]int(nil), slots...),
		base: make([]uint64, len(slots)), last: make([]uint64, len(slots))}
	for i, slot := range slots {
		s.base[i] = src.Counter(slot)
		s.last[i] = s.base[i]
	}
	return s
}

// Sample reads every slot once.
func (s *CounterSet) Sample(now time.Time) Sample {
	out := Sample{Time: now, Totals: make([]uint64, len(s.slots)), Deltas: make([]uint64, len(s.slots))}
	for i, slot := range s.slots {
		v := s.src.Counter(slot)
		out.Totals[i] = v - s.base[i]
		out.Deltas[i] = v - s.last[i]
		s.last[i] = v
	}
	return out
}
