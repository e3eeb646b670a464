package typegraph

import (
	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/typeid"
)

// slot is a pointer member of a type, flattened through embedded
// structs, arrays and unions: where it is and what it points to.
type slot struct {
	off    uint32
	target int32 // the pointed-at struct's type id
	link   bool  // the target is a list or tree node (list_head, …): it points into a container
	union  bool  // the pointer lies in a union: one of several readings of those bytes
	// owned: the pointer is a list or tree head whose entries' type is
	// known (listOwners): it points at offset adj of a struct target.
	owned bool
	adj   uint32
	// xa: an xarray's head or a node's slot: an internal entry (v&3 ==
	// 2, above 4096) is a struct xa_node at v-2; anything else is an
	// entry of unknown type.
	xa bool
}

// tinfo is what the graph knows of one struct type.
type tinfo struct {
	t    *btf.Struct
	name string
	size uint32
	// tail is the offset of a last member of run-time size (a flexible
	// array, or task_struct's FPU state), 0 if none.
	tail      uint32
	slots     []slot
	flexSlots []slot // the pointers of one element of a flexible array member
	flexSize  uint32 // that element's size
	link      bool
	done      bool
	// ptrTo is, for the pseudo struct "S *" (one pointer to struct S,
	// the element of the pointer array a member S ** points at), S's
	// id; -1 for the BTF's own structs.
	ptrTo int32
}

// linkTypes are the kernel's intrusive list and tree nodes: a pointer to
// one points into whatever struct embeds it, not at a list_head object.
var linkTypes = map[string]bool{
	"list_head": true, "hlist_node": true, "hlist_head": true, "rb_node": true,
	"llist_node": true, "hlist_bl_node": true, "hlist_nulls_node": true, "rb_root": true,
}

// ignoredTargets are pointer targets that say nothing of what they point
// into: an RCU callback chains the callback_heads of unrelated objects.
var ignoredTargets = map[string]bool{"callback_head": true}

// maxFlatten bounds the pointer slots of one type and the elements of
// an array expanded when flattening.
const (
	maxSlots     = 1 << 14
	maxArrayElem = 1024
	maxDepth     = 24
)

// types assigns ids to BTF structs and flattens them lazily.
type types struct {
	ids   map[*btf.Struct]int32
	infos []*tinfo
	// emb indexes every struct embedded (not pointed to) in another:
	// (inner type, offset) → the outer structs; built on first use.
	emb map[embKey][]int32
	// heads memoizes whether a type holds another at an offset.
	holds map[holdKey]bool
	// ptrs are the pseudo structs "S *", by S's id.
	ptrs map[int32]int32
	// voids are void * members known to point at one struct (the LSM
	// blobs: inode.i_security), and that struct.
	voids map[memberKey]int32
	// owned are the list and tree heads of listOwners.
	owned map[memberKey]ownedHead
	// xaNode is struct xa_node, -1 if the BTF has none.
	xaNode int32
	// str is the pseudo type of a C string (a char array), -1 until a
	// char * member is met (strID).
	str int32
}

// ownedHead is a head's entry struct and the offset of the node the
// head's pointers point at in it.
type ownedHead struct {
	entry int32
	adj   uint32
}

type embKey struct {
	inner int32
	off   uint32
}

type holdKey struct {
	outer, inner int32
	off          uint32
}

func newTypes() *types {
	return &types{ids: map[*btf.Struct]int32{}, holds: map[holdKey]bool{}, ptrs: map[int32]int32{}, voids: map[memberKey]int32{}, owned: map[memberKey]ownedHead{}, xaNode: -1, str: -1}
}

// structOf strips typedefs and qualifiers down to a struct, nil if t is
// no struct.
func structOf(t btf.Type) *btf.Struct {
	s, _ := btf.UnderlyingType(t).(*btf.Struct)
	return s
}

