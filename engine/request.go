package engine

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"unique"

	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// point is one instrumented instruction. Every request at it shares one
// patch: the requests' snippets in order, then the relocated instruction.
// Adding or removing a request builds a new patch in new memory and
// re-points the splice at it (the driver's RESPLICE: no moment where the
// point runs neither patch); the old patch is freed after the driver's
// RCU-tasks wait. site does not change; the other fields are
// protected by Engine.mu.
type point struct {
	site *splice.Site
	reqs []*Request
	// The installed patch; 0 when not spliced.
	patch uint64
	// A springboard splice's slot (a jmp rel32 to the patch, in padding)
	// and the driver's splice id of the slot.
	slot       uint64
	slotSplice uint32
	splice     uint32 // the driver's splice id at the instruction
	// redZone is codegen.PatchSpec.RedZone for its patches (the engine's).
	redZone int32
	class   springboard.Class
	// pending: an AddEach batch has written the point's patch and will
	// splice it with the rest of the batch.
	pending bool
	// gone: the driver no longer has the point's splice (it put the bytes
	// back as the module was unloaded); its requests only wait to be
	// removed (pointGone).
	gone bool
	// (Fields ordered to pack into 64 bytes: a coverage session has one
	// per probe.)
}

// covered: for a covering splice, the instructions after site that its
// jmp overwrites (site.Covered()); the patch runs each, with its own
// requests' snippets before it. Engine.points maps their addresses to
// this point too. A point is covering from newPoint on or never.
func (pt *point) covered() []*splice.Site {
	if pt.class == springboard.Cover {
		return pt.site.Covered()
	}
	return nil
}

// sites is every instruction the point's splice overwrites, in order.
func (pt *point) sites() []*splice.Site { return append([]*splice.Site{pt.site}, pt.covered()...) }

// coverBytes is the original bytes of the run a covering splice
// overwrites, as far as the jmp reaches.
func (pt *point) coverBytes() []byte {
	var b []byte
	for _, s := range pt.sites() {
		b = append(b, s.Bytes()...)
	}
	b = append(b, pt.site.Padding()...)
	return b[:springboard.JmpRel32Len]
}

// Request is one piece of instrumentation at a point, owned by a session:
// a snippet and the counter slots it writes. Its fields do not change
// once it is made.
type Request struct {
	pt *point
	// owner is interned: a session's requests share one copy (a
	// whole-kernel coverage session has half a million).
	owner   unique.Handle[string]
	snippet codegen.Snippet
	// x holds what few requests have: hooks, other than one counter
	// slot, or a site other than the point's. nil for a coverage probe
	// or a counter, which so take 48 bytes.
	x *requestExtra
	// slot0 is the counter slot, zeroed when the request was made, when x
	// is nil.
	slot0 [1]int
}

// requestExtra is a Request's hooks and counter slots, where it has
// hooks or other than one slot, and its site where that is not its
// point's.
type requestExtra struct {
	hooks Hooks
	slots []int
	// site is the instruction instrumented when it is not the point's
	// own object: one a covering splice overwrites, or the point's
	// instruction as another request resolved it (its own Point spec).
	site *splice.Site
}

// hooks are the request's hooks, nil when none.
func (r *Request) hooks() Hooks {
	if r.x != nil {
		return r.x.hooks
	}
	return nil
}

// Site is the instruction the request instruments, as the request
// resolved it.
func (r *Request) Site() *splice.Site {
	if r.x != nil && r.x.site != nil {
		return r.x.site
	}
	return r.pt.site
}

// Owner is who made the request (a session's ID).
func (r *Request) Owner() string { return r.owner.Value() }

// Slots are the request's counter slots, in the order its snippet got
// their addresses.
func (r *Request) Slots() []int {
	if r.x != nil {
		return r.x.slots
	}
	return r.slot0[:]
}

// Counter is the first counter slot: a counting request's count.
func (r *Request) Counter() int { return r.Slots()[0] }

