package kerninstd

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/bpfprobe"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/report"
	"github.com/kinst/kinst/splice"
)

// A timed function (kinst time): calls counted at the entry, and a timer
// word entered at the entry and left at every exit — ret, jmp to a return
// thunk, tail call, indirect jump — so the word integrates the number of
// threads inside over time (codegen.TimerEnter). From it come the total
// and average wall time and the average concurrency.
type timedFunc struct {
	function string
	entry    *splice.Site
	exits    []*splice.Site
	// region, for a timed region (api.Region), is every site with what
	// it does; entry and exits then only describe it.
	region  []timerSite
	filter  string            // what the predicate selects, "" for everyone
	calls   int               // counter slot: calls
	word    int               // counter slot: the timer word
	reqs    []*engine.Request // exits, then the entry; reqs[0] owns the slots
	virtual *virtualState     // nil: wall time only
	// bpf, without the driver, is the timer's BPF probe: calls counts
	// calls and word the nanoseconds inside (not a timer word).
	bpf *bpfprobe.Probe

	mu     sync.Mutex // protects acc and offAcc
	acc    metrics.TimerAcc
	offAcc metrics.TimerAcc // off-CPU thread-time of a virtual timer
}

// timing resolves, attaches and reads the daemon's timers: wall and
// virtual timers of functions and lock-wait timers, with their filters.
// It holds no session state (Daemon.mu protects the sessions' timers);
// taskOnce guards task and taskErr.
type timing struct {
	eng   *engine.Engine
	plan  *splice.Planner
	clock Clock

	taskOnce sync.Once
	loadTask func(*kernel.Symbols) (kernel.TaskLayout, error)
	task     kernel.TaskLayout // where current's pid, tgid and comm are
	taskErr  error
}

// ErrExitNotSpliceable is returned when a function exit cannot be spliced
// yet, so the function cannot be timed.
var ErrExitNotSpliceable = errors.New("function exit cannot be spliced")

// resolveTimed finds a function's entry and every exit.
func (tm *timing) resolveTimed(name string) (*timedFunc, error) {
	f, p, err := tm.plan.Func(name)
	if err != nil {
		return nil, err
	}
	if p.HasOffset || p.HasBlock {
		// A block's probe as an entry timed nothing: its calls were
		// never counted as the function's (kinst time FUNC:2 said 0).
		return nil, badRequest(fmt.Errorf("time %s: name a function, not an instruction or block (kinst time times whole functions, or FILE:A-B a range of lines)", name))
	}
	entry, err := f.Resolve(p)
	if err != nil {
		return nil, err
	}
	t := &timedFunc{function: f.Fn.Name, entry: entry}
	if t.exits, err = f.Exits(entry); err != nil {
		return nil, err
	}
	if len(t.exits) == 0 {
		return nil, fmt.Errorf("%w: %s has no exit the analysis can see (it never returns?)", ErrExitNotSpliceable, f.Fn.Name)
	}
	return t, nil
}

// attachTimed installs a timed function: the exits first, so that no
// thread can enter and then leave unseen; then the entry. pred, if not
// nil, guards both. The first exit's request owns the two counter slots
// (calls, timer word), so they are reclaimed with its patch after every
// other request is gone. On error nothing stays installed. The caller
// holds Daemon.mu.
func (tm *timing) attachTimed(owner string, t *timedFunc, pred codegen.Predicate) error {
	if t.virtual != nil {
		return tm.attachVirtual(owner, t, pred)
	}
	guard := func(sn ...codegen.Snippet) codegen.Snippet {
		if pred == nil {
			if len(sn) == 1 {
				return sn[0]
			}
			return codegen.Seq(sn)
		}
		return codegen.Guard{If: pred, Then: sn}
	}
	var calls, word uint64
	exit := func() codegen.Snippet { return guard(codegen.TimerExit{Word: word}) }
	enter := func() codegen.Snippet {
		return guard(codegen.Counter{Addr: calls}, codegen.TimerEnter{Word: word})
	}
	// The sites that only leave go in first, so that no thread can enter
	// and then leave unseen; the first request owns the two slots.
	sites := t.sites()
	slices.SortStableFunc(sites, func(a, b timerSite) int { return cmp.Compare(b2i(a.enter), b2i(b.enter)) })
	for _, ts := range sites {
		nslots := 0
		if len(t.reqs) == 0 {
			nslots = 2
		}
		build := func(c []uint64) codegen.Snippet {
			if nslots == 2 {
				calls, word = c[0], c[1]
			}
			var sn codegen.Seq
			switch {
			case ts.count && ts.enter:
				sn = append(sn, enter())
			case ts.count:
				sn = append(sn, guard(codegen.Counter{Addr: calls}))
			case ts.enter:
				sn = append(sn, guard(codegen.TimerEnter{Word: word}))
			}
			if ts.exit {
				sn = append(sn, exit())
			}
			if len(sn) == 1 {
				return sn[0]
			}
			return sn
		}
		r, err := tm.eng.Add(ts.site, engine.Spec{Owner: owner, Slots: nslots, Snippet: build})
		if err != nil {
			tm.detachTimed(t)
			return err
		}
		t.reqs = append(t.reqs, r)
	}
	owners := t.reqs[0]
	t.calls, t.word = owners.Slots()[0], owners.Slots()[1]
	return nil
}

