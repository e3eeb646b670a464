// Package procsession hosts sessions over a user process in kinst
// itself, behind the same API types kerninstd serves for the kernel
// (api.Session, api.CFG, api.CoverReport): counters, timers and coverage
// spliced through the process engine (package process), so that what is
// built on kerninstd's API (the web view) works on a process too.
//
// A Host holds the process attached (ptrace) for its life; Close removes
// every session's splices and lets the process go, every byte of its
// text as it was.
package procsession

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cover"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/process"
	"github.com/kinst/kinst/report"
	"github.com/kinst/kinst/splice"
)

// ErrNoSession is matched when no session has the ID or name given.
var ErrNoSession = errors.New("no such session")

// ErrProcessGone is matched once the process has exited or run exec: its
// splices went with its program.
var ErrProcessGone = errors.New("the process has exited or run exec")

// Host is the sessions over one process.
type Host struct {
	// mu serialises every use of tg (the process engine is not safe for
	// concurrent use) and protects sessions, next, gone, ended, closed
	// and debug (and each session's fields). log is written under it.
	mu       sync.Mutex
	tg       *process.Target
	pid      int
	comm     string
	clock    *metrics.Clock
	sessions map[string]*session // by ID
	next     int
	gone     bool
	// ended is how the process went: "exec" or "exited" once gone.
	ended  string
	closed bool          // by Close: the counters are unmapped
	done   chan struct{} // closed by Close: the pollers stop
	goneC  chan struct{} // closed when gone is set: the sample streams end
	log    io.Writer     // what kinst says as it goes (a library loaded, an exec)
	opened time.Time
	// coverTraps: coverage may use trap splices (Options.CoverTraps).
	coverTraps bool
	// debug is each module's DWARF for Lines and coverage reports (""
	// the executable), nil where it has none; opened on first use.
	debug map[string]*debuginfo.File
}

// session is one request's instrumentation.
type session struct {
	id, name string
	created  time.Time
	// points are the counters' points as asked, sites where each
	// resolved and reqs its splice: nil for a point in a library the
	// process has not loaded yet (pending), spliced when it does.
	points  []string
	sites   []*splice.Site
	reqs    []*engine.Request
	pending map[int]bool
	timers  []*timer
	cover   *cover.Set
	// coverSeen are the functions covered, by address; coverModules
	// their modules ("" the executable); coverPending the LIB: targets
	// whose library is not loaded yet.
	coverSeen    map[uint64]bool
	coverModules map[string]bool
	coverPending []string
}

// timer is a process.Timer and its accumulated totals.
type timer struct {
	*process.Timer
	acc   metrics.TimerAcc
	wall  float64
	calls uint64
}

// Options are how a Host reports as it goes.
type Options struct {
	// Log gets a line for each event a user should know of: a pending
	// point's library loaded, the process's exec. Nil: io.Discard.
	Log io.Writer
	// CoverTraps lets coverage use trap splices (process.TrapHazard
	// says why they are refused by default).
	CoverTraps bool
}

// Open attaches to process pid.
func Open(pid int, o Options) (*Host, error) {
	tg, err := process.Attach(pid)
	if err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	tg.SetStopNote(func(msg string) { fmt.Fprintf(o.Log, "kinst: %s\n", msg) })
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	h := &Host{tg: tg, pid: tg.PID, comm: strings.TrimSpace(string(comm)), clock: metrics.NewClock(),
		sessions: map[string]*session{}, done: make(chan struct{}), goneC: make(chan struct{}), debug: map[string]*debuginfo.File{},
		log: o.Log, opened: time.Now(), coverTraps: o.CoverTraps}
	go h.poll()
	return h, nil
}

// Ended is how the process went: "exec" (its splices went with its old
// program), "exited", or "" while it runs the program attached to.
func (h *Host) Ended() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.alive()
	return h.ended
}

