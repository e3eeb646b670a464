package report

import (
	"cmp"
	"path"
	"slices"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
)

// FindOptions tune FindFunctions.
type FindOptions struct {
	// Classic adds the KernInst paper's names (lookuppn) of the kernel.
	Classic bool
	// Name is how a function is named in the answer (a process's
	// LIB:NAME); nil: its symbol's name.
	Name func(kernel.Symbol) string
}

// FindFunctions is the functions of syms that q names (with o.Classic,
// the classic names that match, of functions present): q is a substring of the name,
// ignoring case, or a glob (*, ?, [...]) of the whole name, and
// "MODULE:" before it keeps the functions of one module ("evdev:",
// "evdev:*read*"). Names starting with q come first, then shorter ones,
// so that typing a few letters finds the function meant. An empty q
// gives the classic names. At most limit are returned; the total counts
// all.
func FindFunctions(syms *kernel.Symbols, q string, limit int, o FindOptions) api.Functions {
	out := api.Functions{Query: q, Functions: []api.FunctionRef{}}
	module, pattern, inModule := strings.Cut(q, ":")
	if !inModule {
		module, pattern = "", q
	}
	lq := strings.ToLower(pattern)
	glob := strings.ContainsAny(pattern, "*?[")
	match := func(name string) bool {
		if glob {
			ok, _ := path.Match(pattern, name)
			return ok
		}
		return strings.Contains(strings.ToLower(name), lq)
	}
	var refs []api.FunctionRef
	if !inModule && o.Classic {
		for _, name := range splice.ClassicNames() {
			if !match(name) {
				continue
			}
			c := splice.Classic[name]
			// Only where the function it stands for is there (ufs_lookup
			// is ext4's, absent without the module).
			if s, _, err := syms.Lookup(c.Linux); err == nil {
				refs = append(refs, api.FunctionRef{Name: name, Module: s.Module, Address: api.Addr(s.Addr),
					Classic: &api.ClassicName{Solaris: c.Solaris, Linux: c.Linux, Why: c.Why}})
			}
		}
	}
	if q != "" {
		for _, s := range syms.All() {
			if (!inModule || s.Module == module) && match(s.Name) {
				name := s.Name
				if o.Name != nil {
					name = o.Name(s)
				}
				refs = append(refs, api.FunctionRef{Name: name, Module: s.Module, Address: api.Addr(s.Addr)})
			}
		}
	}
	rank := func(r api.FunctionRef) int {
		if _, n, _ := strings.Cut(r.Name, ":"); strings.HasPrefix(strings.ToLower(r.Name), lq) || strings.HasPrefix(strings.ToLower(n), lq) {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(refs, func(a, b api.FunctionRef) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(len(a.Name), len(b.Name)),
			strings.Compare(a.Name, b.Name), cmp.Compare(a.Address, b.Address))
	})
	out.Total = len(refs)
	out.Functions = append(out.Functions, refs[:max(0, min(limit, len(refs)))]...)
	return out
}