// SnippetFunc makes a request's snippet from the kernel addresses of its
// counter slots. It must not keep the slice: the engine reuses it.
type SnippetFunc func(counters []uint64) codegen.Snippet

// CounterSnippet counts executions in the request's only slot.
func CounterSnippet(c []uint64) codegen.Snippet { return codegen.Counter{Addr: c[0]} }

// Spec is what a request is made of.
type Spec struct {
	Owner   string
	Slots   int         // fresh counter slots, zeroed
	Snippet SnippetFunc // the snippet, from the slots' addresses
	Hooks   Hooks       // observe the steps of this request's changes; nil: none
}

// Add installs a request at s: sp.Slots fresh counter slots and the
// snippet made from their addresses, then the point's patch rebuilt with
// it (the first request at the instruction splices it). On error nothing
// changed.
func (e *Engine) Add(s *splice.Site, sp Spec) (*Request, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addLocked(s, sp)
}

// addLocked is Add; the caller holds e.mu.
func (e *Engine) addLocked(s *splice.Site, sp Spec) (*Request, error) {
	pt, _ := e.points.get(s.Addr())
	if pt == nil {
		pt = e.newPoint(s)
		if pt.class == springboard.Springboard && e.noTrap != "" && !e.slotFree(s.Addr()) {
			e.coverInstead(pt)
		}
		if pt.class == springboard.Trap {
			if err := e.trapRefused(s); err != nil {
				return nil, err
			}
		}
	}
	r, err := e.newRequest(pt, s, sp)
	if err != nil {
		return nil, err
	}
	reqs := append(append([]*Request(nil), pt.reqs...), r)
	if err := e.install(pt, reqs, r.hooks()); err != nil {
		e.freeSlots(r)
		if errors.Is(err, errPointGone) {
			// The point's module went (and may be back at the same
			// address): its old requests stay with it, to be removed;
			// r goes to a new point.
			pt.reqs = reqs[:len(reqs)-1]
			return e.addLocked(s, sp)
		}
		return nil, err
	}
	for _, ps := range pt.sites() {
		e.points.set(ps.Addr(), pt)
	}
	return r, nil
}

// newRequest makes a request of sp at s, of point pt: sp.Slots fresh
// counter slots, zeroed, and the snippet made from their addresses. The
// caller holds e.mu.
func (e *Engine) newRequest(pt *point, s *splice.Site, sp Spec) (*Request, error) {
	r := &Request{pt: pt, owner: unique.Make(sp.Owner)}
	slots := r.slot0[:0]
	if sp.Hooks != nil || sp.Slots != 1 || s != pt.site {
		r.x = &requestExtra{hooks: sp.Hooks}
		if s != pt.site {
			r.x.site = s
		}
		slots = nil
	}
	for i := 0; i < sp.Slots; i++ {
		slot, err := e.takeCounter()
		if err != nil {
			for _, sl := range slots {
				e.slots.free(sl)
			}
			return nil, err
		}
		slots = append(slots, slot)
	}
	if r.x != nil {
		r.x.slots = slots
	}
	// The addresses go in a buffer the engine reuses (a SnippetFunc keeps
	// none of them): one allocation less a probe.
	addrs := e.counterAddrs[:0]
	for _, sl := range slots {
		addrs = append(addrs, e.dev.CounterAddr(sl))
	}
	e.counterAddrs = addrs
	r.snippet = sp.Snippet(addrs)
	return r, nil
}

// freeSlots gives back the slots of a request that was never installed.
func (e *Engine) freeSlots(r *Request) {
	for _, sl := range r.Slots() {
		e.slots.free(sl)
	}
}

// newPoint is a point at s not yet spliced. A covering splice takes the
// instructions after s only if no other point has one of them; otherwise
// the point gets a trap splice. The caller holds e.mu.
func (e *Engine) newPoint(s *splice.Site) *point {
	pt := &point{site: s, class: s.Class, redZone: e.redZone}
	if pt.class != springboard.Cover {
		return pt
	}
	pt.class = springboard.Trap
	if len(s.Covered()) == 0 && len(s.Padding()) == 0 {
		return pt
	}
	for _, c := range s.Covered() {
		if _, taken := e.points.get(c.Addr()); taken {
			return pt
		}
	}
	pt.class = springboard.Cover
	return pt
}

