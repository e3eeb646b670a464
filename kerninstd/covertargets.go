package kerninstd

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/census"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/kerninstd/bench"
	"github.com/kinst/kinst/splice"
)

// coverTarget is one function a coverage session covers.
type coverTarget struct {
	syms *kernel.Symbols // the snapshot sym is from
	sym  kernel.Symbol
	f    *splice.Func // read and planned already, or nil
	err  error        // why it cannot be read: listed with no blocks
}

// isCover reports whether req asks for a coverage session.
func isCover(req api.SessionRequest) bool {
	return len(req.Cover) > 0 || len(req.CoverModules) > 0 || len(req.CoverCallees) > 0
}

// coverTargets expands a coverage request to its functions, each once
// (by address), in the request's order: a function by name (a classic
// name too) as given; a glob (*, ?, [...]) to every function symbol it
// matches, in address order; a module to every function of its text, in
// address order; a callee root to itself and, breadth first, the
// functions it calls directly or by tail call (the edges of the
// whole-kernel call graph, census.Callees), CoverDepth levels down
// (default 1). A function named or a callee root that cannot be read
// fails the request; a function reached otherwise is listed with the
// reason. Bad input changes nothing: nothing is spliced before this
// returns.
func coverTargets(plan *splice.Planner, req api.SessionRequest) ([]coverTarget, error) {
	if req.CoverDepth < 0 {
		return nil, badRequest(fmt.Errorf("negative call depth %d", req.CoverDepth))
	}
	if req.CoverDepth > 0 && len(req.CoverCallees) == 0 {
		return nil, badRequest(errors.New("a call depth needs a function whose callees to cover (cover_callees)"))
	}
	depth := req.CoverDepth
	if depth == 0 {
		depth = 1
	}
	var out []coverTarget
	seen := map[uint64]bool{}
	add := func(t coverTarget) {
		if !seen[t.sym.Addr] {
			seen[t.sym.Addr] = true
			out = append(out, t)
		}
	}
	named := func(name, what string) (*splice.Func, error) { return namedFunc(plan, name, what) }
	for _, t := range req.Cover {
		if !strings.ContainsAny(t, "*?[") {
			f, err := named(t, "target")
			if err != nil {
				return nil, err
			}
			add(coverTarget{syms: plan.Symbols(), sym: f.Sym, f: f})
			continue
		}
		if _, err := path.Match(t, ""); err != nil {
			return nil, badRequest(fmt.Errorf("target %q: %w", t, err))
		}
		syms, n := plan.Symbols(), 0
		for _, s := range syms.All() {
			if ok, _ := path.Match(t, s.Name); ok && !s.IsPrefix() {
				n++
				add(coverTarget{syms: syms, sym: s})
			}
		}
		if n == 0 {
			return nil, badRequest(fmt.Errorf("target %q matches no function", t))
		}
	}
	for _, m := range req.CoverModules {
		fns, err := moduleFunctions(plan, m)
		if err != nil {
			return nil, err
		}
		for _, t := range fns {
			add(t)
		}
	}
	for _, root := range req.CoverCallees {
		f, err := named(root, "callees of")
		if err != nil {
			return nil, err
		}
		calleeTargets(plan, f, depth, add)
	}
	return out, nil
}

// namedFunc reads a function given by name, failing the request if it
// cannot be read or names an instruction or block.
func namedFunc(plan *splice.Planner, name, what string) (*splice.Func, error) {
	f, pt, err := plan.Func(name)
	if err == nil && (pt.HasOffset || pt.HasBlock) {
		err = badRequest(fmt.Errorf("%s %q: name a function, not an instruction or block", what, name))
	}
	if err != nil {
		return nil, &splice.PointError{Point: name, Err: err}
	}
	return f, nil
}

// calleeTargets adds f and the functions it calls, depth levels down,
// each once.
func calleeTargets(plan *splice.Planner, f *splice.Func, depth int, add func(coverTarget)) {
	syms := plan.Symbols()
	add(coverTarget{syms: syms, sym: f.Sym, f: f})
	census.WalkCallees(f, depth, func(callee uint64) *splice.Func {
		at := syms.FunctionsAt(callee)
		if len(at) == 0 {
			return nil
		}
		cf, err := plan.FuncOf(syms, at[0])
		add(coverTarget{syms: syms, sym: at[0], f: cf, err: err})
		if err != nil {
			return nil
		}
		return cf
	})
}

// moduleFunctions is every function of a loaded module's text, in
// address order; the symbols are read again once if the module has none
// (it may have been loaded since). Module names are spelled as the kernel
// spells them (ext4, virtio_net; a dash is taken for an underscore, as
// modprobe does).
func moduleFunctions(plan *splice.Planner, name string) ([]coverTarget, error) {
	if name == "" || strings.ContainsAny(name, " \t/[]*?") {
		return nil, badRequest(fmt.Errorf("module %q: want a module name as lsmod prints it", name))
	}
	name = strings.ReplaceAll(name, "-", "_")
	of := func(syms *kernel.Symbols) []coverTarget {
		var out []coverTarget
		for _, s := range syms.All() {
			if s.Module == name && !s.IsPrefix() {
				out = append(out, coverTarget{syms: syms, sym: s})
			}
		}
		return out
	}
	if fns := of(plan.Symbols()); len(fns) > 0 {
		return fns, nil
	}
	syms, err := plan.ReloadSymbols()
	if err != nil {
		return nil, err
	}
	if fns := of(syms); len(fns) > 0 {
		return fns, nil
	}
	return nil, badRequest(fmt.Errorf("module %q is not loaded (no function of it in /proc/kallsyms; see lsmod)", name))
}

// coverFunc is t's function, read and planned.
func coverFunc(plan *splice.Planner, t coverTarget) (*splice.Func, error) {
	if t.f != nil || t.err != nil {
		return t.f, t.err
	}
	return plan.FuncOf(t.syms, t.sym)
}

// benchKernel is what the benches (package bench) drive: the engine and
// planner d's sessions use, the driver's reads, and coverage targets as a
// session resolves them. The benches run beside the sessions, not in
// them: they take no lock of d's.
func benchKernel(d *Daemon) bench.Kernel {
	return bench.Kernel{
		Engine:  d.eng,
		Planner: d.plan,
		Read:    d.dev.Read,
		Info:    d.Info,
		Log:     d.log,
		Now:     d.clock.Now,
		Targets: func(globs []string) (int, func(int) (*splice.Func, error), error) {
			ts, err := coverTargets(d.plan, api.SessionRequest{Cover: globs})
			if err != nil {
				return 0, nil, err
			}
			return len(ts), func(i int) (*splice.Func, error) { return coverFunc(d.plan, ts[i]) }, nil
		},
	}
}
