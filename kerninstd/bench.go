package kerninstd

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/springboard"
)

// maxBenchCycles bounds one bench request.
const maxBenchCycles = 1_000_000

// benchPatches is how many patches bench splice allocates to time the
// allocation: each free waits for an RCU-tasks grace period, so few.
const benchPatches = 5

// stepTimer collects the durations of the named steps of repeated
// requests; it is used by one goroutine.
type stepTimer map[string][]time.Duration

// time runs f as one occurrence of step and records how long it took.
func (st stepTimer) time(step string, f func() error) error {
	t := time.Now()
	err := f()
	st[step] = append(st[step], time.Since(t))
	return err
}

func (st stepTimer) summary(step string) api.Durations { return summarize(st[step]) }

// The steps of a request (KernInst's Figure 4, on x86-64).
const (
	stepResolve    = "resolve"
	stepLiveness   = "liveness"
	stepAlloc      = "patch alloc"
	stepCodegen    = "codegen"
	stepRelocate   = "relocate"
	stepPatchWrite = "patch write"
	stepSlotFind   = "slot find"
	stepSlotWrite  = "slot write"
	stepSplice     = "splice"
	stepResplice   = "resplice"
	stepUnsplice   = "unsplice"
	stepFree       = "free"
)

// BenchSplice measures the steps of an instrumentation request at one
// point: resolve, liveness, codegen and relocation a few times, a few
// patch allocations, then cycles of the driver's splice and unsplice of
// one prepared patch (the part that touches the running kernel; for a
// springboard-class point each cycle writes the slot, then the jmp rel8
// to it), then the frees. The point is left as it was.
func (d *Daemon) BenchSplice(ctx context.Context, req api.BenchRequest) (api.BenchResult, error) {
	if req.Cycles <= 0 || req.Cycles > maxBenchCycles {
		return api.BenchResult{}, badRequest(fmt.Errorf("cycles %d: want 1..%d", req.Cycles, maxBenchCycles))
	}
	var res api.BenchResult
	st := stepTimer{}
	light := min(req.Cycles, 100)

	var s *site
	for i := 0; i < light; i++ {
		if err := st.time(stepResolve, func() (err error) { s, err = d.resolve(req.Point); return err }); err != nil {
			return res, &PointError{Point: req.Point, Err: err}
		}
	}
	// Liveness alone (resolve includes it): the same computation again.
	syms := d.symbols()
	for i := 0; i < light; i++ {
		st.time(stepLiveness, func() error { s.live = d.siteLive(syms, s, d.blocks(syms, s.fn)); return nil })
	}
	// A point that would take a covering splice is timed as a trap
	// splice: a covering splice is armed as one, and its jmp is written
	// later by the background finisher after a grace period, which is not
	// a step of the request.
	if s.class == springboard.Cover {
		s.class = springboard.Trap
	}
	res.Point = s.resolved()

	d.mu.Lock()
	defer d.mu.Unlock()
	in := s.insn()
	if pt, ok := d.points[in.Addr]; ok {
		return res, fmt.Errorf("%s is instrumented by session %s; bench needs it free", s.where(), pt.reqs[0].owner)
	}
	slot, err := d.slots.alloc()
	if err != nil {
		return res, err
	}
	defer d.slots.free(slot)
	counter := d.dev.CounterAddr(slot)
	n, err := codegen.PatchLen(d.patchHeapBase(), s.patchSpec([]*request{{snippet: codegen.Counter{Addr: counter}}}))
	if err != nil {
		return res, err
	}
	// patches[0] is the one spliced; all are freed at the end (after the
	// springboard slot is unspliced, before it is released).
	var patches []uint64
	var spring uint64
	defer func() {
		for _, p := range patches {
			st.time(stepFree, func() error { return d.dev.PatchFree(p) })
		}
		if spring != 0 {
			d.spring.Release(spring)
		}
	}()
	for i := 0; i < benchPatches; i++ {
		var p uint64
		if err := st.time(stepAlloc, func() (err error) { p, err = d.dev.PatchAlloc(n); return err }); err != nil {
			return res, err
		}
		patches = append(patches, p)
	}
	patch := patches[0]

	var code []byte
	for i := 0; i < light; i++ {
		if err := st.time(stepCodegen, func() (err error) { code, err = buildCounterPatch(patch, s, counter); return err }); err != nil {
			return res, err
		}
		// Relocation alone (codegen includes it).
		if err := st.time(stepRelocate, func() error {
			_, err := codegen.Relocate(patch, codegen.Site{Addr: in.Addr, Bytes: in.Bytes})
			return err
		}); err != nil {
			return res, err
		}
	}
	if err := st.time(stepPatchWrite, func() error { return d.dev.PatchWrite(patch, code) }); err != nil {
		return res, err
	}
	// A cycle splices and returns the undo, which unsplices.
	var cycle func() func() error
	switch s.class {
	case springboard.Springboard:
		// One slot for every cycle: rewriting it with the same jmp is
		// harmless, and it is released only after the patch frees (each
		// waits for RCU-tasks) when no CPU can be in it.
		if err := st.time(stepSlotFind, func() (err error) { spring, err = d.spring.Alloc(in.Addr); return err }); err != nil {
			return res, err
		}
		cycle = d.benchSpringboardCycle(st, s, spring, patch)
	default:
		cycle = func() func() error {
			var id uint32
			if err := st.time(stepSplice, func() (err error) { id, err = d.splice(s, s.class, patch); return err }); err != nil {
				return func() error { return err }
			}
			return func() error {
				return st.time(stepUnsplice, func() error {
					return d.ov.restored(in.Addr, func() error { return d.dev.Unsplice(id) })
				})
			}
		}
	}
	for i := 0; i < req.Cycles && ctx.Err() == nil; i++ {
		undo := cycle()
		if err := undo(); err != nil {
			return res, fmt.Errorf("cycle %d: %w", i, err)
		}
		res.Cycles++
	}

	now := make([]byte, len(in.Bytes))
	if err := d.dev.Read(in.Addr, now); err != nil {
		return res, err
	}
	res.Restored = bytes.Equal(now, in.Bytes)
	// The frees, before the summary is taken (the deferred ones are
	// for the error paths).
	for _, p := range patches {
		if err := st.time(stepFree, func() error { return d.dev.PatchFree(p) }); err != nil {
			return res, err
		}
	}
	patches = nil
	if spring != 0 {
		d.spring.Release(spring)
		spring = 0
	}
	res.Resolve, res.Liveness = st.summary(stepResolve), st.summary(stepLiveness)
	res.PatchAlloc, res.Codegen, res.Relocation = st.summary(stepAlloc), st.summary(stepCodegen), st.summary(stepRelocate)
	res.Patch, res.SlotFind, res.Springboard = st.summary(stepPatchWrite), st.summary(stepSlotFind), st.summary(stepSlotWrite)
	res.Splice, res.Unsplice, res.Free = st.summary(stepSplice), st.summary(stepUnsplice), st.summary(stepFree)
	return res, ctx.Err()
}