// coverInstead makes the new springboard point pt a covering splice, when
// a trap splice, the fallback for a point whose slot is gone, would be
// refused (SetNoTrap) and its site has a covering run (planned for that:
// splice.Site.Covered) whose instructions no other point has. It reports
// whether it did. The caller holds e.mu.
func (e *Engine) coverInstead(pt *point) bool {
	if e.noTrap == "" || pt.class != springboard.Springboard || len(pt.site.Covered()) == 0 {
		return false
	}
	for _, c := range pt.site.Covered() {
		if _, taken := e.points.get(c.Addr()); taken {
			return false
		}
	}
	pt.class = springboard.Cover
	e.log.Debug("no springboard slot left; covering splice", "at", pt.site.Where())
	return true
}

// trapInstead makes the springboard point pt, whose slot is gone, a trap
// splice, or says why it may not be one (SetNoTrap). The caller holds
// e.mu.
func (e *Engine) trapInstead(pt *point) error {
	if err := e.trapRefused(pt.site); err != nil {
		return err
	}
	e.log.Debug("no springboard slot left; trap splice", "at", pt.site.Where())
	pt.class = springboard.Trap
	return nil
}

// slotFree: a springboard slot for a jmp at addr can be taken now (one
// retired for it, or a free one in reach). The caller holds e.mu.
func (e *Engine) slotFree(addr uint64) bool {
	if e.retiredSlot(addr) != nil {
		return true
	}
	_, ok := e.spring.Find(addr)
	return ok
}

// dropPoint takes pt's instructions out of points. The caller holds
// e.mu.
func (e *Engine) dropPoint(pt *point) {
	for _, ps := range pt.sites() {
		if at, _ := e.points.get(ps.Addr()); at == pt { // a gone point's address may have a new one
			e.points.del(ps.Addr())
		}
	}
}

// Remove removes request r: its point gets a patch without it, or its
// original bytes back when r was the last. A request that cannot be
// removed stays installed (a later attempt, or the driver on close,
// restores it).
func (e *Engine) Remove(r *Request) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.removeLocked(r)
}

// removeLocked is Remove; the caller holds e.mu.
func (e *Engine) removeLocked(r *Request) error {
	pt := r.pt
	var reqs []*Request
	for _, o := range pt.reqs {
		if o != r {
			reqs = append(reqs, o)
		}
	}
	if len(reqs) == len(pt.reqs) {
		return fmt.Errorf("%s: request of %s not installed", r.Site().Where(), r.Owner())
	}
	if err := e.install(pt, reqs, r.hooks()); err != nil && !errors.Is(err, errPointGone) {
		return err
	}
	// A task preempted in the old patch may still write the slots: they
	// go back after the grace period that frees the patch, never to a
	// new request before it.
	e.retireRequest(r)
	if len(pt.reqs) == 0 {
		e.dropPoint(pt)
	}
	return nil
}

