package kerninstd

import (
	"errors"
	"fmt"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/bpfprobe"
	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/splice"
)

// Without kerninst.ko (a kernel that refuses modules, lockdown),
// kerninstd serves `kinst count` and `kinst time` with BPF (package
// bpfprobe): the kernel view reads memory through /proc/kcore, the
// counters are a BPF array map addressed by the engine's slots, and
// nothing is spliced. Requests only a splice can serve (coverage, filters,
// virtual timers, lock waiters) are refused with ErrNoDriver.

// ErrNoDriver is returned for a request that needs kerninst.ko when
// kerninstd runs on BPF alone.
var ErrNoDriver = errors.New("kerninst.ko is not loaded (kerninstd serves count and time with BPF only)")

// MechanismSplice names the driver's splices in reports.
const MechanismSplice = "splice"

// BPFDevice is the engine.Device of a kerninstd without the driver: reads
// go to Mem (/proc/kcore), counters to the BPF map, every change to the
// kernel's text is refused.
type BPFDevice struct {
	Mem interface {
		ReadVirt(p []byte, addr uint64) error
	}
	Set *bpfprobe.Set
}

var _ engine.Device = (*BPFDevice)(nil)

func (b *BPFDevice) Read(addr uint64, p []byte) error { return b.Mem.ReadVirt(p, addr) }
func (b *BPFDevice) PatchAlloc(int) (uint64, error)   { return 0, ErrNoDriver }
func (b *BPFDevice) PatchWrite(uint64, []byte) error  { return ErrNoDriver }
func (b *BPFDevice) PatchWriteMany([]driver.PatchCode) error {
	return ErrNoDriver
}
func (b *BPFDevice) PatchFree(uint64) error { return ErrNoDriver }
func (b *BPFDevice) Splice(uint64, uint64, []byte, []byte) (uint32, error) {
	return 0, ErrNoDriver
}
func (b *BPFDevice) SpliceSlot(uint64, uint64, []byte, []byte) (uint32, error) {
	return 0, ErrNoDriver
}
func (b *BPFDevice) SpliceCovering(uint64, uint64, []byte, []byte) (uint32, error) {
	return 0, ErrNoDriver
}
func (b *BPFDevice) FinishCovering() (int, error)                    { return 0, nil }
func (b *BPFDevice) Resplice(uint32, uint64) error                   { return ErrNoDriver }
func (b *BPFDevice) Unsplice(uint32) error                           { return ErrNoDriver }
func (b *BPFDevice) SpliceBatch([]driver.SpliceOp) ([]uint32, error) { return nil, ErrNoDriver }
func (b *BPFDevice) UnspliceBatch([]uint32) error                    { return ErrNoDriver }
func (b *BPFDevice) BatchMax() int                                   { return 1 }
func (b *BPFDevice) Counter(slot int) uint64                         { return b.Set.Counter(slot) }
func (b *BPFDevice) CounterAddr(int) uint64                          { return 0 }
func (b *BPFDevice) NumCounters() int                                { return b.Set.Len() }
func (b *BPFDevice) ClearCounters(first, n int) error                { return b.Set.Clear(first, n) }

// bpfCount is a counter a BPF program keeps for one point.
type bpfCount struct {
	site  *splice.Site
	slot  int
	probe *bpfprobe.Probe
}

// bpfTarget is where BPF attaches for a site: the function's name and
// the offset of the instruction (0: the function's entry, whatever the
// first instruction is, such as endbr64).
func bpfTarget(s *splice.Site) (string, uint64, error) {
	if s.Ambiguous() > 1 {
		return "", 0, badRequest(fmt.Errorf("%s names %d functions and BPF attaches by name: %w", s.Fn.Name, s.Ambiguous(), ErrNoDriver))
	}
	if !s.Point().HasOffset && !s.Point().HasBlock {
		return s.Fn.Name, 0, nil
	}
	return s.Fn.Name, s.Addr() - s.Fn.Addr, nil
}

// refuseWithoutDriver refuses what only splices can serve.
func (d *Daemon) refuseWithoutDriver(req api.SessionRequest) error {
	var what string
	switch {
	case isCover(req):
		what = "coverage"
	case req.Lock != "":
		what = "lock wait timing"
	case req.Filter != nil && (req.Filter.PID != 0 || req.Filter.TID != 0 || req.Filter.Comm != ""):
		what = "filters (--pid, --tid, --comm)"
	case req.Virtual:
		what = "virtual (on-CPU) time"
	case len(req.Regions) > 0:
		what = "timing a part of a function (a line range)"
	default:
		return nil
	}
	if d.noSplice != nil && !errors.Is(d.noSplice, driver.ErrNotLoaded) {
		return badRequest(&spliceRefused{what: what, why: d.noSplice})
	}
	return badRequest(fmt.Errorf("%s needs the driver: %w; load it with kinst driver load", what, ErrNoDriver))
}