// Close removes every session and lets the process go.
func (h *Host) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.done:
		return nil
	default:
		close(h.done)
	}
	defer func() { h.closed = true }()
	for _, d := range h.debug {
		if d != nil {
			d.Close()
		}
	}
	if h.gone || !h.alive() {
		h.tg.Abandon()
		return nil
	}
	var errs []error
	for _, s := range h.sessions {
		errs = append(errs, h.removeLocked(s))
	}
	h.sessions = map[string]*session{}
	errs = append(errs, h.tg.Close())
	return errors.Join(errs...)
}

// alive reports whether the process still runs the program attached to.
// The caller holds h.mu.
func (h *Host) alive() bool {
	if h.gone {
		return false
	}
	if !process.Alive(h.pid) {
		h.gone, h.ended = true, "exited"
	} else if exe, ex := h.tg.Exec(); ex {
		h.gone, h.ended = true, "exec"
		fmt.Fprintf(h.log, "kinst: process %d ran exec (now %s) %s after the start: kinst's probes went with the program it attached to, and the report covers what ran before; to measure the new program, attach to it (-p %d) or run it directly after --\n",
			h.pid, exe, time.Since(h.opened).Round(time.Millisecond), h.pid)
	}
	if h.gone {
		close(h.goneC)
	}
	return !h.gone
}

// check is ErrProcessGone once the process is. The caller holds h.mu.
func (h *Host) check() error {
	if !h.alive() {
		return fmt.Errorf("process %d: %w", h.pid, ErrProcessGone)
	}
	return nil
}

// poll sweeps the coverage sessions every cover.Poll (probes that ran
// mark their blocks covered and are removed), splices the pending points
// whose library the process has loaded, and notices its exit or exec.
func (h *Host) poll() {
	t := time.NewTicker(cover.Poll)
	defer t.Stop()
	for {
		select {
		case <-h.done:
			return
		case now := <-t.C:
			h.mu.Lock()
			if h.alive() {
				h.loadPending()
				for _, s := range h.sessions {
					if s.cover != nil {
						s.cover.Sweep(h.tg, now)
					}
				}
			}
			h.mu.Unlock()
		}
	}
}

// Info describes the process as kerninstd's Info describes the kernel.
func (h *Host) Info(context.Context) (api.Info, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return api.Info{Mechanism: "process", Target: fmt.Sprintf("process %d (%s)", h.pid, h.comm),
		Sessions: len(h.sessions), Splices: h.tg.Splices()}, nil
}

// MaxFunctions bounds one Functions answer, as kerninstd's.
const MaxFunctions = 1000

// qualified is how a point names a function of module: LIB:NAME for a
// library's, NAME for the executable's.
func qualified(module, name string) string {
	if module == "" {
		return name
	}
	return module + ":" + name
}

// Functions finds the process's functions as kerninstd's /v1/functions
// finds the kernel's (LIB: keeps one library's); their names are
// qualified (LIB:NAME), as points and /fn/ take them.
func (h *Host) Functions(_ context.Context, q string, limit int) (api.Functions, error) {
	if limit < 1 || limit > MaxFunctions {
		return api.Functions{}, badRequest(fmt.Errorf("limit %d: want 1..%d", limit, MaxFunctions))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return report.FindFunctions(h.tg.Syms, q, limit, report.FindOptions{Name: func(s kernel.Symbol) string { return qualified(s.Module, s.Name) }}), nil
}

// CFG is a function's control-flow graph (spec: FUNC or LIB:FUNC), its
// Function qualified as spec names it.
func (h *Host) CFG(_ context.Context, spec string) (api.CFG, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.check(); err != nil {
		return api.CFG{}, err
	}
	f, err := h.tg.Func(spec)
	if err != nil {
		return api.CFG{}, badRequest(err)
	}
	g := report.CFG(f)
	g.Function = qualified(g.Module, g.Function)
	return g, nil
}

// LibraryDebug opens the debug information of the library lib names
// ("libc" for libc.so.6): its own DWARF, or its separate debug file by
// build id. The caller closes it.
func (h *Host) LibraryDebug(lib string) (*debuginfo.File, error) {
	h.mu.Lock()
	_, path, ok := h.tg.Library(lib)
	h.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w %s", process.ErrNoLibrary, lib)
	}
	d, err := debuginfo.OpenOrFind(path)
	if err == nil {
		d.PlaceMergedLines() // a library's lines as gdb places them
	}
	return d, err
}

