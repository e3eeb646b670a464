package cli

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/typegraph"
	"github.com/kinst/kinst/kernel/typed"
)

// kernelStackSize is THREAD_SIZE on x86-64 without KASAN: the bytes of a
// task's stack read as roots (a vmapped stack is read whole with the
// vmalloc areas too).
const kernelStackSize = 16 << 10

// CoreFindLeaks prints the slab objects no root reaches (mdb's
// ::findleaks): the type graph's heap, marked conservatively from the
// kernel's data, every CPU's per-CPU area, every task's kernel stack,
// and every vmalloc area (modules' memory among them); the objects left
// unreached, grouped by cache, type and, where slub_debug=U records
// owners, allocating function. verbose lists each leak.
func CoreFindLeaks(k *core.Kernel, vmlinux, graphFile string, verbose, asJSON bool, w io.Writer) error {
	g, err := buildGraph(k, graphFile)
	if err != nil {
		return err
	}
	r, err := findLeaks(k, vmlinux, g)
	if err != nil {
		return err
	}
	return writeLeaks(r, verbose, asJSON, w)
}

// findLeaks runs findleaks on a built graph.
func findLeaks(k *core.Kernel, vmlinux string, g *typegraph.Graph) (*typegraph.LeakReport, error) {
	roots, err := leakRoots(k, vmlinux, g)
	if err != nil {
		return nil, fmt.Errorf("findleaks: %w", err)
	}
	r := g.FindLeaks(roots)
	for i := range r.Groups {
		gr := &r.Groups[i]
		gr.AllocFunction = symbolize(k, gr.AllocCaller)
		for _, f := range gr.AllocStack {
			gr.AllocFrames = append(gr.AllocFrames, symbolize(k, f))
		}
		for j := range gr.Leaks {
			gr.Leaks[j].AllocFunction = gr.AllocFunction
		}
	}
	return r, nil
}

// writeLeaks prints findleaks' report: the totals, a line per cache and
// type, and with verbose each leak.
func writeLeaks(r *typegraph.LeakReport, verbose, asJSON bool, w io.Writer) error {
	if !verbose {
		for i := range r.Groups {
			r.Groups[i].Leaks = nil
		}
	}
	if asJSON {
		if r.Groups == nil {
			r.Groups = []typegraph.LeakGroup{}
		}
		return writeJSON(w, r)
	}
	nroots := 0
	for _, n := range r.RootRanges {
		nroots += n
	}
	fmt.Fprintf(w, "%d allocated objects: %d reached from %d root ranges (%d MiB read", r.Objects, r.Reached, nroots, r.RootBytes>>20)
	if r.Unreadable > 0 {
		fmt.Fprintf(w, ", %d KiB not in the dump", r.Unreadable>>10)
	}
	fmt.Fprintf(w, "); %d unreached in %d leaks, %d bytes\n", r.Leaked, r.Leaks, r.LeakedSize)
	if r.ReadFails > 0 {
		fmt.Fprintf(w, "%d objects in slabs the dump does not hold: not counted as leaks\n", r.ReadFails)
	}
	if len(r.Groups) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "LEAKS\tHIDDEN\tBYTES\tCACHE\tTYPE\tALLOCATED BY\t\n")
	for _, gr := range r.Groups {
		typ, by := gr.Type, gr.AllocFunction
		if typ == "" {
			typ = "?"
		}
		switch {
		case by == "" && gr.AllocCaller != 0:
			by = fmt.Sprintf("%#x", gr.AllocCaller)
		case by == "":
			by = "-" // the cache keeps no owners (slub_debug=U)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t\n", gr.Count, gr.Hidden, gr.Bytes, gr.Cache, typ, by)
	}
	tw.Flush()
	for _, gr := range r.Groups {
		writeLeakStack(w, gr)
	}
	for _, gr := range r.Groups {
		for _, l := range gr.Leaks {
			fmt.Fprintf(w, "%#x %s", l.Addr, l.Cache)
			if l.Type != "" {
				fmt.Fprintf(w, " %s", l.Type)
			}
			if l.Hidden > 0 {
				fmt.Fprintf(w, " (+%d objects only it reaches)", l.Hidden)
			}
			fmt.Fprintln(w)
		}
	}
	return nil
}