// install makes reqs the point's requests: with none, the original bytes
// go back; otherwise a new patch is generated, verified, written and read
// back, then spliced in (first request) or swapped for the old one. The
// old patch is freed last; the driver waits until no task can still run
// in it. The steps are reported to h. On error the point is as it was.
// The caller holds e.mu.
func (e *Engine) install(pt *point, reqs []*Request, h Hooks) error {
	if pt.gone {
		pt.reqs = reqs // nothing runs there: nothing to re-point
		return nil
	}
	s := pt.site
	old := pt.patch
	if len(reqs) == 0 {
		if err := timed(h, StepUnsplice, func() error { return e.unsplice(pt) }); err != nil {
			return err
		}
		pt.reqs, pt.patch = nil, 0
		e.retire(old, pt.slot, s.Addr(), h)
		pt.slot = 0
		return nil
	}
	patch, err := e.writePatch(pt, reqs, h)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		e.dropPatch(patch)
		return err
	}
	switch {
	case pt.slotSplice != 0: // a springboard splice: re-point its slot
		if err := timed(h, StepResplice, func() error { return e.dev.Resplice(pt.slotSplice, patch) }); err != nil {
			return fail(e.resplicedGone(pt, reqs, fmt.Errorf("re-point the springboard of %s: %w", s.Where(), err)))
		}
	case pt.splice != 0:
		if err := timed(h, StepResplice, func() error { return e.dev.Resplice(pt.splice, patch) }); err != nil {
			return fail(e.resplicedGone(pt, reqs, fmt.Errorf("re-point %s: %w", s.Where(), err)))
		}
	case pt.class == springboard.Springboard:
		if err := e.springboardSplice(pt, patch, h); err != nil {
			if !errors.Is(err, springboard.ErrNoSlot) {
				return fail(fmt.Errorf("springboard splice %s: %w", s.Where(), err))
			}
			// The slot went to another point meanwhile: trap instead.
			if err := e.trapInstead(pt); err != nil {
				return fail(err)
			}
		}
	}
	if pt.splice == 0 {
		var id uint32
		err := timed(h, StepSplice, func() (err error) {
			id, err = e.splice(pt, patch)
			return err
		})
		if err != nil {
			return fail(fmt.Errorf("splice %s: %w", s.Where(), err))
		}
		pt.splice = id
	}
	pt.reqs, pt.patch = reqs, patch
	e.retire(old, 0, 0, h)
	return nil
}

// unsplice puts the point's original bytes back: the instruction's, then
// a springboard splice's slot's. The caller holds e.mu.
func (e *Engine) unsplice(pt *point) error {
	s := pt.site
	if pt.splice != 0 {
		if err := e.ov.restored(s.Addr(), func() error { return goneOK(e.dev.Unsplice(pt.splice)) }); err != nil {
			return fmt.Errorf("unsplice %s: %w", s.Where(), err)
		}
		pt.splice = 0
	}
	if pt.slotSplice != 0 {
		if err := e.ov.restored(pt.slot, func() error { return goneOK(e.dev.Unsplice(pt.slotSplice)) }); err != nil {
			return fmt.Errorf("unsplice springboard %#x of %s: %w", pt.slot, s.Where(), err)
		}
		pt.slotSplice = 0
	}
	return nil
}

// errPointGone is install's answer for a point whose splice the driver no
// longer has (resplicedGone).
var errPointGone = errors.New("its splice went with its module")

// resplicedGone is err, the failure to re-point pt; when it says the
// driver has no such splice (ENOENT: its module was unloaded, and the
// driver put the bytes back and forgot the id), pt is taken out of the
// engine's tables (pointGone), its requests become reqs, and the error
// is errPointGone. Without this, a session holding points in a module
// that was unloaded and loaded again at the same address made every later
// request there fail ("re-point …: no such file or directory"). The
// caller holds e.mu.
func (e *Engine) resplicedGone(pt *point, reqs []*Request, err error) error {
	if !errors.Is(err, syscall.ENOENT) {
		return err
	}
	e.pointGone(pt)
	pt.reqs = reqs
	return fmt.Errorf("%w: %w", errPointGone, err)
}

// pointGone drops a point whose splice the driver no longer has: its
// original bytes from the overlay (the text there is the kernel's own, or
// another module's), its patch and springboard slot to reclaim (as when
// a removal finds the splice gone: goneIsRemoved), its addresses from
// points. Its requests stay with it until they are removed (install then
// only forgets them). The caller holds e.mu.
func (e *Engine) pointGone(pt *point) {
	e.log.Info("splice gone with its module: point dropped", "at", pt.site.Where())
	for _, ps := range pt.sites() {
		e.ov.forget(ps.Addr())
	}
	if pt.slot != 0 {
		e.ov.forget(pt.slot)
	}
	e.retire(pt.patch, pt.slot, pt.site.Addr(), nil)
	e.dropPoint(pt)
	pt.patch, pt.splice, pt.slotSplice, pt.slot, pt.gone = 0, 0, 0, 0, true
}

