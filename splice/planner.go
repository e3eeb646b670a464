package splice

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/springboard"
)

// Config configures a Planner.
type Config struct {
	// Text reads kernel text as the kernel's own code
	// (engine.Engine.Text); the kernel's tables are read through it too.
	Text cfg.TextReader
	// Springboards is the springboard heap the engine takes slots from;
	// the planner adds each function's springboard space to it the first
	// time an instruction in reach asks. Nil: no springboard splices.
	Springboards *springboard.Heap
	Kallsyms     string // default /proc/kallsyms
	// Prototypes loads function prototypes (kernel.LoadKernelPrototypes);
	// nil: none.
	Prototypes func() (kernel.Prototypes, error)
	// Layout loads the struct layouts the module and ftrace table walkers
	// need (kernel.LoadKernelLayout); nil: only the core kernel's tables
	// are read.
	Layout func() (*kernel.KernelLayout, error)
	Log    *slog.Logger
}

// Planner plans splices in the live kernel: it keeps the facts current
// (the symbols, reloaded when a lookup misses, since a module may have
// been loaded; the kernel's own tables, re-read with every new symbol
// snapshot; BTF prototypes and layouts, loaded once; the whole-kernel
// analysis, once it ran) and resolves points against them. Its methods
// may be called from any goroutine; it changes nothing in the kernel.
type Planner struct {
	text       cfg.TextReader
	heap       *springboard.Heap // has its own lock
	kallsyms   string
	log        *slog.Logger
	loadProtos func() (kernel.Prototypes, error)
	loadLayout func() (*kernel.KernelLayout, error)

	symMu sync.Mutex      // protects syms
	syms  *kernel.Symbols // immutable snapshot, replaced on reload

	protoOnce sync.Once
	protos    kernel.Prototypes // from BTF; nil (conservative) if unavailable

	layoutOnce sync.Once
	layout     *kernel.KernelLayout // from BTF; nil if unavailable

	ownMu    sync.Mutex         // protects owned and ownedFor
	owned    *kernel.OwnedSites // nil if unreadable
	ownedFor *kernel.Symbols    // the symbol snapshot owned was read with

	anMu  sync.Mutex      // protects noret and reads
	noret cfg.NoReturnSet // from the whole-kernel analysis; nil until it ran
	reads cfg.CalleeReads // its callee summaries; nil until it ran
}

