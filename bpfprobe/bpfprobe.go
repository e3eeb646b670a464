// Package bpfprobe counts calls and times kernel functions with BPF: the
// mechanism kerninstd falls back to where kerninst.ko is not loaded (a
// kernel that refuses modules, lockdown). It owns one array map of
// counters, addressed by slot like the driver's counter heap, and the
// programs and links that add to it. Programs are written with cilium/ebpf's
// asm package (no clang at build time).
//
// Mechanisms, tried in this order for a function's entry: fentry (a
// trampoline: needs BTF for the function and BPF trampolines, x86-64 from
// 5.5), kprobe.multi (fprobe-based, from 5.18, CONFIG_FPROBE) and a plain
// kprobe. An instruction inside a function is served by a kprobe at
// FUNC+OFF only (the kernel refuses offsets that are not instruction
// boundaries, and kprobe blacklisted functions). A timer uses fentry and
// fexit, else a kprobe and a kretprobe (whose instance pool, maxactive,
// may miss returns when many threads are inside at once).
//
// Caveats: a BPF program is not re-entered on a CPU where another BPF
// program of the same kind is running, so hits from inside BPF programs
// are missed; a timer keeps one start stamp per thread, so a recursive
// call restarts the stamp (the outer call's time is lost). Needs root (or
// CAP_BPF with CAP_PERFMON) and CONFIG_BPF_SYSCALL.
package bpfprobe

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// Mechanisms, as reports name them.
const (
	FEntry      = "fentry"       // fentry (and fexit for a timer)
	KprobeMulti = "kprobe.multi" // one-symbol kprobe.multi
	Kprobe      = "kprobe"       // kprobe (and kretprobe for a timer)
)

// ErrUnavailable wraps every reason a probe cannot be loaded or attached.
var ErrUnavailable = errors.New("BPF probe unavailable")

// AttachError says why each mechanism refused a function.
type AttachError struct {
	Function string
	Offset   uint64
	Tried    []error // one per mechanism, in order
}

func (e *AttachError) Error() string {
	s := fmt.Sprintf("BPF cannot probe %s", e.Function)
	if e.Offset != 0 {
		s = fmt.Sprintf("BPF cannot probe %s+%#x", e.Function, e.Offset)
	}
	for _, t := range e.Tried {
		s += "; " + t.Error()
	}
	return s
}

func (e *AttachError) Unwrap() error { return ErrUnavailable }

// Set is the counters and every probe that adds to them. Its methods may
// be called from any goroutine.
type Set struct {
	counts *ebpf.Map // array of uint64, one per slot
	n      int

	mu     sync.Mutex // protects probes
	probes map[*Probe]bool
}

// NewSet creates the counter map with n slots. It fails, wrapping
// ErrUnavailable, where BPF cannot be used at all.
func NewSet(n int) (*Set, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: raising RLIMIT_MEMLOCK: %v (needs root)", ErrUnavailable, err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "kinst_counts", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: uint32(n)})
	if err != nil {
		return nil, fmt.Errorf("%w: counter map: %v", ErrUnavailable, err)
	}
	return &Set{counts: m, n: n, probes: map[*Probe]bool{}}, nil
}

// Len is the number of counter slots.
func (s *Set) Len() int { return s.n }

// Counter reads a slot (0 for a slot out of range).
func (s *Set) Counter(slot int) uint64 {
	var v uint64
	if slot < 0 || slot >= s.n || s.counts.Lookup(uint32(slot), &v) != nil {
		return 0
	}
	return v
}

// Clear zeroes count slots from first.
func (s *Set) Clear(first, count int) error {
	if first < 0 || count < 0 || first+count > s.n {
		return fmt.Errorf("counter slots %d+%d out of range (%d)", first, count, s.n)
	}
	for i := first; i < first+count; i++ {
		if err := s.counts.Put(uint32(i), uint64(0)); err != nil {
			return err
		}
	}
	return nil
}

// Probe is an attached counter or timer.
type Probe struct {
	set       *Set
	mechanism string
	progs     []*ebpf.Program
	links     []link.Link
	starts    *ebpf.Map // a timer's start stamps by pid_tgid; nil for a counter
}

