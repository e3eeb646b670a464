package process

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// region is one neighbourhood of the process's text: a Device whose
// patch heap and counters are mapped within rel32 reach of it, and the
// engine splicing through it.
type region struct {
	dev   *Device
	eng   *engine.Engine
	facts *splice.Facts
}

// regionReach is how far from a region's anchor the text it serves may
// lie: a rel32 jump's reach, less room for where the region itself lands
// (freeNear places it as close to the anchor as it can).
const regionReach = 1 << 30

// region is the region that serves module's text ("" the executable),
// made on first use: an existing one near enough for all of the module's
// text, else a new one anchored at it. Making one writes nothing into the
// process (the Device maps its region at the first splice).
func (t *Target) region(module string) (*region, error) {
	if r := t.byModule[module]; r != nil {
		return r, nil
	}
	span, ok := t.text[module]
	if !ok {
		return nil, fmt.Errorf("process %d maps no text of %q", t.PID, module)
	}
	near := func(a, b uint64) bool {
		if a > b {
			a, b = b, a
		}
		return b-a < regionReach
	}
	for _, r := range t.regions {
		if near(r.dev.near, span[0]) && near(r.dev.near, span[1]) {
			t.byModule[module] = r
			return r, nil
		}
	}
	dev, err := open(t.PID, span[0], t.traps)
	if err != nil {
		return nil, err
	}
	dev.note = t.stopNote
	// The engine's notes (a trap splice chosen) are the daemon's log
	// lines; here the command reports what matters itself.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	eng := engine.New(engine.Config{Device: dev, PatchHeap: dev.Base, RedZone: 128, Log: quiet})
	eng.SetNoTrap(t.noTrap)
	eng.SetPunned(!t.noPun)
	dev.SetPunning(!t.noPun, t.noTrap)
	r := &region{dev: dev, eng: eng, facts: &splice.Facts{Symbols: t.Syms, Text: eng.Text(), Process: true, NoTrap: t.noTrap, Pun: !t.noPun, Decoded: &splice.Decoded{}, GoModules: t.goModules}}
	t.regions = append(t.regions, r)
	t.byModule[module] = r
	return r, nil
}

// siteRegion is the region of the text a site is in.
func (t *Target) siteRegion(s *splice.Site) (*region, error) { return t.region(s.Fn.Module) }

// byRegion groups the indices of items by the region each is for, in
// the order the regions first appear; an item whose region cannot be had
// gets its error in errs.
func byRegion[T any](items []T, regionOf func(T) (*region, error), errs []error) ([]*region, map[*region][]int) {
	groups := map[*region][]int{}
	var order []*region
	for i, it := range items {
		r, err := regionOf(it)
		if err != nil {
			errs[i] = err
			continue
		}
		if groups[r] == nil {
			order = append(order, r)
		}
		groups[r] = append(groups[r], i)
	}
	return order, groups
}

// pick is items at the indices idx.
func pick[T any](items []T, idx []int) []T {
	out := make([]T, len(idx))
	for k, i := range idx {
		out[k] = items[i]
	}
	return out
}

// AddEach installs a request at each site, each through its region's
// engine (engine.Engine.AddEach, one batch per region); errs[i] is the
// i-th site's error.
func (t *Target) AddEach(sites []*splice.Site, spec engine.Spec) ([]*engine.Request, []error) {
	reqs, errs := make([]*engine.Request, len(sites)), make([]error, len(sites))
	order, groups := byRegion(sites, t.siteRegion, errs)
	for _, r := range order {
		idx := groups[r]
		// The region is mapped now, on the first splice near it; a
		// process that cannot take it (another tracer holds it) says so
		// here rather than through the addresses of a region not there.
		if err := r.dev.region(); err != nil {
			for _, i := range idx {
				errs[i] = err
			}
			continue
		}
		rs, es := r.eng.AddEach(pick(sites, idx), spec)
		for k, i := range idx {
			reqs[i], errs[i] = rs[k], es[k]
			if es[k] == nil && rs[k] != nil {
				t.owner[rs[k]] = r
			}
		}
	}
	return reqs, errs
}

// Add installs one request at s.
func (t *Target) Add(s *splice.Site, spec engine.Spec) (*engine.Request, error) {
	rs, es := t.AddEach([]*splice.Site{s}, spec)
	return rs[0], es[0]
}

// RemoveEach removes each request through its region's engine; errs[i]
// is the i-th request's error.
func (t *Target) RemoveEach(reqs []*engine.Request) []error {
	errs := make([]error, len(reqs))
	order, groups := byRegion(reqs, func(q *engine.Request) (*region, error) {
		if r := t.owner[q]; r != nil {
			return r, nil
		}
		return nil, fmt.Errorf("request at %s: not one of this process's", q.Site().Where())
	}, errs)
	for _, r := range order {
		idx := groups[r]
		sub := pick(reqs, idx)
		for k, err := range r.eng.RemoveEach(sub) {
			errs[idx[k]] = err
			if err == nil {
				delete(t.owner, sub[k])
			}
		}
	}
	return errs
}

// Hit: the request's first counter slot is not zero (a coverage flag).
func (t *Target) Hit(q *engine.Request) bool { return t.Counter(q, 0) != 0 }

// Counter reads the request's i-th counter slot, with the process
// running.
func (t *Target) Counter(q *engine.Request, i int) uint64 {
	r := t.owner[q]
	if r == nil || i >= len(q.Slots()) {
		return 0
	}
	return r.dev.Counter(q.Slots()[i])
}

// Installed describes the request's point (engine.Engine.Installed).
func (t *Target) Installed(q *engine.Request) engine.Installed {
	if r := t.owner[q]; r != nil {
		in := r.eng.Installed(q)
		if in.Class == springboard.Trap && r.dev.Punned(in.Site.Addr()) {
			in.Class = springboard.Pun
		}
		return in
	}
	return engine.Installed{Site: q.Site()}
}

// Splices is the number of splices installed, in every region.
func (t *Target) Splices() int {
	n := 0
	for _, r := range t.regions {
		n += r.dev.Splices()
	}
	return n
}

// Mapped: some region of kinst's is mapped into the process.
func (t *Target) Mapped() bool {
	for _, r := range t.regions {
		if r.dev.Mapped() {
			return true
		}
	}
	return false
}
