package splice

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/springboard"
)

// Config configures a Planner.
type Config struct {
	// Kernel is the live kernel's view (kernel.Live), reading memory as
	// the kernel's own code (through engine.Engine.Text, so instructions
	// under kinst's splices read as their originals): symbols, BTF
	// prototypes and layouts, the module list and the kernel's own tables
	// all come from it.
	Kernel *kernel.Program
	// Springboards is the springboard heap the engine takes slots from;
	// the planner adds each function's springboard space to it the first
	// time an instruction in reach asks. Nil: no springboard splices.
	Springboards *springboard.Heap
	Log          *slog.Logger
	// KprobeBlacklist is the kernel's kprobe blacklist file
	// (kernel.KprobeBlacklistPath on a live kernel), re-read with every
	// new symbol snapshot; its functions are refused. "": none.
	KprobeBlacklist string
	// Modules is the module list Refresh watches ("/proc/modules" on a
	// live kernel); "": none. TextGone is told the text range of each
	// module that went (the engine's ForgetText); nil: none.
	Modules  string
	TextGone func(lo, hi uint64)
}

// Planner plans splices in the live kernel: it keeps the facts current
// (the symbols, reloaded when a lookup misses, since a module may have
// been loaded; the kernel's own tables, re-read with every new symbol
// snapshot; BTF prototypes, loaded once by the view; the whole-kernel
// analysis, once it ran) and resolves points against them. Its methods
// may be called from any goroutine; it changes nothing in the kernel.
type Planner struct {
	view *kernel.Program   // has its own locks
	heap *springboard.Heap // has its own lock
	log  *slog.Logger

	protoWarn sync.Once // logs once that prototypes are unavailable

	blPath string // Config.KprobeBlacklist

	modPath  string              // Config.Modules
	textGone func(lo, hi uint64) // Config.TextGone
	modMu    sync.Mutex          // protects modSeen
	modSeen  []byte              // the module list at the last look

	ownMu    sync.Mutex             // protects owned, ownedFor, bl and die
	owned    *kernel.OwnedSites     // nil if unreadable
	bl       kernel.KprobeBlacklist // nil if unread
	die      DieNotifiers           // nil if unread
	ownedFor *kernel.Symbols        // the symbol snapshot owned and bl were read with

	recent recentFunctions // has its own lock

	anMu  sync.Mutex      // protects noret and reads
	noret cfg.NoReturnSet // from the whole-kernel analysis; nil until it ran
	reads cfg.CalleeReads // its callee summaries; nil until it ran
}