// Mechanism is how the probe is attached (FEntry, KprobeMulti, Kprobe).
func (p *Probe) Mechanism() string { return p.mechanism }

// Inside is the number of threads inside a timed function now (threads
// with a start stamp), 0 for a counter.
func (p *Probe) Inside() int {
	if p.starts == nil {
		return 0
	}
	n := 0
	var k, v uint64
	it := p.starts.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n
}

// Close detaches the probe and frees its programs.
func (p *Probe) Close() error {
	var errs []error
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	for _, pr := range p.progs {
		errs = append(errs, pr.Close())
	}
	if p.starts != nil {
		errs = append(errs, p.starts.Close())
	}
	p.links, p.progs, p.starts = nil, nil, nil
	p.set.mu.Lock()
	delete(p.set.probes, p)
	p.set.mu.Unlock()
	return errors.Join(errs...)
}

// Close detaches every probe and frees the counters.
func (s *Set) Close() error {
	s.mu.Lock()
	ps := make([]*Probe, 0, len(s.probes))
	for p := range s.probes {
		ps = append(ps, p)
	}
	s.mu.Unlock()
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.Close())
	}
	return errors.Join(append(errs, s.counts.Close())...)
}

func (s *Set) keep(p *Probe) *Probe {
	s.mu.Lock()
	s.probes[p] = true
	s.mu.Unlock()
	return p
}

// attempt is one way to attach: load the programs for it and link them.
type attempt struct {
	mechanism string
	attach    func() ([]*ebpf.Program, []link.Link, error)
}

// first tries each attempt in order and keeps the first that works.
func (s *Set) first(fn string, off uint64, starts *ebpf.Map, only string, as []attempt) (*Probe, error) {
	e := &AttachError{Function: fn, Offset: off}
	for _, a := range as {
		if only != "" && a.mechanism != only {
			continue
		}
		progs, links, err := a.attach()
		if err == nil {
			return s.keep(&Probe{set: s, mechanism: a.mechanism, progs: progs, links: links, starts: starts}), nil
		}
		for _, l := range links {
			l.Close()
		}
		for _, p := range progs {
			p.Close()
		}
		e.Tried = append(e.Tried, fmt.Errorf("%s: %v", a.mechanism, err))
	}
	if starts != nil {
		starts.Close()
	}
	if len(e.Tried) == 0 {
		e.Tried = append(e.Tried, fmt.Errorf("%s: not a mechanism for this probe", only))
	}
	return nil, e
}

func (s *Set) checkSlot(slots ...int) error {
	for _, sl := range slots {
		if sl < 0 || sl >= s.n {
			return fmt.Errorf("counter slot %d out of range (%d)", sl, s.n)
		}
	}
	return nil
}

// Count attaches a counter that adds 1 to slot on every hit of fn+off:
// at a function's entry (off 0) by fentry, kprobe.multi or kprobe, at
// any other instruction by a kprobe.
func (s *Set) Count(fn string, off uint64, slot int) (*Probe, error) {
	return s.CountWith("", fn, off, slot)
}

// CountWith is Count by one mechanism only ("" for the first that
// works), for comparisons such as kinst bench hit's.
func (s *Set) CountWith(mechanism, fn string, off uint64, slot int) (*Probe, error) {
	return s.CountThread(mechanism, fn, off, slot, 0)
}

