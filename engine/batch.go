package engine

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// AddEach installs one request of spec sp at every site, each on its own:
// errs[i] says why sites[i] got none (reqs[i] is then nil), and a failure
// changes nothing of the other sites. Once the driver says it has no
// room (ENOSPC), the remaining sites are not tried and get that error.
// The engine's lock is taken once for the batch.
//
// Sites that make a new point with a direct, trap or covering splice --
// nearly every probe of a coverage session -- have their patches written
// one by one and are then spliced together, up to the driver's BatchMax
// at a time, with one round of CPU synchronisations per batch instead of
// one per site. Others (a request joining an existing point, a
// springboard splice, which needs its slot first) go one at a time.
func (e *Engine) AddEach(sites []*splice.Site, sp Spec) (reqs []*Request, errs []error) {
	reqs, errs = make([]*Request, len(sites)), make([]error, len(sites))
	e.mu.Lock()
	defer e.mu.Unlock()
	var batch []pendingSplice
	var full error
	noRoom := func(err error) {
		if full == nil && errors.Is(err, syscall.ENOSPC) {
			// The driver's splice table (or the patch heap, or the
			// counter heap) is full: every further attempt would
			// fail the same way.
			full = err
		}
	}
	flush := func() {
		noRoom(e.spliceBatch(batch, reqs, errs))
		batch = batch[:0]
	}
	for i, s := range sites {
		pt := e.points[s.Addr()]
		if pt != nil && pt.pending {
			flush() // it joins a point of this batch: splice that first
			pt = e.points[s.Addr()]
		}
		if full != nil {
			errs[i] = fmt.Errorf("not tried: no room for an earlier probe (%w)", full)
			continue
		}
		if pt == nil {
			if pt = e.newPoint(s); pt.class != springboard.Springboard {
				p, err := e.prepare(pt, s, sp)
				if err != nil {
					errs[i] = err
					noRoom(err)
					continue
				}
				p.i = i
				if batch = append(batch, p); len(batch) == e.dev.BatchMax() {
					flush()
				}
				continue
			}
		}
		reqs[i], errs[i] = e.addLocked(s, sp)
		noRoom(errs[i])
	}
	flush()
	return reqs, errs
}

// pendingSplice is a new point of an AddEach batch: its request is made
// and its patch written, its splice not yet.
type pendingSplice struct {
	i     int // the site's index in AddEach
	pt    *point
	r     *Request
	patch uint64
}

// prepare makes the request and writes the patch of a new point, and
// enters the point as pending (a later site at one of its instructions
// must wait for the batch). The caller holds e.mu.
func (e *Engine) prepare(pt *point, s *splice.Site, sp Spec) (pendingSplice, error) {
	r, err := e.newRequest(pt, s, sp)
	if err != nil {
		return pendingSplice{}, err
	}
	patch, err := e.writePatch(pt, []*Request{r}, r.hooks)
	if err != nil {
		e.freeSlots(r)
		return pendingSplice{}, err
	}
	pt.pending = true
	for _, ps := range pt.sites() {
		e.points[ps.Addr()] = pt
	}
	return pendingSplice{pt: pt, r: r, patch: patch}, nil
}

// abandon undoes prepare.
func (e *Engine) abandon(p pendingSplice) {
	p.pt.pending = false
	for _, ps := range p.pt.sites() {
		delete(e.points, ps.Addr())
	}
	e.dropPatch(p.patch)
	e.freeSlots(p.r)
}

