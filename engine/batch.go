package engine

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/kinst/kinst/splice"
)

// AddEach installs one request of spec sp at every site, each on its own:
// errs[i] says why sites[i] got none (reqs[i] is then nil), and a failure
// changes nothing of the other sites. Once the driver says it has no
// room (ENOSPC), the remaining sites are not tried and get that error.
// The engine's lock is taken once for the batch. Coverage arms a probe per basic block this way.
func (e *Engine) AddEach(sites []*splice.Site, sp Spec) (reqs []*Request, errs []error) {
	reqs, errs = make([]*Request, len(sites)), make([]error, len(sites))
	e.mu.Lock()
	defer e.mu.Unlock()
	var full error
	for i, s := range sites {
		if full != nil {
			errs[i] = fmt.Errorf("not tried: no room for an earlier probe (%w)", full)
			continue
		}
		reqs[i], errs[i] = e.addLocked(s, sp)
		if errors.Is(errs[i], syscall.ENOSPC) {
			// The driver's splice table (or the patch heap) is full:
			// every further attempt would fail the same way, each
			// after a patch written and freed.
			full = errs[i]
		}
	}
	return reqs, errs
}

// RemoveEach removes every request of rs, each as Remove does: errs[i]
// is nil when rs[i] is gone (a request that cannot be removed stays
// installed). The engine's lock is taken once, and the patches the batch
// retires are freed together after one RCU-tasks grace period (reclaim
// batches them), however many they are.
func (e *Engine) RemoveEach(rs []*Request) (errs []error) {
	errs = make([]error, len(rs))
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, r := range rs {
		errs[i] = e.removeLocked(r)
	}
	return errs
}

// Hit reports whether r's first counter slot is non-zero: for a request
// whose snippet is a codegen.HitFlag, whether its point has run since the
// request was made. A load from the counter heap; no lock.
func (e *Engine) Hit(r *Request) bool { return e.dev.Counter(r.slots[0]) != 0 }