// CountThread is CountWith counting only the hits of thread tid (all
// threads for 0): a benchmark's exact oracle at a function other threads
// call too.
func (s *Set) CountThread(mechanism, fn string, off uint64, slot, tid int) (*Probe, error) {
	if err := s.checkSlot(slot); err != nil {
		return nil, err
	}
	insns := counterProgram(s.counts.FD(), slot, tid)
	kprobe := attempt{Kprobe, func() ([]*ebpf.Program, []link.Link, error) {
		p, err := load(ebpf.Kprobe, 0, "", insns)
		if err != nil {
			return nil, nil, err
		}
		l, err := link.Kprobe(fn, p, &link.KprobeOptions{Offset: off})
		return []*ebpf.Program{p}, links(l), err
	}}
	if off != 0 {
		return s.first(fn, off, nil, mechanism, []attempt{kprobe})
	}
	return s.first(fn, 0, nil, mechanism, []attempt{
		{FEntry, func() ([]*ebpf.Program, []link.Link, error) {
			p, err := load(ebpf.Tracing, ebpf.AttachTraceFEntry, fn, insns)
			if err != nil {
				return nil, nil, err
			}
			l, err := link.AttachTracing(link.TracingOptions{Program: p})
			return []*ebpf.Program{p}, links(l), err
		}},
		{KprobeMulti, func() ([]*ebpf.Program, []link.Link, error) {
			p, err := load(ebpf.Kprobe, ebpf.AttachTraceKprobeMulti, "", insns)
			if err != nil {
				return nil, nil, err
			}
			l, err := link.KprobeMulti(p, link.KprobeMultiOptions{Symbols: []string{fn}})
			return []*ebpf.Program{p}, links(l), err
		}},
		kprobe,
	})
}

// Time attaches a timer to fn: each call adds 1 to calls and its wall
// time in nanoseconds to ns.
func (s *Set) Time(fn string, calls, ns int) (*Probe, error) {
	return s.TimeWith("", fn, calls, ns)
}

// TimeWith is Time by one mechanism only (FEntry or Kprobe; "" for the
// first that works).
func (s *Set) TimeWith(mechanism, fn string, calls, ns int) (*Probe, error) {
	if err := s.checkSlot(calls, ns); err != nil {
		return nil, err
	}
	starts, err := ebpf.NewMap(&ebpf.MapSpec{Name: "kinst_starts", Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: 16384})
	if err != nil {
		return nil, fmt.Errorf("%w: start map: %v", ErrUnavailable, err)
	}
	enter := timerEnter(s.counts.FD(), starts.FD(), calls)
	exit := timerExit(s.counts.FD(), starts.FD(), ns)
	return s.first(fn, 0, starts, mechanism, []attempt{
		{FEntry, func() ([]*ebpf.Program, []link.Link, error) {
			pe, err := load(ebpf.Tracing, ebpf.AttachTraceFEntry, fn, enter)
			if err != nil {
				return nil, nil, err
			}
			px, err := load(ebpf.Tracing, ebpf.AttachTraceFExit, fn, exit)
			if err != nil {
				return []*ebpf.Program{pe}, nil, err
			}
			progs := []*ebpf.Program{pe, px}
			lx, err := link.AttachTracing(link.TracingOptions{Program: px})
			if err != nil {
				return progs, nil, err
			}
			// The exit first: a call entered with no exit attached
			// would leave a stale stamp.
			le, err := link.AttachTracing(link.TracingOptions{Program: pe})
			return progs, links(lx, le), err
		}},
		{Kprobe, func() ([]*ebpf.Program, []link.Link, error) {
			pe, err := load(ebpf.Kprobe, 0, "", enter)
			if err != nil {
				return nil, nil, err
			}
			px, err := load(ebpf.Kprobe, 0, "", exit)
			if err != nil {
				return []*ebpf.Program{pe}, nil, err
			}
			progs := []*ebpf.Program{pe, px}
			lx, err := link.Kretprobe(fn, px, nil)
			if err != nil {
				return progs, nil, err
			}
			le, err := link.Kprobe(fn, pe, nil)
			return progs, links(lx, le), err
		}},
	})
}

// links drops nil links (a failed attach returns a nil interface or a
// typed nil).
func links(ls ...link.Link) []link.Link {
	var out []link.Link
	for _, l := range ls {
		if l != nil {
			out = append(out, l)
		}
	}
	return out
}

func load(typ ebpf.ProgramType, at ebpf.AttachType, attachTo string, insns asm.Instructions) (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{Name: "kinst_probe", Type: typ, AttachType: at, AttachTo: attachTo,
		License: "GPL", Instructions: insns})
}

