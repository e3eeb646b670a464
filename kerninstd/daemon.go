package kerninstd

import (
	"crypto/rand"

	"encoding/hex"
	"errors"
	"fmt"
	"github.com/kinst/kinst/bpfprobe"
	"log/slog"
	"sync"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/report"
	"github.com/kinst/kinst/splice"
)

// Config configures a Daemon.
type Config struct {
	Device   engine.Device
	Kallsyms string // default /proc/kallsyms
	// KprobeBlacklist is the kernel's kprobe blacklist, whose functions
	// are refused; default kernel.KprobeBlacklistPath when Kallsyms is
	// the running kernel's (/proc/kallsyms, named or by default).
	KprobeBlacklist string
	Release         string // kernel release; default from /proc/sys/kernel/osrelease
	Info            func() api.Info
	Log             *slog.Logger
	// BTF is the kernel's BTF (kernel.BTFPath), for function prototypes
	// and the struct layouts the module and ftrace table walkers need;
	// "": none: liveness stays conservative at calls and only the core
	// kernel's tables are read.
	BTF string
	// CacheDir keeps the whole-kernel analysis across restarts; "" off.
	CacheDir string
	// Notes and Modules identify the kernel build and module set for the
	// cache (default /sys/kernel/notes and /proc/modules).
	Notes, Modules string
	// TaskLayout locates current's pid, tgid and comm for filters
	// (default: the kernel view's, from BTF).
	TaskLayout func(*kernel.Symbols) (kernel.TaskLayout, error)
	// Clock is the daemon's time (default: the system's).
	Clock Clock
	// BPF, when set, is the mechanism without the driver: Device is then
	// a *BPFDevice over the same set, and only count and time are served
	// (see bpfmode.go).
	BPF *bpfprobe.Set
	// NoSplice, with BPF, is why the driver is not used (driver.ErrNotLoaded,
	// or a CPU quirk that splicing would turn into an oops: cpuquirk); a
	// request that needs the driver is refused with it.
	NoSplice error
}

// Daemon owns the engine and every session.
type Daemon struct {
	dev  engine.Device // reads of memory and counters; every change goes through eng
	log  *slog.Logger
	info func() api.Info

	eng  *engine.Engine  // installs and removes splices; has its own lock
	plan *splice.Planner // resolves points; has its own locks
	// view is the running kernel as kinst reads it (through the engine's
	// text view: spliced bytes read as the originals): symbols, BTF,
	// layouts, the module list and the kernel's own tables. The planner
	// reads the same view.
	view *kernel.Program

	an *kernelCensus // the whole-kernel analysis; has its own lock

	clock Clock // session times, sampling ticks; converts the timers' TSC ticks

	bpf *bpfprobe.Set // nil with the driver; else every probe is BPF's
	// noSplice is why there is no driver (Config.NoSplice); may be nil.
	noSplice error

	tm *timing // timers: resolution, attachment, task layout

	// mu serialises sessions' changes (a session's requests are made
	// and removed together); it protects sessions and every session's
	// reqs and timers. Lock order: mu before the engine's lock.
	mu       sync.Mutex
	sessions map[string]*session // by ID
}

// session is what one request installed. Its fields do not change after
// creation except reqs, timers and streamed, under Daemon.mu.
type session struct {
	id      string
	name    string
	created time.Time
	expires time.Time   // zero: no TTL
	expiry  *time.Timer // removes the session at expires
	tied    bool
	// streamed: a sample stream has been opened for the session (a
	// tied one is removed unclaimed without one). Under Daemon.mu.
	streamed bool
	reqs     []*engine.Request // in the order of the session's points
	timers   []*timedFunc
	cover    *coverState   // a coverage session's probes; nil for others
	bpf      []*bpfCount   // without the driver: the points' BPF counters
	done     chan struct{} // closed when the session is removed
}

