package kerninstd

import (
	"time"

	"github.com/kinst/kinst/metrics"
)

// Clock is the daemon's time: when sessions are created and sampled, and
// the rate of the timers' TSC ticks. The default is the system's; tests
// of the reports pass one they advance by hand.
type Clock interface {
	Now() time.Time
	// NewTicker ticks every d until stop is called.
	NewTicker(d time.Duration) (c <-chan time.Time, stop func())
	// Nanos converts TSC ticks to nanoseconds.
	Nanos(ticks uint64) float64
}

// systemClock is wall time and the calibrated TSC.
type systemClock struct{ tsc *metrics.Clock }

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

func (c systemClock) Nanos(ticks uint64) float64 { return c.tsc.Nanos(ticks) }