// benchSpringboardCycle returns a cycle of a springboard splice with a
// slot already taken: write the slot, then the jmp rel8 to it; the undo
// removes both, the jmp first.
func (d *Daemon) benchSpringboardCycle(st stepTimer, s *site, slot, patch uint64) func() func() error {
	in := s.insn()
	return func() func() error {
		fail := func(err error) func() error { return func() error { return err } }
		jmp, err := codegen.JmpRel32(slot, patch)
		if err != nil {
			return fail(err)
		}
		rel8, err := springboard.JmpRel8(in.Addr, slot)
		if err != nil {
			return fail(err)
		}
		orig := make([]byte, springboard.SlotLen)
		if err := d.text().Read(slot, orig); err != nil {
			return fail(err)
		}
		var slotID, id uint32
		if err := st.time(stepSlotWrite, func() error {
			return d.ov.spliced(slot, orig, func() (err error) { slotID, err = d.dev.SpliceSlot(slot, patch, orig, jmp); return err })
		}); err != nil {
			return fail(fmt.Errorf("write slot %#x: %w", slot, err))
		}
		if err := st.time(stepSplice, func() error {
			return d.ov.spliced(in.Addr, in.Bytes, func() (err error) {
				id, err = d.dev.Splice(in.Addr, slot, in.Bytes[:len(rel8)], rel8)
				return err
			})
		}); err != nil {
			d.ov.restored(slot, func() error { return d.dev.Unsplice(slotID) })
			return fail(fmt.Errorf("splice: %w", err))
		}
		return func() error {
			return st.time(stepUnsplice, func() error {
				if err := d.ov.restored(in.Addr, func() error { return d.dev.Unsplice(id) }); err != nil {
					return err
				}
				return d.ov.restored(slot, func() error { return d.dev.Unsplice(slotID) })
			})
		}
	}
}

func summarize(ds []time.Duration) api.Durations {
	if len(ds) == 0 {
		return api.Durations{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return api.Durations{
		N:      len(s),
		Median: int64(s[len(s)/2]),
		P90:    int64(s[len(s)*9/10]),
		Min:    int64(s[0]),
		Max:    int64(s[len(s)-1]),
	}
}
