package kerninstd

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/springboard"
)

// Config configures a Daemon.
type Config struct {
	Device   Device
	Kallsyms string // default /proc/kallsyms
	Release  string // kernel release; default from /proc/sys/kernel/osrelease
	Info     func() api.Info
	Log      *slog.Logger
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
}

// Daemon owns the device and every session.
type Daemon struct {
	dev  Device
	log  *slog.Logger
	info func() api.Info

	// view is the running kernel as kinst reads it (through text():
	// spliced bytes read as the originals): symbols, BTF, layouts, the
	// module list and the kernel's own tables. Its symbols are an
	// immutable snapshot, replaced by reloadSymbols.
	view      *kernel.Program
	protoWarn sync.Once // logs once that prototypes are unavailable

	cacheDir, notesPath, modulesPath string

	ownMu    sync.Mutex         // protects owned and ownedFor
	owned    *kernel.OwnedSites // instructions the kernel's own tables name; nil if unreadable
	ownedFor *kernel.Symbols    // the symbol snapshot owned was read with

	anMu     sync.Mutex      // protects noret, reads, stats, calls and callSyms
	noret    cfg.NoReturnSet // from the whole-kernel analysis; nil until it ran
	reads    cfg.CalleeReads // its callee summaries; nil until it ran
	stats    *cfg.Stats      // its census
	calls    *cfg.CallGraph  // its call graph (not cached on disk)
	callSyms *kernel.Symbols // the symbols the graph's addresses belong to

	spring *springboard.Heap // springboard space; has its own lock
	ov     overlay           // original bytes under our splices; has its own lock

	cover coverFinisher // writes armed covering splices' jmps; has its own lock

	clock Clock // session times, sampling ticks; converts the timers' TSC ticks

	taskOnce sync.Once
	loadTask func(*kernel.Symbols) (kernel.TaskLayout, error)
	task     kernel.TaskLayout // where current's pid, tgid and comm are
	taskErr  error

	mu       sync.Mutex          // serialises every change to the kernel; protects the fields below
	sessions map[string]*session // by ID
	points   map[uint64]*point   // instrumented instructions by address
	retired  []retired           // patches and slots waiting for reclaim
	// reclaimArmed: a reclaim of retired is scheduled.
	reclaimArmed bool
	slots        slotAllocator
}

// session is what one request installed. Its fields do not change after
// creation except reqs and timers, under Daemon.mu.
type session struct {
	id      string
	name    string
	created time.Time
	expires time.Time   // zero: no TTL
	expiry  *time.Timer // removes the session at expires
	tied    bool
	reqs    []*request // in the order of the session's points
	timers  []*timedFunc
	done    chan struct{} // closed when the session is removed
}

// New loads the symbol table and returns a daemon ready to serve.
func New(c Config) (*Daemon, error) {
	d := &Daemon{
		dev:         c.Device,
		log:         c.Log,
		info:        c.Info,
		cacheDir:    c.CacheDir,
		notesPath:   c.Notes,
		modulesPath: c.Modules,
		sessions:    make(map[string]*session),
		points:      make(map[uint64]*point),
		spring:      springboard.NewHeap(),
		slots:       slotAllocator{n: c.Device.NumCounters(), used: make(map[int]bool)},
		clock:       c.Clock,
		loadTask:    c.TaskLayout,
	}
	if d.loadTask == nil {
		d.loadTask = func(*kernel.Symbols) (kernel.TaskLayout, error) { return d.view.TaskLayout() }
	}
	if d.clock == nil {
		d.clock = systemClock{metrics.NewClock()}
	}
	if d.log == nil {
		d.log = slog.Default()
	}
	if d.notesPath == "" {
		d.notesPath = "/sys/kernel/notes"
	}
	if d.modulesPath == "" {
		d.modulesPath = "/proc/modules"
	}
	view, err := kernel.Live(d.text(), kernel.LiveOptions{Kallsyms: c.Kallsyms, BTF: c.BTF, Release: c.Release})
	if err != nil {
		return nil, fmt.Errorf("load symbols: %w", err)
	}
	d.view = view
	return d, nil
}

