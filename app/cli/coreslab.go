package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/typegraph"
	"github.com/kinst/kinst/core/typeid"
)

// kernelView adapts the dump's kernel view to what the slab walk and
// type identification need of it (slab.Kernel, typeid.Kernel).
type kernelView struct{ k *core.Kernel }

func (v kernelView) ReadVirt(p []byte, va uint64) error { return v.k.ReadVirt(p, va) }

func (v kernelView) SymbolAddr(name string) (uint64, error) {
	s, err := v.k.LookupSymbol(name)
	return s.Addr, err
}

func (v kernelView) BTF() (*btf.Spec, error) {
	t, err := v.k.Types()
	if err != nil {
		return nil, err
	}
	return t.Spec, nil
}

// PerCPUOffsets are the kernel view's per-CPU offsets of CPUs 0 …
// nr_cpu_ids-1.
func (v kernelView) PerCPUOffsets() ([]uint64, error) {
	n, err := v.k.NumCPUs()
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], err = v.k.PerCPUOffset(i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (v kernelView) SymbolAt(addr uint64) (typeid.Symbol, bool) {
	s, off, ok := v.k.SymbolAt(addr)
	if !ok {
		return typeid.Symbol{}, false
	}
	return typeid.Symbol{Name: s.Name, Module: s.Module, Addr: addr - off, Size: v.k.SymbolSize(s), Type: s.Type}, true
}

func (v kernelView) Tasks() ([]typeid.Task, error) {
	ts, err := v.k.Tasks()
	out := make([]typeid.Task, len(ts))
	for i, t := range ts {
		out[i] = typeid.Task{Addr: t.Addr, PID: t.PID, Comm: t.Comm}
	}
	return out, err
}

// CoreSlabCache is one cache of `kinst core DUMP slabs --json`.
type CoreSlabCache struct {
	Name       string   `json:"name"`
	Aliases    []string `json:"aliases"`
	ObjectSize uint32   `json:"object_size"`
	Size       uint32   `json:"size"`
	Slabs      int      `json:"slabs"`
	Allocated  int      `json:"allocated"`
	Free       int      `json:"free"`
	// Beyond the shape: the rest of the account.
	Objects    int      `json:"objects"`
	FreePerCPU int      `json:"free_percpu"` // free, but counted active by /proc/slabinfo
	Address    string   `json:"address"`
	Refcount   int      `json:"refcount"`
	Sysfs      string   `json:"sysfs,omitempty"`
	Flags      []string `json:"flags"`
	Offset     uint32   `json:"offset"`
	Inuse      uint32   `json:"inuse"`
	Align      uint32   `json:"align"`
	RedLeftPad uint32   `json:"red_left_pad,omitempty"`
	Tracks     int      `json:"track_offset,omitempty"` // SLAB_STORE_USER: where struct track pairs begin
	Ctor       string   `json:"ctor,omitempty"`
	Order      int      `json:"order"`
	PerSlab    int      `json:"objects_per_slab"`
	Random     string   `json:"random,omitempty"` // CONFIG_SLAB_FREELIST_HARDENED key
	CPUSlabs   int      `json:"cpu_slabs"`
	CPUPartial int      `json:"cpu_partial_slabs"`
	Partial    int      `json:"partial_slabs"`
	Full       int      `json:"full_slabs"`
	Unlisted   int      `json:"unlisted_slabs"`
	Anomalies  int      `json:"anomalies"`
	// The kernel's own counters (-1: not kept without CONFIG_SLUB_DEBUG).
	NodeSlabs   int `json:"node_nr_slabs"`
	NodeObjects int `json:"node_total_objects"`
	NodePartial int `json:"node_nr_partial"`
}

// CoreSlabs is `kinst core DUMP slabs --json`.
type CoreSlabs struct {
	Caches       []CoreSlabCache `json:"caches"`
	AliasSource  string          `json:"alias_source"`
	Anomalies    []string        `json:"anomalies"`
	AnomalyCount int             `json:"anomaly_count"`
	PagesScanned uint64          `json:"pages_scanned"`
	VmemmapHoles int             `json:"vmemmap_holes"`
	Notes        []string        `json:"notes,omitempty"`
}

func openHeap(k *core.Kernel) (*slab.Heap, error) {
	h, err := slab.Open(kernelView{k})
	if err != nil {
		return nil, fmt.Errorf("slab caches: %w", err)
	}
	return h, nil
}

// openIdentifier is the dump's slab heap and whattype's identifier over it.
func openIdentifier(k *core.Kernel) (*slab.Heap, *typeid.Identifier, error) {
	h, err := openHeap(k)
	if err != nil {
		return nil, nil, err
	}
	id, err := typeid.New(kernelView{k}, h)
	return h, id, err
}

// CoreSlabsReport walks every slab of every cache and prints each
// cache's account.
func CoreSlabsReport(k *core.Kernel, asJSON bool, w io.Writer) error {
	h, err := openHeap(k)
	if err != nil {
		return err
	}
	if err := h.Walk(); err != nil {
		return err
	}
	out := CoreSlabs{AliasSource: h.AliasSource, PagesScanned: h.PagesScanned, VmemmapHoles: h.VmemmapHoles, Notes: h.Notes}
	for _, c := range h.Caches {
		out.Caches = append(out.Caches, slabCacheReport(k, c))
	}
	anoms, n := h.Anomalies()
	out.AnomalyCount = n
	out.Anomalies = []string{}
	for _, a := range anoms {
		out.Anomalies = append(out.Anomalies, a.String())
	}
	if asJSON {
		return writeJSON(w, out)
	}
	printSlabs(w, out)
	return nil
}

// slabCacheReport is a cache's line of `kinst core slabs`.
func slabCacheReport(k *core.Kernel, c *slab.Cache) CoreSlabCache {
	st := c.Stats
	cc := CoreSlabCache{Name: c.Name, Aliases: c.Aliases, ObjectSize: c.ObjectSize, Size: c.Size,
		Slabs: st.Slabs, Allocated: st.Allocated, Free: st.Free, Objects: st.Objects, FreePerCPU: st.FreePerCPU,
		Address: fmt.Sprintf("%#x", c.Addr), Refcount: c.Refcount, Sysfs: c.SysfsName, Flags: slab.FlagNames(c.Flags),
		Offset: c.Offset, Inuse: c.Inuse, Align: c.Align, RedLeftPad: c.RedLeftPad, Order: c.Order, PerSlab: c.PerSlab,
		CPUSlabs: st.CPUSlabs, CPUPartial: st.CPUPartial, Partial: st.Partial, Full: st.Full, Unlisted: st.Unlisted,
		Anomalies: st.Anomalies, NodeSlabs: st.NodeSlabs, NodeObjects: st.NodeObjects, NodePartial: st.NodePartial}
	if cc.Aliases == nil {
		cc.Aliases = []string{}
	}
	if cc.Flags == nil {
		cc.Flags = []string{}
	}
	if t := c.TrackOffset(); t >= 0 {
		cc.Tracks = t
	}
	if c.Ctor != 0 {
		cc.Ctor = symbolize(k, c.Ctor)
		if cc.Ctor == "" {
			cc.Ctor = fmt.Sprintf("%#x", c.Ctor)
		}
	}
	if c.Hardened {
		cc.Random = fmt.Sprintf("%#x", c.Random)
	}
	return cc
}

// printSlabs is `kinst core slabs` as text: the caches by memory held,
// the totals, notes and anomalies.
func printSlabs(w io.Writer, out CoreSlabs) {
	sorted := append([]CoreSlabCache(nil), out.Caches...)
	sort.SliceStable(sorted, func(i, j int) bool {
		return sorted[i].Objects*int(sorted[i].Size) > sorted[j].Objects*int(sorted[j].Size)
	})
	tw := newTable(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "CACHE\tOBJSIZE\tSIZE\tSLABS\tORDER\tOBJECTS\tALLOCATED\tFREE\tKiB\t NAME (ALIASES)\n")
	for _, c := range sorted {
		name := c.Name
		if len(c.Aliases) > 0 {
			name += " (" + strings.Join(c.Aliases, ", ") + ")"
		}
		if c.Anomalies > 0 {
			name += fmt.Sprintf("  [%d anomalies]", c.Anomalies)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t %s\n", c.Address, c.ObjectSize, c.Size, c.Slabs, c.Order,
			c.Objects, c.Allocated, c.Free, c.Slabs*(4<<c.Order), name)
	}
	tw.Flush()
	var objs, alloc, kib int
	for _, c := range out.Caches {
		objs += c.Objects
		alloc += c.Allocated
		kib += c.Slabs * (4 << c.Order)
	}
	fmt.Fprintf(w, "%d caches, %d objects (%d allocated) in %d MiB of slabs; aliases from %s\n", len(out.Caches), objs, alloc, kib>>10, out.AliasSource)
	for _, n := range out.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if out.AnomalyCount > 0 {
		fmt.Fprintf(w, "%d anomalies:\n", out.AnomalyCount)
		for _, a := range out.Anomalies {
			fmt.Fprintf(w, "  %s\n", a)
		}
		if len(out.Anomalies) < out.AnomalyCount {
			fmt.Fprintf(w, "  … and %d more\n", out.AnomalyCount-len(out.Anomalies))
		}
	}
}

// CoreWhatType says what an address of the dump is: a slab object with
// its cache, state, type and member, or what else.
// With graph, an object its cache gives no type is typed by the type
// graph over the whole heap ("source": the pass that typed it, and the
// chain of pointers).
func CoreWhatType(k *core.Kernel, at string, graph bool, graphFile string, asJSON bool, w io.Writer) error {
	a, err := resolveAddr(k, at)
	if err != nil {
		return err
	}
	if a < kernelHalf {
		return fmt.Errorf("whattype: %#x is not a kernel address", a)
	}
	h, id, err := openIdentifier(k)
	if err != nil {
		return err
	}
	r, err := id.WhatType(a)
	if err != nil {
		return err
	}
	if graph && r.Kind == typeid.KindSlab && r.Object != nil && r.Type == nil {
		var g *typegraph.Graph
		if graphFile != "" {
			g, _, err = graphFor(k, nil, graphFile)
		} else {
			g, err = typegraph.Build(kernelView{k}, h, typeid.CacheTypes(id.Spec(), h), typegraph.Options{})
		}
		if err != nil {
			return err
		}
		typeByGraph(r, g, a)
	}
	if asJSON {
		return writeJSON(w, r)
	}
	printWhatType(w, r)
	return nil
}

// typeByGraph fills in the type the graph gives an object its cache
// does not type.
func typeByGraph(r *typeid.Result, g *typegraph.Graph, a uint64) {
	if t, ok := g.TypeAt(a); ok {
		r.Type, r.Member, r.Source = &t.Type, &t.Member, &t.Pass
		r.How = fmt.Sprintf("type graph, %s pass (%s)", t.Pass, markWord(t.Mark))
		r.Chain = t.Chain
		r.Conflicts = t.Conflicts
	} else {
		r.How += "; the type graph did not type it either"
	}
}

// strOr is *p, or none where p is nil (whattype's optional fields).
func strOr(p *string, none string) string {
	if p == nil {
		return none
	}
	return *p
}

func printWhatType(w io.Writer, r *typeid.Result) {
	str := func(p *string) string { return strOr(p, "?") }
	switch r.Kind {
	case typeid.KindSlab:
		if r.Object == nil {
			fmt.Fprintf(w, "%s: in slab %s of cache %s, %s\n", r.Address, r.Slab, str(r.Cache), r.How)
			return
		}
		off := fmt.Sprintf("+%#x", *r.Offset)
		if *r.Offset < 0 {
			off = fmt.Sprintf("-%#x", -*r.Offset)
		}
		fmt.Fprintf(w, "%s: %s object %s%s in cache %s (slab %s", r.Address, str(r.State), str(r.Object), off, str(r.Cache), r.Slab)
		if r.List != "" {
			fmt.Fprintf(w, ", %s", r.List)
		}
		fmt.Fprintln(w, ")")
		if r.Region != "object" {
			fmt.Fprintf(w, "  in the slot's %s\n", r.Region)
		}
		if r.Type != nil {
			fmt.Fprintf(w, "  type:   %s (from the %s)\n", *r.Type, str(r.Source))
			if r.Member != nil {
				fmt.Fprintf(w, "  member: %s\n", *r.Member)
			}
		} else {
			fmt.Fprintf(w, "  type:   unknown\n")
		}
		if r.How != "" {
			fmt.Fprintf(w, "  how:    %s\n", r.How)
		}
		printChain(w, "  ", r.Chain)
		for i, c := range r.Conflicts {
			fmt.Fprintf(w, "  conflict %d: a pointer says otherwise:\n", i+1)
			printChain(w, "    ", c)
		}
		for _, t := range []struct {
			what string
			t    *typeid.TrackRef
		}{{"allocated by", r.Allocated}, {"freed by", r.Freed}} {
			if t.t != nil {
				fmt.Fprintf(w, "  %s %s, pid %d, cpu %d, jiffies %d\n", t.what, t.t.Function, t.t.PID, t.t.CPU, t.t.Jiffies)
			}
		}
	case typeid.KindStack:
		fmt.Fprintf(w, "%s: kernel stack of task %s (pid %d, %s)\n", r.Address, r.Task.Address, r.Task.PID, r.Task.Comm)
	case typeid.KindSymbol:
		fmt.Fprintf(w, "%s: %s (kernel symbol, %s)\n", r.Address, r.Symbol, r.Detail)
		if r.Type != nil {
			fmt.Fprintf(w, "  type:   %s (%s)\n  member: %s\n", *r.Type, r.How, str(r.Member))
		}
	case typeid.KindPerCPU:
		fmt.Fprintf(w, "%s: per-CPU variable %s of cpu %d\n  type:   %s (%s)\n  member: %s\n", r.Address, r.Symbol, *r.CPU, str(r.Type), r.How, str(r.Member))
	case typeid.KindFreePage, typeid.KindPage:
		fmt.Fprintf(w, "%s: %s, pfn %#x: %s\n", r.Address, r.Kind, *r.PFN, r.Detail)
	case typeid.KindVmalloc:
		fmt.Fprintf(w, "%s: %s\n", r.Address, r.Detail)
	default:
		fmt.Fprintf(w, "%s: %s\n", r.Address, r.Kind)
	}
}

func markWord(m typegraph.Mark) string {
	switch m {
	case typegraph.Known:
		return "known: every step from a known type by the conservative rule"
	case typegraph.Conjectured:
		return "conjectured"
	}
	return "from its cache"
}

func printChain(w io.Writer, indent string, c []typeid.Step) {
	for _, s := range c {
		fmt.Fprintf(w, "%s%s: %s -> %s (%s *)\n", indent, s.From, s.Member, s.To, pointeeName(s.Type))
	}
}

// pointeeName is how a chain's step names what its pointer points at:
// struct S, a pointer (S *), or a string's char.
func pointeeName(t string) string {
	if t == "char" || strings.HasSuffix(t, "*") {
		return t
	}
	return "struct " + t
}