// Lines fills the source lines of a function's instructions from its
// module's DWARF (the executable's, or a library's own or its separate
// debug file by build id): runtime addresses less the module's load
// slide (the function's address less its symbol's in the file). Nothing
// where the module has none.
func (h *Host) Lines(cfg *api.CFG) {
	h.mu.Lock()
	defer h.mu.Unlock()
	dbg := h.openDebug(cfg.Module)
	if dbg == nil {
		return
	}
	link, ok := dbg.Symbols().Addr(strings.TrimPrefix(cfg.Function, cfg.Module+":"))
	if !ok {
		return
	}
	report.CFGLines(cfg, dbg, uint64(cfg.Address)-link)
}

// CreateSession installs a session: counters at Points, timers of
// Timers, or coverage of Cover (functions or globs, LIB: for a library)
// and CoverCallees. What a process cannot take (filters, virtual time,
// lock waits, modules, TTLs, tied sessions) is refused; on error nothing
// stays installed.
func (h *Host) CreateSession(_ context.Context, req api.SessionRequest) (api.Session, error) {
	switch {
	case req.Filter != nil, req.Virtual, req.Lock != "":
		return api.Session{}, badRequest(errors.New("a process session takes no filter, virtual time or lock"))
	case len(req.CoverModules) > 0:
		return api.Session{}, badRequest(errors.New("cover a library's functions with LIB:* (cover_modules names kernel modules)"))
	case req.TTLNS != 0 || req.Tied:
		return api.Session{}, badRequest(errors.New("a process session lives until it is removed (no TTL, not tied)"))
	}
	cov := len(req.Cover) > 0 || len(req.CoverCallees) > 0
	timed := len(req.Timers) > 0 || len(req.Regions) > 0
	if cov && (len(req.Points) > 0 || timed) {
		return api.Session{}, badRequest(errors.New("a coverage session takes functions and callees only"))
	}
	if !cov && len(req.Points) == 0 && !timed {
		return api.Session{}, badRequest(errors.New("nothing to instrument: give points, timers or functions to cover"))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.check(); err != nil {
		return api.Session{}, err
	}
	if timed {
		h.clock.TicksPerNS() // calibrated before the session's life starts
	}
	h.next++
	s := &session{id: strconv.Itoa(h.next), name: req.Name, created: time.Now()}
	if s.name == "" {
		s.name = s.id
	}
	if h.findLocked(s.name) != nil {
		return api.Session{}, badRequest(fmt.Errorf("session name in use: %q", s.name))
	}
	var err error
	switch {
	case cov:
		err = h.armCover(s, req)
	default:
		err = h.install(s, req)
	}
	if err != nil {
		h.removeLocked(s)
		return api.Session{}, err
	}
	h.sessions[s.id] = s
	return h.describe(s, false, false), nil
}

// install resolves and splices a session's counters and timers, all or
// none; a point in a library not loaded yet waits for it (pending).
func (h *Host) install(s *session, req api.SessionRequest) error {
	n := len(req.Points)
	s.points, s.sites, s.reqs, s.pending = req.Points, make([]*splice.Site, n), make([]*engine.Request, n), map[int]bool{}
	var now []int
	for i, p := range req.Points {
		site, err := h.tg.Resolve(p)
		if errors.Is(err, process.ErrNoLibrary) {
			s.pending[i] = true
			fmt.Fprintf(h.log, "kinst: %s: the library is not loaded yet; the counter is spliced when the process loads it (kinst looks every %s: calls before that are not counted)%s\n", p, cover.Poll, h.notInstalled(p))
			continue
		}
		if err != nil {
			return badRequest(&splice.PointError{Point: p, Err: err})
		}
		s.sites[i] = site
		now = append(now, i)
	}
	if err := h.count(s, now); err != nil {
		return err
	}
	for _, name := range req.Timers {
		tm, err := h.tg.Time(s.id, name)
		if err != nil {
			return badRequest(&splice.PointError{Point: name, Err: err})
		}
		s.addTimer(tm)
	}
	for _, r := range req.Regions {
		spans := make([]splice.Span, len(r.Spans))
		for i, sp := range r.Spans {
			spans[i] = splice.Span{Lo: sp.Lo, Hi: sp.Hi}
		}
		tm, err := h.tg.TimeRegion(s.id, r.Name, r.Function, spans)
		if err != nil {
			return badRequest(&splice.PointError{Point: r.Name, Err: err})
		}
		s.addTimer(tm)
	}
	return nil
}

// addTimer enters tm among s's timers, its word read as it starts.
func (s *session) addTimer(tm *process.Timer) {
	t := &timer{Timer: tm}
	_, w := tm.Read()
	t.acc.Add(w, metrics.TSC())
	s.timers = append(s.timers, t)
}

// count splices the counters of s's points idx names, all or none. The
// caller holds h.mu.
func (h *Host) count(s *session, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	ss := make([]*splice.Site, len(idx))
	for k, i := range idx {
		ss[k] = s.sites[i]
	}
	rs, err := h.tg.Count(s.id, ss)
	if err != nil {
		return err
	}
	for k, i := range idx {
		s.reqs[i] = rs[k]
	}
	return nil
}

// loadPending splices the pending points whose library the process has
// loaded since the last look. The caller holds h.mu.
func (h *Host) loadPending() {
	waiting := 0
	for _, s := range h.sessions {
		waiting += len(s.pending) + len(s.coverPending)
	}
	if waiting == 0 {
		return
	}
	if mods, err := h.tg.Refresh(); err != nil || len(mods) == 0 {
		return
	}
	for _, s := range h.sessions {
		if len(s.coverPending) > 0 {
			h.loadCover(s)
		}
		for i := range s.pending {
			site, err := h.tg.Resolve(s.points[i])
			if errors.Is(err, process.ErrNoLibrary) {
				continue
			}
			delete(s.pending, i)
			if err == nil {
				s.sites[i] = site
				err = h.count(s, []int{i})
			}
			if err != nil {
				fmt.Fprintf(h.log, "kinst: %s: %v\n", s.points[i], err)
				continue
			}
			fmt.Fprintf(h.log, "kinst: %s: its library was loaded %s after the start\n", s.points[i], time.Since(s.created).Round(time.Millisecond))
		}
	}
}

// armCover plans and arms a coverage session. Traps are refused unless
// the host was opened with CoverTraps (a probe at every block reaches
// code that runs with signals blocked). A LIB: target whose library is
// not loaded yet waits for it; a glob that matches nothing beside other
// targets is a warning.
func (h *Host) armCover(s *session, req api.SessionRequest) error {
	if !h.coverTraps {
		h.tg.NoTraps(process.TrapHazard + "; kinst cover --user --trap allows it")
	}
	set := cover.New("")
	set.Planning(time.Now())
	if req.CoverAllBlocks {
		set.AllBlocks()
	}
	s.cover, s.coverSeen, s.coverModules = set, map[uint64]bool{}, map[string]bool{}
	var lists [][]process.CoverTarget
	var unmatched []error
	for _, target := range req.Cover {
		fns, err := h.tg.Functions(target)
		switch {
		case errors.Is(err, process.ErrNoLibrary):
			s.coverPending = append(s.coverPending, target)
			fmt.Fprintf(h.log, "kinst: %s: the library is not loaded yet; its probes are armed when the process loads it (kinst looks every %s: what runs before is not seen)%s\n", target, cover.Poll, h.notInstalled(target))
			continue
		case errors.Is(err, process.ErrNoFunction) && strings.ContainsAny(target, "*?[") && len(req.Cover)+len(req.CoverCallees) > 1:
			// A glob over one object (the executable's '*' when it is
			// stripped) matching nothing does not stop the others.
			unmatched = append(unmatched, err)
			fmt.Fprintf(h.log, "kinst: warning: %v\n", err)
			continue
		case err != nil:
			return badRequest(err)
		}
		lists = append(lists, fns)
	}
	for _, root := range req.CoverCallees {
		fns, err := h.tg.Callees(root, max(req.CoverDepth, 1))
		if err != nil {
			return badRequest(err)
		}
		lists = append(lists, fns)
	}
	if len(lists) == 0 && len(s.coverPending) == 0 && len(unmatched) > 0 {
		return badRequest(errors.Join(unmatched...))
	}
	for _, fns := range lists {
		h.addCover(s, fns)
	}
	debugOpened := h.coverDebugAsync(s) // beside the arming: libc's debug file takes a tenth of a second to find and open
	set.Arm(h.tg, s.id, cover.Flag(nil), time.Now)
	alive := h.alive() // first: a process gone took its /proc/PID/root, and its debug files are no news
	debugOpened()
	if !alive {
		// Every batch after its end failed alike: say that, not why each
		// block was refused.
		how := map[string]string{"exec": "ran exec"}[h.ended]
		if how == "" {
			how = "exited"
		}
		return fmt.Errorf("process %d %s while kinst armed its probes (%d of %d blocks armed): %w", h.pid, how, set.Armed(), set.Summary(time.Now()).TotalBlocks, ErrProcessGone)
	}
	// The summary says whether anything was armed; every block's state
	// (a full report) only when nothing was, for the reason.
	if sum := set.Summary(time.Now()); sum.Armed == 0 && sum.TotalBlocks > 0 && len(s.coverPending) == 0 {
		return badRequest(fmt.Errorf("no probe could be armed over %d blocks: %s", sum.TotalBlocks, firstRefusal(report.Cover(set, "", time.Now()))))
	}
	return nil
}

// notInstalled is a warning for a LIB: point whose library is neither
// loaded nor in the process's library directories (a misspelling: the
// run would end with nothing of it seen); "" otherwise.
func (h *Host) notInstalled(point string) string {
	lib, _ := process.SplitLib(point)
	if lib == "" || h.tg.LibraryInstalled(lib) {
		return ""
	}
	return fmt.Sprintf("; warning: no library %q is in the library directories either (misspelt? one dlopen loads by a path elsewhere still counts)", lib)
}

// firstRefusal is why a report's first refused block was refused.
func firstRefusal(rep *api.CoverReport) string {
	for _, f := range rep.Functions {
		for _, b := range f.Blocks {
			if b.Refused != nil {
				return *b.Refused
			}
		}
	}
	return "every block was refused"
}

// addCover plans the functions s has not planned yet (a function two
// targets name is planned once) and says how many. The caller holds
// h.mu.
func (h *Host) addCover(s *session, fns []process.CoverTarget) (n int) {
	var fresh []process.CoverTarget
	for _, ct := range fns {
		if s.coverSeen[ct.Sym.Addr] {
			continue
		}
		s.coverSeen[ct.Sym.Addr] = true
		s.coverModules[ct.Sym.Module] = true
		fresh = append(fresh, ct)
	}
	// Planned on every CPU (libc's 3,706 functions: 280-340 ms on one
	// of two, 155-205 on both), added in order.
	plans := make([]*cover.FuncPlan, len(fresh))
	h.tg.EachFunc(fresh, func(i int, f *splice.Func) { plans[i] = s.cover.Plan(f) })
	for i, ct := range fresh {
		if ct.Err != nil {
			s.cover.AddUnreadable(ct.Sym, ct.Err)
			continue
		}
		s.cover.AddPlan(plans[i])
	}
	return len(fresh)
}

// loadCover arms the pending coverage targets of s whose library the
// process has loaded (dlopen). The caller holds h.mu.
func (h *Host) loadCover(s *session) {
	var still []string
	for _, target := range s.coverPending {
		fns, err := h.tg.Functions(target)
		if errors.Is(err, process.ErrNoLibrary) {
			still = append(still, target)
			continue
		}
		if err != nil {
			fmt.Fprintf(h.log, "kinst: %s: %v\n", target, err)
			continue
		}
		before := s.cover.Armed()
		n := h.addCover(s, fns)
		h.coverDebug(s)
		s.cover.Arm(h.tg, s.id, cover.Flag(nil), time.Now)
		fmt.Fprintf(h.log, "kinst: %s: loaded %s after the start: %d probes armed over %d functions (%d named by other targets)\n",
			target, time.Since(s.created).Round(time.Millisecond), s.cover.Armed()-before, n, len(fns)-n)
	}
	s.coverPending = still
}

// coverDebug opens the debug information of every module s covers, now:
// the process (and its /proc/PID/root) may be gone when the report is
// made. The caller holds h.mu.
func (h *Host) coverDebug(s *session) { h.coverDebugAsync(s)() }

// coverDebugAsync is coverDebug on another goroutine: the files are found
// and opened while the caller goes on, and are h's once the function it
// returns has returned (the caller holds h.mu throughout).
func (h *Host) coverDebugAsync(s *session) (wait func()) {
	paths := map[string]string{}
	for mod := range s.coverModules {
		if _, ok := h.debug[mod]; !ok {
			paths[mod] = h.tg.Path(mod)
		}
	}
	opened := make(chan map[string]*debuginfo.File, 1)
	go func() {
		files := map[string]*debuginfo.File{}
		for mod, path := range paths {
			files[mod], _ = openDebugFile(path)
		}
		opened <- files
	}()
	return func() { h.addDebug(<-opened) }
}

// addDebug records the debug files opened (nil: none) and says which
// modules have none.
func (h *Host) addDebug(files map[string]*debuginfo.File) {
	var none []string
	for mod, f := range files {
		h.debug[mod] = f
		if f == nil && mod != "" {
			none = append(none, mod)
		}
	}
	if len(none) > 0 && !h.gone {
		slices.Sort(none)
		fmt.Fprintf(h.log, "kinst: no source lines for %s: no DWARF, nor a debug file by build id under /usr/lib/debug (install the -dbg or -dbgsym package)\n", strings.Join(none, ", "))
	}
}

// openDebug is module's DWARF ("" the executable): its own, or its
// separate debug file by build id (Debian's -dbg and -dbgsym packages);
// nil where it has none. Opened once. The caller holds h.mu.
func (h *Host) openDebug(module string) *debuginfo.File {
	dbg, ok := h.debug[module]
	if !ok {
		dbg, _ = openDebugFile(h.tg.Path(module))
		h.debug[module] = dbg
	}
	return dbg
}

// openDebugFile is the DWARF of the file at path, its own or its debug
// file's by build id; nil where it has none.
func openDebugFile(path string) (*debuginfo.File, error) {
	d, err := debuginfo.OpenOrFind(path)
	if err != nil {
		return nil, err
	}
	d.PlaceMergedLines()
	return d, nil
}

// coverLines fills the source lines of a coverage report's blocks, each
// module's from its debug information. The caller holds h.mu.
func (h *Host) coverLines(rep *api.CoverReport) {
	mods := map[string]bool{}
	for _, f := range rep.Functions {
		mods[f.Module] = true
	}
	for mod := range mods {
		dbg := h.debug[mod]
		if dbg == nil {
			continue
		}
		if _, err := report.AnnotateModule(rep, dbg, mod); err != nil {
			name := mod
			if name == "" {
				name = "the executable"
			}
			fmt.Fprintf(h.log, "kinst: no source lines for %s: %v\n", name, err)
		}
	}
}

// findLocked finds a session by ID, then by name. The caller holds h.mu.
func (h *Host) findLocked(idOrName string) *session {
	if s, ok := h.sessions[idOrName]; ok {
		return s
	}
	for _, s := range h.sessions {
		if s.name == idOrName {
			return s
		}
	}
	return nil
}

// describe is a session as kerninstd describes one; with all, a
// coverage session's blocks too. A final description (the one removal
// gives) has its blocks' source lines and names each function as its
// module does, Module apart, as kerninstd's final report does; the others
// qualify a library's functions (LIB:NAME), as the web view opens them.
// The caller holds h.mu.
func (h *Host) describe(s *session, all, final bool) api.Session {
	out := api.Session{ID: s.id, Name: s.name, Created: s.created, Probes: []api.Probe{}}
	// The counters and timer words are kinst's own memory (shared with
	// the process): they keep the last counts after it exits or execs,
	// until Close unmaps them.
	live := !h.closed
	h.alive()
	for i, r := range s.reqs {
		if r == nil { // its library never loaded
			out.Probes = append(out.Probes, api.Probe{Resolved: api.Resolved{Point: s.points[i]}, Mechanism: "none"})
			continue
		}
		p := api.Probe{Resolved: report.Resolved(r.Site()), Mechanism: "splice"}
		p.Function, p.Point = qualified(p.Module, p.Function), s.points[i]
		if live {
			p.Count = h.tg.Counter(r, 0)
		}
		out.Probes = append(out.Probes, p)
	}
	now := time.Now()
	for _, t := range s.timers {
		if live {
			calls, w := t.Read()
			t.calls, t.wall = calls, h.clock.Nanos(t.acc.Add(w, metrics.TSC()))
		}
		name := t.Function
		if !t.Region {
			name = qualified(t.Entry.Fn.Module, name)
		}
		ti := api.TimerInfo{Function: name, Entry: report.Resolved(t.Entry),
			Mechanism: "splice", Totals: api.Totals{Time: now, Calls: t.calls, WallNS: t.wall}}
		for _, x := range t.Exits {
			ti.Exits = append(ti.Exits, report.Resolved(x))
		}
		out.Timers = append(out.Timers, ti)
	}
	if s.cover != nil {
		var rep *api.CoverReport
		if all {
			rep = report.Cover(s.cover, s.name, now)
			if final {
				h.coverLines(rep)
			} else {
				for i := range rep.Functions {
					f := &rep.Functions[i]
					f.Function = qualified(f.Module, f.Function)
				}
			}
		} else {
			rep = report.CoverSummary(s.cover, s.name, now)
		}
		out.Cover = rep
	}
	return out
}

// Sessions lists every session with its counts as of now.
func (h *Host) Sessions(context.Context) ([]api.Session, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []api.Session{}
	for _, s := range h.sessions {
		out = append(out, h.describe(s, false, false))
	}
	sortSessions(out)
	if !h.alive() {
		return out, fmt.Errorf("process %d: %w (the counts are its last)", h.pid, ErrProcessGone)
	}
	return out, nil
}

// CoverReport is a coverage session's every block.
func (h *Host) CoverReport(_ context.Context, id string) (*api.CoverReport, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.findLocked(id)
	if s == nil {
		return nil, &noSession{id}
	}
	if s.cover == nil {
		return nil, badRequest(fmt.Errorf("session %s is not a coverage session", id))
	}
	return h.describe(s, true, false).Cover, nil
}

// RemoveSession removes a session's splices and returns its final
// totals.
func (h *Host) RemoveSession(_ context.Context, id string) (api.Session, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.findLocked(id)
	if s == nil {
		return api.Session{}, &noSession{id}
	}
	if s.cover != nil {
		if h.alive() {
			s.cover.Sweep(h.tg, time.Now()) // the last hits count
		} else {
			// The process has gone, and its text with it: its flags are
			// still in kinst's mapping, nothing is left to remove.
			s.cover.Mark(h.tg, time.Now())
		}
		for _, target := range s.coverPending {
			fmt.Fprintf(h.log, "kinst: %s: the library was not seen loaded (kinst looks every %s): nothing of it was covered\n", target, cover.Poll)
		}
	}
	final := h.describe(s, true, true)
	err := h.removeLocked(s)
	delete(h.sessions, s.id)
	return final, err
}

// removeLocked removes s's splices (nothing once the process is gone:
// they went with it). The caller holds h.mu.
func (h *Host) removeLocked(s *session) error {
	if !h.alive() {
		return nil
	}
	var errs []error
	var spliced []*engine.Request
	for _, r := range s.reqs {
		if r != nil {
			spliced = append(spliced, r)
		}
	}
	if len(spliced) > 0 {
		errs = append(errs, h.tg.RemoveEach(spliced)...)
	}
	for _, t := range s.timers {
		errs = append(errs, h.tg.Untime(t.Timer))
	}
	if s.cover != nil {
		_, err := s.cover.Remove(h.tg)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// SampleStream is a session's totals every interval, as kerninstd
// streams a kernel session's (api.Client.Samples).
type SampleStream struct {
	h    *Host
	id   string
	tick *time.Ticker
	ctx  context.Context
	last []uint64
}

// Samples streams session id's totals every interval. The stream ends
// (io.EOF) when the session is removed, the process exits or runs exec,
// or ctx is done.
func (h *Host) Samples(ctx context.Context, id string, interval time.Duration) (*SampleStream, error) {
	if interval <= 0 {
		return nil, badRequest(fmt.Errorf("interval %v: want more than 0", interval))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.findLocked(id)
	if s == nil {
		return nil, &noSession{id}
	}
	return &SampleStream{h: h, id: s.id, tick: time.NewTicker(interval), ctx: ctx, last: make([]uint64, len(s.points))}, nil
}

// Next blocks for the next sample; io.EOF once the stream has ended.
func (st *SampleStream) Next() (api.Sample, error) {
	select {
	case <-st.tick.C:
	case <-st.ctx.Done():
		return api.Sample{}, io.EOF
	case <-st.h.done:
		return api.Sample{}, io.EOF
	case <-st.h.goneC: // seen by the poller within cover.Poll
		return api.Sample{}, io.EOF
	}
	h := st.h
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sessions[st.id]
	if s == nil || !h.alive() {
		return api.Sample{}, io.EOF
	}
	d := h.describe(s, false, false)
	out := api.Sample{Time: time.Now(), Totals: make([]uint64, len(d.Probes)), Deltas: make([]uint64, len(d.Probes))}
	for i, p := range d.Probes {
		out.Totals[i], out.Deltas[i] = p.Count, p.Count-st.last[i]
		st.last[i] = p.Count
	}
	for _, t := range d.Timers {
		out.Timers = append(out.Timers, t.Totals)
	}
	return out, nil
}

// Close stops the stream.
func (st *SampleStream) Close() error {
	st.tick.Stop()
	return nil
}

// BadRequestError is an error of the request itself (HTTP 400).
type BadRequestError struct{ Err error }

func (e *BadRequestError) Error() string   { return e.Err.Error() }
func (e *BadRequestError) Unwrap() error   { return e.Err }
func (e *BadRequestError) HTTPStatus() int { return 400 }

// noSession is ErrNoSession for one ID or name (HTTP 404).
type noSession struct{ id string }

func (e *noSession) Error() string        { return fmt.Sprintf("%v %q", ErrNoSession, e.id) }
func (e *noSession) Is(target error) bool { return target == ErrNoSession }
func (e *noSession) HTTPStatus() int      { return 404 }

func badRequest(err error) error { return &BadRequestError{err} }

// sortSessions orders sessions by creation, then ID, as kinst ls lists
// kerninstd's.
func sortSessions(ss []api.Session) {
	slices.SortFunc(ss, func(a, b api.Session) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(len(a.ID), len(b.ID)), strings.Compare(a.ID, b.ID))
	})
}