// spliceRefused: a request needs splices, and kerninstd does not splice
// for a reason other than a missing driver (Config.NoSplice). It matches
// ErrNoDriver and the reason with errors.Is.
type spliceRefused struct {
	what string
	why  error
}

func (e *spliceRefused) Error() string {
	return e.what + " needs splices, which kerninstd does not make here: " + e.why.Error()
}

func (e *spliceRefused) Unwrap() []error { return []error{ErrNoDriver, e.why} }

// createBPFSession is CreateSession without the driver.
func (d *Daemon) createBPFSession(req api.SessionRequest) (api.Session, error) {
	if err := d.refuseWithoutDriver(req); err != nil {
		return api.Session{}, err
	}
	sites, err := d.resolvePoints(req, func(s *splice.Site) error { _, _, err := bpfTarget(s); return err })
	if err != nil {
		return api.Session{}, err
	}
	var timers []*timedFunc
	seen := map[string]bool{}
	for _, name := range req.Timers {
		f, p, err := d.plan.Func(name)
		if err == nil && (p.HasOffset || p.HasBlock) {
			err = badRequest(fmt.Errorf("time %s: name a function, not an instruction or block", name))
		}
		var entry *splice.Site
		if err == nil {
			entry, err = f.Resolve(p)
		}
		if err == nil {
			_, _, err = bpfTarget(entry)
		}
		if err == nil && seen[f.Fn.Name] {
			err = badRequest(fmt.Errorf("%s named twice", f.Fn.Name))
		}
		if err != nil {
			return api.Session{}, &splice.PointError{Point: name, Err: err}
		}
		seen[f.Fn.Name] = true
		timers = append(timers, &timedFunc{function: f.Fn.Name, entry: entry, calls: -1, word: -1})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ss, err := d.newSessionLocked(req)
	if err != nil {
		return api.Session{}, err
	}
	fail := func(point string, err error) (api.Session, error) {
		if rerr := d.removeLocked(ss); rerr != nil {
			d.log.Error("roll back session", "err", rerr)
		}
		return api.Session{}, &splice.PointError{Point: point, Err: err}
	}
	for _, t := range timers {
		base, err := d.eng.ReserveCounters(2)
		if err != nil {
			return fail(t.function, err)
		}
		p, err := d.bpf.Time(t.function, base, base+1)
		if err != nil {
			d.eng.ReleaseCounters(base, 2)
			return fail(t.function, badRequest(err))
		}
		t.calls, t.word, t.bpf = base, base+1, p
		ss.timers = append(ss.timers, t)
		d.log.Info("timing", "session", ss.id, "function", t.function, "mechanism", p.Mechanism())
	}
	for _, s := range sites {
		fn, off, _ := bpfTarget(s)
		slot, err := d.eng.ReserveCounters(1)
		if err != nil {
			return fail(s.Point().Spec, err)
		}
		p, err := d.bpf.Count(fn, off, slot)
		if err != nil {
			d.eng.ReleaseCounters(slot, 1)
			return fail(s.Point().Spec, badRequest(err))
		}
		ss.bpf = append(ss.bpf, &bpfCount{site: s, slot: slot, probe: p})
		d.log.Info("probed", "session", ss.id, "point", s.Point().Spec, "at", s.Where(), "mechanism", p.Mechanism(), "slot", slot)
	}
	d.sessions[ss.id] = ss
	d.startTTL(ss, time.Duration(req.TTLNS))
	return d.describe(ss), nil
}

// removeBPFLocked detaches a session's BPF probes. The caller holds d.mu.
func (d *Daemon) removeBPFLocked(ss *session) (keptTimers []*timedFunc, errs []error) {
	var kept []*bpfCount
	for _, c := range ss.bpf {
		if err := c.probe.Close(); err != nil {
			errs = append(errs, err)
			kept = append(kept, c)
			continue
		}
		d.eng.ReleaseCounters(c.slot, 1)
		d.log.Info("probe removed", "session", ss.id, "at", c.site.Where())
	}
	ss.bpf = kept
	for _, t := range ss.timers {
		if err := t.bpf.Close(); err != nil {
			errs = append(errs, err)
			keptTimers = append(keptTimers, t)
			continue
		}
		d.eng.ReleaseCounters(t.calls, 2)
		d.log.Info("timer removed", "session", ss.id, "function", t.function)
	}
	return keptTimers, errs
}
