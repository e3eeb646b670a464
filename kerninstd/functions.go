package kerninstd

import (
	"cmp"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
)

// maxFunctions bounds one /v1/functions answer.
const maxFunctions = 1000

// findFunctions is the functions of syms that q names, with the classic
// names that match (of functions present): q is a substring of the name,
// ignoring case, or a glob (*, ?, [...]) of the whole name, and
// "MODULE:" before it keeps the functions of one module ("evdev:",
// "evdev:*read*"). Names starting with q come first, then shorter ones,
// so that typing a few letters finds the function meant. An empty q
// gives the classic names. At most limit are returned; the total counts
// all.
func findFunctions(syms *kernel.Symbols, q string, limit int) api.Functions {
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
	if !inModule {
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
				refs = append(refs, api.FunctionRef{Name: s.Name, Module: s.Module, Address: api.Addr(s.Addr)})
			}
		}
	}
	rank := func(r api.FunctionRef) int {
		if strings.HasPrefix(strings.ToLower(r.Name), lq) {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(refs, func(a, b api.FunctionRef) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(len(a.Name), len(b.Name)),
			strings.Compare(a.Name, b.Name), cmp.Compare(a.Address, b.Address))
	})
	out.Total = len(refs)
	out.Functions = append(out.Functions, refs[:min(limit, len(refs))]...)
	return out
}

// serveFunctions is GET /v1/functions?q=TEXT&limit=N (default 50).
func serveFunctions(syms func() *kernel.Symbols) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		limit := 50
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxFunctions {
				writeError(w, badRequest(fmt.Errorf("limit %q: want 1..%d", v, maxFunctions)))
				return
			}
			limit = n
		}
		writeJSON(w, http.StatusOK, findFunctions(syms(), r.URL.Query().Get("q"), limit))
	}
}