// ForgetText drops every point in [lo, hi), text that went: a module
// unloaded, whose splices the driver restored and forgot as it went. The
// points' requests stay until their sessions remove them. (A module
// unloaded and loaded again at the same place between two looks is found
// at the next change of one of its points instead: resplicedGone.) It
// returns how many points it dropped.
func (e *Engine) ForgetText(lo, hi uint64) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	gone := map[*point]bool{}
	for _, pt := range e.points.within(lo, hi) {
		gone[pt] = true
	}
	for pt := range gone {
		e.pointGone(pt)
	}
	return len(gone)
}

// goneOK is err, or nil for a splice the driver no longer has: removed
// with its module (see goneIsRemoved).
func goneOK(err error) error {
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return err
}

// writePatch builds the point's patch for reqs (makePatch) and writes it
// (writePatches). On error nothing is left allocated. The caller holds
// e.mu.
func (e *Engine) writePatch(pt *point, reqs []*Request, h Hooks) (uint64, error) {
	patch, code, err := e.makePatch(pt, reqs, h)
	if err != nil {
		return 0, err
	}
	if err := timed(h, StepPatchWrite, func() error { return e.writePatches([]driver.PatchCode{{Addr: patch, Code: code}}) }); err != nil {
		e.dropPatch(patch)
		return 0, err
	}
	return patch, nil
}

// makePatch allocates patch heap memory for the point's patch for reqs
// and builds (and verifies) the code for that address. On error nothing
// is left allocated. The caller holds e.mu.
func (e *Engine) makePatch(pt *point, reqs []*Request, h Hooks) (uint64, []byte, error) {
	specs := pt.patchSpecs(reqs)
	patch, err := e.allocPatchFor(pt, specs, h)
	if err != nil {
		return 0, nil, err
	}
	code, err := pt.buildPatchTimed(patch, specs, h)
	if err != nil {
		e.dropPatch(patch)
		return 0, nil, err
	}
	return patch, code, nil
}

// allocPatchFor allocates patch heap memory for the point's patch of
// specs, sized before it is built (codegen.PatchLen). The caller holds
// e.mu.
func (e *Engine) allocPatchFor(pt *point, specs []codegen.PatchSpec, h Hooks) (uint64, error) {
	n, err := pt.patchLen(e.patchHeapBase(), specs)
	if err != nil {
		return 0, err
	}
	return e.allocPatchTimed(n, h)
}

// patchLen is the length of the point's patch for specs anywhere near
// the heap at near. It reads only the point and specs.
func (pt *point) patchLen(near uint64, specs []codegen.PatchSpec) (int, error) {
	n := 0
	for _, spec := range specs {
		k, err := codegen.PatchLen(near, spec)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", pt.site.Where(), err)
		}
		n += k
	}
	return n, nil
}

// allocPatchTimed allocates n bytes of patch heap, timed as
// StepPatchAlloc. The caller holds e.mu.
func (e *Engine) allocPatchTimed(n int, h Hooks) (uint64, error) {
	var patch uint64
	if err := timed(h, StepPatchAlloc, func() (err error) { patch, err = e.allocPatch(n); return err }); err != nil {
		return 0, fmt.Errorf("allocate patch: %w", err)
	}
	return patch, nil
}

// buildPatchTimed is buildPatch, timed as StepCodegen, with the site in
// its error. It reads only the point and specs: the patches of an AddEach
// batch are built at once on every CPU.
func (pt *point) buildPatchTimed(patch uint64, specs []codegen.PatchSpec, h Hooks) ([]byte, error) {
	var code []byte
	if err := timed(h, StepCodegen, func() (err error) { code, err = pt.buildPatch(patch, specs); return err }); err != nil {
		return nil, fmt.Errorf("%s: %w", pt.site.Where(), err)
	}
	return code, nil
}

