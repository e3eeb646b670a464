package typegraph

import (
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/slab/slabtest"
	"github.com/kinst/kinst/core/typeid"
)

var u64 = &btf.Int{Name: "unsigned long", Size: 8}

func mem(name string, t btf.Type, off uint32) btf.Member {
	return btf.Member{Name: name, Type: t, Offset: btf.Bits(8 * off)}
}

func ptr(t btf.Type) btf.Type { return &btf.Pointer{Target: t} }

// testTypes are the structs of the synthetic heap: owner (its own
// cache) points at an item, a blob, an array of elem, a list of lnode,
// the inner member of an outer and a thing (its own cache).
func testTypes(list *btf.Struct) []btf.Type {
	leaf := &btf.Struct{Name: "leaf", Size: 24, Members: []btf.Member{mem("a", u64, 0), mem("b", u64, 8), mem("c", u64, 16)}}
	item := &btf.Struct{Name: "item", Size: 96, Members: []btf.Member{mem("lf", ptr(leaf), 0), mem("x", u64, 8)}}
	blob := &btf.Struct{Name: "blob", Size: 96, Members: []btf.Member{mem("x", u64, 0)}}
	elem := &btf.Struct{Name: "elem", Size: 16, Members: []btf.Member{mem("p", ptr(leaf), 0), mem("x", u64, 8)}}
	inner := &btf.Struct{Name: "inner", Size: 32, Members: []btf.Member{mem("x", u64, 0)}}
	outer := &btf.Struct{Name: "outer", Size: 120, Members: []btf.Member{
		mem("", &btf.Union{Size: 8, Members: []btf.Member{mem("l", ptr(leaf), 0), mem("v", u64, 0)}}, 0),
		mem("in", inner, 16), mem("y", u64, 112)}}
	lnode := &btf.Struct{Name: "lnode", Size: 48, Members: []btf.Member{mem("x", u64, 0), mem("link", list, 16), mem("z", u64, 40)}}
	thing := &btf.Struct{Name: "thing", Size: 40, Members: []btf.Member{mem("x", u64, 0)}}
	owner := &btf.Struct{Name: "owner", Size: 64, Members: []btf.Member{
		mem("it", ptr(item), 0), mem("bl", ptr(blob), 8), mem("arr", ptr(elem), 16), mem("head", list, 24),
		mem("in", ptr(inner), 40), mem("th", ptr(thing), 48), mem("pad", u64, 56)}}
	return []btf.Type{leaf, item, blob, elem, inner, outer, lnode, thing, owner}
}

// heap builds the synthetic heap; want maps object addresses to the
// type, the mark and the pass the graph must give them ("" : untyped).
type want struct {
	typ  string
	mark Mark
	pass string
}

const nList = 40

