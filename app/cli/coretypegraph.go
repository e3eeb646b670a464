package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/typegraph"
	"github.com/kinst/kinst/core/typeid"
	"github.com/kinst/kinst/internal/outfile"
)

// CoreTypeGraph types the dump's heap by the type graph and prints the
// account: each pass, each cache's types, the held-out caches'
// precision and recall, and a few conflicts with their chains.
//
// istype, if set, is "ADDR TYPE": the object at ADDR is a struct TYPE,
// set by hand, and the report says how many more objects the graph
// types with it than without.
//
// graphFile, if set, is a saved graph (typegraph.Load): used instead of
// building when it is this dump's, written when it does not exist yet,
// and with istype, changed incrementally and written back.
func CoreTypeGraph(k *core.Kernel, holdOut []string, istype []string, graphFile string, asJSON bool, w io.Writer) error {
	if graphFile != "" {
		start := time.Now()
		g, how, err := graphFor(k, holdOut, graphFile)
		if err != nil {
			return err
		}
		if len(istype) == 2 {
			res, err := isType(k, g, istype[0], istype[1])
			if err != nil {
				return err
			}
			if err := saveGraph(k, g, graphFile); err != nil {
				return err
			}
			if asJSON {
				return writeJSON(w, res)
			}
			printIsType(w, res)
			return nil
		}
		if !asJSON {
			fmt.Fprintf(w, "graph %s %s\n", how, graphFile)
		}
		return printTypeGraph(g, nil, 0, start, asJSON, w)
	}
	h, err := openHeap(k)
	if err != nil {
		return err
	}
	spec, err := kernelView{k}.BTF()
	if err != nil {
		return err
	}
	opt := typegraph.Options{HoldOut: holdOut}
	var before int
	if len(istype) == 2 {
		a, err := resolveAddr(k, istype[0])
		if err != nil {
			return err
		}
		g0, err := typegraph.Build(kernelView{k}, h, typeid.CacheTypes(spec, h), opt)
		if err != nil {
			return err
		}
		before = g0.Report().Typed
		opt.ByHand = []typegraph.ByHand{{Addr: a, Type: istype[1]}}
	}
	start := time.Now()
	g, err := typegraph.Build(kernelView{k}, h, typeid.CacheTypes(spec, h), opt)
	if err != nil {
		return err
	}
	return printTypeGraph(g, opt.ByHand, before, start, asJSON, w)
}

// printTypeGraph prints a graph's report; hand, if set, is the istype
// of a full build and before the count typed without it.
func printTypeGraph(g *typegraph.Graph, hand []typegraph.ByHand, before int, start time.Time, asJSON bool, w io.Writer) error {
	r := g.Report()
	if asJSON {
		return writeJSON(w, r)
	}
	if len(hand) > 0 {
		fmt.Fprintf(w, "%#x is a struct %s: %d objects typed, %d more than without it\n", hand[0].Addr, hand[0].Type, r.Typed, r.Typed-before)
	}
	fmt.Fprintf(w, "%d objects: %d typed (%.1f%%), %d by their cache, %d by the graph; %d untyped; %d with conflicts\n",
		r.Objects, r.Typed, pct(r.Typed, r.Objects), r.ByCache, r.Propagated, r.Untyped, r.Conflicts)
	fmt.Fprintf(w, "%d variables read, %d pointers into objects of unknown type, %d arrays; %.2fs\n\n", r.Roots, r.Claims, r.Arrays, time.Since(start).Seconds())
	tw := newTable(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "PASS\tOBJECTS\tKNOWN\tCONJECTURED\tCONFLICTS\tUNMARKED\tMS\t\n")
	for _, p := range r.Passes {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.1f\t\n", p.Pass, r.Objects, p.Known, p.Conjectured, p.Conflicts, p.Unmarked, float64(p.NS)/1e6)
	}
	tw.Flush()
	if r.GreatestReach != nil {
		fmt.Fprintf(w, "\ngreatest reach: %s (%s), %d untyped objects reachable from it\n", r.GreatestReach.Object, r.GreatestReach.Cache, r.GreatestReach.Reach)
	}
	fmt.Fprintf(w, "\ncaches whose objects the graph typed:\n")
	for _, c := range r.Caches {
		if c.Typed == 0 || c.ByCache == c.Objects {
			continue // typed by the cache: nothing the graph found
		}
		fmt.Fprintf(w, "  %-24s %6d of %6d: %s\n", c.Name, c.Typed, c.Objects, topTypes(c.Types, 5))
	}
	printHeldOut(w, r.HeldOut)
	if cs := g.Conflicts(3); len(cs) > 0 {
		fmt.Fprintf(w, "\nconflicts (first %d of %d):\n", len(cs), r.Conflicts)
		for _, c := range cs {
			fmt.Fprintf(w, "  %#x (%s) is %s:\n", c.Object, c.Cache, c.Type)
			printChain(w, "    ", c.Chain)
			for _, o := range c.Conflicts {
				fmt.Fprintf(w, "    but:\n")
				printChain(w, "      ", o)
			}
		}
	}
	return nil
}

