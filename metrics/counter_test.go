package metrics

import (
	"testing"
	"time"
)

type fakeHeap []uint64

func (h fakeHeap) Counter(slot int) uint64 { return h[slot] }

func TestCounterSet(t *testing.T) {
	h := fakeHeap{100, 7, 0}
	s := NewCounterSet(h, []int{0, 2})
	h[0], h[2] = 150, 3
	got := s.Sample(time.Unix(1, 0))
	if got.Totals[0] != 50 || got.Totals[1] != 3 || got.Deltas[0] != 50 || got.Deltas[1] != 3 {
		t.Fatalf("first sample = %+v", got)
	}
	h[0] = 160
	got = s.Sample(time.Unix(2, 0))
	if got.Totals[0] != 60 || got.Deltas[0] != 10 || got.Deltas[1] != 0 || got.Totals[1] != 3 {
		t.Fatalf("second sample = %+v", got)
	}
}