// New loads the symbol table and returns a daemon ready to serve.
func New(c Config) (*Daemon, error) {
	d := &Daemon{
		dev:      c.Device,
		log:      c.Log,
		info:     c.Info,
		sessions: make(map[string]*session),
		clock:    c.Clock,
		bpf:      c.BPF,
		noSplice: c.NoSplice,
	}
	if d.clock == nil {
		d.clock = systemClock{metrics.NewClock()}
	}
	if d.log == nil {
		d.log = slog.Default()
	}
	d.an = &kernelCensus{log: d.log, cacheDir: c.CacheDir, notesPath: c.Notes, modulesPath: c.Modules}
	if d.an.notesPath == "" {
		d.an.notesPath = "/sys/kernel/notes"
	}
	if d.an.modulesPath == "" {
		d.an.modulesPath = "/proc/modules"
	}
	d.eng = engine.New(engine.Config{Device: c.Device, Log: d.log, PatchHeap: func() uint64 {
		if d.info != nil {
			return uint64(d.info().PatchHeap)
		}
		return 0
	}})
	view, err := kernel.Live(d.eng.Text(), kernel.LiveOptions{Kallsyms: c.Kallsyms, BTF: c.BTF, Release: c.Release})
	if err != nil {
		return nil, fmt.Errorf("load symbols: %w", err)
	}
	d.view = view
	// The running kernel's own symbols: its blacklist and module list
	// apply. (kerninstd's --kallsyms defaults to /proc/kallsyms by name:
	// testing for "" alone left both unread in production.)
	liveKernel := c.Kallsyms == "" || c.Kallsyms == kernel.KallsymsPath
	bl := c.KprobeBlacklist
	if bl == "" && liveKernel {
		bl = kernel.KprobeBlacklistPath
	}
	pc := splice.Config{Kernel: view, Springboards: d.eng.Springboards(), Log: d.log, KprobeBlacklist: bl}
	if liveKernel { // watch its modules come and go
		pc.Modules = d.an.modulesPath
		pc.TextGone = func(lo, hi uint64) { d.eng.ForgetText(lo, hi) }
	}
	p, err := splice.New(pc)
	if err != nil {
		return nil, err
	}
	d.plan = p
	d.an.plan, d.an.eng = p, d.eng
	d.tm = &timing{eng: d.eng, plan: p, clock: d.clock, loadTask: c.TaskLayout}
	if d.tm.loadTask == nil {
		d.tm.loadTask = func(*kernel.Symbols) (kernel.TaskLayout, error) { return view.TaskLayout() }
	}
	return d, nil
}

// Info reports the daemon's state.
func (d *Daemon) Info() api.Info {
	in := d.deviceInfo()
	in.KernelRelease = d.view.Release()
	in.Mechanism = MechanismSplice
	if d.bpf != nil {
		in.Mechanism = "bpf"
		if d.noSplice != nil {
			in.NoSplice = d.noSplice.Error()
		}
	}
	in.Symbols = d.plan.Symbols().Len()
	d.mu.Lock()
	in.Sessions = len(d.sessions)
	d.mu.Unlock()
	st := d.eng.State()
	in.Splices, in.CoveringArmed, in.CoveringJumps = st.Splices, st.CoveringArmed, st.CoveringJumps
	in.StaleCounterWrites = d.eng.StaleCounterWrites()
	in.DirtyFreeCounters, _ = d.eng.DirtyFreeCounters()
	return in
}

// deviceInfo is what the device reports (the driver's splice table,
// heaps, build), without the daemon's own state: Info adds that, and a
// scan of the counter heap a cover request need not wait for.
func (d *Daemon) deviceInfo() api.Info {
	if d.info == nil {
		return api.Info{}
	}
	return d.info()
}

// refresh brings the planner's facts up to date with the modules loaded
// now (splice.Planner.Refresh) before a request is planned: text of a
// module that went is forgotten, the symbols read again.
func (d *Daemon) refresh() {
	if err := d.plan.Refresh(); err != nil {
		d.log.Warn("module list unreadable; symbols as last read", "err", err)
	}
}

// Resolve maps a point to its instruction without changing anything.
func (d *Daemon) Resolve(point string) (api.Resolved, error) {
	d.refresh()
	s, err := d.plan.Resolve(point)
	if err != nil {
		return api.Resolved{}, err
	}
	return report.Resolved(s), nil
}

// resolvePoints checks a request's shape and resolves its points, each
// also passing check if set. It changes nothing.
func (d *Daemon) resolvePoints(req api.SessionRequest, check func(*splice.Site) error) ([]*splice.Site, error) {
	if len(req.Points) == 0 && len(req.Timers) == 0 && len(req.Regions) == 0 && req.Lock == "" {
		return nil, badRequest(errors.New("no points or functions given"))
	}
	if req.TTLNS < 0 {
		return nil, badRequest(errors.New("negative time-to-live"))
	}
	sites := make([]*splice.Site, len(req.Points))
	for i, p := range req.Points {
		s, err := d.plan.Resolve(p)
		if err == nil && check != nil {
			err = check(s)
		}
		if err != nil {
			return nil, &splice.PointError{Point: p, Err: err}
		}
		sites[i] = s
	}
	return sites, nil
}

