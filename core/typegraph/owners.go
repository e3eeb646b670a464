package typegraph

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/internal/btflayout"
)

// listOwners are list and tree heads whose entries' type the kernel's
// code fixes (6.1's BTF says no list's owner type): the head's pointers
// point at the entry struct's node member. The inference's list rule
// cannot tell these entries apart where many structs of the cache's size
// have a node at that offset (anon_vma_chain lives in a merged cache).
var listOwners = []struct{ owner, member, entry, node string }{
	{"vm_area_struct", "anon_vma_chain", "anon_vma_chain", "same_vma"}, // mm/rmap.c: anon_vma_chain_link
	{"anon_vma", "rb_root", "anon_vma_chain", "rb"},                    // mm/interval_tree.c: anon_vma_interval_tree_insert
	{"vmap_block_queue", "free", "vmap_block", "free_list"},            // mm/vmalloc.c: new_vmap_block
	{"trace_event_class", "fields", "ftrace_event_field", "link"},      // kernel/trace/trace_events.c: __trace_define_field
	{"syscall_metadata", "enter_fields", "ftrace_event_field", "link"}, // kernel/trace/trace_syscalls.c: syscall_get_enter_fields
	{"syscall_metadata", "exit_fields", "ftrace_event_field", "link"},  // (6.1 has none: the exit fields are the class's)
	{"trace_array", "events", "trace_event_file", "list"},              // kernel/trace/trace_events.c: trace_create_new_event
	// 6.9+: the busy and lazily freed areas of each vmap_node, its pools
	// of free ones (mm/vmalloc.c: struct rb_list, struct vmap_pool).
	{"rb_list", "root", "vmap_area", "rb_node"},
	{"rb_list", "head", "vmap_area", "list"},
	{"vmap_pool", "head", "vmap_area", "list"},
}

// knownStatics are static variables whose type the kernel's source
// fixes but which BTF may not type (6.1's BTF types only per-CPU
// variables): read as roots, as BTF's variables are. count, when set, is
// an int variable saying how many structs lie behind the pointer name
// holds (an array allocated at boot: above two nodes 6.9's vmap_nodes is
// a large kmalloc, pages no slab object holds).
var knownStatics = []struct{ name, typ, count string }{
	{"global_trace", "trace_array", ""},          // kernel/trace/trace.c
	{"vmap_nodes", "vmap_node", "nr_vmap_nodes"}, // mm/vmalloc.c, 6.9+
}

// staticRoots are the knownStatics this kernel has, each a root.
func (g *Graph) staticRoots() []root {
	var out []root
	for _, v := range knownStatics {
		var st *btf.Struct
		a, err := g.k.SymbolAddr(v.name)
		if err != nil || g.structByName(v.typ, &st) != nil {
			continue
		}
		if v.count == "" {
			out = append(out, root{name: v.name, addr: a, typ: st})
			continue
		}
		base, n, ok := g.countedArray(a, v.count)
		if !ok {
			continue
		}
		for i := range n {
			out = append(out, root{name: fmt.Sprintf("%s[%d]", v.name, i), addr: base + uint64(i)*uint64(st.Size), typ: st})
		}
	}
	return append(out, g.eventClassRoots()...)
}

// eventClassRoots are the trace event classes in the kernel's data, each
// a root. Their fields lists hold the ftrace_event_field objects, about
// 3,800 on a stock kernel, whose cache 6.12 merges with others (so they
// are not typed by their cache); the classes are static
// (event_class_*), variables no stock BTF types. They are found through
// the list of every event (ftrace_events, of struct trace_event_call by
// their list member); a class inside a heap object (a dynamic event's)
// is the graph's to type as any object.
func (g *Graph) eventClassRoots() []root {
	var call, class, meta *btf.Struct
	head, err := g.k.SymbolAddr("ftrace_events")
	if err != nil || g.structByName("trace_event_call", &call) != nil || g.structByName("trace_event_class", &class) != nil {
		return nil
	}
	b := btflayout.New(g.spec)
	listF, _, err1 := b.Lookup("trace_event_call", "list")
	classF, _, err2 := b.Lookup("trace_event_call", "class")
	dataF, _, err3 := b.Lookup("trace_event_call", "data")
	if err1 != nil || err2 != nil {
		return nil
	}
	// A system call's event keeps its fields in its struct
	// syscall_metadata (call->data, static too), not in the class that
	// every system call's enter (or exit) event shares.
	sysClass := map[uint64]bool{}
	if err3 == nil && g.structByName("syscall_metadata", &meta) == nil {
		for _, name := range []string{"event_class_syscall_enter", "event_class_syscall_exit"} {
			if a, err := g.k.SymbolAddr(name); err == nil {
				sysClass[a] = true
			}
		}
	}
	var out []root
	seen := map[uint64]bool{}
	add := func(a uint64, t *btf.Struct) {
		if _, _, inHeap := g.node(a); a != 0 && !inHeap && !seen[a] {
			seen[a] = true
			out = append(out, root{name: fmt.Sprintf("%s at %#x", t.Name, a), addr: a, typ: t})
		}
	}
	next, ok := g.readU64(head)
	for n := 0; ok && next != head && n < maxEventCalls; n++ {
		ca := next - uint64(listF.Off)
		if c, ok := g.readU64(ca + uint64(classF.Off)); ok {
			add(c, class)
			if d, ok := g.readU64(ca + uint64(dataF.Off)); ok && sysClass[c] {
				add(d, meta)
			}
		}
		next, ok = g.readU64(next)
	}
	return out
}

