package typegraph

import (
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab/slabtest"
)

// TestListOwners: a vm_area_struct's anon_vma_chain head points at the
// same_vma node of anon_vma_chains, in a cache where another struct has
// a list_head at the same offset (the list rule alone cannot choose);
// the owner table types the first and last entries as known. An empty
// list (the head points at itself) and a pointer whose entry would
// straddle two objects type nothing.
func TestListOwners(t *testing.T) {
	for _, tc := range []struct {
		name  string
		links func(head, a0, a1 uint64) []uint64 // the ring of list_heads from the head
		want  map[string]string                  // "a0", "a1" → type ("" untyped)
	}{
		{"list", func(h, a0, a1 uint64) []uint64 { return []uint64{h, a0 + 16, a1 + 16} }, map[string]string{"a0": "anon_vma_chain", "a1": "anon_vma_chain"}},
		{"empty", func(h, a0, a1 uint64) []uint64 { return []uint64{h} }, map[string]string{"a0": "", "a1": ""}},
		{"straddles", func(h, a0, a1 uint64) []uint64 { return []uint64{h, a1 + 8} }, map[string]string{"a1": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := slabtest.Types(false)
			var list *btf.Struct
			for _, ty := range base {
				if s, ok := ty.(*btf.Struct); ok && s.Name == "list_head" {
					list = s
				}
			}
			vma := &btf.Struct{Name: "vm_area_struct", Size: 48, Members: []btf.Member{mem("x", u64, 0), mem("anon_vma_chain", list, 8), mem("y", u64, 24), mem("z", u64, 32), mem("w", u64, 40)}}
			avc := &btf.Struct{Name: "anon_vma_chain", Size: 64, Members: []btf.Member{mem("vma", ptr(vma), 0), mem("x", u64, 8), mem("same_vma", list, 16), mem("y", u64, 32)}}
			other := &btf.Struct{Name: "other", Size: 64, Members: []btf.Member{mem("x", u64, 0), mem("l", list, 16), mem("y", u64, 56)}}
			im := slabtest.NewImageTypes(t, false, append(base, vma, avc, other))
			vc := im.AddCache("vm_area_struct", 48, 48, 0, 0)
			k64 := im.AddCache("kmalloc-64", 64, 64, 0, 0)
			sv := im.AddSlab(vc, 1, nil)
			s64 := im.AddSlab(k64, 2, nil)
			im.Finish()
			head := vc.Obj(sv, 0) + 8
			objs := map[string]uint64{"a0": k64.Obj(s64, 0), "a1": k64.Obj(s64, 1)}
			ring := tc.links(head, objs["a0"], objs["a1"])
			for i, l := range ring {
				im.U64(l, ring[(i+1)%len(ring)])
				im.U64(l+8, ring[(i+len(ring)-1)%len(ring)])
			}
			g := buildImageGraph(t, im)
			for k, want := range tc.want {
				at, ok := g.TypeAt(objs[k])
				switch {
				case want == "" && ok:
					t.Errorf("%s typed %s, want untyped", k, at.Type)
				case want != "" && (!ok || at.Type != want || at.Mark != Known || len(at.Chain) != 1 || at.Chain[0].Member != "vm_area_struct.anon_vma_chain."+map[string]string{"a0": "next", "a1": "prev"}[k]):
					t.Errorf("%s: %+v, want %s known through the head", k, at, want)
				}
			}
			if r := g.Report(); r.Conflicts != 0 {
				t.Errorf("conflicts %d", r.Conflicts)
			}
		})
	}
}

// TestXArray: an xarray's head and its nodes' slots hold internal
// entries (node | 2) that point at struct xa_nodes; other entries say
// nothing.
func TestXArray(t *testing.T) {
	for _, tc := range []struct {
		name       string
		head       func(n0 uint64) uint64
		slot       func(n1 uint64) uint64 // n0's slot 3
		want0, wan string
	}{
		{"nodes", func(n0 uint64) uint64 { return n0 | 2 }, func(n1 uint64) uint64 { return n1 | 2 }, "xa_node", "xa_node"},
		{"entry", func(n0 uint64) uint64 { return n0 }, func(n1 uint64) uint64 { return n1 | 2 }, "", ""},
		{"value entry in a node", func(n0 uint64) uint64 { return n0 | 2 }, func(n1 uint64) uint64 { return n1 | 1 }, "xa_node", ""},
		{"middle of an object", func(n0 uint64) uint64 { return (n0 + 8) | 2 }, func(n1 uint64) uint64 { return n1 | 2 }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := slabtest.Types(false)
			void := ptr(&btf.Void{})
			xa := &btf.Struct{Name: "xarray", Size: 16, Members: []btf.Member{mem("xa_flags", u64, 0), mem("xa_head", void, 8)}}
			xn := &btf.Struct{Name: "xa_node", Size: 576}
			xn.Members = []btf.Member{mem("shift", u64, 0), mem("parent", ptr(xn), 8), mem("array", ptr(xa), 16),
				mem("slots", &btf.Array{Index: u64, Type: void, Nelems: 64}, 40), mem("tags", u64, 552)}
			mapping := &btf.Struct{Name: "mapping", Size: 32, Members: []btf.Member{mem("x", u64, 0), mem("i_pages", xa, 8), mem("y", u64, 24)}}
			im := slabtest.NewImageTypes(t, false, append(base, xa, xn, mapping))
			mc := im.AddCache("mapping", 32, 32, 0, 0)
			k1k := im.AddCache("kmalloc-1k", 1024, 1024, 0, 0)
			sm := im.AddSlab(mc, 1, nil)
			sk := im.AddSlab(k1k, 2, nil)
			im.Finish()
			n0, n1 := k1k.Obj(sk, 0), k1k.Obj(sk, 1)
			im.U64(mc.Obj(sm, 0)+16, tc.head(n0))
			im.U64(n0+40+3*8, tc.slot(n1))
			im.U64(n1+8, n0) // the child's parent: a typed pointer, but from an untyped object
			g := buildImageGraph(t, im)
			for a, want := range map[uint64]string{n0: tc.want0, n1: tc.wan} {
				at, ok := g.TypeAt(a)
				switch {
				case want == "" && ok:
					t.Errorf("%#x typed %s, want untyped", a, at.Type)
				case want != "" && (!ok || at.Type != want || at.Mark != Known):
					t.Errorf("%#x: %+v, want %s known", a, at, want)
				}
			}
		})
	}
}
