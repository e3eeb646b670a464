package engine

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/internal/parallel"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// AddEach installs one request of spec sp at every site, each on its own:
// errs[i] says why sites[i] got none (reqs[i] is then nil), and a failure
// changes nothing of the other sites. Once the driver says it has no
// room (ENOSPC), the remaining sites are not tried and get that error.
// The engine's lock is taken once for the batch.
//
// Sites that make a new point -- nearly every probe of a coverage
// session -- have their patches built one by one, written together
// (writePatches), and are then spliced
// together, up to the driver's BatchMax at a time, with one round of CPU
// synchronisations per batch instead of one per site (two for
// springboard points: their slots, then the jmp rel8s to them). A request
// joining an existing point goes on its own.
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
	// Clocks are read per batch, not per site: under an emulator a read
	// can cost microseconds (a guest on the HPET).
	t, start, before := &e.armTimes, time.Now(), e.armTimes
	defer func() {
		flushed := t.Build + t.Write + t.Splice - before.Build - before.Write - before.Splice
		t.Prepare += time.Since(start) - flushed
	}()
	flush := func() {
		e.flushBatch(batch, reqs, errs, noRoom)
		batch = batch[:0]
	}
	for i, s := range sites {
		pt, _ := e.points.get(s.Addr())
		if pt != nil && pt.pending {
			flush() // it joins a point of this batch: splice that first
			pt, _ = e.points.get(s.Addr())
		}
		if full != nil {
			errs[i] = fmt.Errorf("not tried: no room for an earlier probe (%w)", full)
			continue
		}
		if pt == nil {
			np := e.newPoint(s)
			if np.class == springboard.Trap {
				if err := e.trapRefused(s); err != nil {
					errs[i] = err
					continue
				}
			}
			p, err := e.prepare(np, s, sp)
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
		reqs[i], errs[i] = e.addLocked(s, sp)
		noRoom(errs[i])
	}
	flush()
	return reqs, errs
}

// pendingSplice is a new point of an AddEach batch: its request is made
// and its patch written, its splice not yet.
type pendingSplice struct {
	i      int // the site's index in AddEach
	pt     *point
	r      *Request
	patch  uint64
	specs  []codegen.PatchSpec
	code   []byte // the patch, built and written with the batch's others
	slot   uint64 // a springboard point's slot, taken for the batch
	reused bool   // the slot was taken back from reclaim
}

// prepare makes the request of a new point (its patch is sized, allocated,
// built and written with the rest of the batch), and enters the point as
// pending (a later site at one of its instructions must wait for the
// batch). The caller holds e.mu.
func (e *Engine) prepare(pt *point, s *splice.Site, sp Spec) (pendingSplice, error) {
	r, err := e.newRequest(pt, s, sp)
	if err != nil {
		return pendingSplice{}, err
	}
	p := pendingSplice{pt: pt, r: r}
	if pt.class == springboard.Springboard {
		// The slot is taken now, before the patch is built: where none
		// is left the point becomes a covering splice (whose patch runs
		// the covered instructions too) or a trap splice.
		if p.slot, p.reused, err = e.takeSlot(s.Addr()); err != nil {
			switch {
			case !errors.Is(err, springboard.ErrNoSlot):
			case e.coverInstead(pt):
				err = nil
			default:
				err = e.trapInstead(pt)
			}
			if err != nil {
				e.freeSlots(r)
				return pendingSplice{}, err
			}
		}
	}
	p.specs = pt.patchSpecs([]*Request{r})
	pt.pending = true
	for _, ps := range pt.sites() {
		e.points.set(ps.Addr(), pt)
	}
	return p, nil
}

// flushBatch builds, writes and splices an AddEach batch, each site's
// answer in reqs and errs, timing the stages in e.armTimes; noRoom sees
// the errors that may say the driver is full. The caller holds e.mu.
func (e *Engine) flushBatch(batch []pendingSplice, reqs []*Request, errs []error, noRoom func(error)) {
	t := &e.armTimes
	since := func(d *time.Duration, start time.Time) time.Time {
		now := time.Now()
		*d += now.Sub(start)
		return now
	}
	t0 := time.Now()
	batch, err := e.buildBatch(batch, errs)
	noRoom(err)
	codes := make([]driver.PatchCode, len(batch))
	for j, p := range batch {
		codes[j] = driver.PatchCode{Addr: p.patch, Code: p.code}
	}
	t0 = since(&t.Build, t0)
	if err := e.writePatches(codes); err != nil {
		for _, p := range batch {
			errs[p.i] = fmt.Errorf("%s: %w", p.pt.site.Where(), err)
			e.abandon(p)
		}
		return
	}
	t0 = since(&t.Write, t0)
	noRoom(e.spliceBatch(batch, reqs, errs))
	since(&t.Splice, t0)
}