// New loads the symbols and returns a planner.
func New(c Config) (*Planner, error) {
	p := &Planner{text: c.Text, heap: c.Springboards, kallsyms: c.Kallsyms, log: c.Log,
		loadProtos: c.Prototypes, loadLayout: c.Layout}
	if p.kallsyms == "" {
		p.kallsyms = "/proc/kallsyms"
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if _, err := p.ReloadSymbols(); err != nil {
		return nil, err
	}
	return p, nil
}

// Symbols is the current symbol snapshot.
func (p *Planner) Symbols() *kernel.Symbols {
	p.symMu.Lock()
	defer p.symMu.Unlock()
	return p.syms
}

// ReloadSymbols reads kallsyms again.
func (p *Planner) ReloadSymbols() (*kernel.Symbols, error) {
	s, err := kernel.LoadKallsyms(p.kallsyms)
	if err != nil {
		return nil, fmt.Errorf("load symbols: %w", err)
	}
	p.symMu.Lock()
	p.syms = s
	p.symMu.Unlock()
	return s, nil
}

// Lookup finds a function by name, reloading kallsyms once if it is not
// there: a module may have been loaded since the last snapshot. It returns
// the snapshot the symbol is from and how many others share its name.
func (p *Planner) Lookup(name string) (*kernel.Symbols, kernel.Symbol, int, error) {
	syms := p.Symbols()
	sym, amb, err := syms.Lookup(name)
	if errors.Is(err, kernel.ErrUnknownFunction) {
		if syms, err = p.ReloadSymbols(); err == nil {
			sym, amb, err = syms.Lookup(name)
		}
	}
	return syms, sym, amb, err
}

// Prototypes returns the kernel's function prototypes from BTF, loaded
// on first use. Without BTF, liveness assumes every call reads all six
// argument registers.
func (p *Planner) Prototypes() kernel.Prototypes {
	p.protoOnce.Do(func() {
		if p.loadProtos == nil {
			return
		}
		pr, err := p.loadProtos()
		if err != nil {
			p.log.Warn("no function prototypes; liveness stays conservative at calls", "err", err)
			return
		}
		p.protos = pr
	})
	return p.protos
}

// Layout returns the kernel's struct layouts from BTF, loaded on first
// use; nil without BTF.
func (p *Planner) Layout() *kernel.KernelLayout {
	p.layoutOnce.Do(func() {
		if p.loadLayout == nil {
			return
		}
		l, err := p.loadLayout()
		if err != nil {
			p.log.Warn("no struct layouts; modules' tables and ftrace's records are not read", "err", err)
			return
		}
		p.layout = l
	})
	return p.layout
}

// Owned returns the instructions the kernel's exception, jump-label,
// static-call and ftrace tables name (core kernel and modules), read from
// live memory, for the current symbols: they are read again whenever the
// symbols are reloaded, which is what happens when a lookup meets a newly
// loaded module.
func (p *Planner) Owned() *kernel.OwnedSites { return p.ownedSites(p.Symbols()) }

func (p *Planner) ownedSites(syms *kernel.Symbols) *kernel.OwnedSites {
	p.ownMu.Lock()
	defer p.ownMu.Unlock()
	if p.ownedFor == syms {
		return p.owned
	}
	layout := p.Layout()
	o, n, err := kernel.LoadOwnedSites(p.text, syms, layout)
	if err != nil && layout != nil {
		p.log.Warn("modules' tables or ftrace's records unreadable; only the core kernel's tables are refused", "err", err)
		o, n, err = kernel.LoadOwnedSites(p.text, syms, nil)
	}
	p.ownedFor = syms
	if err != nil {
		p.log.Warn("kernel tables unreadable; their sites are not refused", "err", err)
		p.owned = nil
		return nil
	}
	p.owned = o
	p.log.Info("kernel tables read", "ex_table", n.ExTable, "jump_labels", n.JumpLabels, "static_calls", n.StaticCalls,
		"ftrace", n.Ftrace, "modules", n.Modules)
	return o
}

// SetAnalysis installs the whole-kernel analysis's results: the
// functions that never return and the callee summaries.
func (p *Planner) SetAnalysis(noret cfg.NoReturnSet, reads cfg.CalleeReads) {
	p.anMu.Lock()
	p.noret, p.reads = noret, reads
	p.anMu.Unlock()
}

// Analysis returns what SetAnalysis installed (nil, nil before).
func (p *Planner) Analysis() (cfg.NoReturnSet, cfg.CalleeReads) {
	p.anMu.Lock()
	defer p.anMu.Unlock()
	return p.noret, p.reads
}

// Facts is a snapshot of the current facts.
func (p *Planner) Facts() *Facts { return p.factsFor(p.Symbols()) }

func (p *Planner) factsFor(syms *kernel.Symbols) *Facts {
	noret, reads := p.Analysis()
	return &Facts{Symbols: syms, Text: p.text, Owned: p.ownedSites(syms), NoReturn: noret, Reads: reads,
		Prototypes: p.Prototypes()}
}

// Func parses spec as a point, reads its function from the live kernel
// and plans it; Func.Resolve(point) finishes what Resolve does.
func (p *Planner) Func(spec string) (*Func, Point, error) {
	pt, err := ParsePoint(spec)
	if err != nil {
		return nil, Point{}, &BadPointError{err}
	}
	syms, sym, amb, err := p.Lookup(pt.Function)
	if err != nil {
		return nil, pt, err
	}
	fn, err := cfg.ReadFunction(p.text, syms, sym)
	if err != nil {
		return nil, pt, err
	}
	k := p.factsFor(syms)
	f := k.Func(fn, nil)
	f.Sym, f.Ambiguous = sym, amb
	if p.heap != nil {
		f.slotFree = func(addr uint64) bool {
			p.addSpringboardSpace(k, addr)
			_, ok := p.heap.Find(addr)
			return ok
		}
	}
	return f, pt, nil
}

// Resolve maps a point to one instruction of the live kernel and plans
// its splice. It changes nothing.
func (p *Planner) Resolve(spec string) (*Site, error) {
	f, pt, err := p.Func(spec)
	if err != nil {
		return nil, err
	}
	return f.Resolve(pt)
}

// Liveness computes what is live at s's instruction afresh, as Resolve
// does (blocks and the block data-flow): step 2 of a request, alone.
func (p *Planner) Liveness(s *Site) cfg.LiveSet {
	return p.factsFor(p.Symbols()).Func(s.Fn, nil).Live(s.Index)
}

// addSpringboardSpace makes sure the springboard space of every function
// within rel8 reach of addr is in the heap: each function's padding is
// found (SpringboardSpace) the first time an instruction near it asks.
func (p *Planner) addSpringboardSpace(k *Facts, addr uint64) {
	lo, hi := springboard.Reach(addr)
	hi += springboard.SlotLen
	for _, sym := range k.Symbols.Overlapping(lo, hi) {
		if p.heap.Seen(sym.Addr) {
			continue
		}
		fn, err := cfg.ReadFunction(k.Text, k.Symbols, sym)
		if err != nil || FunctionNoSplice(k.Symbols, fn, DriverModule) != "" {
			continue
		}
		owned := func(a uint64) bool { return k.Owned.Reason(a) != "" }
		p.heap.Add(SpringboardSpace(fn, fn.BlocksOpt(k.BlockOptions()), owned)...)
	}
}
