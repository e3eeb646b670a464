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
	"github.com/kinst/kinst/internal/kbtf"
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
	in, err := leakRoots(k, vmlinux, g)
	if err != nil {
		return nil, fmt.Errorf("findleaks: %w", err)
	}
	r := g.FindLeaksIn(in)
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
	fmt.Fprintf(w, "); %d unreached in %d leaks, %d bytes\n", r.Leaked, r.Leaks-r.RegionsLeaked, r.LeakedSize-regionBytes(r))
	if r.Regions > 0 {
		fmt.Fprintf(w, "%d vmalloc'd areas judged the same way: %d unreached, %d bytes\n", r.Regions, r.RegionsLeaked, regionBytes(r))
	}
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
		switch {
		case gr.Cache == "vmalloc":
			typ = "-" // an area, not an object: no type to infer
		case typ == "":
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

// regionBytes is the bytes of the report's leaked regions.
func regionBytes(r *typegraph.LeakReport) uint64 {
	var n uint64
	for _, gr := range r.Groups {
		if gr.Cache == "vmalloc" {
			n += gr.Bytes
		}
	}
	return n
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
	for i, node := range vmapNodeAddrs(r, n) {
		as, err := e.ListEntries(node+root, va, "rb_node", maxListEntries)
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

// leakRoots are findleaks' roots beyond the graph's own, and its
// candidate regions: each task's kernel stack and each busy vmalloc area
// (busyVmapAreas), whose unmapped guard pages are skipped as they are
// read. A vmalloc'd area (VM_ALLOC: vmalloc, module memory) that is no
// task's stack is a candidate, reached only when a pointer leads to it,
// and a leak when none does; other areas (ioremap, vmap, vm_map_ram)
// map memory that others own, and stay roots.
func leakRoots(k *core.Kernel, vmlinux string, g *typegraph.Graph) (typegraph.LeakInput, error) {
	var in typegraph.LeakInput
	tasks, err := k.Tasks()
	if err != nil {
		return in, err
	}
	stacks := map[uint64]bool{}
	for _, t := range tasks {
		// Only the live part: the dead frames below the stack pointer
		// hold stale words that would keep alive what they once named.
		if lo, hi, ok := k.LiveStack(t, kernelStackSize); ok {
			in.Roots = append(in.Roots, typegraph.Range{Lo: lo, Hi: hi, What: "task stack"})
			base, _ := t.Stack()
			stacks[base] = true
		}
	}
	e, done, err := typedEnv(k, vmlinux)
	if err != nil {
		return in, err
	}
	defer done()
	va, err := lookupStruct(e, "vmap_area")
	if err != nil {
		return in, err
	}
	areas, vnodes, err := busyVmapAreas(e, va, g)
	if err != nil {
		return in, err
	}
	if vnodes != nil {
		in.Roots = append(in.Roots, *vnodes)
	}
	f, err := vmapFields(e, va)
	if err != nil {
		return in, err
	}
	var b [8]byte
	word := func(a uint64) (uint64, bool) {
		if e.Mem.Read(a, b[:]) != nil {
			return 0, false
		}
		return binary.LittleEndian.Uint64(b[:]), true
	}
	cached := cachedStacks(e)
	// Every record of an area, busy or free, names its bounds: a record
	// whose end is the next area's start must not reach that area.
	for _, a := range append(areas, otherVmapAreas(e, va, g)...) {
		in.Metadata = append(in.Metadata, a+f.start, a+f.end)
	}
	for _, a := range areas {
		s, ok1 := word(a + f.start)
		t, ok2 := word(a + f.end)
		if !ok1 || !ok2 || s >= t || t-s > 1<<32 {
			continue
		}
		vm, _ := word(a + f.vm)
		if cached[vm] {
			// A stack kept for the next fork holds what its last task
			// left: stale words that would reach whatever now lies at
			// the addresses they name (a freed buffer's, reused by a
			// new area). Held, so no leak, and not read.
			continue
		}
		flags, ok := word(vm + f.flags)
		if vm == 0 || !ok || flags&vmAlloc == 0 || stacks[s] {
			in.Roots = append(in.Roots, typegraph.Range{Lo: s, Hi: t, What: "vmalloc area"})
			continue
		}
		caller, _ := word(vm + f.caller)
		in.Regions = append(in.Regions, typegraph.Region{Lo: s, Hi: t, What: "vmalloc", Caller: caller})
		in.Metadata = append(in.Metadata, vm+f.addr)
	}
	return in, nil
}

// cachedStacks are the vm_structs of the task stacks each CPU keeps for
// the next fork (cached_stacks, with CONFIG_VMAP_STACK): held through
// the vm_struct alone (whose address field findleaks does not follow),
// and holding nothing (what they hold is a dead task's).
func cachedStacks(e *typed.Env) map[uint64]bool {
	out := map[uint64]bool{}
	for cpu := 0; cpu < maxCPUs; cpu++ {
		for i := 0; ; i++ {
			v, err := e.Eval(fmt.Sprintf("per_cpu(cached_stacks, %d)[%d]", cpu, i))
			if err != nil {
				if i == 0 {
					return out // no such CPU, or no cache of stacks
				}
				break
			}
			if p, err := e.Uint(v); err == nil && p != 0 {
				out[p] = true
			}
			if i > 16 {
				break
			}
		}
	}
	return out
}

// maxCPUs bounds a walk over CPUs that ends at the first one the dump
// does not have.
const maxCPUs = 8192

// otherVmapAreas are the records of the vmalloc space's free and lazily
// freed areas: the free tree (free_vmap_area_root), the lazy tree
// before 6.9 (purge_vmap_area_root), and from 6.9 each vmap_node's lazy
// tree and its pools of free areas by size. A tree or list that cannot
// be read is skipped: its records then stay references, and at worst a
// leaked area next to a free one is not reported.
func otherVmapAreas(e *typed.Env, va btf.Type, g *typegraph.Graph) []uint64 {
	var out []uint64
	walk := func(head uint64, member string) {
		if as, err := e.ListEntries(head, va, member, maxListEntries); err == nil {
			out = append(out, as...)
		}
	}
	for _, root := range []string{"free_vmap_area_root", "purge_vmap_area_root"} {
		if head, ok := e.Symbol(root); ok {
			walk(head, "rb_node")
		}
	}
	// Areas being purged: before 6.9 on a global list beside the tree,
	// from 6.9 on each node's purge_list, where a purge moves the lazy
	// tree's areas (emptying the tree) until its work frees them. A record
	// there whose end is a new area's start reached that area: a leaked
	// vmalloc area went unreported when the dump caught a purge (after
	// executable memory was freed, as a splice's patches are).
	if head, ok := e.Symbol("purge_vmap_area_list"); ok {
		walk(head, "list")
	}
	r, n, ok := g.VmapNodes()
	vn, err := lookupStruct(e, "vmap_node")
	if !ok || err != nil {
		return out
	}
	lazy, err1 := typed.OffsetOf(vn, "lazy.root")
	pool, err2 := typed.OffsetOf(vn, "pool")
	purge, perr := typed.OffsetOf(vn, "purge_list")
	m, _ := kbtf.Member(vn, "pool")
	pools, ok := btf.UnderlyingType(m.Type).(*btf.Array)
	if err1 != nil || err2 != nil || !ok {
		return out
	}
	psize, _ := btf.Sizeof(pools.Type)
	for _, node := range vmapNodeAddrs(r, n) {
		walk(node+lazy, "rb_node")
		if perr == nil {
			walk(node+purge, "list")
		}
		for j := range uint64(pools.Nelems) {
			walk(node+pool+j*uint64(psize), "list")
		}
	}
	return out
}

// vmapNodeAddrs are the addresses of the n vmap_nodes in r (the graph's
// VmapNodes).
func vmapNodeAddrs(r typegraph.Range, n int) []uint64 {
	out := make([]uint64, n)
	size := (r.Hi - r.Lo) / uint64(n)
	for i := range out {
		out[i] = r.Lo + uint64(i)*size
	}
	return out
}

// vmAlloc is VM_ALLOC (include/linux/vmalloc.h): the area's pages were
// allocated for it (vmalloc and its kin), not mapped from elsewhere.
const vmAlloc = 0x2

// vmapFieldOffsets are where struct vmap_area and struct vm_struct keep
// what findleaks reads.
type vmapFieldOffsets struct {
	start, end, vm      uint64 // vmap_area
	flags, caller, addr uint64 // vm_struct
}

func vmapFields(e *typed.Env, va btf.Type) (vmapFieldOffsets, error) {
	var f vmapFieldOffsets
	vs, err := lookupStruct(e, "vm_struct")
	if err != nil {
		return f, err
	}
	for _, m := range []struct {
		t    btf.Type
		name string
		to   *uint64
	}{{va, "va_start", &f.start}, {va, "va_end", &f.end}, {va, "vm", &f.vm},
		{vs, "flags", &f.flags}, {vs, "caller", &f.caller}, {vs, "addr", &f.addr}} {
		off, err := typed.OffsetOf(m.t, m.name)
		if err != nil {
			return f, err
		}
		*m.to = off
	}
	return f, nil
}
