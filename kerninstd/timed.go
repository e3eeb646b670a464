package kerninstd

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/springboard"
)

// A timed function (kinst time): calls counted at the entry, and a timer
// word entered at the entry and left at every exit — ret, jmp to a return
// thunk, tail call, indirect jump — so the word integrates the number of
// threads inside over time (codegen.TimerEnter). From it come the total
// and average wall time and the average concurrency.
type timedFunc struct {
	function string
	entry    *site
	exits    []*site
	filter   string // what the predicate selects, "" for everyone
	calls    int    // counter slot: calls
	word     int    // counter slot: the timer word
	probes   []*probe

	mu  sync.Mutex // protects acc
	acc metrics.TimerAcc
}

// ErrExitNotSpliceable is returned when a function exit cannot be spliced
// yet, so the function cannot be timed.
var ErrExitNotSpliceable = errors.New("function exit cannot be spliced")

// resolveTimed finds a function's entry and every exit.
func (d *Daemon) resolveTimed(name string) (*timedFunc, error) {
	entry, err := d.resolve(name)
	if err != nil {
		return nil, err
	}
	if entry.point.HasOffset {
		return nil, badRequest(fmt.Errorf("time %s: name a function, not an instruction", name))
	}
	fn := entry.fn
	syms := d.symbols()
	blocks := fn.BlocksOpt(cfg.BlockOptions{Names: syms.Names(), NoReturn: d.noReturn(), Tables: d.dev})
	t := &timedFunc{function: fn.Name, entry: entry}
	for _, b := range blocks {
		if b.Padding {
			continue
		}
		switch b.Exit {
		case cfg.Return, cfg.TailCall, cfg.IndirectJump:
		default:
			continue
		}
		i := b.First + b.N - 1
		if i == entry.index {
			t.exits = append(t.exits, entry)
			continue
		}
		s, err := d.exitSite(entry, i, b.Exit)
		if err != nil {
			return nil, err
		}
		t.exits = append(t.exits, s)
	}
	if len(t.exits) == 0 {
		return nil, fmt.Errorf("%w: %s has no exit the analysis can see (it never returns?)", ErrExitNotSpliceable, fn.Name)
	}
	return t, nil
}

// exitSite checks instruction i of entry's function as a splice site.
func (d *Daemon) exitSite(entry *site, i int, kind cfg.ExitKind) (*site, error) {
	fn := entry.fn
	s := &site{point: cfg.Point{Spec: fmt.Sprintf("%s+%#x", fn.Name, fn.Insns[i].Addr-fn.Addr), Function: fn.Name,
		Offset: fn.Insns[i].Addr - fn.Addr, HasOffset: true}, sym: entry.sym, fn: fn, index: i}
	in := s.insn()
	if why := d.noSpliceReason(d.symbols(), fn, in.Addr); why != "" {
		return nil, &cfg.NoSpliceError{Where: s.where(), Reason: why}
	}
	if springboard.Classify(in.Len()) != springboard.Direct {
		return nil, fmt.Errorf("%w: %s exit at %s is the %d-byte %q; functions whose exits are shorter than 5 bytes can be timed once springboard and trap splices land",
			ErrExitNotSpliceable, kind, s.where(), in.Len(), in.String())
	}
	s.live = d.dataflowLive(d.symbols(), fn, i)
	if fn.FlagsLive(i) {
		s.live |= cfg.FlagBits
	}
	return s, nil
}

// attachTimed installs a timed function: the exits first, so that no
// thread can enter and then leave unseen; then the entry. pred, if not
// nil, guards both. On error nothing stays installed. The caller holds
// d.mu.
func (d *Daemon) attachTimed(owner string, t *timedFunc, pred codegen.Predicate) error {
	var err error
	if t.calls, err = d.slots.alloc(); err != nil {
		return err
	}
	if t.word, err = d.slots.alloc(); err != nil {
		d.slots.free(t.calls)
		return err
	}
	undo := func(err error) error {
		d.detachTimed(t)
		return err
	}
	for _, slot := range []int{t.calls, t.word} {
		if err := d.dev.ClearCounters(slot, 1); err != nil {
			return undo(err)
		}
	}
	guard := func(sn ...codegen.Snippet) []codegen.Snippet {
		if pred == nil {
			return sn
		}
		return []codegen.Snippet{codegen.Guard{If: pred, Then: sn}}
	}
	enter := guard(codegen.Counter{Addr: d.dev.CounterAddr(t.calls)}, codegen.TimerEnter{Word: d.dev.CounterAddr(t.word)})
	exit := guard(codegen.TimerExit{Word: d.dev.CounterAddr(t.word)})
	entryIsExit := false
	for _, s := range t.exits {
		if s == t.entry {
			entryIsExit = true
			continue
		}
		p, err := d.attachSnippets(owner, s, exit)
		if err != nil {
			return undo(err)
		}
		t.probes = append(t.probes, p)
	}
	if entryIsExit {
		enter = append(enter, exit...)
	}
	p, err := d.attachSnippets(owner, t.entry, enter)
	if err != nil {
		return undo(err)
	}
	t.probes = append(t.probes, p)
	return nil
}