// buildBatch sizes, allocates and builds the patches of batch (sizing
// and building on every CPU: code generation and its three checks are
// most of arming's work), and returns the pending splices whose patch was
// built; the others get their error in errs and are abandoned. full is
// the error of a patch heap with no room left, if any: the allocations
// after it are not tried. Requests with hooks, which need not be safe for
// concurrent use, are sized and built one at a time. The caller holds
// e.mu.
func (e *Engine) buildBatch(batch []pendingSplice, errs []error) (kept []pendingSplice, full error) {
	hooked := false
	for _, p := range batch {
		hooked = hooked || p.r.hooks() != nil
	}
	each := func(f func(i int)) {
		if hooked {
			for i := range batch {
				f(i)
			}
		} else {
			parallel.For(len(batch), f)
		}
	}
	fail := make([]error, len(batch))
	// Sizes first (a patch's length does not depend on where in the heap
	// it lies), then the allocations in order, then the code at its
	// address. The analysis of each instruction, most of the sizing, is
	// kept with its spec for the build.
	sizes, near := make([]int, len(batch)), e.patchHeapBase()
	each(func(i int) {
		p := &batch[i]
		for j := range p.specs {
			p.specs[j].Analyze() // an error is PatchLen's to say
		}
		sizes[i], fail[i] = p.pt.patchLen(near, p.specs)
	})
	for i := range batch {
		p := &batch[i]
		if fail[i] != nil {
			continue
		}
		if full != nil {
			fail[i] = fmt.Errorf("not tried: no room for an earlier probe (%w)", full)
			continue
		}
		p.patch, fail[i] = e.allocPatchTimed(sizes[i], p.r.hooks())
		if errors.Is(fail[i], syscall.ENOSPC) {
			full = fail[i]
		}
	}
	code := make([][]byte, len(batch))
	each(func(i int) {
		if fail[i] == nil {
			p := &batch[i]
			code[i], fail[i] = p.pt.buildPatchTimed(p.patch, p.specs, p.r.hooks())
		}
	})
	kept = batch[:0]
	for i, p := range batch {
		if fail[i] != nil {
			errs[p.i] = fail[i]
			e.abandon(p)
			continue
		}
		p.code, p.specs = code[i], nil
		kept = append(kept, p)
	}
	return kept, full
}

// abandon undoes prepare (and gives back the slot, which nothing was
// written to or whose jmp is gone again).
func (e *Engine) abandon(p pendingSplice) {
	p.pt.pending = false
	e.dropPoint(p.pt)
	// The patch is freed first: the driver waits until no task can
	// still be in it, so none is left on the slot's jmp either.
	if p.patch != 0 {
		e.dropPatch(p.patch)
	}
	e.freeSlots(p.r)
	if p.slot != 0 {
		e.releaseSlot(p.slot, p.reused, p.pt.site.Addr())
	}
}

// spliceBatch splices the pending points of batch in two driver
// batches: every direct, trap and covering splice and every springboard
// slot, then the jmp rel8 of each springboard point to its slot. A point
// whose op the driver refuses fails alone (the rest of its batch is tried
// again). (A springboard point took its slot in prepare, or became a
// covering or trap splice there.) It returns the error of a driver with
// no room left, if any. The caller holds e.mu.
func (e *Engine) spliceBatch(batch []pendingSplice, reqs []*Request, errs []error) (full error) {
	fail := func(p pendingSplice, err error) {
		errs[p.i] = fmt.Errorf("splice %s: %w", p.pt.site.Where(), err)
		e.abandon(p)
	}
	first := make([]pendingSplice, 0, len(batch))
	ops := make([]driver.SpliceOp, 0, len(batch))
	for _, p := range batch {
		var op driver.SpliceOp
		var err error
		if p.slot != 0 {
			op, err = e.slotOp(p.slot, p.patch)
		} else {
			op, err = p.pt.spliceOp(p.patch)
		}
		if err != nil {
			fail(p, err)
			continue
		}
		first, ops = append(first, p), append(ops, op)
	}
	ids, ferrs, full := e.spliceEach(ops)
	var second []pendingSplice
	var slotIDs []uint32
	var jmps []driver.SpliceOp
	covering := 0
	for j, p := range first {
		if ferrs[j] != nil {
			fail(p, ferrs[j])
			continue
		}
		pt := p.pt
		if p.slot == 0 {
			pt.pending = false
			pt.splice, pt.reqs, pt.patch = ids[j], []*Request{p.r}, p.patch
			reqs[p.i] = p.r
			if ops[j].Covering {
				covering++
			}
			continue
		}
		jmp, err := pt.springboardOp(p.slot)
		if err != nil {
			e.unspliceSlot(p.slot, ids[j])
			fail(p, err)
			continue
		}
		second, slotIDs = append(second, p), append(slotIDs, ids[j])
		jmps = append(jmps, jmp)
	}
	if covering > 0 {
		e.cover.kick(e.dev, e.log, covering)
	}
	ids, serrs, full2 := e.spliceEach(jmps)
	for j, p := range second {
		if serrs[j] != nil {
			e.unspliceSlot(p.slot, slotIDs[j])
			fail(p, serrs[j])
			continue
		}
		pt := p.pt
		pt.pending = false
		pt.slot, pt.slotSplice, pt.splice = p.slot, slotIDs[j], ids[j]
		pt.reqs, pt.patch = []*Request{p.r}, p.patch
		reqs[p.i] = p.r
	}
	if full == nil {
		full = full2
	}
	return full
}