func (ts *types) id(s *btf.Struct) int32 {
	if id, ok := ts.ids[s]; ok {
		return id
	}
	id := int32(len(ts.infos))
	ts.ids[s] = id
	ts.infos = append(ts.infos, &tinfo{t: s, name: s.Name, size: s.Size, link: linkTypes[s.Name], ptrTo: -1})
	return id
}

// stringTypeName names the pseudo type of a C string; an object of it
// is reported as char[N], N its size.
const stringTypeName = "char"

// strID is the pseudo type of a C string: what a char * member points
// at, where the object holds a string (Graph.isString).
func (ts *types) strID() int32 {
	if ts.str < 0 {
		ts.str = ts.id(&btf.Struct{Name: stringTypeName, Size: 1})
	}
	return ts.str
}

// isChar says whether t is a byte: char, signed or unsigned, or u8.
func isChar(t btf.Type) bool {
	i, ok := btf.UnderlyingType(t).(*btf.Int)
	return ok && i.Size == 1
}

// ptrID is the pseudo struct "S *" for struct S: one pointer, the
// element of an array of pointers to S (what a member S ** points at,
// as fdtable.fd at the open files).
func (ts *types) ptrID(s *btf.Struct) int32 {
	e := ts.id(s)
	if id, ok := ts.ptrs[e]; ok {
		return id
	}
	ps := &btf.Struct{Name: s.Name + " *", Size: 8, Members: []btf.Member{{Type: &btf.Pointer{Target: s}}}}
	id := ts.id(ps)
	ts.infos[id].ptrTo = e
	ts.ptrs[e] = id
	return id
}

// pointee strips typedefs and qualifiers off t down to what a pointer
// points to, nil if t is no pointer.
func pointee(t btf.Type) btf.Type {
	if p, ok := btf.UnderlyingType(t).(*btf.Pointer); ok {
		return p.Target
	}
	return nil
}

// info returns a type's flattened description.
func (ts *types) info(id int32) *tinfo {
	ti := ts.infos[id]
	if ti.done {
		return ti
	}
	ti.done = true
	ts.flatten(ti.t, 0, false, 0, &ti.slots)
	if off, elem, ok := flexTail(ti.t); ok {
		ti.tail = off
		if es, err := btf.Sizeof(elem); err == nil && es > 0 {
			ti.flexSize = uint32(es)
			ts.flatten(elem, 0, false, 0, &ti.flexSlots)
		}
	} else if tail, ok := typeid.VariableTail(ti.t); ok && (!tail.Array || tail.Elems == 0) {
		// A tail sized at boot: the object may be longer or shorter than sizeof.
		ti.tail = uint32(tail.Offset)
	}
	return ti
}

