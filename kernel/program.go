package kernel

import (
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
)

// Reader reads kernel memory at a virtual address: the driver, a core
// dump, or a file.
type Reader interface {
	Read(addr uint64, b []byte) error
}

// Program is one view of a kernel, live or from a dump, modelled on
// drgn's program: its memory, its symbols (kernel image and modules), its
// types and the struct layouts derived from them, its module list and
// per-CPU data. Two constructors build it: Live for the running kernel
// and, in package kernel/dumpview, one over a crash dump; both answer
// every question the same way from there on.
//
// What is derived is loaded on first use and kept, error included: a dump
// does not change, and a live kernel's symbols and modules are reread
// only by Reload. A Program is safe for concurrent use.
type Program struct {
	mem Reader
	src Source

	mu  sync.Mutex
	gen *generation // symbols and modules; replaced by Reload

	types  lazy[*Types]
	layout lazy[*KernelLayout]
	task   lazy[TaskLayout]
	protos lazy[Prototypes]
	percpu lazy[uint64] // address of __per_cpu_offset
	ncpu   lazy[int]
}

// generation is what a Reload replaces: the symbols and the module list.
type generation struct {
	syms lazy[*Symbols] // the backend's
	mods lazy[[]*Module]
	all  lazy[*Symbols] // syms with the modules' symbols
}

// Source is what a backend gives a Program.
type Source struct {
	// Memory reads kernel virtual memory.
	Memory Reader
	// Symbols loads the symbol table; Reload calls it again.
	Symbols func() (*Symbols, error)
	// Types loads the kernel's BTF, through p where it lies in the
	// kernel's memory (ReadTypes). nil: the view has no types.
	Types func(p *Program) (*Types, error)
	// ModuleSymbols: Symbols lists the kernel image's symbols only (a
	// dump's kallsyms tables), and each module's symbols are to be read
	// from its struct module.
	ModuleSymbols bool
	// Release is the kernel release (uname -r).
	Release string
}

// lazy computes a value on first use and keeps it, error included.
type lazy[T any] struct {
	once sync.Once
	v    T
	err  error
}

func (l *lazy[T]) get(load func() (T, error)) (T, error) {
	l.once.Do(func() { l.v, l.err = load() })
	return l.v, l.err
}

// New makes a view over a backend. Nothing is read until asked for: a
// dump whose symbols cannot be decoded still has memory, registers and a
// log to show.
func New(src Source) *Program {
	return &Program{mem: src.Memory, src: src, gen: &generation{}}
}

// LiveOptions locate the running kernel's symbols and types.
type LiveOptions struct {
	// Kallsyms is the symbol table; "" is /proc/kallsyms.
	Kallsyms string
	// BTF is the kernel's BTF (BTFPath); "" leaves the view without
	// types: prototypes, layouts and the module list are then
	// unavailable.
	BTF string
	// Release is the kernel release; "" reads
	// /proc/sys/kernel/osrelease.
	Release string
}

// Live makes the view of the running kernel: memory through mem (the
// driver's device), symbols from kallsyms (which lists every module's
// too), types from BTF.
func Live(mem Reader, o LiveOptions) (*Program, error) {
	if o.Kallsyms == "" {
		o.Kallsyms = KallsymsPath
	}
	if o.Release == "" {
		b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
		o.Release = strings.TrimSpace(string(b))
	}
	src := Source{
		Memory:  mem,
		Symbols: func() (*Symbols, error) { return LoadKallsyms(o.Kallsyms) },
		Release: o.Release,
	}
	if o.BTF != "" {
		src.Types = func(*Program) (*Types, error) {
			if o.BTF == BTFPath {
				return LoadKernelTypes()
			}
			return LoadTypes(o.BTF)
		}
	}
	p := New(src)
	if _, err := p.KernelSymbols(); err != nil {
		return nil, err
	}
	return p, nil
}

// Release is the kernel release the backend reported.
func (p *Program) Release() string { return p.src.Release }

// Read reads kernel memory.
func (p *Program) Read(addr uint64, b []byte) error { return p.mem.Read(addr, b) }

// ReadBytes reads n bytes of kernel memory.
func (p *Program) ReadBytes(addr uint64, n int) ([]byte, error) {
	b := make([]byte, n)
	return b, p.mem.Read(addr, b)
}

// ReadU64 reads one little-endian 64-bit word of kernel memory.
func (p *Program) ReadU64(addr uint64) (uint64, error) { return readU64(p.mem, addr) }

