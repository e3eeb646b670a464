package typegraph

import "fmt"

// Static data: a typed pointer (not to a list or tree node, not in a
// union) that lands in the kernel image's data, read-only data or bss
// says a struct of its type lies there, as one into a slab object does
// (trace_event_file.event_call points at a static trace_event_call,
// whose class points at a static trace_event_class, whose fields list
// holds the heap's ftrace_event_fields). The struct is read there and
// becomes a root: its pointers propagate as the object's would. Only
// known objects' pointers are followed there (a conjecture's would
// spread a wrong type through the image to objects of every kind). 6.1's BTF types no such variable itself.

// staticData is the kernel image's data ranges and the structs read in
// them.
type staticData struct {
	ranges [][2]uint64
	seen   map[staticKey]bool
}

type staticKey struct {
	addr uint64
	typ  int32
}

// maxStatic bounds the static structs read.
const maxStatic = 1 << 16

func (g *Graph) initStatic() {
	g.static.seen = map[staticKey]bool{}
	span := func(a, b string) ([2]uint64, bool) {
		lo, err1 := g.k.SymbolAddr(a)
		hi, err2 := g.k.SymbolAddr(b)
		return [2]uint64{lo, hi}, err1 == nil && err2 == nil && lo < hi
	}
	for _, r := range [][2]string{{"_sdata", "_edata"}, {"__start_rodata", "__end_rodata"}, {"__bss_start", "__bss_stop"}} {
		if s, ok := span(r[0], r[1]); ok {
			g.static.ranges = append(g.static.ranges, s)
		}
	}
	// Parts of the image the kernel frees after boot are the page
	// allocator's, then anyone's: x86's unused .bss..decrypted ("Freeing
	// unused decrypted memory", mem_encrypt_free_decrypted_mem) lies
	// inside the bss. Read as the image's, a slab's free object there
	// was a root: its stale va_start reached a leaked vmalloc area, and
	// findleaks did not report it (livecompat, a 6.1 dump). The init
	// section goes too, and the SMP alternatives' lock list ("Freeing
	// SMP alternatives memory"; between the init section and the bss in
	// 6.1 and 6.12, outside the ranges, but cut wherever it lies).
	for _, r := range [][2]string{{"__start_bss_decrypted_unused", "__end_bss_decrypted"}, {"__init_begin", "__init_end"}, {"__smp_locks", "__smp_locks_end"}} {
		if s, ok := span(r[0], r[1]); ok {
			g.static.ranges = cutRange(g.static.ranges, s)
		}
	}
}

// cutRange is rs without the addresses of cut.
func cutRange(rs [][2]uint64, cut [2]uint64) [][2]uint64 {
	var out [][2]uint64
	for _, r := range rs {
		if r[1] <= cut[0] || r[0] >= cut[1] {
			out = append(out, r)
			continue
		}
		if r[0] < cut[0] {
			out = append(out, [2]uint64{r[0], cut[0]})
		}
		if cut[1] < r[1] {
			out = append(out, [2]uint64{cut[1], r[1]})
		}
	}
	return out
}

// staticRoot reads struct t at v if v lies in the image's data.
func (g *Graph) staticRoot(v uint64, t int32, src int32, srcOff uint32, m Mark) {
	ti := g.ts.info(t)
	if m != Known || ti.ptrTo >= 0 || ti.link || len(g.static.seen) >= maxStatic {
		return
	}
	in := false
	for _, r := range g.static.ranges {
		if v >= r[0] && v+uint64(ti.size) <= r[1] {
			in = true
			break
		}
	}
	k := staticKey{v, t}
	if !in || g.static.seen[k] {
		return
	}
	g.static.seen[k] = true
	from := "a variable"
	if src >= 0 {
		from = fmt.Sprintf("%#x (%s)+%#x", g.addr(src), g.slabs[g.nodeSlab[src]].Cache.Name, srcOff)
	} else {
		from = g.roots[-1-src].name
	}
	g.roots = append(g.roots, root{name: fmt.Sprintf("static %s at %#x, from %s", ti.name, v, from), addr: v, typ: ti.t, mark: m})
	g.rootq = append(g.rootq, int32(len(g.roots)-1))
}
