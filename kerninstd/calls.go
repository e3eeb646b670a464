package kerninstd

import (
	"context"
	"fmt"
	"sort"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/splice"
)

// functionCalls returns the callers and callees of a function from the
// whole-kernel call graph, running the analysis first if it has not run.
func (c *kernelCensus) functionCalls(ctx context.Context, name string) (api.Calls, error) {
	c.mu.Lock()
	g, syms := c.calls, c.callSyms
	c.mu.Unlock()
	if g == nil {
		if _, err := c.analyze(ctx, 0, nil); err != nil {
			return api.Calls{}, err
		}
		c.mu.Lock()
		g, syms = c.calls, c.callSyms
		c.mu.Unlock()
	}
	sym, _, err := syms.Lookup(name)
	if err != nil {
		return api.Calls{}, err
	}
	// A callee is named as the analysis names call targets: of several
	// symbols at one address, a retpoline thunk's name beats a marker's
	// (__x86_indirect_thunk_rax, not __static_call_text_end).
	names := splice.AnalysisNames(syms)
	ref := func(fn, site uint64, tail bool) api.CallRef {
		r := api.CallRef{Function: "?", Site: api.Addr(site), Kind: "call"}
		if tail {
			r.Kind = "tail-call"
		}
		if s, off, ok := syms.At(fn); ok && off == 0 {
			r.Function, r.Module = s.Name, s.Module
			if n, ok := names(fn); ok {
				r.Function = n
			}
		}
		if s, off, ok := syms.At(site); ok {
			r.At = fmt.Sprintf("%s+%#x", s.Name, off)
		}
		return r
	}
	out := api.Calls{Function: sym.Name, Address: api.Addr(sym.Addr), Callees: []api.CallRef{}, Callers: []api.CallRef{}}
	for _, e := range g.Callees[sym.Addr] {
		out.Callees = append(out.Callees, ref(e.Callee, e.Site, e.Tail))
	}
	for _, e := range g.Callers[sym.Addr] {
		out.Callers = append(out.Callers, ref(e.Caller, e.Site, e.Tail))
	}
	for _, l := range [][]api.CallRef{out.Callees, out.Callers} {
		sort.Slice(l, func(i, j int) bool { return l[i].Site < l[j].Site })
	}
	return out, nil
}
