package typegraph

import (
	"bytes"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab/slabtest"
)

// TestStrings: a char * at the start of a heap object holding a C
// string types it char[N] (N its size, known through the named object);
// one at bytes that are no string (binary, empty, unterminated), or
// into the middle of a string, types nothing; a char * at a typed
// object contradicts nothing; and a saved graph gives the string back.
func TestStrings(t *testing.T) {
	base := slabtest.Types(false)
	char := &btf.Int{Name: "char", Size: 1}
	cptr := ptr(&btf.Const{Type: char})
	named := &btf.Struct{Name: "named", Size: 64, Members: []btf.Member{
		mem("name", cptr, 0), mem("bin", cptr, 8), mem("empty", cptr, 16), mem("full", cptr, 24),
		mem("mid", cptr, 32), mem("other", cptr, 40), mem("x", u64, 48), mem("y", u64, 56)}}
	im := slabtest.NewImageTypes(t, false, append(base, named))
	nc := im.AddCache("named", 64, 64, 0, 0)
	k16 := im.AddCache("kmalloc-16", 16, 16, 0, 0)
	sn := im.AddSlab(nc, 2, nil)
	s16 := im.AddSlab(k16, 8, nil)
	im.Finish()
	o, o2 := nc.Obj(sn, 0), nc.Obj(sn, 1)
	str, bin, empty, full, mid := k16.Obj(s16, 0), k16.Obj(s16, 1), k16.Obj(s16, 2), k16.Obj(s16, 3), k16.Obj(s16, 4)
	im.Write(str, []byte("eth0\x00"))
	im.Write(bin, []byte{0x01, 0x00, 0x00, 0x00, 0xff, 0xff})
	im.Write(full, bytes.Repeat([]byte("a"), 16)) // no NUL within the object
	im.Write(mid, []byte("lo\x00"))
	for i, p := range []uint64{str, bin, empty, full, mid + 1, o2} {
		im.U64(o+uint64(8*i), p)
	}
	g := buildImageGraph(t, im)
	want := map[uint64]string{str: "char[16]", bin: "", empty: "", full: "", mid: "", o2: "named"}
	for a, w := range want {
		at, ok := g.TypeAt(a)
		switch {
		case w == "" && ok:
			t.Errorf("%#x typed %s, want untyped", a, at.Type)
		case w != "" && (!ok || at.Type != w):
			t.Errorf("%#x: %+v, want %s", a, at, w)
		}
	}
	if at, ok := g.TypeAt(str + 2); !ok || at.Member != "char[2]" || len(at.Chain) != 1 || at.Chain[0].Member != "named.name" {
		t.Errorf("a character of the string: %+v", at)
	}
	if n := len(g.Conflicts(10)); n != 0 {
		t.Errorf("%d conflicts, want none (a char * contradicts no type)", n)
	}
	var b bytes.Buffer
	if err := g.Save(&b, testVMCI); err != nil {
		t.Fatal(err)
	}
	lg, err := load(t, im, b.Bytes(), testVMCI)
	if err != nil {
		t.Fatal(err)
	}
	if at, ok := lg.TypeAt(str); !ok || at.Type != "char[16]" {
		t.Errorf("loaded: %+v, want char[16]", at)
	}
}
