package metrics

import (
	"sync"
	"time"
)

// rdtsc reads the time-stamp counter, the clock the timer primitives use
// in the kernel (user space may read it: CR4.TSD is clear on Linux).
func rdtsc() uint64

// TSC reads the time-stamp counter.
func TSC() uint64 { return rdtsc() }

// Clock converts TSC ticks to time. The rate is calibrated against
// CLOCK_MONOTONIC over the clock's whole life, so it sharpens as it
// ages; the first conversion waits until at least MinCalibration has
// passed. Linux runs kernels only on CPUs whose TSC is invariant
// (constant_tsc, nonstop_tsc) when it uses the TSC as a clocksource; under
// emulation (QEMU TCG) the TSC follows the host's clock. Safe for
// concurrent use.
type Clock struct {
	mu    sync.Mutex // protects the fields below
	tsc0  uint64
	t0    time.Time
	rate  float64 // ticks per nanosecond, once calibrated
	rateT time.Time
}

// MinCalibration is how long a Clock watches the TSC before it converts.
const MinCalibration = 200 * time.Millisecond

// NewClock starts calibrating.
func NewClock() *Clock { return &Clock{tsc0: rdtsc(), t0: time.Now()} }

// TicksPerNS is the TSC rate in ticks per nanosecond.
func (c *Clock) TicksPerNS() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rate != 0 && time.Since(c.rateT) < time.Second {
		return c.rate
	}
	if d := MinCalibration - time.Since(c.t0); d > 0 {
		time.Sleep(d)
	}
	tsc, now := rdtsc(), time.Now()
	c.rate = float64(tsc-c.tsc0) / float64(now.Sub(c.t0).Nanoseconds())
	c.rateT = now
	return c.rate
}

// Nanos converts ticks to nanoseconds.
func (c *Clock) Nanos(ticks uint64) float64 { return float64(ticks) / c.TicksPerNS() }
