package kerninstd

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cover"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/internal/parallel"
	"github.com/kinst/kinst/report"
)

// ErrTooManyProbes is matched by a coverage request with more probes than
// the driver can hold.
var ErrTooManyProbes = errors.New("too many probes")

// coverState is a coverage session: a cover.Set of hit-flag probes, and
// the poller's stop. Protected by Daemon.mu.
type coverState struct {
	set  *cover.Set
	quit chan struct{} // closed when the session is removed: the poller stops
}

// createCover makes a coverage session (SessionRequest.Cover): plans
// every block first (an unknown function changes nothing), then arms the
// probes in one engine batch. A probe the engine cannot install leaves
// its block refused with the error; the others stay.
func (d *Daemon) createCover(req api.SessionRequest) (api.Session, error) {
	if len(req.Points) > 0 || len(req.Timers) > 0 || len(req.Regions) > 0 || req.Lock != "" || req.Virtual {
		return api.Session{}, badRequest(errors.New("a coverage session takes functions, modules and callees only (no points, timers or lock)"))
	}
	if req.TTLNS < 0 {
		return api.Session{}, badRequest(errors.New("negative time-to-live"))
	}
	start := d.clock.Now()
	pred, desc, err := d.tm.predicate(req.Filter)
	if err != nil {
		return api.Session{}, err
	}
	targets, err := coverTargets(d.plan, req)
	if err != nil {
		return api.Session{}, err
	}
	set := cover.New(desc)
	set.Planning(start)
	if req.CoverAllBlocks {
		set.AllBlocks()
	}
	// More probes than the driver's splice table has room for fail: said
	// before planning them all (a whole kernel's sites would not fit in
	// kerninstd's memory either), not found out probe by probe.
	in := d.deviceInfo()
	room := -1
	if in.MaxSplices > 0 {
		room = in.MaxSplices - in.DriverSplices
	}
	// Functions are planned on every CPU (planning is most of a big
	// session's creation), and added to the set in target order.
	var tooMany error
	parallel.Map(len(targets), func(i int) funcPlan {
		f, err := coverFunc(d.plan, targets[i])
		if err != nil {
			return funcPlan{err: err}
		}
		return funcPlan{plan: set.Plan(f)}
	}, func(i int, p funcPlan) bool {
		if p.err != nil {
			// A glob, module or call graph reached a symbol kinst
			// cannot read as a function. (A function named alone failed
			// the request.)
			set.AddUnreadable(targets[i].sym, p.err)
			return true
		}
		set.AddPlan(p.plan)
		if room >= 0 && set.Planned() > room {
			tooMany = badRequest(fmt.Errorf("%w: the first %d of the targets' %d functions already have %d blocks that take a probe, and the driver holds %d splices (%d in use): cover fewer functions at once (a module, globs, --callees), one session after another",
				ErrTooManyProbes, i+1, len(targets), set.Planned(), in.MaxSplices, in.DriverSplices))
			return false
		}
		return true
	})
	if tooMany != nil {
		return api.Session{}, tooMany
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	ss, err := d.newSessionLocked(req)
	if err != nil {
		return api.Session{}, err
	}
	set.Arm(d.eng, ss.id, cover.Flag(pred), d.clock.Now)
	ss.cover = &coverState{set: set, quit: make(chan struct{})}
	d.sessions[ss.id] = ss
	d.startTTL(ss, time.Duration(req.TTLNS))
	// The ticker is made before the session is returned: a client that
	// sees the session sees it polled.
	// Every cover.Poll the poller loads each live probe's flag from the
	// counter heap and removes the probes that ran, in one batch.
	tick, stop := d.clock.NewTicker(cover.Poll)
	go d.pollCover(ss, tick, stop)
	// Planning and arming a big session leave as much garbage as it
	// holds: handed back, not kept for the session's life.
	releaseHeapAfter(set.Armed())
	sum := set.Summary(d.clock.Now())
	d.log.Info("coverage armed", "session", ss.id, "functions", sum.Functions, "blocks", sum.TotalBlocks,
		"probes", sum.Armed, "arm", sum.Arm, "filter", desc)
	return d.describe(ss), nil
}

// funcPlan is a coverage target planned: its blocks' probes, or why it
// could not be read.
type funcPlan struct {
	plan *cover.FuncPlan
	err  error
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
				ss.cover.sweep(d.eng, d.log, ss.id, now)
			}
			d.mu.Unlock()
		}
	}
}

// sweep marks the blocks whose probe has run as covered and removes
// those probes in one batch. The caller holds Daemon.mu.
func (cs *coverState) sweep(eng *engine.Engine, log *slog.Logger, id string, now time.Time) {
	for r, err := range cs.set.Sweep(eng, now) {
		log.Error("remove covered probe", "session", id, "at", r.Site().Where(), "err", err)
	}
}

// report is the session's coverage as of now, every block; the caller
// holds Daemon.mu. A session's description carries only the summary: a
// whole-kernel session's blocks are half a million.
func (cs *coverState) report(name string, now time.Time) *api.CoverReport {
	return report.Cover(cs.set, name, now)
}

// summary is the session's coverage totals as of now. The caller holds
// Daemon.mu.
func (cs *coverState) summary(name string, now time.Time) *api.CoverReport {
	return report.CoverSummary(cs.set, name, now)
}

// final is the report of a session whose probes remove has removed.
// After a big session the engine's records of its probes are collected
// first, so that the report takes their place rather than adding to
// them. The caller holds Daemon.mu.
func (cs *coverState) final(name string, now time.Time) *api.CoverReport {
	if cs.set.Armed() >= bigSession {
		runtime.GC()
	}
	return cs.report(name, now)
}

// CoverReport is the coverage of the session named or numbered id, as of
// now, every block (GET /v1/sessions/{id}/cover; kinst cover report).
func (d *Daemon) CoverReport(id string) (*api.CoverReport, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ss := d.findLocked(id)
	if ss == nil {
		return nil, fmt.Errorf("%w %q", ErrNoSession, id)
	}
	if ss.cover == nil {
		return nil, badRequest(fmt.Errorf("session %s is not a coverage session", id))
	}
	return ss.cover.report(ss.name, d.clock.Now()), nil
}

// remove stops the poller and removes every probe still live; it
// reports whether none is left. The caller holds Daemon.mu and has swept
// the session last.
func (cs *coverState) remove(eng *engine.Engine, log *slog.Logger, id string, now time.Time) (bool, error) {
	select {
	case <-cs.quit:
	default:
		close(cs.quit)
	}
	gone, err := cs.set.Remove(eng)
	rep := cs.set.Summary(now)
	releaseHeapAfter(rep.Armed)
	log.Info("coverage removed", "session", id, "covered", rep.CoveredBlocks, "blocks", rep.TotalBlocks,
		"left", len(cs.set.Live()))
	return gone, err
}