// flatten appends the pointer slots of t at offset base.
func (ts *types) flatten(t btf.Type, base uint32, union bool, depth int, out *[]slot) {
	if depth > maxDepth || len(*out) >= maxSlots {
		return
	}
	switch c := btf.UnderlyingType(t).(type) {
	case *btf.Struct:
		for _, m := range c.Members {
			if m.BitfieldSize != 0 || m.Offset%8 != 0 {
				continue
			}
			if v, ok := ts.voids[memberKey{c.Name, m.Name}]; ok {
				*out = append(*out, slot{off: base + uint32(m.Offset.Bytes()), target: v, union: union})
				continue
			}
			if o, ok := ts.owned[memberKey{c.Name, m.Name}]; ok {
				// A head of a list or tree of known entries: each of its
				// pointers points at the entry's node.
				before := len(*out)
				ts.flatten(m.Type, base+uint32(m.Offset.Bytes()), union, depth+1, out)
				for i := before; i < len(*out); i++ {
					(*out)[i].target, (*out)[i].adj, (*out)[i].owned, (*out)[i].link = o.entry, o.adj, true, false
				}
				continue
			}
			if ts.xaNode >= 0 && (c.Name == "xarray" && m.Name == "xa_head" || c.Name == "xa_node" && m.Name == "slots") {
				n, err := btf.Sizeof(m.Type)
				if err == nil {
					for o := uint32(0); o+8 <= uint32(n); o += 8 {
						*out = append(*out, slot{off: base + uint32(m.Offset.Bytes()) + o, target: ts.xaNode, union: union, xa: true})
					}
				}
				continue
			}
			ts.flatten(m.Type, base+uint32(m.Offset.Bytes()), union, depth+1, out)
		}
	case *btf.Union:
		for _, m := range c.Members {
			if m.BitfieldSize != 0 || m.Offset%8 != 0 {
				continue
			}
			ts.flatten(m.Type, base+uint32(m.Offset.Bytes()), true, depth+1, out)
		}
	case *btf.Array:
		es, err := btf.Sizeof(c.Type)
		if err != nil || es == 0 {
			return
		}
		n := min(c.Nelems, maxArrayElem)
		before := len(*out)
		ts.flatten(c.Type, base, union, depth+1, out)
		per := (*out)[before:]
		if len(per) == 0 {
			return
		}
		per = append([]slot(nil), per...)
		for i := uint32(1); i < n && len(*out) < maxSlots; i++ {
			for _, s := range per {
				s.off += i * uint32(es)
				*out = append(*out, s)
			}
		}
	case *btf.Pointer:
		ts.flattenPointer(c, base, union, out)
	}
}

// flattenPointer is flatten's pointer: a slot for a pointer to a
// struct, to an array of pointers to one (S **), or to a string.
func (ts *types) flattenPointer(c *btf.Pointer, base uint32, union bool, out *[]slot) {
	if isChar(c.Target) {
		*out = append(*out, slot{off: base, target: ts.strID(), union: union})
		return
	}
	st := structOf(c.Target)
	if st == nil {
		// S **: a pointer to an array of pointers to S. The back
		// pointers of lists (hlist_node **pprev) point at the next
		// member of whatever holds the previous node: no array.
		if pt := structOf(pointee(c.Target)); pt != nil && pt.Name != "" && pt.Size > 0 && !ignoredTargets[pt.Name] && !linkTypes[pt.Name] {
			*out = append(*out, slot{off: base, target: ts.ptrID(pt), union: union})
		}
		return
	}
	if st.Name == "" || st.Size == 0 || ignoredTargets[st.Name] {
		return
	}
	*out = append(*out, slot{off: base, target: ts.id(st), link: linkTypes[st.Name], union: union})
}

// flexTail finds a struct's last member when it is a flexible array
// (size 0): its offset and element type.
func flexTail(s *btf.Struct) (uint32, btf.Type, bool) {
	if len(s.Members) == 0 {
		return 0, nil, false
	}
	m := s.Members[len(s.Members)-1]
	a, ok := btf.UnderlyingType(m.Type).(*btf.Array)
	if !ok || a.Nelems != 0 || m.BitfieldSize != 0 {
		return 0, nil, false
	}
	return uint32(m.Offset.Bytes()), a.Type, true
}

// holds says whether outer has inner embedded at off (at any depth;
// inner == outer at 0 included), or, for a link type, any link there.
func (ts *types) holdsAt(outer, inner int32, off uint32) bool {
	if outer == inner && off == 0 {
		return true
	}
	k := holdKey{outer, inner, off}
	if v, ok := ts.holds[k]; ok {
		return v
	}
	var v bool
	if e := ts.infos[inner].ptrTo; e >= 0 {
		// "S *": a member that is a pointer to S lies there.
		v = ts.holdsPtr(ts.infos[outer].t, ts.infos[e].t, off, 0)
	} else {
		v = ts.holdsIn(ts.infos[outer].t, ts.infos[inner].t, off, 0)
	}
	ts.holds[k] = v
	return v
}