// writePatches writes patches into the patch heap, then reads them back
// (one read of the span they lie in): what runs must be what was
// verified.
func (e *Engine) writePatches(ps []driver.PatchCode) error {
	if len(ps) == 0 {
		return nil
	}
	if err := e.dev.PatchWriteMany(ps); err != nil {
		return fmt.Errorf("write patch: %w", err)
	}
	lo, hi := ps[0].Addr, ps[0].Addr
	for _, p := range ps {
		lo, hi = min(lo, p.Addr), max(hi, p.Addr+uint64(len(p.Code)))
	}
	back := make([]byte, hi-lo)
	if err := e.dev.Read(lo, back); err != nil {
		return fmt.Errorf("read patches back at %#x: %w", lo, err)
	}
	for _, p := range ps {
		if off := p.Addr - lo; !bytes.Equal(back[off:off+uint64(len(p.Code))], p.Code) {
			return fmt.Errorf("patch at %#x does not read back as written", p.Addr)
		}
	}
	return nil
}

// dropPatch frees a patch no splice was made to.
func (e *Engine) dropPatch(patch uint64) {
	if err := e.freePatch(patch); err != nil {
		e.log.Error("free patch after failed attach", "patch", hex(patch), "err", err)
	}
}

// spliceOp is the driver's splice of the point to patch: a jmp rel32
// for a direct splice, an int3 for a trap splice, a jmp rel32 over the
// run of instructions for a covering splice (armed as an int3: the
// driver writes the jmp when the background FinishCovering has seen a
// grace period).
func (pt *point) spliceOp(patch uint64) (driver.SpliceOp, error) {
	addr, orig := pt.site.Addr(), pt.site.Bytes()
	switch pt.class {
	case springboard.Direct, springboard.Cover:
		jmp, err := codegen.JmpRel32(addr, patch)
		if err != nil {
			return driver.SpliceOp{}, err
		}
		if pt.class == springboard.Cover {
			return driver.SpliceOp{Addr: addr, Patch: patch, Orig: pt.coverBytes(), New: jmp, Covering: true}, nil
		}
		return driver.SpliceOp{Addr: addr, Patch: patch, Orig: orig[:len(jmp)], New: jmp}, nil
	case springboard.Trap:
		// A process's device may pun the never-run nops after it too.
		inst := append(slices.Clip(orig), pt.site.TrapPadding()...)
		return driver.SpliceOp{Addr: addr, Patch: patch, Orig: orig[:1], New: []byte{0xcc}, Inst: inst}, nil
	}
	return driver.SpliceOp{}, fmt.Errorf("%v splices go through springboardSplice (a slot first)", pt.class)
}

// overlayOrig is what the text overlay keeps as the original bytes under
// op: a trap splice's whole instruction where it carries it (a process
// device may write a punned jmp over all of it), else what op replaces.
func overlayOrig(op driver.SpliceOp) []byte {
	if op.Inst != nil {
		return op.Inst
	}
	return op.Orig
}

// wholeOpSplicer is a device that takes a trap splice's whole op: a
// process's, which may write a punned jmp over the instruction
// (driver.SpliceOp.Inst) instead of the int3.
type wholeOpSplicer interface {
	SpliceOp(op driver.SpliceOp) (uint32, error)
}

// splice splices the point to patch (spliceOp) on its own.
func (e *Engine) splice(pt *point, patch uint64) (uint32, error) {
	op, err := pt.spliceOp(patch)
	if err != nil {
		return 0, err
	}
	var id uint32
	err = e.ov.spliced(op.Addr, overlayOrig(op), func() (err error) {
		if ws, ok := e.dev.(wholeOpSplicer); ok && op.Inst != nil {
			id, err = ws.SpliceOp(op)
		} else if op.Covering {
			id, err = e.dev.SpliceCovering(op.Addr, op.Patch, op.Orig, op.New)
		} else {
			id, err = e.dev.Splice(op.Addr, op.Patch, op.Orig, op.New)
		}
		return err
	})
	if err == nil && op.Covering {
		e.cover.kick(e.dev, e.log, 1)
	}
	return id, err
}

