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
	ch := &churner{k: k, st: newStepTimer()}
	ch.hooks = engine.HookFunc(ch.hook)
	defer ch.removeAll()
	start := time.Now()
	for c := 0; c < req.Cycles && ctx.Err() == nil; c++ {
		var first []*splice.Site
		for i := 0; i < 3; i++ {
			first = append(first, pool[rng.Intn(len(pool))])
		}
		second := []*splice.Site{first[rng.Intn(3)], first[rng.Intn(3)], pool[rng.Intn(len(pool))]}
		for _, s := range append(first, second...) {
			if err := ch.add(s); err != nil {
				return res, fmt.Errorf("cycle %d: %w", c, err)
			}
		}
		// The first three out in a random order, then the rest.
		for _, n := range []int{3, 3} {
			for k := n; k > 0; k-- {
				if err := ch.remove(rng.Intn(k)); err != nil {
					return res, fmt.Errorf("cycle %d: %w", c, err)
				}
			}
		}
		res.Cycles++
	}
	res.Seconds = time.Since(start).Seconds()
	st := ch.st
	res.Splice, res.Resplice, res.Unsplice = st.summary(engine.StepSplice), st.summary(engine.StepResplice), st.summary(engine.StepUnsplice)
	res.NotRestored, err = notRestored(k, pool)
	res.Restored = len(res.NotRestored) == 0
	if err != nil {
		return res, err
	}
	return res, ctx.Err()
}

// churner makes Churn's changes, timing each by the kind of change the
// engine's hooks say it was (frees come later, from the reclaim).
type churner struct {
	k     Kernel
	st    *stepTimer
	hooks engine.Hooks
	live  []*engine.Request // this run's requests still installed

	mu   sync.Mutex
	kind engine.Step // protected by mu
	seen bool        // protected by mu
}

func (ch *churner) hook(s engine.Step, _ time.Duration) {
	if s == engine.StepSplice || s == engine.StepResplice || s == engine.StepUnsplice {
		ch.mu.Lock()
		ch.kind, ch.seen = s, true
		ch.mu.Unlock()
	}
}

// change times f, a change at s.
func (ch *churner) change(what string, s *splice.Site, f func() error) error {
	ch.mu.Lock()
	ch.seen = false
	ch.mu.Unlock()
	t := time.Now()
	err := f()
	took := time.Since(t)
	if err != nil {
		return fmt.Errorf("%s at %s: %w", what, s.Where(), err)
	}
	ch.mu.Lock()
	k, ok := ch.kind, ch.seen
	ch.mu.Unlock()
	if !ok {
		return fmt.Errorf("%s at %s: the engine reported no splice, re-splice or unsplice", what, s.Where())
	}
	ch.st.Step(k, took)
	return nil
}

func (ch *churner) add(s *splice.Site) error {
	return ch.change("add", s, func() error {
		r, err := ch.k.Engine.Add(s, engine.Spec{Owner: churnOwner, Slots: 1, Snippet: engine.CounterSnippet, Hooks: ch.hooks})
		if err == nil {
			ch.live = append(ch.live, r)
		}
		return err
	})
}

func (ch *churner) remove(i int) error {
	r := ch.live[i]
	if err := ch.change("remove", r.Site(), func() error { return ch.k.Engine.Remove(r) }); err != nil {
		return err
	}
	ch.live = append(ch.live[:i], ch.live[i+1:]...)
	return nil
}

// removeAll removes what a failed run left installed.
func (ch *churner) removeAll() {
	for _, r := range ch.live {
		if err := ch.k.Engine.Remove(r); err != nil {
			ch.k.Log.Error("remove churn request", "at", r.Site().Where(), "err", err)
		}
	}
}

// notRestored are the pool's points, of those nobody else instruments,
// whose bytes do not read back as the kernel's own (the driver's read,
// not the overlay).
func notRestored(k Kernel, pool []*splice.Site) ([]string, error) {
	var bad []string
	for _, s := range pool {
		in := s.Insn()
		if _, ok := k.Engine.Owner(in.Addr); ok {
			continue
		}
		now := make([]byte, len(in.Bytes))
		if err := k.Read(in.Addr, now); err != nil {
			return bad, err
		}
		if string(now) != string(in.Bytes) {
			bad = append(bad, s.Where())
		}
	}
	return bad, nil
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