// maxEventCalls bounds the walk of ftrace_events (a stock kernel has
// about 2,000 events).
const maxEventCalls = 1 << 16

// countedArray reads an array allocated at boot: the pointer at ptr, and
// the int variable count that says how many elements it has (at most
// maxCounted: more is not plausible).
func (g *Graph) countedArray(ptr uint64, count string) (base uint64, n uint32, ok bool) {
	ca, err := g.k.SymbolAddr(count)
	base, ok = g.readU64(ptr)
	var nb [4]byte
	if err != nil || !ok || g.k.ReadVirt(nb[:], ca) != nil {
		return 0, 0, false
	}
	n = binary.LittleEndian.Uint32(nb[:])
	return base, n, n > 0 && n <= maxCounted
}

// maxCounted bounds a countedArray.
const maxCounted = 1024

// VmapNodes is the range of 6.9+'s array of struct vmap_node
// (mm/vmalloc.c: vmap_nodes, nr_vmap_nodes of them), and how many it
// holds; ok is false on a kernel without it, or where it cannot be read.
// The graph reads it as roots; findleaks walks each node's busy tree.
func (g *Graph) VmapNodes() (r Range, n int, ok bool) {
	var st *btf.Struct
	a, err := g.k.SymbolAddr("vmap_nodes")
	if err != nil || g.structByName("vmap_node", &st) != nil {
		return Range{}, 0, false
	}
	base, nn, ok := g.countedArray(a, "nr_vmap_nodes")
	if !ok {
		return Range{}, 0, false
	}
	return Range{Lo: base, Hi: base + uint64(nn)*uint64(st.Size), What: "vmap nodes"}, int(nn), true
}

// initOwners resolves listOwners and struct xa_node in the BTF.
func (g *Graph) initOwners() {
	b := btflayout.New(g.spec)
	for _, o := range listOwners {
		var os, es *btf.Struct
		if g.structByName(o.owner, &os) != nil || g.structByName(o.entry, &es) != nil {
			continue
		}
		f, _, err := b.Lookup(o.entry, o.node)
		if err != nil {
			continue
		}
		if _, _, err := b.Lookup(o.owner, o.member); err != nil {
			continue
		}
		g.ts.owned[memberKey{os.Name, o.member}] = ownedHead{entry: g.ts.id(es), adj: f.Off}
	}
	var xn *btf.Struct
	if g.structByName("xa_node", &xn) == nil {
		g.ts.xaNode = g.ts.id(xn)
	}
}

// ownedTarget is where an owned head's pointer v points: the entry's
// node must lie in the same object as the entry, and a head pointing at
// itself (an empty list) or into its own object points at no entry.
func (g *Graph) ownedTarget(src int32, s slot, v uint64) (int32, uint32, bool) {
	ln, _, ok := g.node(v)
	if !ok || ln == src {
		return 0, 0, false
	}
	tn, toff, ok := g.node(v - uint64(s.adj))
	if !ok || tn != ln {
		return 0, 0, false
	}
	return tn, toff, true
}

// xaTarget is the xa_node an xarray slot's internal entry points at.
func (g *Graph) xaTarget(v uint64) (int32, uint32, bool) {
	if v&3 != 2 || v < 4096 {
		return 0, 0, false
	}
	tn, toff, ok := g.node(v - 2)
	if !ok || toff != 0 {
		return 0, 0, false
	}
	return tn, 0, true
}

// structByName finds a struct by name; BTF may hold several of one
// name (TypeByName then refuses), of which the first with members is
// taken, as they differ only where deduplication failed.
func (g *Graph) structByName(name string, out **btf.Struct) error {
	ts, err := g.spec.AnyTypesByName(name)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if s, ok := t.(*btf.Struct); ok && len(s.Members) > 0 {
			*out = s
			return nil
		}
	}
	return fmt.Errorf("struct %s: not in BTF", name)
}
