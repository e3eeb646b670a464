package typegraph

import (
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab/slabtest"
)

// TestPointerArrays: a member S ** (fdtable.fd) types the object it
// points at as an array of pointers to S, when every word of it is null
// or a kernel address and no element lands in a typed object on
// something else than an S; the elements then type what they point at.
// A list's back pointer (hlist_node **pprev) is no array.
func TestPointerArrays(t *testing.T) {
	for _, tc := range []struct {
		name string
		// elems are the array object's 8 words: "i0", "i1" (items in
		// kmalloc-96), "th" (a thing, its own cache's), "5" (not a
		// pointer), "" (null).
		elems    [8]string
		member   string // the pointing member: "fd" (item **) or "pp" (list_head **)
		arr      string // the array object's type, "" untyped
		itemsTyp string // the items' type, "" untyped
	}{
		{"array", [8]string{"i0", "i1", "", "", "", "", "", ""}, "fd", "item *[8]", "item"},
		{"later element", [8]string{"", "", "", "i1", "", "", "", ""}, "fd", "item *[8]", "item"},
		{"not a pointer", [8]string{"i0", "i1", "5", "", "", "", "", ""}, "fd", "", ""},
		{"element on another type", [8]string{"i0", "th", "", "", "", "", "", ""}, "fd", "", ""},
		{"only the first", [8]string{"i0", "", "", "", "", "", "", ""}, "fd", "", ""},
		{"back pointer", [8]string{"i0", "i1", "", "", "", "", "", ""}, "pp", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := slabtest.Types(false)
			var list *btf.Struct
			for _, ty := range base {
				if s, ok := ty.(*btf.Struct); ok && s.Name == "list_head" {
					list = s
				}
			}
			item := &btf.Struct{Name: "item", Size: 96, Members: []btf.Member{mem("x", u64, 0), mem("y", u64, 8)}}
			thing := &btf.Struct{Name: "thing", Size: 40, Members: []btf.Member{mem("x", u64, 0)}}
			fdt := &btf.Struct{Name: "fdt", Size: 32, Members: []btf.Member{
				mem("fd", ptr(ptr(item)), 0), mem("pp", ptr(ptr(list)), 8), mem("x", u64, 16), mem("y", u64, 24)}}
			im := slabtest.NewImageTypes(t, false, append(base, item, thing, fdt))
			fc := im.AddCache("fdt", 32, 32, 0, 0)
			tc2 := im.AddCache("thing", 40, 40, 0, 0)
			k64 := im.AddCache("kmalloc-64", 64, 64, 0, 0)
			k96 := im.AddCache("kmalloc-96", 96, 96, 0, 0)
			sf := im.AddSlab(fc, 1, nil)
			st := im.AddSlab(tc2, 1, nil)
			s64 := im.AddSlab(k64, 1, nil)
			s96 := im.AddSlab(k96, 2, nil)
			im.Finish()
			arr := k64.Obj(s64, 0)
			objs := map[string]uint64{"i0": k96.Obj(s96, 0), "i1": k96.Obj(s96, 1), "th": tc2.Obj(st, 0), "5": 5}
			for i, e := range tc.elems {
				if e != "" {
					im.U64(arr+uint64(8*i), objs[e])
				}
			}
			off := map[string]uint64{"fd": 0, "pp": 8}[tc.member]
			im.U64(fc.Obj(sf, 0)+off, arr)
			g := buildImageGraph(t, im)
			at, ok := g.TypeAt(arr + 8)
			switch {
			case tc.arr == "" && ok:
				t.Errorf("array object typed %s, want untyped", at.Type)
			case tc.arr != "" && (!ok || at.Type != tc.arr || at.Mark != Conjectured || at.Pass != PassArrays || at.Member != "item *[1]"):
				t.Errorf("array object: %+v, want %s by the arrays pass", at, tc.arr)
			}
			for _, e := range []string{"i0", "i1"} {
				present := false
				for _, x := range tc.elems {
					present = present || x == e
				}
				if !present {
					continue
				}
				it, ok := g.TypeAt(objs[e])
				switch {
				case tc.itemsTyp == "" && ok:
					t.Errorf("%s typed %s, want untyped", e, it.Type)
				case tc.itemsTyp != "" && (!ok || it.Type != tc.itemsTyp || len(it.Chain) != 2):
					t.Errorf("%s: %+v, want %s through the array", e, it, tc.itemsTyp)
				}
			}
			if r := g.Report(); r.Conflicts != 0 {
				t.Errorf("conflicts %d", r.Conflicts)
			}
		})
	}
}
