package kerninstd

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/report"
	"github.com/kinst/kinst/splice"
)

// ErrNameTaken is returned when a live session already has the name.
var ErrNameTaken = errors.New("session name in use")

// checkName refuses a name another live session has (as its name or ID).
// The caller holds d.mu.
func (d *Daemon) checkName(name string) error {
	if other := d.findLocked(name); other != nil {
		return badRequest(fmt.Errorf("%w: %q (session %s); detach it first", ErrNameTaken, name, other.id))
	}
	return nil
}

// findLocked finds a session by ID, then by name. The caller holds d.mu.
func (d *Daemon) findLocked(idOrName string) *session {
	if ss, ok := d.sessions[idOrName]; ok {
		return ss
	}
	for _, ss := range d.sessions {
		if ss.name == idOrName {
			return ss
		}
	}
	return nil
}

// startTTL arranges for ss to remove itself after ttl. The caller holds
// d.mu.
func (d *Daemon) startTTL(ss *session, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	ss.expires = ss.created.Add(ttl)
	ss.expiry = time.AfterFunc(ttl, func() {
		if _, err := d.RemoveSession(ss.id); err != nil {
			if !errors.Is(err, ErrNoSession) {
				d.log.Error("remove expired session", "session", ss.id, "err", err)
			}
			return
		}
		d.log.Info("session expired; instrumentation removed", "session", ss.id, "name", ss.name, "ttl", ttl)
	})
}

// Sessions describes every live session, oldest first, with current
// totals.
func (d *Daemon) Sessions() []api.Session {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]api.Session, 0, len(d.sessions))
	for _, ss := range d.sessions {
		out = append(out, d.describe(ss))
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// timerInfo describes a timed function with its totals at now.
func (d *Daemon) timerInfo(t *timedFunc, now time.Time) api.TimerInfo {
	ti := api.TimerInfo{Function: t.function, Filter: t.filter, Virtual: t.virtual != nil, Entry: report.Resolved(t.entry), Totals: api.Totals(d.timerPoint(t, now)),
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
func (d *Daemon) resolveTimers(req api.SessionRequest) ([]*timedFunc, codegen.Predicate, error) {
	if req.Lock != "" {
		return d.resolveWaiters(req)
	}
	if len(req.Timers) == 0 {
		if req.Filter != nil {
			return nil, nil, badRequest(errors.New("a filter applies to timed functions; none given"))
		}
		return nil, nil, nil
	}
	pred, desc, err := d.predicate(req.Filter)
	if err != nil {
		return nil, nil, err
	}
	var sw *splice.Site
	if req.Virtual {
		if err := d.loadTaskLayout(); err != nil {
			return nil, nil, fmt.Errorf("virtual timers need the task layout: %w", err)
		}
		if sw, err = d.resolveSwitch(); err != nil {
			return nil, nil, err
		}
	}
	seen := map[string]bool{}
	var out []*timedFunc
	for _, name := range req.Timers {
		t, err := d.resolveTimed(name)
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
	return out, pred, nil
}

// predicate builds the guard of a filter, with task_struct offsets from
// the kernel's BTF.
func (d *Daemon) predicate(f *api.Filter) (codegen.Predicate, string, error) {
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
	if err := d.loadTaskLayout(); err != nil {
		return nil, "", fmt.Errorf("filters need the task layout: %w", err)
	}
	l := d.task
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
func (d *Daemon) loadTaskLayout() error {
	d.taskOnce.Do(func() { d.task, d.taskErr = d.loadTask(d.symbols()) })
	return d.taskErr
}
