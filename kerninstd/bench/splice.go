package bench

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/report"
	"github.com/kinst/kinst/splice"
)

// maxBenchCycles bounds one bench request.
const maxBenchCycles = 1_000_000

// benchOwner owns the requests bench splice makes; no session has this ID.
const benchOwner = "bench-splice"

// stepTimer collects the durations of the steps of requests: the
// engine's hooks (engine.Hooks) and the steps the caller times around the
// planner. The batched reclaim reports frees from its own goroutine.
type stepTimer struct {
	mu    sync.Mutex
	steps map[string][]time.Duration
}

func newStepTimer() *stepTimer { return &stepTimer{steps: map[string][]time.Duration{}} }

// Step records one occurrence of an engine step (engine.Hooks).
func (st *stepTimer) Step(s engine.Step, d time.Duration) { st.add(s.String(), d) }

func (st *stepTimer) add(step string, d time.Duration) {
	st.mu.Lock()
	st.steps[step] = append(st.steps[step], d)
	st.mu.Unlock()
}

// time runs f as one occurrence of step and records how long it took.
func (st *stepTimer) time(step string, f func() error) error {
	t := time.Now()
	err := f()
	st.add(step, time.Since(t))
	return err
}

func (st *stepTimer) summary(s engine.Step) api.Durations { return st.summaryOf(s.String()) }

func (st *stepTimer) summaryOf(step string) api.Durations {
	st.mu.Lock()
	defer st.mu.Unlock()
	return summarize(st.steps[step])
}

// stepRelocate is relocation alone (codegen includes it): not a step of
// the engine's, timed by the bench around codegen.Relocate.
const stepRelocate = "relocate"

// BenchSplice measures the steps of an instrumentation request at one
// point (KernInst's Figure 4): resolve and liveness through the planner,
// relocation alone, then cycles of a counting request added to the free
// point and removed again through the engine, each step timed by the
// engine's hooks: patch alloc, codegen, patch write, slot find and
// springboard (springboard splices), splice, unsplice, and the batched
// free of each replaced patch. The point is left as it was.
func Splice(ctx context.Context, k Kernel, req api.BenchRequest) (api.BenchResult, error) {
	if req.Cycles <= 0 || req.Cycles > maxBenchCycles {
		return api.BenchResult{}, badRequest(fmt.Errorf("cycles %d: want 1..%d", req.Cycles, maxBenchCycles))
	}
	var res api.BenchResult
	st := newStepTimer()
	light := min(req.Cycles, 100)

	var s *splice.Site
	for i := 0; i < light; i++ {
		if err := st.time(engine.StepResolve.String(), func() (err error) { s, err = k.Planner.Resolve(req.Point); return err }); err != nil {
			return res, &splice.PointError{Point: req.Point, Err: err}
		}
	}
	// Liveness alone (resolve includes it): the same computation again.
	for i := 0; i < light; i++ {
		st.time(engine.StepLiveness.String(), func() error { k.Planner.Liveness(s); return nil })
	}
	in := s.Insn()
	for i := 0; i < light; i++ {
		if err := st.time(stepRelocate, func() error {
			_, err := codegen.Relocate(in.Addr, codegen.Site{Addr: in.Addr, Bytes: in.Bytes})
			return err
		}); err != nil {
			return res, err
		}
	}
	res.Point = report.Resolved(s)
	sites := append([]*splice.Site{s}, s.Covered()...)
	for _, c := range sites {
		if owner, ok := k.Engine.Owner(c.Addr()); ok {
			return res, fmt.Errorf("%s is instrumented by session %s; bench needs it free", c.Where(), owner)
		}
	}
	var left *engine.Request // a request whose removal failed
	defer func() {
		if left != nil {
			if err := k.Engine.Remove(left); err != nil {
				k.Log.Error("remove bench request", "at", s.Where(), "err", err)
			}
		}
	}()
	for i := 0; i < req.Cycles && ctx.Err() == nil; i++ {
		r, err := k.Engine.Add(s, engine.Spec{Owner: benchOwner, Slots: 1, Snippet: engine.CounterSnippet, Hooks: st})
		if err != nil {
			return res, fmt.Errorf("cycle %d: %w", i, err)
		}
		if i == 0 {
			res.Point.SpliceClass = k.Engine.Installed(r).Class.String() // as installed
		}
		if err := k.Engine.Remove(r); err != nil {
			left = r
			return res, fmt.Errorf("cycle %d: %w", i, err)
		}
		res.Cycles++
	}
	// The frees still waiting for the batched reclaim, timed too.
	k.Engine.Reclaim()
	for _, c := range sites {
		ci := c.Insn()
		now := make([]byte, len(ci.Bytes))
		if err := k.Read(ci.Addr, now); err != nil {
			return res, err
		}
		res.Restored = bytes.Equal(now, ci.Bytes)
		if !res.Restored {
			break
		}
	}
	res.Resolve, res.Liveness = st.summary(engine.StepResolve), st.summary(engine.StepLiveness)
	res.PatchAlloc, res.Codegen, res.Relocation = st.summary(engine.StepPatchAlloc), st.summary(engine.StepCodegen), st.summaryOf(stepRelocate)
	res.Patch, res.SlotFind, res.Springboard = st.summary(engine.StepPatchWrite), st.summary(engine.StepSlotFind), st.summary(engine.StepSpringboard)
	res.Splice, res.Unsplice, res.Free = st.summary(engine.StepSplice), st.summary(engine.StepUnsplice), st.summary(engine.StepFree)
	return res, ctx.Err()
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
