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
	syms *kernel.Symbols          // the snapshot fns were read from
	fns  [recentCap]*cfg.Function // a ring, newest at next-1
	err  [recentCap]error         // ReadFunction's error for fns[i]'s symbol
	at   [recentCap]kernel.Symbol // the symbol each entry was read for
	next int
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
		for i := range r.at {
			if (r.fns[i] != nil || r.err[i] != nil) && r.at[i] == sym {
				fn, err := r.fns[i], r.err[i]
				r.mu.Unlock()
				return fn, err
			}
		}
	}
	r.mu.Unlock()
	fn, err := cfg.ReadFunction(text, syms, sym)
	r.mu.Lock()
	if r.syms != syms {
		r.syms, r.fns, r.err, r.at, r.next = syms, [recentCap]*cfg.Function{}, [recentCap]error{}, [recentCap]kernel.Symbol{}, 0
	}
	r.fns[r.next], r.err[r.next], r.at[r.next] = fn, err, sym
	r.next = (r.next + 1) % recentCap
	r.mu.Unlock()
	return fn, err
}