// detachTimed removes the entry first (it was attached last), then the
// exits, and frees the slots. Probes that cannot be removed stay listed.
// The caller holds d.mu.
func (d *Daemon) detachTimed(t *timedFunc) error {
	var errs []error
	var kept []*probe
	for i := len(t.probes) - 1; i >= 0; i-- {
		p := t.probes[i]
		if err := d.detach(p); err != nil {
			errs = append(errs, err)
			kept = append(kept, p)
			continue
		}
		delete(d.spliced, p.site.insn().Addr)
	}
	t.probes = kept
	if len(kept) == 0 {
		d.slots.free(t.calls)
		d.slots.free(t.word)
	}
	return errors.Join(errs...)
}

// point reads the timed function's totals now.
func (d *Daemon) timerPoint(t *timedFunc, now time.Time) metrics.Point {
	calls := d.dev.Counter(t.calls)
	w := d.dev.Counter(t.word)
	tsc := metrics.TSC() // after the word: every event in it happened before
	t.mu.Lock()
	ticks := t.acc.Add(w, tsc)
	t.mu.Unlock()
	return metrics.Point{Time: now, Calls: calls, WallNS: d.clock.Nanos(ticks), Inside: metrics.TimerInside(w)}
}

// attachSnippets writes one patch with snippets at s and splices it. On
// error nothing stays installed. The caller holds d.mu.
//
// Each point has its own patch here; a point already instrumented by
// another request is refused.
func (d *Daemon) attachSnippets(owner string, s *site, snippets []codegen.Snippet) (*probe, error) {
	in := s.insn()
	if other, ok := d.spliced[in.Addr]; ok {
		return nil, fmt.Errorf("%s is already instrumented (session %s)", s.where(), other)
	}
	spec := codegen.PatchSpec{Site: codegen.Site{Addr: in.Addr, Bytes: in.Bytes},
		Live: codegen.Live{Regs: uint16(s.live), Flags: s.flagsLive()}, Snippets: snippets}
	size, err := codegen.PatchLen(d.dev.CounterAddr(0), spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.where(), err)
	}
	patch, err := d.dev.PatchAlloc(size)
	if err != nil {
		return nil, fmt.Errorf("allocate patch: %w", err)
	}
	fail := func(err error) (*probe, error) {
		if ferr := d.dev.PatchFree(patch); ferr != nil {
			d.log.Error("free patch after failed attach", "patch", fmt.Sprintf("%#x", patch), "err", ferr)
		}
		return nil, err
	}
	p, err := codegen.BuildPatch(patch, spec)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", s.where(), err))
	}
	if err := codegen.VerifyPatch(p, spec); err != nil {
		return fail(fmt.Errorf("%s: %w", s.where(), err))
	}
	if err := checkClobbers(p.Code[:p.Instr], patch, s.live); err != nil {
		return fail(fmt.Errorf("%s: %w", s.where(), err))
	}
	if len(p.Code) > size {
		return fail(fmt.Errorf("%s: patch of %d bytes exceeds %d", s.where(), len(p.Code), size))
	}
	if err := d.dev.PatchWrite(patch, p.Code); err != nil {
		return fail(fmt.Errorf("write patch: %w", err))
	}
	back := make([]byte, len(p.Code))
	if err := d.dev.Read(patch, back); err != nil || !bytes.Equal(back, p.Code) {
		return fail(fmt.Errorf("patch at %#x does not read back as written (%v)", patch, err))
	}
	jmp, err := codegen.JmpRel32(in.Addr, patch)
	if err != nil {
		return fail(err)
	}
	orig := append([]byte(nil), in.Bytes[:len(jmp)]...)
	id, err := d.dev.Splice(in.Addr, patch, orig, jmp)
	if err != nil {
		return fail(fmt.Errorf("splice %s: %w", s.where(), err))
	}
	d.spliced[in.Addr] = owner
	return &probe{site: s, slot: -1, patch: patch, spliceID: id}, nil
}