// ReadU32 reads one little-endian 32-bit word of kernel memory.
func (p *Program) ReadU32(addr uint64) (uint32, error) {
	var b [4]byte
	if err := p.mem.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// WalkList walks a kernel list through the view's memory (see WalkList).
func (p *Program) WalkList(head, entryOff uint64, limit int, f func(entry uint64) error) error {
	return WalkList(p.mem, head, entryOff, limit, f)
}

func (p *Program) generation() *generation {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen
}

// Symbols returns the symbol table: the kernel image's and every loaded
// module's. Where the backend's table lacks the modules' (a dump), they
// are read from the module list, as far as it can be read (Modules says
// why not).
func (p *Program) Symbols() (*Symbols, error) {
	g := p.generation()
	base, err := p.symbolsOf(g)
	if err != nil || !p.src.ModuleSymbols {
		return base, err
	}
	return g.all.get(func() (*Symbols, error) {
		mods, _ := p.modules(g) // a list cut short still names its modules
		l, err := p.moduleLayout()
		if err != nil {
			return base, nil
		}
		var syms []Symbol
		for _, m := range mods {
			s, err := ReadModuleSymbols(p.mem, m, l)
			if err != nil {
				return base, nil
			}
			syms = append(syms, s...)
		}
		return MergeSymbols(base, NewSymbols(syms)), nil
	})
}

// KernelSymbols returns the backend's own table, without the symbols
// Symbols adds from the module list: for a dump, the kernel image's.
func (p *Program) KernelSymbols() (*Symbols, error) { return p.symbolsOf(p.generation()) }

func (p *Program) symbolsOf(g *generation) (*Symbols, error) {
	return g.syms.get(p.src.Symbols)
}

// Reload reads the symbols again and forgets the module list: a live
// kernel loads and unloads modules. The old generation stays valid for
// whoever holds it; on error nothing changes.
func (p *Program) Reload() (*Symbols, error) {
	syms, err := p.src.Symbols()
	if err != nil {
		return nil, err
	}
	g := &generation{}
	g.syms.get(func() (*Symbols, error) { return syms, nil })
	p.mu.Lock()
	p.gen = g
	p.mu.Unlock()
	return syms, nil
}

// Types returns the kernel's BTF; ErrNoBTF for a view without it.
func (p *Program) Types() (*Types, error) {
	return p.types.get(func() (*Types, error) {
		if p.src.Types == nil {
			return nil, ErrNoBTF
		}
		return p.src.Types(p)
	})
}

// Prototypes returns every function prototype of the kernel's BTF.
func (p *Program) Prototypes() (Prototypes, error) {
	return p.protos.get(func() (Prototypes, error) {
		t, err := p.Types()
		if err != nil {
			return nil, err
		}
		// A copy: reading every prototype inflates every type, and
		// the spec would keep them all (about 22 MB for 6.1) though
		// only the prototypes are wanted.
		return PrototypesFromBTF(t.Spec.Copy())
	})
}

// KernelLayout returns the layouts the owned-site walkers read.
func (p *Program) KernelLayout() (*KernelLayout, error) {
	return p.layout.get(func() (*KernelLayout, error) {
		t, err := p.Types()
		if err != nil {
			return nil, err
		}
		return KernelLayoutFrom(t)
	})
}

// TaskLayout returns where the running task and its identity are.
func (p *Program) TaskLayout() (TaskLayout, error) {
	return p.task.get(func() (TaskLayout, error) {
		t, err := p.Types()
		if err != nil {
			return TaskLayout{}, fmt.Errorf("%w: %w", ErrNoTaskLayout, err)
		}
		syms, err := p.KernelSymbols()
		if err != nil {
			return TaskLayout{}, fmt.Errorf("%w: %w", ErrNoTaskLayout, err)
		}
		return TaskLayoutFrom(t, syms)
	})
}

func (p *Program) moduleLayout() (*ModuleLayout, error) {
	if l, err := p.KernelLayout(); err == nil {
		return &l.Module, nil
	}
	t, err := p.Types()
	if err != nil {
		return nil, err
	}
	return ModuleLayoutFromBTF(t)
}

// Modules returns the loaded modules, sorted by the address of their
// text.
func (p *Program) Modules() ([]*Module, error) { return p.modules(p.generation()) }

func (p *Program) modules(g *generation) ([]*Module, error) {
	return g.mods.get(func() ([]*Module, error) {
		l, err := p.moduleLayout()
		if err != nil {
			return nil, fmt.Errorf("modules: %w", err)
		}
		syms, err := p.symbolsOf(g)
		if err != nil {
			return nil, fmt.Errorf("modules: %w", err)
		}
		head, ok := syms.Address("modules")
		if !ok {
			return nil, nil // built without module support
		}
		mods, err := ReadModules(p.mem, head, l)
		sort.Slice(mods, func(i, j int) bool { return mods[i].Base < mods[j].Base })
		if err != nil {
			return mods, fmt.Errorf("modules: %w", err)
		}
		return mods, nil
	})
}

// ModuleAt returns the module whose core text range (see ModuleLayout)
// holds addr, or nil.
func (p *Program) ModuleAt(addr uint64) *Module {
	mods, _ := p.Modules()
	i := sort.Search(len(mods), func(i int) bool { return mods[i].Base+mods[i].Size > addr })
	if i < len(mods) && addr >= mods[i].Base {
		return mods[i]
	}
	return nil
}

// OwnedSites reads the instructions the kernel's own tables name (see
// LoadOwnedSites) with the view's symbols and layouts. When the layouts
// are unavailable, or the modules' tables or ftrace's records cannot be
// read, it reads the core kernel's tables alone and returns them with the
// error that stopped the rest; a nil set means even those were
// unreadable.
func (p *Program) OwnedSites() (*OwnedSites, OwnedCounts, error) {
	syms, err := p.KernelSymbols()
	if err != nil {
		return nil, OwnedCounts{}, err
	}
	l, err := p.KernelLayout()
	if err == nil {
		o, n, err2 := LoadOwnedSites(p.mem, syms, l)
		if err2 == nil {
			return o, n, nil
		}
		err = err2
	}
	o, n, err2 := LoadOwnedSites(p.mem, syms, nil)
	if err2 != nil {
		return nil, n, err2
	}
	return o, n, err
}

// maxSymbolDistance bounds how far below an address the symbol naming
// it may start (the 6.1 kernel's largest object is well under it).
const maxSymbolDistance = 1 << 20

// inImage reports whether addr lies in the kernel image, [_text, _end):
// its symbols are the backend's own, no module list needed.
func inImage(syms *Symbols, addr uint64) bool { return syms.InRange(addr, "_text", "_end") }

// SymbolAt names the symbol, of any type, containing addr: in a module,
// that module's; elsewhere the kernel image's. Per-CPU symbols, whose
// values are small offsets, name small numbers: callers that want kernel
// addresses only check the address first.
func (p *Program) SymbolAt(addr uint64) (Symbol, uint64, bool) {
	kern, err := p.KernelSymbols()
	if err != nil {
		return Symbol{}, 0, false
	}
	var sym Symbol
	var ok bool
	if m := p.moduleOf(kern, addr); m != nil {
		syms, _ := p.Symbols()
		sym, ok = syms.Before(addr, m.Name, addr-m.Base)
	} else {
		sym, ok = kern.Before(addr, "", maxSymbolDistance)
	}
	if !ok {
		return Symbol{}, 0, false
	}
	return sym, addr - sym.Addr, true
}

// moduleOf is ModuleAt, without reading the module list for an address
// of the kernel image.
func (p *Program) moduleOf(kern *Symbols, addr uint64) *Module {
	if inImage(kern, addr) {
		return nil
	}
	return p.ModuleAt(addr)
}

// SymbolSize is the distance from sym to the next symbol of its module
// (or of the kernel image); for a module's last, to the end of its text;
// 0 where nothing bounds it.
func (p *Program) SymbolSize(sym Symbol) uint64 {
	syms, err := p.KernelSymbols()
	if sym.Module != "" {
		syms, err = p.Symbols()
	}
	if err != nil {
		return 0
	}
	if next, ok := syms.After(sym); ok {
		return next.Addr - sym.Addr
	}
	if m := p.ModuleAt(sym.Addr); m != nil && sym.Module == m.Name && m.Base+m.TextSize > sym.Addr {
		return m.Base + m.TextSize - sym.Addr
	}
	return 0
}

// LookupSymbol finds a symbol of any type by name: the kernel image's,
// else the first module's that has it; "module:name" looks in one module
// only.
func (p *Program) LookupSymbol(name string) (Symbol, error) {
	mod, fn, scoped := strings.Cut(name, ":")
	if !scoped {
		kern, err := p.KernelSymbols()
		if err != nil {
			return Symbol{}, err
		}
		for _, s := range kern.Named(name) {
			if s.Module == "" {
				return s, nil
			}
		}
		fn = name
	}
	syms, err := p.Symbols()
	if err != nil {
		return Symbol{}, err
	}
	for _, s := range syms.Named(fn) {
		if !scoped || s.Module == mod {
			return s, nil
		}
	}
	return Symbol{}, &NoSymbolError{Name: name}
}
