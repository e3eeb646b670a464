package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/splice"
)

// churnOwner owns the requests a churn run makes; no session has this ID.
const churnOwner = "bench-churn"

// maxChurnPool bounds the points one churn run resolves.
const maxChurnPool = 4096

// BenchChurn runs cycles of splice, re-splice and unsplice over a pool of
// points, through the same path sessions take (a request added to or
// removed from a point's shared patch, through the engine). Each cycle
// adds a counter at three points drawn from the pool, a second counter at
// two of them and at one more, then removes the first three and the last
// three in a shuffled order. A request at a point that already has one
// (this run's, or a session's) re-points its splice at a rebuilt patch;
// the last request's removal restores the original bytes. Each change is
// timed whole and counted as what the engine's hooks saw it do (a splice,
// a re-splice or an unsplice). The engine's lock is taken per change, so
// sessions, sampling and reclaim go on between them. The requests are
// removed on every exit, error or cancellation included.
func Churn(ctx context.Context, k Kernel, req api.ChurnRequest) (api.ChurnResult, error) {
	var res api.ChurnResult
	if req.Cycles <= 0 || req.Cycles > maxBenchCycles {
		return res, badRequest(fmt.Errorf("cycles %d: want 1..%d", req.Cycles, maxBenchCycles))
	}
	pool, err := churnPool(k, req)
	if err != nil {
		return res, err
	}
	res.Pool = len(pool)
	rng := rand.New(rand.NewSource(req.Seed))
	st := newStepTimer()
	// kind is what the change being made did to the point, as the
	// engine's hooks report it (frees come later, from the reclaim).
	var (
		kindMu sync.Mutex
		kind   engine.Step
		seen   bool
	)
	hooks := engine.HookFunc(func(s engine.Step, _ time.Duration) {
		if s == engine.StepSplice || s == engine.StepResplice || s == engine.StepUnsplice {
			kindMu.Lock()
			kind, seen = s, true
			kindMu.Unlock()
		}
	})
	change := func(what string, s *splice.Site, f func() error) error {
		kindMu.Lock()
		seen = false
		kindMu.Unlock()
		t := time.Now()
		err := f()
		took := time.Since(t)
		if err != nil {
			return fmt.Errorf("%s at %s: %w", what, s.Where(), err)
		}
		kindMu.Lock()
		k, ok := kind, seen
		kindMu.Unlock()
		if !ok {
			return fmt.Errorf("%s at %s: the engine reported no splice, re-splice or unsplice", what, s.Where())
		}
		st.Step(k, took)
		return nil
	}
	var live []*engine.Request // this run's requests still installed
	defer func() {
		for _, r := range live {
			if err := k.Engine.Remove(r); err != nil {
				k.Log.Error("remove churn request", "at", r.Site().Where(), "err", err)
			}
		}
	}()
	add := func(s *splice.Site) error {
		return change("add", s, func() error {
			r, err := k.Engine.Add(s, engine.Spec{Owner: churnOwner, Slots: 1, Snippet: engine.CounterSnippet, Hooks: hooks})
			if err == nil {
				live = append(live, r)
			}
			return err
		})
	}
	remove := func(i int) error {
		r := live[i]
		if err := change("remove", r.Site(), func() error { return k.Engine.Remove(r) }); err != nil {
			return err
		}
		live = append(live[:i], live[i+1:]...)
		return nil
	}
	start := time.Now()
	for c := 0; c < req.Cycles && ctx.Err() == nil; c++ {
		var first []*splice.Site
		for i := 0; i < 3; i++ {
			first = append(first, pool[rng.Intn(len(pool))])
		}
		second := []*splice.Site{first[rng.Intn(3)], first[rng.Intn(3)], pool[rng.Intn(len(pool))]}
		for _, s := range append(first, second...) {
			if err := add(s); err != nil {
				return res, fmt.Errorf("cycle %d: %w", c, err)
			}
		}
		// The first three out in a random order, then the rest.
		for _, n := range []int{3, 3} {
			for k := n; k > 0; k-- {
				if err := remove(rng.Intn(k)); err != nil {
					return res, fmt.Errorf("cycle %d: %w", c, err)
				}
			}
		}
		res.Cycles++
	}
	res.Seconds = time.Since(start).Seconds()
	res.Splice, res.Resplice, res.Unsplice = st.summary(engine.StepSplice), st.summary(engine.StepResplice), st.summary(engine.StepUnsplice)
	// Every pool point nobody else instruments must read back as the
	// kernel's own bytes (the driver's read, not the overlay).
	res.Restored = true
	for _, s := range pool {
		in := s.Insn()
		if _, ok := k.Engine.Owner(in.Addr); ok {
			continue
		}
		now := make([]byte, len(in.Bytes))
		if err := k.Read(in.Addr, now); err != nil {
			return res, err
		}
		if string(now) != string(in.Bytes) {
			res.Restored = false
			res.NotRestored = append(res.NotRestored, s.Where())
		}
	}
	return res, ctx.Err()
}

// churnPool resolves the run's points: the listed ones, and every
// instruction of the listed functions that may be spliced (the refused
// ones are skipped). A bad point is an error; nothing is changed.
func churnPool(k Kernel, req api.ChurnRequest) ([]*splice.Site, error) {
	var pool []*splice.Site
	seen := map[uint64]bool{}
	keep := func(s *splice.Site) {
		if a := s.Addr(); !seen[a] {
			seen[a] = true
			pool = append(pool, s)
		}
	}
	for _, p := range req.Points {
		s, err := k.Planner.Resolve(p)
		if err != nil {
			return nil, &splice.PointError{Point: p, Err: err}
		}
		keep(s)
	}
	for _, name := range req.Functions {
		f, _, err := k.Planner.Func(name)
		if err != nil {
			return nil, &splice.PointError{Point: name, Err: err}
		}
		n := 0
		for i := range f.Fn.Insns {
			if f.Refusal(i) != "" {
				continue
			}
			s, err := f.At(i)
			if err != nil {
				return nil, &splice.PointError{Point: name, Err: err}
			}
			keep(s)
			n++
		}
		if n == 0 {
			return nil, &splice.PointError{Point: name, Err: errors.New("no instruction may be spliced")}
		}
	}
	if len(pool) == 0 {
		return nil, badRequest(errors.New("churn: no points"))
	}
	if len(pool) > maxChurnPool {
		return nil, badRequest(fmt.Errorf("churn: %d points, at most %d", len(pool), maxChurnPool))
	}
	return pool, nil
}
