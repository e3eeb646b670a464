package kerninstdtest

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when Advance is called: the daemon's
// (kerninstd.Clock) and a report's (Now and After) in tests, so that what
// they print depends on nothing but the test. One TSC tick is one
// nanosecond.
type Clock struct {
	mu      sync.Mutex
	cond    *sync.Cond
	now     time.Time
	tickers map[*ticker]bool
	made    int // tickers made so far
	timers  []*timer
}

type ticker struct {
	c      chan time.Time
	next   time.Time
	period time.Duration
}

type timer struct {
	c  chan time.Time
	at time.Time
}

// Epoch is where a new Clock starts.
var Epoch = time.Date(2024, 10, 1, 12, 0, 0, 0, time.UTC)

// NewClock returns a clock at Epoch.
func NewClock() *Clock {
	c := &Clock{now: Epoch, tickers: map[*ticker]bool{}}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTicker ticks every d of the clock's time, dropping ticks the
// receiver has not taken, as time.Ticker does.
func (c *Clock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &ticker{c: make(chan time.Time, 1), next: c.now.Add(d), period: d}
	c.tickers[t] = true
	c.made++
	c.cond.Broadcast()
	return t.c, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.tickers, t)
	}
}

// After fires once the clock has advanced by d.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: make(chan time.Time, 1), at: c.now.Add(d)}
	if d <= 0 {
		t.c <- c.now
		return t.c
	}
	c.timers = append(c.timers, t)
	c.cond.Broadcast()
	return t.c
}

// Nanos converts TSC ticks: one a nanosecond.
func (c *Clock) Nanos(ticks uint64) float64 { return float64(ticks) }

// Advance moves the clock by d and fires the tickers and timers due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for t := range c.tickers {
		for !t.next.After(c.now) {
			select {
			case t.c <- t.next:
			default:
			}
			t.next = t.next.Add(t.period)
		}
	}
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.c <- t.at
	}
	c.timers = kept
}

// AwaitTickers blocks until n tickers have been made in all: a sample
// stream has started ticking.
func (c *Clock) AwaitTickers(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.made < n {
		c.cond.Wait()
	}
}

// Tickers is how many tickers have been made so far.
func (c *Clock) Tickers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.made
}

// AwaitTimer blocks until someone waits in After, and returns how long
// until the earliest of those timers fires.
func (c *Clock) AwaitTimer() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.timers) == 0 {
		c.cond.Wait()
	}
	first := c.timers[0].at
	for _, t := range c.timers[1:] {
		if t.at.Before(first) {
			first = t.at
		}
	}
	return first.Sub(c.now)
}