// spliceEach runs ops through the driver in batches (inBatches) and
// returns each op's id or error, and the error of a driver with no room
// left, if any. The caller holds e.mu.
func (e *Engine) spliceEach(ops []driver.SpliceOp) (ids []uint32, errs []error, full error) {
	ids, errs = make([]uint32, len(ops)), make([]error, len(ops))
	full = e.inBatches(len(ops), errs, func(live []int) error {
		batch := make([]driver.SpliceOp, len(live))
		addrs, origs := make([]uint64, len(live)), make([][]byte, len(live))
		for j, i := range live {
			batch[j], addrs[j], origs[j] = ops[i], ops[i].Addr, overlayOrig(ops[i])
		}
		return e.ov.splicedMany(addrs, origs, func() error {
			t0 := time.Now()
			got, err := e.dev.SpliceBatch(batch)
			e.armTimes.Driver += time.Since(t0)
			for j, i := range live[:len(got)] {
				ids[i] = got[j]
			}
			return err
		})
	})
	return ids, errs, full
}

// inBatches runs n driver ops BatchMax at a time: try(live) does the ops
// whose indices are live as one all-or-none batch. An op the driver
// refuses (a *driver.BatchError naming it) gets that error in errs and
// the rest of its batch is tried again; when the driver has no room
// (ENOSPC), the ops that fit are tried again, the others fail, and the
// error is returned. Any other error fails the whole batch.
func (e *Engine) inBatches(n int, errs []error, try func(live []int) error) (full error) {
	max := max(e.dev.BatchMax(), 1)
	for lo := 0; lo < n; lo += max {
		live := make([]int, 0, max)
		for i := lo; i < min(lo+max, n); i++ {
			live = append(live, i)
		}
		for len(live) > 0 {
			err := try(live)
			if err == nil {
				break
			}
			var be *driver.BatchError
			if !errors.As(err, &be) || be.Index >= len(live) {
				for _, i := range live {
					errs[i] = err
				}
				break
			}
			if errors.Is(err, syscall.ENOSPC) {
				full = be.Err
				for _, i := range live[be.Index:] {
					errs[i] = be.Err
				}
				live = live[:be.Index]
				continue
			}
			refused := map[int]bool{be.Index: true}
			errs[live[be.Index]] = be.Err
			for _, o := range be.Also {
				if o.Index >= 0 && o.Index < len(live) {
					refused[o.Index] = true
					errs[live[o.Index]] = o.Err
				}
			}
			kept := live[:0]
			for j, i := range live {
				if !refused[j] {
					kept = append(kept, i)
				}
			}
			live = kept
		}
	}
	return full
}

// RemoveEach removes every request of rs, each as Remove does: errs[i]
// is nil when rs[i] is gone (a request that cannot be removed stays
// installed). The engine's lock is taken once, and the patches the batch
// retires are freed together after one RCU-tasks grace period (reclaim
// batches them), however many they are.
//
// A request that is its point's last is unspliced together with the
// others like it, up to the driver's BatchMax at a time, in one round of
// CPU synchronisations per batch (two for springboard points: the jmp
// rel8s, then their slots).
func (e *Engine) RemoveEach(rs []*Request) (errs []error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.removeEachLocked(rs)
}

// RemoveCounted is RemoveEach that also returns each removed request's
// count (its first counter slot), read once no patch of the request can
// be entered any more and before the slot is retired: the final count,
// every hit in it. A count read before the removal misses the hits
// between the reading and the splice going, so two points of one
// straight-line path, read one after the other, could disagree.
// counts[i] is 0 where errs[i] is not nil.
func (e *Engine) RemoveCounted(rs []*Request) (errs []error, counts []uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.finals = make(map[*Request]uint64, len(rs))
	errs = e.removeEachLocked(rs)
	counts = make([]uint64, len(rs))
	for i, r := range rs {
		counts[i] = e.finals[r]
	}
	e.finals = nil
	return errs, counts
}