// springboardSplice takes a slot within rel8 reach of the point
// (takeSlot), writes the slot (jmp rel32 to patch) into the padding, then
// the jmp rel8 to the slot over the instruction. On error nothing is left
// installed; the slot goes back to the heap only after the caller's patch
// free (which waits for RCU-tasks), as a CPU may have passed through it,
// or, if it was taken back from reclaim, back to reclaim.
func (e *Engine) springboardSplice(pt *point, patch uint64, h Hooks) error {
	addr, orig := pt.site.Addr(), pt.site.Bytes()
	var slot uint64
	var reused bool
	if err := timed(h, StepSlotFind, func() (err error) { slot, reused, err = e.takeSlot(addr); return err }); err != nil {
		return err
	}
	// release gives back a slot nothing was written to this time.
	release := func() { e.releaseSlot(slot, reused, addr) }
	op, err := e.slotOp(slot, patch)
	if err != nil {
		release()
		return err
	}
	var slotID uint32
	err = timed(h, StepSpringboard, func() error {
		return e.ov.spliced(slot, op.Orig, func() (err error) {
			slotID, err = e.dev.SpliceSlot(slot, patch, op.Orig, op.New)
			return err
		})
	})
	if err != nil {
		release() // not written: nothing reached it this time
		return fmt.Errorf("write slot %#x: %w", slot, err)
	}
	jmp, err := pt.springboardOp(slot)
	var id uint32
	if err == nil {
		err = timed(h, StepSplice, func() error {
			return e.ov.spliced(addr, orig, func() (err error) {
				id, err = e.dev.Splice(addr, slot, jmp.Orig, jmp.New)
				return err
			})
		})
	}
	if err != nil {
		e.unspliceSlot(slot, slotID)
		// The caller's failure path frees the patch, which waits for
		// RCU-tasks, before e.mu lets any other point take this slot.
		e.spring.Release(slot)
		return err
	}
	pt.slot, pt.slotSplice, pt.splice = slot, slotID, id
	return nil
}

// slotOp is a springboard slot at slot: a jmp rel32 to patch over the
// padding there.
func (e *Engine) slotOp(slot, patch uint64) (driver.SpliceOp, error) {
	orig := make([]byte, springboard.SlotLen)
	jmp, err := codegen.JmpRel32(slot, patch)
	if err == nil {
		err = e.Text().Read(slot, orig)
	}
	return driver.SpliceOp{Addr: slot, Patch: patch, Orig: orig, New: jmp, Slot: true}, err
}

// springboardOp is the point's springboard splice: a jmp rel8 to slot.
func (pt *point) springboardOp(slot uint64) (driver.SpliceOp, error) {
	addr := pt.site.Addr()
	rel8, err := springboard.JmpRel8(addr, slot)
	if err != nil {
		return driver.SpliceOp{}, err
	}
	return driver.SpliceOp{Addr: addr, Patch: slot, Orig: pt.site.Bytes()[:len(rel8)], New: rel8}, nil
}

// releaseSlot gives back a slot taken for the instruction at addr that
// nothing leads to now: to reclaim if it was taken back from there (a
// task may still stop on its old jmp), else to the heap.
func (e *Engine) releaseSlot(slot uint64, reused bool, addr uint64) {
	if reused {
		e.retire(0, slot, addr, nil)
	} else {
		e.spring.Release(slot)
	}
}

// unspliceSlot takes out a slot whose springboard splice failed.
func (e *Engine) unspliceSlot(slot uint64, id uint32) {
	err := e.ov.restored(slot, func() error { return e.dev.Unsplice(id) })
	if err != nil && !errors.Is(err, driver.ErrClosed) { // closed: nothing is left to restore
		e.log.Error("remove slot after failed springboard splice", "slot", hex(slot), "err", err)
	}
}
