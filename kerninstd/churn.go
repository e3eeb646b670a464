package kerninstd

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
)

// churnOwner owns the requests a churn run makes; no session has this ID.
const churnOwner = "bench-churn"

// maxChurnPool bounds the points one churn run resolves.
const maxChurnPool = 4096

// BenchChurn runs cycles of splice, re-splice and unsplice over a pool of
// points, through the same path sessions take (a request added to or
// removed from a point's shared patch). Each cycle adds a counter at three
// points drawn from the pool, a second counter at two of them and at one
// more, then removes the first three and the last three in a shuffled
// order. A request at a point that already has one (this run's, or a
// session's) re-points its splice at a rebuilt patch; the last request's
// removal restores the original bytes. d.mu is taken per change, so
// sessions, sampling and reclaim go on between them. The requests are
// removed on every exit, error or cancellation included.
func (d *Daemon) BenchChurn(ctx context.Context, req api.ChurnRequest) (api.ChurnResult, error) {
	var res api.ChurnResult
	if req.Cycles <= 0 || req.Cycles > maxBenchCycles {
		return res, badRequest(fmt.Errorf("cycles %d: want 1..%d", req.Cycles, maxBenchCycles))
	}
	pool, err := d.churnPool(req)
	if err != nil {
		return res, err
	}
	res.Pool = len(pool)
	rng := rand.New(rand.NewSource(req.Seed))
	st := stepTimer{}
	var live []*request // this run's requests still installed
	defer func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, r := range live {
			if err := d.uninstrument(r); err != nil {
				d.log.Error("remove churn request", "at", r.pt.site.where(), "err", err)
			}
		}
	}()
	add := func(s *site) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		step := stepSplice
		if _, ok := d.points[s.insn().Addr]; ok {
			step = stepResplice
		}
		var r *request
		err := st.time(step, func() (err error) { r, err = d.instrument(s, churnOwner, 1, CounterSnippet); return err })
		if err != nil {
			return fmt.Errorf("%s at %s: %w", step, s.where(), err)
		}
		live = append(live, r)
		return nil
	}
	remove := func(i int) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		r := live[i]
		step := stepResplice
		if len(r.pt.reqs) == 1 {
			step = stepUnsplice
		}
		if err := st.time(step, func() error { return d.uninstrument(r) }); err != nil {
			return fmt.Errorf("%s at %s: %w", step, r.pt.site.where(), err)
		}
		live = append(live[:i], live[i+1:]...)
		return nil
	}
	start := time.Now()
	for c := 0; c < req.Cycles && ctx.Err() == nil; c++ {
		var first []*site
		for i := 0; i < 3; i++ {
			first = append(first, pool[rng.Intn(len(pool))])
		}
		second := []*site{first[rng.Intn(3)], first[rng.Intn(3)], pool[rng.Intn(len(pool))]}
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
	res.Splice, res.Resplice, res.Unsplice = st.summary(stepSplice), st.summary(stepResplice), st.summary(stepUnsplice)
	// Every pool point nobody else instruments must read back as the
	// kernel's own bytes (the driver's read, not the overlay).
	d.mu.Lock()
	defer d.mu.Unlock()
	res.Restored = true
	for _, s := range pool {
		in := s.insn()
		if _, ok := d.points[in.Addr]; ok {
			continue
		}
		now := make([]byte, len(in.Bytes))
		if err := d.dev.Read(in.Addr, now); err != nil {
			return res, err
		}
		if string(now) != string(in.Bytes) {
			res.Restored = false
			res.NotRestored = append(res.NotRestored, s.where())
		}
	}
	return res, ctx.Err()
}

// churnPool resolves the run's points: the listed ones, and every
// instruction of the listed functions that may be spliced (the refused
// ones are skipped). A bad point is an error; nothing is changed.
func (d *Daemon) churnPool(req api.ChurnRequest) ([]*site, error) {
	var pool []*site
	seen := map[uint64]bool{}
	keep := func(s *site) {
		if a := s.insn().Addr; !seen[a] {
			seen[a] = true
			pool = append(pool, s)
		}
	}
	for _, p := range req.Points {
		s, err := d.resolve(p)
		if err != nil {
			return nil, &PointError{Point: p, Err: err}
		}
		keep(s)
	}
	for _, name := range req.Functions {
		syms, sym, _, err := d.lookup(name)
		if err != nil {
			return nil, &PointError{Point: name, Err: err}
		}
		fn, err := cfg.ReadFunction(d.text(), syms, sym)
		if err != nil {
			return nil, &PointError{Point: name, Err: err}
		}
		n := 0
		for _, in := range fn.Insns {
			s, err := d.resolve(fmt.Sprintf("%s+%#x", name, in.Addr-fn.Addr))
			var refused *cfg.NoSpliceError
			if errors.As(err, &refused) {
				continue
			}
			if err != nil {
				return nil, &PointError{Point: name, Err: err}
			}
			if unrelocatable(s.insn()) != "" {
				continue
			}
			keep(s)
			n++
		}
		if n == 0 {
			return nil, &PointError{Point: name, Err: errors.New("no instruction may be spliced")}
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