// text reads kernel text for analysis: live bytes, with the original
// bytes wherever kerninstd has spliced.
func (d *Daemon) text() textView { return textView{dev: d.dev, ov: &d.ov} }

func (d *Daemon) symbols() *kernel.Symbols {
	s, _ := d.view.KernelSymbols() // loaded by New; a failed reload keeps the last
	return s
}

// prototypes returns the kernel's function prototypes from BTF, loaded on
// first use. Without BTF the analysis assumes every call reads all six
// argument registers.
func (d *Daemon) prototypes() kernel.Prototypes {
	p, err := d.view.Prototypes()
	if err != nil && !errors.Is(err, kernel.ErrNoBTF) {
		d.protoWarn.Do(func() { d.log.Warn("no function prototypes; liveness stays conservative at calls", "err", err) })
	}
	return p
}

// ownedSites returns the instructions the kernel's exception, jump-label,
// static-call and ftrace tables name (core kernel and modules), read from
// live memory. They are read again whenever the symbols are reloaded,
// which is what happens when a lookup meets a newly loaded module.
func (d *Daemon) ownedSites() *kernel.OwnedSites {
	syms := d.symbols()
	d.ownMu.Lock()
	defer d.ownMu.Unlock()
	if d.ownedFor == syms {
		return d.owned
	}
	o, n, err := d.view.OwnedSites()
	d.ownedFor = syms
	switch {
	case o == nil:
		d.log.Warn("kernel tables unreadable; their sites are not refused", "err", err)
		d.owned = nil
		return nil
	case err != nil && !errors.Is(err, kernel.ErrNoBTF):
		d.log.Warn("modules' tables or ftrace's records unreadable; only the core kernel's tables are refused", "err", err)
	}
	d.owned = o
	d.log.Info("kernel tables read", "ex_table", n.ExTable, "jump_labels", n.JumpLabels, "static_calls", n.StaticCalls,
		"ftrace", n.Ftrace, "modules", n.Modules)
	return o
}

func (d *Daemon) reloadSymbols() (*kernel.Symbols, error) {
	s, err := d.view.Reload()
	if err != nil {
		return nil, fmt.Errorf("load symbols: %w", err)
	}
	return s, nil
}

// Info reports the daemon's state.
func (d *Daemon) Info() api.Info {
	var in api.Info
	if d.info != nil {
		in = d.info()
	}
	in.KernelRelease = d.view.Release()
	in.Symbols = d.symbols().Len()
	d.mu.Lock()
	in.Sessions = len(d.sessions)
	for addr, pt := range d.points {
		if pt.site.insn().Addr == addr { // not the covered instructions' entries
			in.Splices++
		}
	}
	in.CoveringArmed, in.CoveringJumps = d.cover.state()
	d.mu.Unlock()
	return in
}

// Resolve maps a point to its instruction without changing anything.
func (d *Daemon) Resolve(point string) (api.Resolved, error) {
	s, err := d.resolve(point)
	if err != nil {
		return api.Resolved{}, err
	}
	return s.resolved(), nil
}

// PointError ties an error to the point that caused it.
type PointError struct {
	Point string
	Err   error
}

func (e *PointError) Error() string { return fmt.Sprintf("%s: %v", e.Point, e.Err) }
func (e *PointError) Unwrap() error { return e.Err }