// holdsIn says whether t has struct inner at off, itself or nested.
func (ts *types) holdsIn(t btf.Type, inner *btf.Struct, off uint32, depth int) bool {
	return holdsAt(t, off, depth, func(t btf.Type, off uint32) bool {
		s, ok := t.(*btf.Struct)
		return ok && s == inner && off == 0
	})
}

// holdsPtr says whether t has a pointer to struct elem at off.
func (ts *types) holdsPtr(t btf.Type, elem *btf.Struct, off uint32, depth int) bool {
	return holdsAt(t, off, depth, func(t btf.Type, off uint32) bool {
		p, ok := t.(*btf.Pointer)
		return ok && off == 0 && structOf(p.Target) == elem
	})
}

// holdsAt says whether at holds for t at off or, descending through the
// member or array element that covers off, for a type nested in t.
func holdsAt(t btf.Type, off uint32, depth int, at func(t btf.Type, off uint32) bool) bool {
	if depth > maxDepth {
		return false
	}
	t = btf.UnderlyingType(t)
	if at(t, off) {
		return true
	}
	switch c := t.(type) {
	case *btf.Struct, *btf.Union:
		var ms []btf.Member
		if s, ok := c.(*btf.Struct); ok {
			ms = s.Members
		} else {
			ms = c.(*btf.Union).Members
		}
		for _, m := range ms {
			if m.BitfieldSize != 0 {
				continue
			}
			start := uint32(m.Offset.Bytes())
			n, err := btf.Sizeof(m.Type)
			if err != nil || off < start || off >= start+uint32(n) {
				continue
			}
			if holdsAt(m.Type, off-start, depth+1, at) {
				return true
			}
		}
	case *btf.Array:
		es, err := btf.Sizeof(c.Type)
		if err != nil || es == 0 {
			return false
		}
		return holdsAt(c.Type, off%uint32(es), depth+1, at)
	}
	return false
}

// embedders are the structs that embed inner at off.
func (ts *types) embedders(spec *btf.Spec, inner int32, off uint32) []int32 {
	if ts.emb == nil {
		ts.buildEmb(spec)
	}
	return ts.emb[embKey{inner, off}]
}

// buildEmb indexes every named struct of the BTF by the structs it
// embeds and where.
func (ts *types) buildEmb(spec *btf.Spec) {
	ts.emb = map[embKey][]int32{}
	for typ, err := range spec.All() {
		if err != nil {
			break
		}
		s, ok := typ.(*btf.Struct)
		if !ok || s.Name == "" || s.Size == 0 {
			continue
		}
		outer := ts.id(s)
		seen := map[embKey]bool{}
		ts.walkEmb(s, 0, 0, func(k embKey) {
			if !seen[k] {
				seen[k] = true
				ts.emb[k] = append(ts.emb[k], outer)
			}
		})
	}
}

func (ts *types) walkEmb(t btf.Type, base uint32, depth int, add func(embKey)) {
	if depth > 8 {
		return
	}
	switch c := btf.UnderlyingType(t).(type) {
	case *btf.Struct:
		if depth > 0 && c.Name != "" {
			add(embKey{ts.id(c), base})
		}
		for _, m := range c.Members {
			if m.BitfieldSize == 0 && m.Offset%8 == 0 {
				ts.walkEmb(m.Type, base+uint32(m.Offset.Bytes()), depth+1, add)
			}
		}
	case *btf.Union:
		for _, m := range c.Members {
			if m.BitfieldSize == 0 && m.Offset%8 == 0 {
				ts.walkEmb(m.Type, base+uint32(m.Offset.Bytes()), depth+1, add)
			}
		}
	case *btf.Array:
		es, err := btf.Sizeof(c.Type)
		if err != nil || es == 0 || structOf(c.Type) == nil {
			return
		}
		for i := uint32(0); i < min(c.Nelems, 16); i++ {
			ts.walkEmb(c.Type, base+i*uint32(es), depth+1, add)
		}
	}
}