func heap(t *testing.T) (*slabtest.Image, *slab.Heap, map[uint64]want, map[string]uint64) {
	base := slabtest.Types(false)
	var list *btf.Struct
	for _, ty := range base {
		if s, ok := ty.(*btf.Struct); ok && s.Name == "list_head" {
			list = s
		}
	}
	im := slabtest.NewImageTypes(t, false, append(base, testTypes(list)...))
	owner := im.AddCache("owner", 64, 64, 0, 0)
	thing := im.AddCache("thing", 40, 40, 0, 0)
	k32 := im.AddCache("kmalloc-32", 32, 32, 0, 0)
	k64 := im.AddCache("kmalloc-64", 64, 64, 0, 0)
	k96 := im.AddCache("kmalloc-96", 96, 96, 0, 0)
	k128 := im.AddCache("kmalloc-128", 128, 128, 0, 0)
	so := im.AddSlab(owner, owner.PerSlab, nil)
	st := im.AddSlab(thing, thing.PerSlab, nil)
	s32 := im.AddSlab(k32, k32.PerSlab, []int{10, 11})
	s64 := im.AddSlab(k64, k64.PerSlab, nil)
	s96 := im.AddSlab(k96, k96.PerSlab, []int{1})
	s128 := im.AddSlab(k128, k128.PerSlab, nil)
	im.Finish()

	o0, o1 := owner.Obj(so, 0), owner.Obj(so, 1)
	item, freed := k96.Obj(s96, 0), k96.Obj(s96, 1)
	leaf0, leaf1, leaf2, leaf3 := k32.Obj(s32, 0), k32.Obj(s32, 1), k32.Obj(s32, 2), k32.Obj(s32, 3)
	arr := k64.Obj(s64, 0)
	// A list of 40 lnodes: followed to its end in one round.
	var ln []uint64
	for i := 1; i <= nList; i++ {
		ln = append(ln, k64.Obj(s64, i))
	}
	outer := k128.Obj(s128, 0)
	th := thing.Obj(st, 0)

	im.U64(o0+0, item)
	im.U64(item+0, leaf0)
	im.U64(o0+16, arr+16) // at element 1 of the array
	for i, l := range []uint64{leaf1, leaf2, 0, 0} {
		im.U64(arr+uint64(16*i), l)
		im.U64(arr+uint64(16*i)+8, 7)
	}
	// owner.head → lnode.link → … → lnode.link → owner.head
	links := []uint64{o0 + 24}
	for _, l := range ln {
		links = append(links, l+16)
	}
	for i, l := range links {
		im.U64(l, links[(i+1)%len(links)])
		im.U64(l+8, links[(i+len(links)-1)%len(links)])
	}
	im.U64(o0+40, outer+16)
	im.U64(outer, leaf3) // through a union
	im.U64(o0+48, th)
	// A second owner says the item is a blob, and points at a freed object.
	im.U64(o1+8, item)
	im.U64(o1+0, freed)

	w := map[uint64]want{
		item:   {"item", Known, PassConservative},
		leaf0:  {"leaf", Known, PassConservative},
		arr:    {"elem[4]", Conjectured, PassArrays},
		leaf1:  {"leaf", Conjectured, PassArrays},
		leaf2:  {"leaf", Conjectured, PassArrays},
		ln[0]:  {"lnode", Conjectured, PassInference},
		ln[1]:  {"lnode", Conjectured, PassInference},
		ln[39]: {"lnode", Conjectured, PassInference},
		outer:  {"outer", Conjectured, PassInference},
		leaf3:  {"leaf", Conjectured, PassInference},
		th:     {"thing", ByCache, PassCache},
		o0:     {"owner", ByCache, PassCache},
		// untyped: nothing points at them
		k32.Obj(s32, 5):   {},
		k128.Obj(s128, 1): {},
		freed:             {},
	}
	h, err := slab.Open(im)
	if err != nil {
		t.Fatal(err)
	}
	// An untyped outer whose union points at an untyped leaf: istype's.
	hand, handLeaf := k128.Obj(s128, 2), k32.Obj(s32, 6)
	im.U64(hand+16+8, 5) // not a pointer
	im.U64(hand, handLeaf)
	return im, h, w, map[string]uint64{"item": item, "o1": o1, "hand": hand, "handLeaf": handLeaf, "o0": o0}
}

