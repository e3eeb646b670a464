package splice

import (
	"sync"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
)

// recentFunctions keeps the last few functions the planner decoded. A
// session over many functions plans them in address order, and planning
// one decodes its neighbours to find their springboard space
// (addSpringboardSpace), so the next function asked for was usually
// decoded moments before: without this, planning the whole kernel decoded
// every function about 2.6 times, two thirds of planning's time.
//
// A function is kept with the symbol snapshot it was read from, and only
// while that snapshot is current: a module loaded or unloaded since makes
// a new snapshot, and the addresses mean something else. The text itself
// is read as the kernel's own code (original bytes under kinst's
// splices), which a splice does not change; what else changes kernel text
// (jump labels, static calls, alternatives) is refused at the owned
// sites whatever their bytes were when read.
type recentFunctions struct {
	mu   sync.Mutex
	syms *kernel.Symbols           // the snapshot the entries were read from
	ring [recentCap]recentFunction // newest at next-1
	next int
}

// recentFunction is ReadFunction's answer for sym.
type recentFunction struct {
	sym  kernel.Symbol
	fn   *cfg.Function
	err  error
	used bool
}

// recentCap covers a function and its neighbours within rel8 reach on
// each side, with room to spare.
const recentCap = 8

// read is cfg.ReadFunction(text, syms, sym), from the ring when it holds
// sym of syms. The Function returned is shared: the caller must not
// change it (planning does not).
func (r *recentFunctions) read(text cfg.TextReader, syms *kernel.Symbols, sym kernel.Symbol) (*cfg.Function, error) {
	if r == nil {
		return cfg.ReadFunction(text, syms, sym)
	}
	r.mu.Lock()
	if r.syms == syms {
		for _, e := range r.ring {
			if e.used && e.sym == sym {
				r.mu.Unlock()
				return e.fn, e.err
			}
		}
	}
	r.mu.Unlock()
	fn, err := cfg.ReadFunction(text, syms, sym)
	r.mu.Lock()
	if r.syms != syms {
		r.syms, r.ring, r.next = syms, [recentCap]recentFunction{}, 0
	}
	r.ring[r.next] = recentFunction{sym: sym, fn: fn, err: err, used: true}
	r.next = (r.next + 1) % recentCap
	r.mu.Unlock()
	return fn, err
}

// Decoded are the functions a caller has decoded and planned already (a
// process target decodes each function it plans once, funcOf): the
// planner's later reads of the same symbol -- a neighbour's springboard
// space, found as each site is planned -- take them instead of decoding
// the text again (over libc that was half of planning's time). The
// functions are shared and must not be changed. It has its own lock.
type Decoded struct {
	mu  sync.Mutex
	fns map[kernel.Symbol]*cfg.Function
}

// Add records fn as sym's function.
func (d *Decoded) Add(sym kernel.Symbol, fn *cfg.Function) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fns == nil {
		d.fns = map[kernel.Symbol]*cfg.Function{}
	}
	d.fns[sym] = fn
}

// get is sym's function, if one was added.
func (d *Decoded) get(sym kernel.Symbol) *cfg.Function {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fns[sym]
}