// removeEachLocked is RemoveEach; the caller holds e.mu.
func (e *Engine) removeEachLocked(rs []*Request) (errs []error) {
	errs = make([]error, len(rs))
	var last []int
	queued := map[*point]bool{}
	flush := func() {
		e.unspliceBatch(rs, last, errs)
		last = last[:0]
		clear(queued)
	}
	// A flush at every removeChunk keeps queued and last small: a
	// whole-kernel session's were 27 MB at the moment its removal began,
	// kerninstd's peak. A chunk of several driver batches costs at most
	// one round more (its springboard slots) than one flush at the end.
	chunk := removeChunk * max(e.dev.BatchMax(), 1)
	for i, r := range rs {
		pt := r.pt
		if queued[pt] || len(last) >= chunk {
			flush()
		}
		if len(pt.reqs) == 1 && pt.reqs[0] == r && pt.splice != 0 {
			queued[pt] = true
			last = append(last, i)
			continue
		}
		errs[i] = e.removeLocked(r)
	}
	flush()
	return errs
}

// removeChunk is how many driver batches RemoveEach unsplices per flush
// (a variable for tests).
var removeChunk = 8

// unspliceBatch unsplices the points of rs[idx...] (each its point's
// last request) and retires their patches, slots and counters; a point
// the driver refuses fails alone. The caller holds e.mu.
func (e *Engine) unspliceBatch(rs []*Request, idx []int, errs []error) {
	fail := func(i int, err error) { errs[i] = fmt.Errorf("unsplice %s: %w", rs[i].Site().Where(), err) }
	ids, addrs := make([]uint32, len(idx)), make([]uint64, len(idx))
	for j, i := range idx {
		ids[j], addrs[j] = rs[i].pt.splice, rs[i].pt.site.Addr()
	}
	var slotted []int
	var slotIDs []uint32
	var slotAddrs []uint64
	for j, err := range e.unspliceEach(ids, addrs) {
		i := idx[j]
		if err = e.goneIsRemoved(err, addrs[j]); err != nil {
			fail(i, err)
			continue
		}
		pt := rs[i].pt
		pt.splice = 0
		if pt.slotSplice == 0 {
			e.retirePoint(rs[i])
			continue
		}
		slotted, slotIDs, slotAddrs = append(slotted, i), append(slotIDs, pt.slotSplice), append(slotAddrs, pt.slot)
	}
	for j, err := range e.unspliceEach(slotIDs, slotAddrs) {
		i := slotted[j]
		if err = e.goneIsRemoved(err, slotAddrs[j]); err != nil {
			// The jmp rel8 is gone, the slot not: a later Remove
			// takes the slot out (see unsplice).
			fail(i, fmt.Errorf("springboard %#x: %w", rs[i].pt.slot, err))
			continue
		}
		rs[i].pt.slotSplice = 0
		e.retirePoint(rs[i])
	}
}

// unspliceEach unsplices ids (spliced at addrs) through the driver in
// batches (inBatches) and returns each one's error. The caller holds
// e.mu.
func (e *Engine) unspliceEach(ids []uint32, addrs []uint64) []error {
	errs := make([]error, len(ids))
	e.inBatches(len(ids), errs, func(live []int) error {
		bids, baddrs := make([]uint32, len(live)), make([]uint64, len(live))
		for j, i := range live {
			bids[j], baddrs[j] = ids[i], addrs[i]
		}
		return e.ov.restoredMany(baddrs, func() error { return e.dev.UnspliceBatch(bids) })
	})
	return errs
}

// retirePoint finishes the removal of r, its point's last request, once
// the point's splices are gone: as install and removeLocked do when the
// last request goes. The caller holds e.mu.
func (e *Engine) retirePoint(r *Request) {
	pt := r.pt
	old := pt.patch
	pt.reqs, pt.patch = nil, 0
	e.retire(old, pt.slot, pt.site.Addr(), r.hooks())
	pt.slot = 0
	e.retireRequest(r)
	e.dropPoint(pt)
}

// Hit reports whether r's first counter slot is non-zero: for a request
// whose snippet is a codegen.HitFlag, whether its point has run since the
// request was made. A load from the counter heap; no lock.
func (e *Engine) Hit(r *Request) bool { return e.dev.Counter(r.Slots()[0]) != 0 }

// goneIsRemoved is err, or nil when err says the driver has no such
// splice any more: it put the bytes back itself when the module whose text
// held the splice was unloaded (its ids become unknown, ENOENT), so the
// splice is as removed as an unsplice would leave it, and addr's original
// bytes are forgotten. A coverage session over a module that is unloaded
// meanwhile then ends with its report, not an error per probe. The caller
// holds e.mu.
func (e *Engine) goneIsRemoved(err error, addr uint64) error {
	if goneOK(err) != nil || err == nil {
		return err
	}
	e.log.Debug("splice already removed by the driver (its module was unloaded)", "at", hex(addr))
	e.ov.forget(addr)
	return nil
}
