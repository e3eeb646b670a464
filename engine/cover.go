package engine

import (
	"log/slog"
	"sync"
)

// coverFinisher runs the driver's FinishCovering in the background after
// covering splices are armed: one grace period serves every splice armed
// before it, and neither Engine.mu nor the driver's lock is held across
// it, so requests go on meanwhile. Until then an armed splice works as a
// trap splice.
type coverFinisher struct {
	mu sync.Mutex // protects the fields below

	// +checklocks:mu
	running bool // a goroutine is finishing
	// +checklocks:mu
	arms uint64 // covering splices armed
	// +checklocks:mu
	finished uint64 // arms covered by a completed FinishCovering
	// +checklocks:mu
	jmps uint64 // jmps the driver wrote
}

// kick notes n more armed splices and starts a finisher if none runs.
func (c *coverFinisher) kick(dev Device, log *slog.Logger, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.arms += uint64(n)
	if c.running {
		return
	}
	c.running = true
	go func() {
		for {
			c.mu.Lock()
			upto := c.arms
			c.mu.Unlock()
			n, err := dev.FinishCovering()
			c.mu.Lock()
			if err != nil {
				log.Error("finish covering splices", "err", err)
			} else {
				c.finished = upto
				c.jmps += uint64(n)
			}
			if err != nil || c.arms == upto {
				c.running = false
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
		}
	}()
}

// state is how many covering splices may still be int3 only, and how
// many jmps the driver has written.
func (c *coverFinisher) state() (armed int, jmps uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.arms - c.finished), c.jmps
}
