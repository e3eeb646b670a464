package kerninstd

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kinst/kinst/bpfprobe"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/metrics"
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
	filter   string            // what the predicate selects, "" for everyone
	calls    int               // counter slot: calls
	word     int               // counter slot: the timer word
	reqs     []*engine.Request // exits, then the entry; reqs[0] owns the slots
	virtual  *virtualState     // nil: wall time only
	// bpf, without the driver, is the timer's BPF probe: calls counts
	// calls and word the nanoseconds inside (not a timer word).
	bpf *bpfprobe.Probe

	mu     sync.Mutex // protects acc and offAcc
	acc    metrics.TimerAcc
	offAcc metrics.TimerAcc // off-CPU thread-time of a virtual timer
}

// ErrExitNotSpliceable is returned when a function exit cannot be spliced
// yet, so the function cannot be timed.
var ErrExitNotSpliceable = errors.New("function exit cannot be spliced")

// resolveTimed finds a function's entry and every exit.
func (d *Daemon) resolveTimed(name string) (*timedFunc, error) {
	f, p, err := d.plan.Func(name)
	if err != nil {
		return nil, err
	}
	entry, err := f.Resolve(p)
	if err != nil {
		return nil, err
	}
	if p.HasOffset {
		return nil, badRequest(fmt.Errorf("time %s: name a function, not an instruction", name))
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
// holds d.mu.
func (d *Daemon) attachTimed(owner string, t *timedFunc, pred codegen.Predicate) error {
	if t.virtual != nil {
		return d.attachVirtual(owner, t, pred)
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
	mk := func(nslots int, build func() codegen.Snippet) engine.SnippetFunc {
		return func(c []uint64) codegen.Snippet {
			if nslots == 2 {
				calls, word = c[0], c[1]
			}
			return build()
		}
	}
	exit := func() codegen.Snippet { return guard(codegen.TimerExit{Word: word}) }
	enter := func() codegen.Snippet {
		return guard(codegen.Counter{Addr: calls}, codegen.TimerEnter{Word: word})
	}
	entryIsExit := false
	for _, s := range t.exits {
		if s == t.entry {
			entryIsExit = true
			continue
		}
		nslots := 0
		if len(t.reqs) == 0 {
			nslots = 2
		}
		r, err := d.eng.Add(s, engine.Spec{Owner: owner, Slots: nslots, Snippet: mk(nslots, exit)})
		if err != nil {
			d.detachTimed(t)
			return err
		}
		t.reqs = append(t.reqs, r)
	}
	nslots := 0
	if len(t.reqs) == 0 {
		nslots = 2 // the entry is the only exit too
	}
	build := enter
	if entryIsExit {
		build = func() codegen.Snippet { return codegen.Seq{enter(), exit()} }
	}
	r, err := d.eng.Add(t.entry, engine.Spec{Owner: owner, Slots: nslots, Snippet: mk(nslots, build)})
	if err != nil {
		d.detachTimed(t)
		return err
	}
	t.reqs = append(t.reqs, r)
	owners := t.reqs[0]
	t.calls, t.word = owners.Slots()[0], owners.Slots()[1]
	return nil
}

// detachTimed removes the entry first (it was attached last), then the
// exits; the slots go with the last. Requests that cannot be removed
// stay listed. The caller holds d.mu.
func (d *Daemon) detachTimed(t *timedFunc) error {
	var errs []error
	var kept []*engine.Request
	for i := len(t.reqs) - 1; i >= 0; i-- {
		r := t.reqs[i]
		if err := d.eng.Remove(r); err != nil {
			errs = append(errs, err)
			kept = append([]*engine.Request{r}, kept...)
		}
	}
	t.reqs = kept
	if len(kept) == 0 && t.virtual != nil && t.virtual.base >= 0 {
		d.freeVirtualSlots(t)
		t.virtual.base = -1
	}
	return errors.Join(errs...)
}

// timerPoint reads the timed function's totals now. The point is stamped
// with the time of the reading, not the caller's (a sampling tick may be
// late by then), since rates divide by the time between points.
func (d *Daemon) timerPoint(t *timedFunc, _ time.Time) metrics.Point {
	if t.bpf != nil {
		calls, ns := d.eng.Counter(t.calls), d.eng.Counter(t.word)
		return metrics.Point{Time: d.clock.Now(), Calls: calls, WallNS: float64(ns), Inside: t.bpf.Inside()}
	}
	calls := d.eng.Counter(t.calls)
	w := d.eng.Counter(t.word)
	var off uint64
	if t.virtual != nil {
		off = d.eng.Counter(t.virtual.off)
	}
	tsc := metrics.TSC() // after the words: every event in them happened before
	now := d.clock.Now()
	t.mu.Lock()
	ticks := t.acc.Add(w, tsc)
	offTicks := t.offAcc.Add(off, tsc)
	t.mu.Unlock()
	p := metrics.Point{Time: now, Calls: calls, WallNS: d.clock.Nanos(ticks), Inside: metrics.TimerInside(w)}
	if t.virtual != nil {
		p.VirtualNS = d.clock.Nanos(ticks - min(offTicks, ticks))
	}
	return p
}