// graphFor loads the saved graph in file if it is this dump's with the
// same held-out caches, else builds one and saves it there; how says
// which ("loaded from", "built and saved to"). A file that is another
// dump's, or corrupt, is an error: it is not overwritten.
func graphFor(k *core.Kernel, holdOut []string, file string) (*typegraph.Graph, string, error) {
	if k.Live() {
		return nil, "", fmt.Errorf("--graph-file: a live kernel's heap changes while it is read; a saved graph is for a dump")
	}
	h, err := openHeap(k)
	if err != nil {
		return nil, "", err
	}
	spec, err := kernelView{k}.BTF()
	if err != nil {
		return nil, "", err
	}
	ct := typeid.CacheTypes(spec, h)
	f, err := os.Open(file)
	switch {
	case err == nil:
		defer f.Close()
		g, err := typegraph.Load(f, kernelView{k}, h, ct, k.Dump.VMCoreInfo())
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", file, err)
		}
		want := append([]string(nil), holdOut...)
		sort.Strings(want)
		if got := g.HeldOut(); strings.Join(got, ",") != strings.Join(want, ",") {
			return nil, "", fmt.Errorf("%s: the saved graph holds out %v, not %v: build it again into another file", file, got, want)
		}
		return g, "loaded from", nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, "", err
	}
	g, err := typegraph.Build(kernelView{k}, h, ct, typegraph.Options{HoldOut: holdOut})
	if err != nil {
		return nil, "", err
	}
	if err := saveGraph(k, g, file); err != nil {
		return nil, "", err
	}
	return g, "built and saved to", nil
}

// saveGraph writes the graph to file through a temporary file renamed
// over it, so that a reader never sees half a graph.
func saveGraph(k *core.Kernel, g *typegraph.Graph, file string) error {
	return outfile.Write(file, func(w io.Writer) error {
		bw := bufio.NewWriter(w)
		if err := g.Save(bw, k.Dump.VMCoreInfo()); err != nil {
			return err
		}
		return bw.Flush()
	})
}

// isType sets a type by hand on a built or loaded graph.
func isType(k *core.Kernel, g *typegraph.Graph, at, typ string) (*typegraph.IsTypeResult, error) {
	a, err := resolveAddr(k, at)
	if err != nil {
		return nil, err
	}
	return g.IsType(a, typ)
}

func printIsType(w io.Writer, r *typegraph.IsTypeResult) {
	fmt.Fprintf(w, "%s is a struct %s: %d objects newly typed (reprocessed from it in %.1f ms); %d typed, %d untyped\n",
		r.Object, r.Type, r.NewlyTyped, float64(r.NS)/1e6, r.Typed, r.Untyped)
	if r.GreatestReach != nil {
		fmt.Fprintf(w, "greatest reach now: %s (%s), %d untyped objects reachable from it\n", r.GreatestReach.Object, r.GreatestReach.Cache, r.GreatestReach.Reach)
	}
}

// buildGraph types the dump's heap (graphFile: as graphFor).
func buildGraph(k *core.Kernel, graphFile string) (*typegraph.Graph, error) {
	if graphFile != "" {
		g, _, err := graphFor(k, nil, graphFile)
		return g, err
	}
	return buildHeapGraph(k, nil)
}

// buildHeapGraph walks the dump's heap and builds its graph, treating the
// caches of holdOut as untyped.
func buildHeapGraph(k *core.Kernel, holdOut []string) (*typegraph.Graph, error) {
	h, err := openHeap(k)
	if err != nil {
		return nil, err
	}
	spec, err := kernelView{k}.BTF()
	if err != nil {
		return nil, err
	}
	return typegraph.Build(kernelView{k}, h, typeid.CacheTypes(spec, h), typegraph.Options{HoldOut: holdOut})
}