// CreateSession installs a counter at every point, or none.
func (d *Daemon) CreateSession(req api.SessionRequest) (api.Session, error) {
	d.refresh()
	if d.bpf != nil {
		return d.createBPFSession(req)
	}
	if isCover(req) {
		return d.createCover(req)
	}
	sites, err := d.resolvePoints(req, nil)
	if err != nil {
		return api.Session{}, err
	}
	timers, pred, err := d.tm.resolveTimers(req)
	if err != nil {
		return api.Session{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ss, err := d.newSessionLocked(req)
	if err != nil {
		return api.Session{}, err
	}
	for _, t := range timers {
		if err := d.tm.attachTimed(ss.id, t, pred); err != nil {
			if rerr := d.removeLocked(ss); rerr != nil {
				d.log.Error("roll back session", "err", rerr)
			}
			return api.Session{}, &splice.PointError{Point: t.function, Err: err}
		}
		ss.timers = append(ss.timers, t)
		d.log.Info("timing", "session", ss.id, "function", t.function, "exits", len(t.exits), "filter", t.filter)
	}
	// Every point in one engine call: patches written together, splices
	// in driver batches (one round of CPU synchronisations a batch, not
	// one a point). Any refusal rolls the whole session back.
	reqs, errs := d.eng.AddEach(sites, engine.Spec{Owner: ss.id, Slots: 1, Snippet: engine.CounterSnippet})
	for i, r := range reqs {
		if errs[i] == nil && r != nil {
			ss.reqs = append(ss.reqs, r)
		}
	}
	for i, err := range errs {
		if err != nil {
			if rerr := d.removeLocked(ss); rerr != nil {
				d.log.Error("roll back session", "err", rerr)
			}
			return api.Session{}, &splice.PointError{Point: sites[i].Point().Spec, Err: err}
		}
	}
	for i, r := range ss.reqs {
		s := sites[i]
		in := d.eng.Installed(r)
		d.log.Debug("spliced", "session", ss.id, "point", s.Point().Spec, "at", s.Where(), "class", in.Class,
			"addr", fmt.Sprintf("%#x", s.Addr()), "patch", fmt.Sprintf("%#x", in.Patch),
			"requests", in.Requests, "slot", r.Counter())
	}
	if len(sites) > 0 {
		d.log.Info("spliced", "session", ss.id, "points", len(sites))
	}
	d.sessions[ss.id] = ss
	d.startTTL(ss, time.Duration(req.TTLNS))
	return d.describe(ss), nil
}

// newSessionLocked makes the session req asks for, named as asked or
// after its ID, refusing a name in use. The caller holds d.mu.
func (d *Daemon) newSessionLocked(req api.SessionRequest) (*session, error) {
	ss := &session{id: newID(), name: req.Name, created: d.clock.Now(), tied: req.Tied, done: make(chan struct{})}
	if ss.name == "" {
		ss.name = ss.id
	}
	if err := d.checkName(ss.name); err != nil {
		return nil, err
	}
	return ss, nil
}

func (d *Daemon) describe(ss *session) api.Session {
	out := api.Session{ID: ss.id, Name: ss.name, Created: ss.created, Tied: ss.tied}
	if !ss.expires.IsZero() {
		e := ss.expires
		out.Expires = &e
	}
	for _, r := range ss.reqs {
		res := report.Resolved(r.Site())
		in := d.eng.Installed(r)
		res.SpliceClass = in.Class.String() // as installed
		out.Probes = append(out.Probes, api.Probe{Resolved: res, Count: d.eng.Counter(r.Counter()),
			Patch: api.Addr(in.Patch), Springboard: api.Addr(in.Springboard), Mechanism: MechanismSplice})
	}
	for _, c := range ss.bpf {
		res := report.Resolved(c.site)
		res.SpliceClass = ""
		out.Probes = append(out.Probes, api.Probe{Resolved: res, Count: d.eng.Counter(c.slot), Mechanism: c.probe.Mechanism()})
	}
	now := d.clock.Now()
	for _, t := range ss.timers {
		out.Timers = append(out.Timers, d.tm.timerInfo(t, now))
	}
	if ss.cover != nil {
		out.Cover = ss.cover.summary(ss.name, d.clock.Now())
	}
	return out
}

// ErrNoSession is returned for an unknown session ID.
var ErrNoSession = errors.New("no such session")

// RemoveSession removes every splice of a session and returns its final
// counts.
func (d *Daemon) RemoveSession(id string) (api.Session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ss := d.findLocked(id)
	if ss == nil {
		return api.Session{}, fmt.Errorf("%w %q", ErrNoSession, id)
	}
	if ss.cover != nil {
		ss.cover.sweep(d.eng, d.log, ss.id, d.clock.Now()) // the last hits count
	}
	final, reqs := d.describe(ss), ss.reqs
	removed, err := d.removeCountedLocked(ss)
	// The counts as the splices went, not as described a moment before:
	// the hits in between are in them.
	for i, r := range reqs {
		if c, ok := removed[r]; ok {
			final.Probes[i].Count = c
		}
	}
	if ss.cover != nil {
		// The final state, every block, made once the probes are gone:
		// a whole kernel's report is 100 MB, its probes as much again.
		final.Cover = ss.cover.final(ss.name, d.clock.Now())
	}
	delete(d.sessions, ss.id)
	return final, err
}

// removeLocked removes every request of ss, last first. A request that
// cannot be removed stays listed so a later attempt (or the driver, on
// close) restores it.
func (d *Daemon) removeLocked(ss *session) error {
	_, err := d.removeCountedLocked(ss)
	return err
}

// removeCountedLocked is removeLocked that also returns the final count
// of each request it took out, read as it went (engine.RemoveCounted).
func (d *Daemon) removeCountedLocked(ss *session) (removed map[*engine.Request]uint64, err error) {
	var errs []error
	if ss.expiry != nil {
		ss.expiry.Stop()
	}
	var keptTimers []*timedFunc
	if d.bpf != nil {
		var berrs []error
		ss.timers, berrs = d.removeBPFLocked(ss)
		errs = append(errs, berrs...)
	}
	for _, t := range ss.timers {
		if t.bpf != nil {
			keptTimers = append(keptTimers, t)
			continue
		}
		if err := d.tm.detachTimed(t); err != nil {
			errs = append(errs, err)
			keptTimers = append(keptTimers, t)
			continue
		}
		d.log.Info("timer removed", "session", ss.id, "function", t.function)
	}
	ss.timers = keptTimers
	// Last first, all in one engine call: points that are their last
	// request's are unspliced in driver batches, one round of CPU syncs
	// per batch, and their patches freed after one grace period.
	var kept []*engine.Request
	rev := make([]*engine.Request, len(ss.reqs))
	for i, r := range ss.reqs {
		rev[len(ss.reqs)-1-i] = r
	}
	errsRev, counts := d.eng.RemoveCounted(rev)
	for i, err := range errsRev {
		r := rev[i]
		if err != nil {
			errs = append(errs, err)
			kept = append([]*engine.Request{r}, kept...)
			continue
		}
		if removed == nil {
			removed = make(map[*engine.Request]uint64, len(rev))
		}
		removed[r] = counts[i]
		d.log.Debug("unspliced", "session", ss.id, "at", r.Site().Where(), "requests left", d.eng.Installed(r).Requests)
	}
	if n := len(rev) - len(kept); n > 0 {
		d.log.Info("unspliced", "session", ss.id, "points", n)
	}
	ss.reqs = kept
	coverGone := true
	if ss.cover != nil {
		var err error
		if coverGone, err = ss.cover.remove(d.eng, d.log, ss.id, d.clock.Now()); err != nil {
			errs = append(errs, err)
		}
	}
	if len(kept) == 0 && len(keptTimers) == 0 && len(ss.bpf) == 0 && coverGone {
		select {
		case <-ss.done:
		default:
			close(ss.done)
		}
	}
	return removed, errors.Join(errs...)
}

// Close removes every session.
func (d *Daemon) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for id, ss := range d.sessions {
		errs = append(errs, d.removeLocked(ss))
		delete(d.sessions, id)
	}
	d.eng.Reclaim()
	return errors.Join(errs...)
}

func newID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}
