package typegraph

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab/slabtest"
)

// TestStaticData: a typed pointer from a heap object into the kernel
// image's data reads the struct there as a root, whose pointers type
// the heap objects they reach (known, as from the object); a pointer
// to an address outside the image's data, or through a union, does not.
func TestStaticData(t *testing.T) {
	for _, tc := range []struct {
		name    string
		inData  bool // the static struct lies within [_sdata, _edata)
		viaUnio bool // the object's pointer to it lies in a union
		want    string
	}{
		{"in data", true, false, "item"},
		{"outside the data", false, false, ""},
		{"through a union", true, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := slabtest.Types(false)
			item := &btf.Struct{Name: "item", Size: 96, Members: []btf.Member{mem("x", u64, 0), mem("y", u64, 8)}}
			cls := &btf.Struct{Name: "cls", Size: 32, Members: []btf.Member{mem("x", u64, 0), mem("it", ptr(item), 8), mem("y", u64, 16), mem("z", u64, 24)}}
			var m btf.Member
			if tc.viaUnio {
				m = mem("", &btf.Union{Size: 8, Members: []btf.Member{mem("c", ptr(cls), 0), mem("v", u64, 0)}}, 8)
			} else {
				m = mem("c", ptr(cls), 8)
			}
			own := &btf.Struct{Name: "own", Size: 32, Members: []btf.Member{mem("x", u64, 0), m, mem("y", u64, 16), mem("z", u64, 24)}}
			im := slabtest.NewImageTypes(t, false, append(base, item, cls, own))
			oc := im.AddCache("own", 32, 32, 0, 0)
			k96 := im.AddCache("kmalloc-96", 96, 96, 0, 0)
			so := im.AddSlab(oc, 1, nil)
			s96 := im.AddSlab(k96, 1, nil)
			im.Finish()
			st := im.Alloc(64)
			im.Syms["_sdata"] = st - 64
			im.Syms["_edata"] = st + 64
			if !tc.inData {
				im.Syms["_edata"] = st + 16 // the struct would end past it
			}
			it := k96.Obj(s96, 0)
			im.U64(st+8, it)
			im.U64(oc.Obj(so, 0)+8, st)
			g := buildImageGraph(t, im)
			at, ok := g.TypeAt(it)
			switch {
			case tc.want == "" && ok:
				t.Errorf("item typed %+v, want untyped", at)
			case tc.want != "" && (!ok || at.Type != tc.want || at.Mark != Known || len(at.Chain) != 1 || at.Chain[0].Member != "cls.it"):
				t.Errorf("item: %+v, want %s known through the static cls", at, tc.want)
			}
		})
	}
}

// TestCutRange: the image ranges freed after boot come out of the data
// ranges findleaks and the static typing read as the image's.
func TestCutRange(t *testing.T) {
	rs := [][2]uint64{{0x100, 0x200}, {0x300, 0x400}, {0x500, 0x600}}
	for _, tc := range []struct {
		cut  [2]uint64
		want [][2]uint64
	}{
		{[2]uint64{0x380, 0x400}, [][2]uint64{{0x100, 0x200}, {0x300, 0x380}, {0x500, 0x600}}}, // x86's bss_decrypted tail
		{[2]uint64{0x320, 0x340}, [][2]uint64{{0x100, 0x200}, {0x300, 0x320}, {0x340, 0x400}, {0x500, 0x600}}},
		{[2]uint64{0x200, 0x300}, rs}, // between ranges: nothing
		{[2]uint64{0x0, 0x1000}, nil},
	} {
		if got := cutRange(rs, tc.cut); !slices.Equal(got, tc.want) {
			t.Errorf("cut %#x: %#x, want %#x", tc.cut, got, tc.want)
		}
	}
}