// New returns a planner over c.Kernel, whose symbols must load.
func New(c Config) (*Planner, error) {
	p := &Planner{view: c.Kernel, heap: c.Springboards, log: c.Log, blPath: c.KprobeBlacklist,
		modPath: c.Modules, textGone: c.TextGone}
	if p.modPath != "" {
		p.modSeen, _ = os.ReadFile(p.modPath) // unreadable: every Refresh says so
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if _, err := p.view.KernelSymbols(); err != nil {
		return nil, fmt.Errorf("load symbols: %w", err)
	}
	return p, nil
}

// Kernel is the view the planner reads.
func (p *Planner) Kernel() *kernel.Program { return p.view }

// Symbols is the current symbol snapshot (the core kernel's and the
// modules' functions).
func (p *Planner) Symbols() *kernel.Symbols {
	s, _ := p.view.KernelSymbols() // loaded by New; a failed reload keeps the last
	return s
}

// ReloadSymbols reads the symbols again (and with them the module list).
func (p *Planner) ReloadSymbols() (*kernel.Symbols, error) {
	s, err := p.view.Reload()
	if err != nil {
		return nil, fmt.Errorf("load symbols: %w", err)
	}
	return s, nil
}

// Lookup finds a function by name, reloading the symbols once if it is
// not there: a module may have been loaded since the last snapshot. It
// returns the snapshot the symbol is from and how many others share its
// name.
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

// LookupModule is Lookup of a module's function (MODULE:FUNC), with the
// symbols reloaded once when the module is not known yet.
func (p *Planner) LookupModule(name, module string) (*kernel.Symbols, kernel.Symbol, error) {
	syms := p.Symbols()
	sym, err := syms.LookupModule(name, module)
	if errors.Is(err, kernel.ErrUnknownFunction) {
		if syms, err = p.ReloadSymbols(); err == nil {
			sym, err = syms.LookupModule(name, module)
		}
	}
	return syms, sym, err
}

// Prototypes returns the kernel's function prototypes from BTF. Without
// BTF, liveness assumes every call reads all six argument registers.
func (p *Planner) Prototypes() kernel.Prototypes {
	pr, err := p.view.Prototypes()
	if err != nil && !errors.Is(err, kernel.ErrNoBTF) {
		p.protoWarn.Do(func() { p.log.Warn("no function prototypes; liveness stays conservative at calls", "err", err) })
	}
	return pr
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
	p.bl = nil
	if p.blPath != "" {
		bl, err := kernel.ReadKprobeBlacklist(p.blPath)
		if err != nil {
			p.log.Warn("kprobe blacklist unreadable; only kinst's own lists of the int3 path protect it", "err", err)
		} else {
			p.bl = bl
			p.log.Info("kprobe blacklist read", "functions", len(bl))
		}
	}
	p.die = nil
	if dn, err := p.view.DieNotifiers(); err != nil {
		p.log.Warn("die notifier chain unreadable; only kinst's own lists of the int3 path protect it", "err", err)
	} else {
		p.die = NewDieNotifiers(dn)
		p.log.Info("die notifiers read", "functions", len(p.die))
	}
	o, n, err := p.view.OwnedSites()
	p.ownedFor = syms
	switch {
	case o == nil:
		p.log.Warn("kernel tables unreadable; their sites are not refused", "err", err)
		p.owned = nil
		return nil
	case err != nil && !errors.Is(err, kernel.ErrNoBTF):
		p.log.Warn("modules' tables or ftrace's records unreadable; only the core kernel's tables are refused", "err", err)
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
	owned := p.ownedSites(syms)
	p.ownMu.Lock()
	bl, die := p.bl, p.die
	p.ownMu.Unlock()
	return &Facts{Symbols: syms, Text: p.view, Owned: owned, NoReturn: noret, Reads: reads,
		Prototypes: p.Prototypes(), Unprobeable: bl, DieNotifiers: die, recent: &p.recent}
}

// Func parses spec as a point, reads its function from the live kernel
// and plans it; Func.Resolve(point) finishes what Resolve does.
func (p *Planner) Func(spec string) (*Func, Point, error) {
	pt, err := ParsePoint(spec)
	if err != nil {
		return nil, Point{}, &BadPointError{err}
	}
	var syms *kernel.Symbols
	var sym kernel.Symbol
	amb := 0
	if pt.Module != "" {
		syms, sym, err = p.LookupModule(pt.Function, pt.Module)
	} else {
		syms, sym, amb, err = p.Lookup(pt.Function)
	}
	if err != nil {
		return nil, pt, err
	}
	f, err := p.FuncOf(syms, sym)
	if err != nil {
		return nil, pt, err
	}
	f.Ambiguous = amb
	return f, pt, nil
}

// FuncOf reads the function sym of the snapshot syms from the live kernel
// and plans it: Func for a symbol already found, which a name may not
// name alone (a module's static function can share its name with the
// core kernel's).
func (p *Planner) FuncOf(syms *kernel.Symbols, sym kernel.Symbol) (*Func, error) {
	fn, err := p.recent.read(p.view, syms, sym)
	if err != nil {
		return nil, err
	}
	k := p.factsFor(syms)
	f := k.Func(fn, nil)
	f.Sym = sym
	if p.heap != nil {
		f.UseSpringboards(p.heap)
	}
	return f, nil
}

// UseSpringboards lets f plan springboard splices with slots from heap,
// adding the springboard space of the functions near an instruction the
// first time one asks.
func (f *Func) UseSpringboards(heap *springboard.Heap) {
	k := f.facts
	f.slotFree = func(addr uint64) bool {
		addSpringboardSpace(heap, k, addr)
		_, ok := heap.Find(addr)
		return ok
	}
	f.padFree = func(r springboard.Range, take bool) bool {
		addSpringboardSpace(heap, k, r.Start) // before a take: added later, the run would come back whole
		return heap.Reserve(r, take)
	}
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
	return p.factsFor(p.Symbols()).Func(s.Fn, nil).Live(s.Index())
}

// addSpringboardSpace makes sure the springboard space of every function
// within rel8 reach of addr is in the heap: each function's padding is
// found (SpringboardSpace) the first time an instruction near it asks.
func addSpringboardSpace(heap *springboard.Heap, k *Facts, addr uint64) {
	lo, hi := springboard.Reach(addr)
	hi += springboard.SlotLen
	for sym := range k.Symbols.EachOverlapping(lo, hi) {
		heap.AddFunction(sym.Addr, func() []springboard.Range {
			fn, err := k.readFunction(sym)
			if err != nil || !k.Process && k.functionNoSplice(fn) != "" {
				return nil
			}
			owned := func(a uint64) bool { return k.Owned.Reason(a) != "" }
			return SpringboardSpace(fn, fn.BlocksOpt(k.BlockOptions()), owned)
		})
	}
}