func TestGraph(t *testing.T) {
	im, h, w, addrs := heap(t)
	g, err := Build(im, h, typeid.CacheTypes(im.Spec, h), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for a, want := range w {
		got, ok := g.TypeAt(a)
		if want.typ == "" {
			if ok {
				t.Errorf("%#x: typed %s (%s), want untyped", a, got.Type, got.Pass)
			}
			continue
		}
		if !ok {
			t.Errorf("%#x: untyped, want %s", a, want.typ)
			continue
		}
		if got.Type != want.typ || got.Mark != want.mark || got.Pass != want.pass {
			t.Errorf("%#x: %s mark %d pass %s, want %s mark %d pass %s", a, got.Type, got.Mark, got.Pass, want.typ, want.mark, want.pass)
		}
		if want.mark != ByCache && len(got.Chain) == 0 {
			t.Errorf("%#x: %s without a chain of inference", a, got.Type)
		}
	}
	r := g.Report()
	// Allocated objects: every slot of the six slabs less the 3 free ones.
	var total int
	for _, c := range h.Caches {
		total += c.Stats.Allocated
	}
	if r.Objects != total || r.Typed+r.Untyped != r.Objects || r.ByCache+r.Propagated != r.Typed {
		t.Errorf("report counts: %+v, want %d objects", r, total)
	}
	if r.Conflicts != 1 {
		t.Errorf("conflicts = %d, want 1 (the item a second owner calls a blob)", r.Conflicts)
	}
	it, _ := g.TypeAt(addrs["item"])
	if it == nil || len(it.Conflicts) != 1 || len(it.Conflicts[0]) != 1 || it.Conflicts[0][0].Type != "blob" || it.Conflicts[0][0].Member != "owner.bl" {
		t.Errorf("item's conflicts: %+v", it)
	}
	if got, want := it.Member, "item.lf"; got != want {
		t.Errorf("member = %q, want %q", got, want)
	}
	if at, ok := g.TypeAt(w2(t, g, "elem[4]") + 24); !ok || at.Member != "elem[1].x" {
		t.Errorf("array member: %+v", at)
	}
	names := []string{}
	for _, p := range r.Passes {
		names = append(names, p.Pass)
		if p.Known+p.Conjectured+p.Unmarked != r.Objects {
			t.Errorf("pass %s: %+v does not add up to %d objects", p.Pass, p, r.Objects)
		}
	}
	if len(names) != 5 || names[1] != PassConservative || names[4] != PassInference {
		t.Errorf("passes %v", names)
	}
	last := r.Passes[len(r.Passes)-1]
	oc, _ := h.Cache("owner")
	tc, _ := h.Cache("thing")
	if byCache := oc.Stats.Allocated + tc.Stats.Allocated; last.Known != byCache+2 || last.Conjectured != 5+nList || r.ByCache != byCache {
		t.Errorf("after inference: %+v, want %d known (all but 2 by cache), %d conjectured", last, byCache+2, 5+nList)
	}
	if r.Arrays != 1 {
		t.Errorf("arrays = %d", r.Arrays)
	}
}

// w2 finds the object the graph typed as name.
func w2(t *testing.T, g *Graph, name string) uint64 {
	for n := range g.typ {
		if g.mark[n] != Unmarked && g.typeName(int32(n)) == name {
			return g.addr(int32(n))
		}
	}
	t.Fatalf("no object typed %s", name)
	return 0
}

func TestHoldOut(t *testing.T) {
	im, h, _, _ := heap(t)
	ct := typeid.CacheTypes(im.Spec, h)
	g, err := Build(im, h, ct, Options{HoldOut: []string{"thing"}})
	if err != nil {
		t.Fatal(err)
	}
	r := g.Report()
	if len(r.HeldOut) != 1 {
		t.Fatalf("held out: %+v", r.HeldOut)
	}
	ho := r.HeldOut[0]
	c, _ := h.Cache("thing")
	if ho.Cache != "thing" || ho.Type != "thing" || ho.Objects != c.Stats.Allocated || ho.Typed != 1 || ho.Correct != 1 {
		t.Errorf("held out: %+v (%d objects)", ho, c.Stats.Allocated)
	}
	if _, err := Build(im, h, ct, Options{HoldOut: []string{"nosuch"}}); err == nil {
		t.Error("hold-out of a cache that does not exist: no error")
	}
}

func TestFits(t *testing.T) {
	im, h, _, _ := heap(t)
	g, err := Build(im, h, typeid.CacheTypes(im.Spec, h), Options{})
	if err != nil {
		t.Fatal(err)
	}
	id := func(name string) int32 {
		var s *btf.Struct
		if err := im.Spec.TypeByName(name, &s); err != nil {
			t.Fatal(err)
		}
		return g.ts.id(s)
	}
	ci := func(name string) *cacheInfo {
		c, _ := h.Cache(name)
		return g.caches[g.cacheIdx[c]]
	}
	for _, c := range []struct {
		cache, typ string
		want       bool
	}{
		{"kmalloc-96", "item", true},   // 96 in (64, 96]
		{"kmalloc-128", "item", false}, // 96 is kmalloc-96's
		{"kmalloc-128", "outer", true},
		{"kmalloc-32", "leaf", true},
		{"kmalloc-64", "elem", false}, // 16: an array, or a larger struct
		{"kmalloc-64", "lnode", true},
		{"thing", "thing", true},
		{"owner", "thing", false}, // a dedicated cache's objects are its size
	} {
		if got := g.fits(ci(c.cache), id(c.typ)); got != c.want {
			t.Errorf("fits(%s, %s) = %v, want %v", c.cache, c.typ, got, c.want)
		}
	}
}

func TestIsType(t *testing.T) {
	im, h, _, addrs := heap(t)
	ct := typeid.CacheTypes(im.Spec, h)
	g0, err := Build(im, h, ct, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := g0.TypeAt(addrs["hand"]); ok {
		t.Fatal("the object istype is to type is typed already")
	}
	g, err := Build(im, h, ct, Options{ByHand: []ByHand{{addrs["hand"], "outer"}}})
	if err != nil {
		t.Fatal(err)
	}
	if ty, ok := g.TypeAt(addrs["hand"]); !ok || ty.Type != "outer" || ty.Mark != Hand || ty.Pass != "istype" {
		t.Errorf("typed by hand: %+v", ty)
	}
	// Its union's pointer types the leaf in the inference.
	if ty, ok := g.TypeAt(addrs["handLeaf"]); !ok || ty.Type != "leaf" || len(ty.Chain) != 1 || ty.Chain[0].Member != "outer.l" {
		t.Errorf("the leaf an istype object points at: %+v", ty)
	}
	r, r0 := g.Report(), g0.Report()
	if r.ByHand != 1 || r.Typed != r0.Typed+2 || r.ByCache+r.ByHand+r.Propagated != r.Typed {
		t.Errorf("istype report: %+v; without: %+v", r, r0)
	}
	for _, bad := range []ByHand{{addrs["hand"] + 8, "outer"}, {addrs["hand"], "nosuch"}, {addrs["o0"], "outer"}} {
		if _, err := Build(im, h, ct, Options{ByHand: []ByHand{bad}}); err == nil {
			t.Errorf("istype %#x %s: no error", bad.Addr, bad.Type)
		}
	}
}
