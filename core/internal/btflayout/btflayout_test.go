package btflayout

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/btftest"
)

func TestFields(t *testing.T) {
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	i16 := &btf.Int{Name: "short", Size: 2, Encoding: btf.Signed}
	u64 := &btf.Int{Name: "unsigned long", Size: 8}
	bits := &btf.Struct{Size: 4, Members: []btf.Member{
		{Name: "inuse", Type: u32, BitfieldSize: 16},
		{Name: "objects", Type: u32, Offset: 16, BitfieldSize: 15},
		{Name: "frozen", Type: u32, Offset: 31, BitfieldSize: 1},
	}}
	inner := &btf.Struct{Name: "inner", Size: 16, Members: []btf.Member{{Name: "a", Type: u64}, {Name: "b", Type: i16, Offset: 64}}}
	outer := &btf.Struct{Name: "outer", Size: 64, Members: []btf.Member{
		{Name: "x", Type: u64},
		{Name: "", Type: &btf.Union{Size: 8, Members: []btf.Member{{Name: "counters", Type: u64}, {Name: "", Type: bits}}}, Offset: 64},
		{Name: "in", Type: inner, Offset: 128},
		{Name: "arr", Type: &btf.Array{Index: u32, Type: u64, Nelems: 4}, Offset: 256},
	}}
	e := &btf.Enum{Name: "pageflags", Size: 4, Values: []btf.EnumValue{{Name: "PG_slab", Value: 9}}}
	spec := btftest.Spec(t, outer, e)
	b := New(spec)
	for _, c := range []struct {
		path            string
		off, size       uint32
		shift, bitwidth uint8
	}{
		{"x", 0, 8, 0, 0}, {"counters", 8, 8, 0, 0}, {"inuse", 8, 2, 0, 16}, {"objects", 10, 2, 0, 15},
		{"frozen", 11, 1, 7, 1}, {"in.b", 24, 2, 0, 0}, {"arr", 32, 32, 0, 0},
	} {
		f := b.Need("outer", c.path)
		if f.Off != c.off || f.Size != c.size || f.Shift != c.shift || f.Bits != c.bitwidth || !f.OK {
			t.Errorf("%s: %+v, want off %d size %d shift %d bits %d", c.path, f, c.off, c.size, c.shift, c.bitwidth)
		}
	}
	buf := make([]byte, 64)
	inuse, objects, frozen, sb := b.Need("outer", "inuse"), b.Need("outer", "objects"), b.Need("outer", "frozen"), b.Need("outer", "in.b")
	inuse.Put(buf, 0x1234)
	objects.Put(buf, 0x7fff)
	frozen.Put(buf, 1)
	sb.Put(buf, 0xfffe)
	if inuse.U64(buf) != 0x1234 || objects.U64(buf) != 0x7fff || frozen.U64(buf) != 1 || buf[11] != 0xff || sb.I64(buf) != -2 {
		t.Errorf("bitfields: %x", buf[8:12])
	}
	objects.Put(buf, 3)
	if inuse.U64(buf) != 0x1234 || objects.U64(buf) != 3 || frozen.U64(buf) != 1 {
		t.Errorf("a bitfield write disturbed its neighbours: %x", buf[8:12])
	}
	if n := b.ArrayLen("outer", "arr"); n != 4 {
		t.Errorf("arr has %d elements", n)
	}
	if v, ok := EnumValue(spec, "pageflags", "PG_slab"); !ok || v != 9 {
		t.Errorf("PG_slab = %d %v", v, ok)
	}
	if f := b.Opt("outer", "nope", "x"); f.Off != 0 || !f.OK {
		t.Errorf("Opt falls back to the next path: %+v", f)
	}
	if b.Err() != nil {
		t.Fatal(b.Err())
	}
	b.Need("outer", "missing")
	b.Sizeof("nostruct")
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "missing") || !strings.Contains(err.Error(), "nostruct") {
		t.Errorf("errors: %v", err)
	}
	if (Field{}).U64(buf) != 0 || (Field{Off: 60, Size: 8, OK: true}).U64(buf) != 0 {
		t.Errorf("absent or out-of-range fields read as 0")
	}
}