// counterProgram: counts[slot] += 1 (atomically), if tid is 0 or the
// current thread's id; return 0.
func counterProgram(counts, slot, tid int) asm.Instructions {
	var insns asm.Instructions
	if tid != 0 {
		insns = asm.Instructions{
			asm.FnGetCurrentPidTgid.Call(),
			asm.LSh.Imm(asm.R0, 32), // the low half is the thread id
			asm.RSh.Imm(asm.R0, 32),
			asm.JNE.Imm(asm.R0, int32(tid), "out"),
		}
	}
	insns = append(insns, addTo(counts, slot, -4, asm.R1, 1)...)
	return append(insns, asm.Mov.Imm(asm.R0, 0).WithSymbol("out"), asm.Return())
}

// addTo adds imm (or, with imm 0, the register src) to counts[slot],
// keying the lookup at the frame pointer's offset key; it jumps to "out"
// if the lookup fails. It clobbers R0-R5 (src must be R6-R9 when imm is
// 0).
func addTo(counts, slot int, key int16, src asm.Register, imm int64) asm.Instructions {
	insns := asm.Instructions{
		asm.StoreImm(asm.RFP, key, int64(slot), asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(key)),
		asm.LoadMapPtr(asm.R1, counts),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
	}
	if imm != 0 {
		insns = append(insns, asm.Mov.Imm(asm.R1, int32(imm)))
		src = asm.R1
	}
	return append(insns, asm.StoreXAdd(asm.R0, src, asm.DWord))
}

// timerEnter: starts[pid_tgid] = ktime_ns; counts[calls] += 1.
func timerEnter(counts, starts, calls int) asm.Instructions {
	insns := asm.Instructions{
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, -16, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, starts),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -16),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),
	}
	insns = append(insns, addTo(counts, calls, -20, asm.R1, 1)...)
	return append(insns, asm.Mov.Imm(asm.R0, 0).WithSymbol("out"), asm.Return())
}

// timerExit: if starts[pid_tgid] exists, counts[ns] += ktime_ns - it and
// delete it.
func timerExit(counts, starts, ns int) asm.Instructions {
	insns := asm.Instructions{
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, starts),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R6, asm.R0, 0, asm.DWord),
		asm.FnKtimeGetNs.Call(),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.Sub.Reg(asm.R7, asm.R6),
		asm.LoadMapPtr(asm.R1, starts),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapDeleteElem.Call(),
	}
	insns = append(insns, addTo(counts, ns, -12, asm.R7, 0)...)
	return append(insns, asm.Mov.Imm(asm.R0, 0).WithSymbol("out"), asm.Return())
}

// Available attaches a counter to fn with each mechanism in turn, then
// detaches it, and returns the mechanisms that worked; where none did,
// the error says why each was refused. kerninstd calls it at start so
// that a kernel where BPF cannot probe anything is said plainly at once.
func (s *Set) Available(fn string) ([]string, error) {
	e := &AttachError{Function: fn}
	var ok []string
	for _, m := range []string{FEntry, KprobeMulti, Kprobe} {
		p, err := s.CountWith(m, fn, 0, 0)
		if err != nil {
			var ae *AttachError
			if errors.As(err, &ae) {
				e.Tried = append(e.Tried, ae.Tried...)
			} else {
				e.Tried = append(e.Tried, err)
			}
			continue
		}
		p.Close()
		ok = append(ok, m)
	}
	s.Clear(0, 1)
	if len(ok) == 0 {
		return nil, e
	}
	return ok, nil
}

// Uprobe attaches a counter that adds 1 to slot on every hit of symbol in
// the executable or library at path (a BPF uprobe: the kernel's int3 in
// the process, then the program): kinst bench hit --user's comparison.
func (s *Set) Uprobe(path, symbol string, slot int) (*Probe, error) {
	if err := s.checkSlot(slot); err != nil {
		return nil, err
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return s.first(symbol, 0, nil, "", []attempt{{"uprobe", func() ([]*ebpf.Program, []link.Link, error) {
		p, err := load(ebpf.Kprobe, 0, "", counterProgram(s.counts.FD(), slot, 0))
		if err != nil {
			return nil, nil, err
		}
		l, err := ex.Uprobe(symbol, p, nil)
		return []*ebpf.Program{p}, links(l), err
	}}})
}
