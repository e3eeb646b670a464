package kerninstd

import (
	"errors"
	"fmt"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/splice"
)

// CoverPoll is how often a coverage session looks for probes that have
// run (a load of each live probe's flag from the counter heap) and
// removes them, all of one look in one batch.
const CoverPoll = 50 * time.Millisecond

// coverState is a coverage session: a hit-flag probe at every block of
// its functions that can take one; the daemon removes each probe once its
// flag is set. Protected by Daemon.mu.
type coverState struct {
	report api.CoverReport // Functions' blocks, totals, timeline; kept current
	live   []coverProbe    // probes still spliced
	armed  time.Time       // when the last probe was spliced
	quit   chan struct{}   // closed when the session is removed: the poller stops
}

// coverProbe is one probe and the block it is for.
type coverProbe struct {
	r      *engine.Request
	fn, bl int // report.Functions[fn].Blocks[bl]
}

// planCover plans a probe at every block of the function: the block's
// cheapest spliceable instruction (splice.Func.Block). A block with none
// is listed with the planner's reason; padding is not a block of the
// function and is left out.
func (d *Daemon) planCover(t coverTarget) (api.CoverFunction, []*splice.Site, []int, error) {
	f, err := t.f, t.err
	if f == nil && err == nil {
		f, err = d.plan.FuncOf(t.syms, t.sym)
	}
	if err != nil {
		return api.CoverFunction{}, nil, nil, err
	}
	fn := f.Fn
	cf := api.CoverFunction{Function: fn.Name, Module: fn.Module, Address: api.Addr(fn.Addr), Blocks: []api.CoverBlock{}}
	var sites []*splice.Site
	var where []int
	for b := range f.Blocks {
		blk := &f.Blocks[b]
		if blk.Padding || blk.N == 0 {
			continue
		}
		last := blk.Last(fn)
		cb := api.CoverBlock{Index: b, Start: api.Addr(blk.Start(fn)), End: api.Addr(last.Addr + uint64(last.Len())), Lines: []string{}}
		s, err := f.Resolve(splice.Point{Spec: fmt.Sprintf("%s:%d", fn.Name, b), Function: fn.Name, Block: b, HasBlock: true})
		if err != nil {
			why := refusal(err)
			cb.Refused = &why
			cf.Refused++
		} else {
			sites = append(sites, s)
			where = append(where, len(cf.Blocks))
		}
		cf.Blocks = append(cf.Blocks, cb)
	}
	cf.Total = len(cf.Blocks)
	return cf, sites, where, nil
}

// refusal is why a block takes no probe, without the location the report
// already gives.
func refusal(err error) string {
	var ns *splice.NoSpliceError
	if errors.As(err, &ns) {
		return ns.Reason
	}
	return err.Error()
}