// spliceBatch splices the pending points of batch in one driver batch.
// An op the driver refuses fails alone and the rest is tried again; when
// the driver has no room, the ops that fit are tried again and the
// others fail, and the error is returned. The caller holds e.mu.
func (e *Engine) spliceBatch(batch []pendingSplice, reqs []*Request, errs []error) (full error) {
	live := make([]pendingSplice, 0, len(batch))
	ops := make([]driver.SpliceOp, 0, len(batch))
	fail := func(p pendingSplice, err error) {
		errs[p.i] = fmt.Errorf("splice %s: %w", p.pt.site.Where(), err)
		e.abandon(p)
	}
	for _, p := range batch {
		op, err := p.pt.spliceOp(p.patch)
		if err != nil {
			fail(p, err)
			continue
		}
		live, ops = append(live, p), append(ops, op)
	}
	for len(live) > 0 {
		addrs, origs := make([]uint64, len(ops)), make([][]byte, len(ops))
		for i, op := range ops {
			addrs[i], origs[i] = op.Addr, op.Orig
		}
		var ids []uint32
		err := e.ov.splicedMany(addrs, origs, func() (err error) {
			ids, err = e.dev.SpliceBatch(ops)
			return err
		})
		if err == nil {
			covering := 0
			for i, p := range live {
				pt := p.pt
				pt.pending = false
				pt.splice, pt.reqs, pt.patch = ids[i], []*Request{p.r}, p.patch
				reqs[p.i] = p.r
				if ops[i].Covering {
					covering++
				}
			}
			if covering > 0 {
				e.cover.kick(e.dev, e.log, covering)
			}
			return full
		}
		var be *driver.BatchError
		if !errors.As(err, &be) || be.Index >= len(live) {
			for _, p := range live {
				fail(p, err)
			}
			return full
		}
		if errors.Is(err, syscall.ENOSPC) {
			// Only the ops before be.Index fit.
			full = be.Err
			for _, p := range live[be.Index:] {
				fail(p, be.Err)
			}
			live, ops = live[:be.Index], ops[:be.Index]
			continue
		}
		fail(live[be.Index], be.Err)
		live = append(live[:be.Index], live[be.Index+1:]...)
		ops = append(ops[:be.Index], ops[be.Index+1:]...)
	}
	return full
}

// RemoveEach removes every request of rs, each as Remove does: errs[i]
// is nil when rs[i] is gone (a request that cannot be removed stays
// installed). The engine's lock is taken once, and the patches the batch
// retires are freed together after one RCU-tasks grace period (reclaim
// batches them), however many they are.
//
// A request that is its point's last, at a point with one splice (not a
// springboard splice, which is two), is unspliced together with the
// others like it, up to the driver's BatchMax at a time, in one round of
// CPU synchronisations per batch.
func (e *Engine) RemoveEach(rs []*Request) (errs []error) {
	errs = make([]error, len(rs))
	e.mu.Lock()
	defer e.mu.Unlock()
	var batch []int
	queued := map[*point]bool{}
	flush := func() {
		e.unspliceBatch(rs, batch, errs)
		batch = batch[:0]
		clear(queued)
	}
	for i, r := range rs {
		pt := r.pt
		if queued[pt] {
			flush()
		}
		if len(pt.reqs) == 1 && pt.reqs[0] == r && pt.splice != 0 && pt.slotSplice == 0 {
			queued[pt] = true
			if batch = append(batch, i); len(batch) == e.dev.BatchMax() {
				flush()
			}
			continue
		}
		errs[i] = e.removeLocked(r)
	}
	flush()
	return errs
}

// unspliceBatch unsplices the points of rs[idx...] in one driver batch
// and retires their patches and counters; an id the driver refuses fails
// alone and the rest is tried again. The caller holds e.mu.
func (e *Engine) unspliceBatch(rs []*Request, idx []int, errs []error) {
	live := append([]int(nil), idx...)
	for len(live) > 0 {
		ids, addrs := make([]uint32, len(live)), make([]uint64, len(live))
		for j, i := range live {
			ids[j], addrs[j] = rs[i].pt.splice, rs[i].pt.site.Addr()
		}
		err := e.ov.restoredMany(addrs, func() error { return e.dev.UnspliceBatch(ids) })
		if err == nil {
			for _, i := range live {
				e.retirePoint(rs[i])
			}
			return
		}
		var be *driver.BatchError
		if !errors.As(err, &be) || be.Index >= len(live) {
			for _, i := range live {
				errs[i] = fmt.Errorf("unsplice %s: %w", rs[i].site.Where(), err)
			}
			return
		}
		errs[live[be.Index]] = fmt.Errorf("unsplice %s: %w", rs[live[be.Index]].site.Where(), be.Err)
		live = append(live[:be.Index], live[be.Index+1:]...)
	}
}

// retirePoint finishes the removal of r, its point's last request, once
// the point's splice is gone: as install and removeLocked do when the
// last request goes. The caller holds e.mu.
func (e *Engine) retirePoint(r *Request) {
	pt := r.pt
	old := pt.patch
	pt.splice, pt.reqs, pt.patch = 0, nil, 0
	e.retire(old, 0, 0, r.hooks)
	e.retireCounters(r.slots)
	for _, ps := range pt.sites() {
		delete(e.points, ps.Addr())
	}
}

// Hit reports whether r's first counter slot is non-zero: for a request
// whose snippet is a codegen.HitFlag, whether its point has run since the
// request was made. A load from the counter heap; no lock.
func (e *Engine) Hit(r *Request) bool { return e.dev.Counter(r.slots[0]) != 0 }