// writeLeakStack prints the allocating stack of a group's leaks, where
// the stack depot kept it (slub_debug=U), innermost frame first.
func writeLeakStack(w io.Writer, gr typegraph.LeakGroup) {
	if len(gr.AllocStack) == 0 {
		return
	}
	typ := gr.Type
	if typ == "" {
		typ = "?"
	}
	fmt.Fprintf(w, "\n%d leaks of %s (%s) allocated at:\n", gr.Count, gr.Cache, typ)
	for i, f := range gr.AllocStack {
		name := fmt.Sprintf("%#x", f)
		if i < len(gr.AllocFrames) && gr.AllocFrames[i] != "" {
			name = gr.AllocFrames[i]
		}
		fmt.Fprintf(w, "    %s\n", name)
	}
}

// busyVmapAreas are the busy vmap areas: the rb-tree vmap_area_root
// before 6.9, then one busy tree per vmap_node (the graph's VmapNodes,
// whose memory is returned as a root too).
func busyVmapAreas(e *typed.Env, va btf.Type, g *typegraph.Graph) (areas []uint64, nodes *typegraph.Range, err error) {
	if head, ok := e.Symbol("vmap_area_root"); ok {
		areas, err := e.ListEntries(head, va, "rb_node", maxListEntries)
		if err != nil {
			return nil, nil, fmt.Errorf("vmap_area_root: %w", err)
		}
		return areas, nil, nil
	}
	r, n, ok := g.VmapNodes()
	vn, err := lookupStruct(e, "vmap_node")
	if !ok || err != nil {
		return nil, nil, errors.New("neither vmap_area_root nor a readable vmap_nodes: the kernel's vmalloc areas cannot be found")
	}
	root, err := typed.OffsetOf(vn, "busy.root")
	if err != nil {
		return nil, nil, err
	}
	size := (r.Hi - r.Lo) / uint64(n)
	for i := range uint64(n) {
		as, err := e.ListEntries(r.Lo+i*size+root, va, "rb_node", maxListEntries)
		if err != nil {
			return nil, nil, fmt.Errorf("vmap_nodes[%d].busy: %w", i, err)
		}
		areas = append(areas, as...)
	}
	// The node array itself is a root: above two nodes it is a large
	// kmalloc, pages that are neither a slab object nor a vmalloc area,
	// and it holds the free and lazily freed areas' lists.
	return areas, &r, nil
}

// leakRoots are findleaks' roots beyond the graph's own: each task's
// kernel stack and each busy vmalloc area (busyVmapAreas), whose
// unmapped guard pages are skipped as they are read.
func leakRoots(k *core.Kernel, vmlinux string, g *typegraph.Graph) ([]typegraph.Range, error) {
	tasks, err := k.Tasks()
	if err != nil {
		return nil, err
	}
	var roots []typegraph.Range
	for _, t := range tasks {
		if base, ok := t.Stack(); ok {
			roots = append(roots, typegraph.Range{Lo: base, Hi: base + kernelStackSize, What: "task stack"})
		}
	}
	e, done, err := typedEnv(k, vmlinux)
	if err != nil {
		return nil, err
	}
	defer done()
	va, err := lookupStruct(e, "vmap_area")
	if err != nil {
		return nil, err
	}
	areas, vnodes, err := busyVmapAreas(e, va, g)
	if err != nil {
		return nil, err
	}
	if vnodes != nil {
		roots = append(roots, *vnodes)
	}
	lo, err := typed.OffsetOf(va, "va_start")
	if err != nil {
		return nil, err
	}
	hi, err := typed.OffsetOf(va, "va_end")
	if err != nil {
		return nil, err
	}
	var b [8]byte
	word := func(a uint64) (uint64, bool) {
		if e.Mem.Read(a, b[:]) != nil {
			return 0, false
		}
		return binary.LittleEndian.Uint64(b[:]), true
	}
	for _, a := range areas {
		s, ok1 := word(a + lo)
		t, ok2 := word(a + hi)
		if ok1 && ok2 && s < t && t-s <= 1<<32 {
			roots = append(roots, typegraph.Range{Lo: s, Hi: t, What: "vmalloc area"})
		}
	}
	return roots, nil
}