// CreateSession installs a counter at every point, or none.
func (d *Daemon) CreateSession(req api.SessionRequest) (api.Session, error) {
	if len(req.Points) == 0 && len(req.Timers) == 0 && req.Lock == "" {
		return api.Session{}, badRequest(errors.New("no points or functions given"))
	}
	if req.TTLNS < 0 {
		return api.Session{}, badRequest(errors.New("negative time-to-live"))
	}
	sites := make([]*site, len(req.Points))
	for i, p := range req.Points {
		s, err := d.resolve(p)
		if err != nil {
			return api.Session{}, &PointError{Point: p, Err: err}
		}
		sites[i] = s
	}
	timers, pred, err := d.resolveTimers(req)
	if err != nil {
		return api.Session{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ss := &session{id: newID(), name: req.Name, created: d.clock.Now(), tied: req.Tied, done: make(chan struct{})}
	if ss.name == "" {
		ss.name = ss.id
	}
	if err := d.checkName(ss.name); err != nil {
		return api.Session{}, err
	}
	for _, t := range timers {
		if err := d.attachTimed(ss.id, t, pred); err != nil {
			if rerr := d.removeLocked(ss); rerr != nil {
				d.log.Error("roll back session", "err", rerr)
			}
			return api.Session{}, &PointError{Point: t.function, Err: err}
		}
		ss.timers = append(ss.timers, t)
		d.log.Info("timing", "session", ss.id, "function", t.function, "exits", len(t.exits), "filter", t.filter)
	}
	for _, s := range sites {
		r, err := d.instrument(s, ss.id, 1, CounterSnippet)
		if err != nil {
			if rerr := d.removeLocked(ss); rerr != nil {
				d.log.Error("roll back session", "err", rerr)
			}
			return api.Session{}, &PointError{Point: s.point.Spec, Err: err}
		}
		ss.reqs = append(ss.reqs, r)
		d.log.Info("spliced", "session", ss.id, "point", s.point.Spec, "at", s.where(), "class", r.pt.class,
			"addr", fmt.Sprintf("%#x", s.insn().Addr), "patch", fmt.Sprintf("%#x", r.pt.patch),
			"requests", len(r.pt.reqs), "slot", r.counter())
	}
	d.sessions[ss.id] = ss
	d.startTTL(ss, time.Duration(req.TTLNS))
	return d.describe(ss), nil
}

func (d *Daemon) describe(ss *session) api.Session {
	out := api.Session{ID: ss.id, Name: ss.name, Created: ss.created, Tied: ss.tied}
	if !ss.expires.IsZero() {
		e := ss.expires
		out.Expires = &e
	}
	for _, r := range ss.reqs {
		res := r.site.resolved()
		res.SpliceClass = r.pt.class.String() // as installed
		out.Probes = append(out.Probes, api.Probe{Resolved: res, Count: d.dev.Counter(r.counter()),
			Patch: api.Addr(r.pt.patch), Springboard: api.Addr(r.pt.slot)})
	}
	now := d.clock.Now()
	for _, t := range ss.timers {
		out.Timers = append(out.Timers, d.timerInfo(t, now))
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
	final := d.describe(ss)
	err := d.removeLocked(ss)
	delete(d.sessions, ss.id)
	return final, err
}

// removeLocked removes every request of ss, last first. A request that
// cannot be removed stays listed so a later attempt (or the driver, on
// close) restores it.
func (d *Daemon) removeLocked(ss *session) error {
	var errs []error
	if ss.expiry != nil {
		ss.expiry.Stop()
	}
	var keptTimers []*timedFunc
	for _, t := range ss.timers {
		if err := d.detachTimed(t); err != nil {
			errs = append(errs, err)
			keptTimers = append(keptTimers, t)
			continue
		}
		d.log.Info("timer removed", "session", ss.id, "function", t.function)
	}
	ss.timers = keptTimers
	var kept []*request
	for i := len(ss.reqs) - 1; i >= 0; i-- {
		r := ss.reqs[i]
		if err := d.uninstrument(r); err != nil {
			errs = append(errs, err)
			kept = append([]*request{r}, kept...)
			continue
		}
		d.log.Info("unspliced", "session", ss.id, "at", r.pt.site.where(), "requests left", len(r.pt.reqs))
	}
	ss.reqs = kept
	if len(kept) == 0 && len(keptTimers) == 0 {
		select {
		case <-ss.done:
		default:
			close(ss.done)
		}
	}
	return errors.Join(errs...)
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
	d.reclaimLocked()
	return errors.Join(errs...)
}

func newID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}
