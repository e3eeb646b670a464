package metrics

// A timer word is what the codegen enter/exit primitives keep for one
// timed region (see codegen.Probe): W = S·2^16 + c, with c the threads
// inside (low 16 bits) and S = Σ exit TSC − Σ entry TSC (mod 2^48). Its
// integral S + c·t is the total thread-time spent inside up to TSC t: the
// sum of the wall time of every call, finished or not. Differences of it
// over an interval give the average concurrency (Little's law: threads
// inside = arrival rate × time inside) and, divided by the calls made,
// the average latency.

const (
	timerCountBits = 16
	timerSumBits   = 64 - timerCountBits
	timerSumMask   = 1<<timerSumBits - 1
)

// TimerInside is the number of threads inside the region now.
func TimerInside(w uint64) int { return int(w & (1<<timerCountBits - 1)) }

// TimerIntegral is the region's thread-time in TSC ticks at TSC tsc,
// modulo 2^48: only differences of two readings mean anything.
func TimerIntegral(w, tsc uint64) uint64 {
	s := w >> timerCountBits
	c := w & (1<<timerCountBits - 1)
	return (s + c*tsc) & timerSumMask
}

// TimerDelta is the thread-time between two integrals, in ticks.
func TimerDelta(from, to uint64) uint64 { return (to - from) & timerSumMask }

// TimerAcc turns successive readings of a timer word into a running
// 64-bit total of thread-time. Read the word first and the TSC after it:
// every event in the word then happened before the TSC reading. A reading
// that goes back a little (an entry's TSC on another CPU just ahead of
// ours) is ignored until time catches up. Not safe for concurrent use.
type TimerAcc struct {
	prev  uint64 // integral at the last reading, mod 2^48
	Ticks uint64 // thread-time since the accumulator started
}

// Add takes a reading of word w at TSC tsc and returns the total.
func (a *TimerAcc) Add(w, tsc uint64) uint64 {
	cur := TimerIntegral(w, tsc)
	d := TimerDelta(a.prev, cur)
	if d >= 1<<(timerSumBits-1) { // negative: a reading slightly behind
		return a.Ticks
	}
	a.Ticks += d
	a.prev = cur
	return a.Ticks
}