// createCover makes a coverage session (SessionRequest.Cover): plans
// every block first (an unknown function changes nothing), then arms the
// probes in one engine batch. A probe the engine cannot install leaves
// its block refused with the error; the others stay.
func (d *Daemon) createCover(req api.SessionRequest) (api.Session, error) {
	if len(req.Points) > 0 || len(req.Timers) > 0 || req.Lock != "" || req.Virtual {
		return api.Session{}, badRequest(errors.New("a coverage session takes functions, modules and callees only (no points, timers or lock)"))
	}
	if req.TTLNS < 0 {
		return api.Session{}, badRequest(errors.New("negative time-to-live"))
	}
	pred, desc, err := d.predicate(req.Filter)
	if err != nil {
		return api.Session{}, err
	}
	targets, err := d.coverTargets(req)
	if err != nil {
		return api.Session{}, err
	}
	rep := api.CoverReport{Filter: desc, Functions: []api.CoverFunction{}, Timeline: []api.CoverSample{}}
	var sites []*splice.Site
	var where [][2]int
	for _, t := range targets {
		cf, fs, bl, err := d.planCover(t)
		if err != nil {
			// A glob, module or call graph reached a symbol kinst
			// cannot read as a function: listed with the reason and no
			// blocks. (A function named alone failed the request.)
			rep.Functions = append(rep.Functions, api.CoverFunction{Function: t.sym.Name, Module: t.sym.Module,
				Address: api.Addr(t.sym.Addr), Error: refusal(err), Blocks: []api.CoverBlock{}})
			continue
		}
		for i, s := range fs {
			sites = append(sites, s)
			where = append(where, [2]int{len(rep.Functions), bl[i]})
		}
		rep.Functions = append(rep.Functions, cf)
	}
	snippet := func(c []uint64) codegen.Snippet {
		var s codegen.Snippet = codegen.HitFlag{Addr: c[0]}
		if pred != nil {
			s = codegen.Guard{If: pred, Then: []codegen.Snippet{s}}
		}
		return s
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	ss, err := d.newSessionLocked(req)
	if err != nil {
		return api.Session{}, err
	}
	cs := &coverState{quit: make(chan struct{})}
	start := d.clock.Now()
	reqs, errs := d.eng.AddEach(sites, engine.Spec{Owner: ss.id, Slots: 1, Snippet: snippet})
	cs.armed = d.clock.Now()
	rep.ArmNS = int64(cs.armed.Sub(start))
	for i, r := range reqs {
		fn, bl := where[i][0], where[i][1]
		b := &rep.Functions[fn].Blocks[bl]
		if errs[i] != nil {
			why := refusal(errs[i])
			b.Refused = &why
			rep.Functions[fn].Refused++
			continue
		}
		at := fmt.Sprintf("%s+%#x", r.Site().Fn.Name, r.Site().Addr()-r.Site().Fn.Addr)
		b.Point = &at
		cs.live = append(cs.live, coverProbe{r: r, fn: fn, bl: bl})
	}
	for _, f := range rep.Functions {
		rep.TotalBlocks += f.Total
	}
	rep.Armed = len(cs.live)
	rep.Timeline = append(rep.Timeline, api.CoverSample{LiveProbes: len(cs.live)})
	cs.report = rep
	ss.cover = cs
	d.sessions[ss.id] = ss
	d.startTTL(ss, time.Duration(req.TTLNS))
	// The ticker is made before the session is returned: a client that
	// sees the session sees it polled.
	tick, stop := d.clock.NewTicker(CoverPoll)
	go d.pollCover(ss, tick, stop)
	d.log.Info("coverage armed", "session", ss.id, "functions", len(rep.Functions), "blocks", rep.TotalBlocks,
		"probes", rep.Armed, "arm", time.Duration(rep.ArmNS), "filter", desc)
	return d.describe(ss), nil
}

// pollCover sweeps ss every tick until the session is removed.
func (d *Daemon) pollCover(ss *session, tick <-chan time.Time, stop func()) {
	defer stop()
	for {
		select {
		case <-ss.cover.quit:
			return
		case now := <-tick:
			d.mu.Lock()
			select {
			case <-ss.cover.quit:
			default:
				d.sweepCover(ss, now)
			}
			d.mu.Unlock()
		}
	}
}

// sweepCover marks the blocks whose probe has run as covered and removes
// those probes in one batch (one grace period frees all their patches).
// A probe that cannot be removed stays live and is tried again. The
// caller holds d.mu.
func (d *Daemon) sweepCover(ss *session, now time.Time) {
	cs := ss.cover
	var hit, live []coverProbe
	for _, p := range cs.live {
		if d.eng.Hit(p.r) {
			hit = append(hit, p)
		} else {
			live = append(live, p)
		}
	}
	if len(hit) == 0 {
		return
	}
	rs := make([]*engine.Request, len(hit))
	for i, p := range hit {
		rs[i] = p.r
		f := &cs.report.Functions[p.fn]
		f.Blocks[p.bl].Covered = true
		f.Covered++
		cs.report.CoveredBlocks++
	}
	for i, err := range d.eng.RemoveEach(rs) {
		if err != nil {
			d.log.Error("remove covered probe", "session", ss.id, "at", rs[i].Site().Where(), "err", err)
			live = append(live, hit[i])
			continue
		}
		cs.report.Removed++
	}
	cs.live = live
	cs.report.Timeline = append(cs.report.Timeline, api.CoverSample{ElapsedNS: int64(now.Sub(cs.armed)),
		LiveProbes: len(live), Covered: cs.report.CoveredBlocks})
}

// coverReport is a copy of the session's coverage, as of now. The caller
// holds d.mu.
func (d *Daemon) coverReport(ss *session) *api.CoverReport {
	cs := ss.cover
	rep := cs.report
	rep.Session = ss.name
	rep.DurationNS = int64(d.clock.Now().Sub(cs.armed))
	rep.Functions = make([]api.CoverFunction, len(cs.report.Functions))
	for i, f := range cs.report.Functions {
		f.Blocks = append([]api.CoverBlock(nil), f.Blocks...)
		rep.Functions[i] = f
	}
	rep.Timeline = append([]api.CoverSample(nil), cs.report.Timeline...)
	return &rep
}

// removeCover stops the poller and removes every probe still live; it
// reports whether none is left. The caller holds d.mu and has swept the
// session last.
func (d *Daemon) removeCover(ss *session) (bool, error) {
	cs := ss.cover
	select {
	case <-cs.quit:
	default:
		close(cs.quit)
	}
	rs := make([]*engine.Request, len(cs.live))
	for i, p := range cs.live {
		rs[i] = p.r
	}
	var kept []coverProbe
	var errs []error
	for i, err := range d.eng.RemoveEach(rs) {
		if err != nil {
			errs = append(errs, err)
			kept = append(kept, cs.live[i])
		}
	}
	cs.live = kept
	d.log.Info("coverage removed", "session", ss.id, "covered", cs.report.CoveredBlocks, "blocks", cs.report.TotalBlocks,
		"left", len(kept))
	return len(kept) == 0, errors.Join(errs...)
}
