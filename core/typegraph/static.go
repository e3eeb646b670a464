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
	for _, r := range [][2]string{{"_sdata", "_edata"}, {"__start_rodata", "__end_rodata"}, {"__bss_start", "__bss_stop"}} {
		lo, err1 := g.k.SymbolAddr(r[0])
		hi, err2 := g.k.SymbolAddr(r[1])
		if err1 == nil && err2 == nil && lo < hi {
			g.static.ranges = append(g.static.ranges, [2]uint64{lo, hi})
		}
	}
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