// timerSite is one site of a timer: where a call is counted, and where
// a thread enters or leaves.
type timerSite struct {
	site               *splice.Site
	count, enter, exit bool
}

// sites are the timer's sites: a region's, or a function's entry (which
// may be an exit too) and exits.
func (t *timedFunc) sites() []timerSite {
	if t.region != nil {
		return slices.Clone(t.region)
	}
	var out []timerSite
	entryIsExit := false
	for _, s := range t.exits {
		if s == t.entry {
			entryIsExit = true
			continue
		}
		out = append(out, timerSite{site: s, exit: true})
	}
	if entryIsExit { // a function of one instruction: in and out at once
		out = append(out, timerSite{site: t.entry, count: true, enter: true, exit: true})
		return out
	}
	return append(out, timerSite{site: t.entry, count: true, enter: true})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// detachTimed removes the entry first (it was attached last), then the
// exits; the slots go with the last. Requests that cannot be removed
// stay listed. The caller holds Daemon.mu.
func (tm *timing) detachTimed(t *timedFunc) error {
	var errs []error
	var kept []*engine.Request
	for i := len(t.reqs) - 1; i >= 0; i-- {
		r := t.reqs[i]
		if err := tm.eng.Remove(r); err != nil {
			errs = append(errs, err)
			kept = append([]*engine.Request{r}, kept...)
		}
	}
	t.reqs = kept
	if len(kept) == 0 && t.virtual != nil && t.virtual.base >= 0 {
		tm.freeVirtualSlots(t)
		t.virtual.base = -1
	}
	return errors.Join(errs...)
}

// timerPoint reads the timed function's totals now. The point is stamped
// with the time of the reading, not the caller's (a sampling tick may be
// late by then), since rates divide by the time between points.
func (tm *timing) timerPoint(t *timedFunc, _ time.Time) metrics.Point {
	if t.bpf != nil {
		calls, ns := tm.eng.Counter(t.calls), tm.eng.Counter(t.word)
		return metrics.Point{Time: tm.clock.Now(), Calls: calls, WallNS: float64(ns), Inside: t.bpf.Inside()}
	}
	calls := tm.eng.Counter(t.calls)
	w := tm.eng.Counter(t.word)
	var off uint64
	if t.virtual != nil {
		off = tm.eng.Counter(t.virtual.off)
	}
	tsc := metrics.TSC() // after the words: every event in them happened before
	now := tm.clock.Now()
	t.mu.Lock()
	ticks := t.acc.Add(w, tsc)
	offTicks := t.offAcc.Add(off, tsc)
	t.mu.Unlock()
	p := metrics.Point{Time: now, Calls: calls, WallNS: tm.clock.Nanos(ticks), Inside: metrics.TimerInside(w)}
	if t.virtual != nil {
		p.VirtualNS = tm.clock.Nanos(ticks - min(offTicks, ticks))
	}
	return p
}

// timerInfo describes a timed function with its totals at now.
func (tm *timing) timerInfo(t *timedFunc, now time.Time) api.TimerInfo {
	ti := api.TimerInfo{Function: t.function, Filter: t.filter, Virtual: t.virtual != nil, Entry: report.Resolved(t.entry), Totals: api.Totals(tm.timerPoint(t, now)),
		Mechanism: MechanismSplice}
	if t.bpf != nil {
		ti.Mechanism = t.bpf.Mechanism()
		ti.Entry.SpliceClass = ""
		ti.Exits = []api.Resolved{}
	}
	for _, s := range t.exits {
		ti.Exits = append(ti.Exits, report.Resolved(s))
	}
	return ti
}

// resolveTimers resolves every function of a request and builds the
// filter's predicate. It changes nothing.
func (tm *timing) resolveTimers(req api.SessionRequest) ([]*timedFunc, codegen.Predicate, error) {
	if req.Lock != "" {
		return tm.resolveWaiters(req)
	}
	if len(req.Regions) > 0 && req.Virtual {
		return nil, nil, badRequest(errors.New("a timed region measures wall time only (no --virtual)"))
	}
	if len(req.Timers) == 0 && len(req.Regions) == 0 {
		if req.Filter != nil {
			return nil, nil, badRequest(errors.New("a filter applies to timed functions; none given"))
		}
		return nil, nil, nil
	}
	pred, desc, err := tm.predicate(req.Filter)
	if err != nil {
		return nil, nil, err
	}
	var sw *splice.Site
	if req.Virtual {
		if err := tm.loadTaskLayout(); err != nil {
			return nil, nil, fmt.Errorf("virtual timers need the task layout: %w", err)
		}
		if sw, err = tm.resolveSwitch(); err != nil {
			return nil, nil, err
		}
	}
	seen := map[string]bool{}
	var out []*timedFunc
	for _, name := range req.Timers {
		t, err := tm.resolveTimed(name)
		if err != nil {
			return nil, nil, &splice.PointError{Point: name, Err: err}
		}
		if seen[t.function] {
			return nil, nil, &splice.PointError{Point: name, Err: badRequest(fmt.Errorf("%s named twice", t.function))}
		}
		seen[t.function] = true
		t.filter = desc
		if sw != nil {
			t.virtual = &virtualState{sw: sw, base: -1}
		}
		out = append(out, t)
	}
	for _, r := range req.Regions {
		t, err := tm.resolveRegion(r)
		if err != nil {
			return nil, nil, &splice.PointError{Point: r.Name, Err: err}
		}
		if seen[t.function] {
			return nil, nil, &splice.PointError{Point: r.Name, Err: badRequest(errors.New("named twice"))}
		}
		seen[t.function] = true
		t.filter = desc
		out = append(out, t)
	}
	return out, pred, nil
}

// resolveRegion plans a timed region's sites (cfg.Region): where control
// passes into the region's instructions and out of them.
func (tm *timing) resolveRegion(r api.Region) (*timedFunc, error) {
	if r.Name == "" || len(r.Spans) == 0 {
		return nil, badRequest(errors.New("a region needs a name and spans"))
	}
	f, p, err := tm.plan.Func(r.Function)
	if err != nil {
		return nil, err
	}
	if p.HasOffset || p.HasBlock {
		return nil, badRequest(fmt.Errorf("region %s: name its function, not a point (%s)", r.Name, r.Function))
	}
	spans := make([]splice.Span, len(r.Spans))
	for i, sp := range r.Spans {
		spans[i] = splice.Span{Lo: sp.Lo, Hi: sp.Hi}
	}
	plan, err := f.RegionSites(spans)
	if err != nil {
		return nil, badRequest(fmt.Errorf("region %s: %w", r.Name, err))
	}
	t := &timedFunc{function: r.Name}
	for _, rs := range plan {
		t.region = append(t.region, timerSite{site: rs.Site, count: rs.Count, enter: rs.Enter, exit: rs.Exit})
		if (rs.Enter || rs.Count) && t.entry == nil {
			t.entry = rs.Site
		}
		if rs.Exit {
			t.exits = append(t.exits, rs.Site)
		}
	}
	return t, nil
}

// predicate builds the guard of a filter, with task_struct offsets from
// the kernel's BTF.
func (tm *timing) predicate(f *api.Filter) (codegen.Predicate, string, error) {
	if f == nil || (f.PID == 0 && f.TID == 0 && f.Comm == "") {
		return nil, "", nil
	}
	set := 0
	for _, b := range []bool{f.PID != 0, f.TID != 0, f.Comm != ""} {
		if b {
			set++
		}
	}
	if set > 1 {
		return nil, "", badRequest(errors.New("filter on one of pid, tid or comm"))
	}
	if f.PID < 0 || f.TID < 0 {
		return nil, "", badRequest(errors.New("pid and tid are positive"))
	}
	if len(f.Comm) >= codegen.TaskCommLen {
		return nil, "", badRequest(fmt.Errorf("comm %q is longer than the kernel keeps (%d bytes); give the first %d", f.Comm, codegen.TaskCommLen-1, codegen.TaskCommLen-1))
	}
	if err := tm.loadTaskLayout(); err != nil {
		return nil, "", fmt.Errorf("filters need the task layout: %w", err)
	}
	l := tm.task
	switch {
	case f.PID != 0:
		return codegen.TaskField32{CurrentTask: int32(l.CurrentTask), Offset: int32(l.TGID), Value: int32(f.PID)}, fmt.Sprintf("pid %d", f.PID), nil
	case f.TID != 0:
		return codegen.TaskField32{CurrentTask: int32(l.CurrentTask), Offset: int32(l.PID), Value: int32(f.TID)}, fmt.Sprintf("tid %d", f.TID), nil
	}
	p := codegen.TaskComm{CurrentTask: int32(l.CurrentTask), Offset: int32(l.Comm)}
	copy(p.Comm[:], f.Comm)
	return p, fmt.Sprintf("comm %s", f.Comm), nil
}

// loadTaskLayout loads where current's pid, tgid and comm are, once.
func (tm *timing) loadTaskLayout() error {
	tm.taskOnce.Do(func() { tm.task, tm.taskErr = tm.loadTask(tm.plan.Symbols()) })
	return tm.taskErr
}