// CoreFindLocks prints the held locks in typed memory, with owners and
// waiters.
func CoreFindLocks(k *core.Kernel, graphFile string, asJSON bool, w io.Writer) error {
	g, err := buildGraph(k, graphFile)
	if err != nil {
		return err
	}
	locks, implausible, err := g.FindLocks()
	if err != nil {
		return fmt.Errorf("findlocks: %w", err)
	}
	if locks == nil {
		locks = []typegraph.Lock{}
	}
	if asJSON {
		return writeJSON(w, struct {
			Locks       []typegraph.Lock `json:"locks"`
			Implausible int              `json:"implausible"`
		}{locks, implausible})
	}
	task := func(t *typegraph.TaskRef) string {
		if t.PID < 0 {
			return t.Address + " (not a task)"
		}
		return fmt.Sprintf("%d %s", t.PID, t.Comm)
	}
	for _, l := range locks {
		fmt.Fprintf(w, "%s %-8s %s", l.Address, l.Kind, l.In)
		if l.Cache != "" {
			fmt.Fprintf(w, " (%s)", l.Cache)
		}
		switch {
		case l.HeldBy != nil:
			fmt.Fprintf(w, "\n  held by %s", task(l.HeldBy))
		case l.Readers > 0:
			fmt.Fprintf(w, "\n  held by %d reader(s)", l.Readers)
		case l.Owner != "":
			fmt.Fprintf(w, "\n  owner word %s names no task", l.Owner)
		}
		fmt.Fprintln(w)
		for _, t := range l.Waiters {
			fmt.Fprintf(w, "  waiting: %s\n", task(t))
		}
	}
	fmt.Fprintf(w, "%d held locks; %d more locks' words could not be a held lock's (their objects' types are wrong)\n", len(locks), implausible)
	return nil
}

// CoreFindFalse prints the arrays whose small elements hold a lock and
// share cache lines.
func CoreFindFalse(k *core.Kernel, graphFile string, asJSON bool, w io.Writer) error {
	g, err := buildGraph(k, graphFile)
	if err != nil {
		return err
	}
	fs := g.FindFalse()
	if fs == nil {
		fs = []typegraph.FalseShare{}
	}
	if asJSON {
		return writeJSON(w, struct {
			Arrays []typegraph.FalseShare `json:"arrays"`
		}{fs})
	}
	// One line per member, with how many objects have it.
	type key struct{ in, typ, prim string }
	count := map[key]int{}
	first := map[key]typegraph.FalseShare{}
	var keys []key
	for _, f := range fs {
		in := f.In
		if f.Cache != "" {
			in = f.Cache + ": " + f.In
		}
		k := key{in, f.Type, f.Primitive}
		if count[k] == 0 {
			keys = append(keys, k)
			first[k] = f
		}
		count[k]++
	}
	tw := newTable(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "ADDRESS\tCOUNT\tELEMENT\tTOTAL\tTYPE\tPRIMITIVE\tIN\n")
	for _, k := range keys {
		f := first[k]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", f.Address, count[k], f.ElementSize, f.TotalSize, f.Type, f.Primitive, k.in)
	}
	tw.Flush()
	fmt.Fprintf(w, "%d arrays (%d kinds); ADDRESS is the first of COUNT\n", len(fs), len(keys))
	return nil
}

// pct is a as a percentage of b, 0 when b is.
func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// topTypes names the n types with the most objects, most first ("task_struct 12, …").
func topTypes(types map[string]int, n int) string {
	names := make([]string, 0, len(types))
	for t := range types {
		names = append(names, t)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := types[names[i]], types[names[j]]
		return a > b || a == b && names[i] < names[j]
	})
	parts := []string{}
	for i, t := range names {
		if i == n {
			parts = append(parts, fmt.Sprintf("… %d more", len(names)-n))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %d", t, types[t]))
	}
	return strings.Join(parts, ", ")
}

// printHeldOut is the held-out caches' precision and recall.
func printHeldOut(w io.Writer, held []typegraph.HeldOut) {
	if len(held) == 0 {
		return
	}
	fmt.Fprintf(w, "\nheld out (typed by inference only, checked against the cache's type):\n")
	for _, ho := range held {
		if ho.Type == "" {
			fmt.Fprintf(w, "  %-20s %6d objects, %6d typed: the cache holds no one known type to check against (merged, or no struct fits)\n", ho.Cache, ho.Objects, ho.Typed)
			continue
		}
		fmt.Fprintf(w, "  %-20s %-16s %6d objects, %6d typed, %6d right: precision %.1f%%, recall %.1f%%", ho.Cache, ho.Type, ho.Objects, ho.Typed, ho.Correct, pct(ho.Correct, ho.Typed), pct(ho.Correct, ho.Objects))
		if len(ho.Wrong) > 0 {
			var ws []string
			for t, n := range ho.Wrong {
				ws = append(ws, fmt.Sprintf("%s %d", t, n))
			}
			sort.Strings(ws)
			fmt.Fprintf(w, "; wrong: %s", strings.Join(ws, ", "))
		}
		fmt.Fprintln(w)
	}
}
