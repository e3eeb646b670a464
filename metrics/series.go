package metrics

import "time"

// Point is the totals of one timed function at one instant, since it was
// attached.
type Point struct {
	Time      time.Time `json:"time"`
	Calls     uint64    `json:"calls"`
	WallNS    float64   `json:"wall_ns"`    // thread-time inside (Σ wall time of every call)
	VirtualNS float64   `json:"virtual_ns"` // the part of it on a CPU; 0 when not measured
	Inside    int       `json:"inside"`     // threads inside at Time
}

// Rates are the derived metrics of one interval between two Points.
type Rates struct {
	Seconds      float64 `json:"seconds"`
	CallsPerSec  float64 `json:"calls_per_sec"`
	AvgWallNS    float64 `json:"avg_wall_ns"`    // per call made in the interval
	AvgVirtualNS float64 `json:"avg_virtual_ns"` // per call made in the interval
	// Concurrency is the average number of threads inside (KernInst's
	// AOT); for a lock's slow path, the average number of waiters.
	Concurrency float64 `json:"concurrency"`
}

// Derive computes the rates between a and a later b. Averages per call
// are taken over the calls that started in the interval, as KernInst's
// timers do: a call spanning the boundary counts in both intervals' time
// but only in one's calls, which evens out over intervals.
func Derive(a, b Point) Rates {
	r := Rates{Seconds: b.Time.Sub(a.Time).Seconds()}
	if r.Seconds <= 0 {
		return r
	}
	calls := float64(b.Calls - a.Calls)
	// Totals are ticks converted at the clock's current rate, which
	// sharpens over time: a difference may come out a hair below zero.
	wall := max(b.WallNS-a.WallNS, 0)
	r.CallsPerSec = calls / r.Seconds
	r.Concurrency = wall / (r.Seconds * 1e9)
	if calls > 0 {
		r.AvgWallNS = wall / calls
		r.AvgVirtualNS = max(b.VirtualNS-a.VirtualNS, 0) / calls
	}
	return r
}

// Series is a bounded history of Points, oldest first.
type Series struct {
	Name   string  `json:"name"`
	Points []Point `json:"points"`
	Max    int     `json:"-"` // keep at most this many (0: unbounded)
}

// Add appends p, dropping the oldest point beyond Max.
func (s *Series) Add(p Point) {
	s.Points = append(s.Points, p)
	if s.Max > 0 && len(s.Points) > s.Max {
		s.Points = append(s.Points[:0], s.Points[len(s.Points)-s.Max:]...)
	}
}

// Rates derives every interval of the series.
func (s *Series) Rates() []Rates {
	var out []Rates
	for i := 1; i < len(s.Points); i++ {
		out = append(out, Derive(s.Points[i-1], s.Points[i]))
	}
	return out
}

// Total derives the rates over the whole series.
func (s *Series) Total() Rates {
	if len(s.Points) < 2 {
		return Rates{}
	}
	return Derive(s.Points[0], s.Points[len(s.Points)-1])
}
