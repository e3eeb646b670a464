package kernel

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// memberSpec: a struct with an anonymous union, a nested struct, an
// array of structs and a bitfield.
func memberSpec(t *testing.T) *Types {
	t.Helper()
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	u64 := &btf.Int{Name: "long unsigned int", Size: 8}
	m := func(name string, typ btf.Type, byteOff uint32) btf.Member {
		return btf.Member{Name: name, Type: typ, Offset: btf.Bits(byteOff * 8)}
	}
	mem := &btf.Struct{Name: "module_memory", Size: 16, Members: []btf.Member{m("base", u64, 0), m("size", u32, 8)}}
	thread := &btf.Struct{Name: "thread_struct", Size: 16, Members: []btf.Member{m("sp", u64, 8)}}
	anon := &btf.Union{Size: 8, Members: []btf.Member{m("a", u32, 0), m("b", u64, 0)}}
	s := &btf.Struct{Name: "thing", Size: 128, Members: []btf.Member{
		m("first", u32, 0),
		m("", anon, 8),
		m("thread", thread, 16),
		m("mem", &btf.Array{Index: u32, Type: mem, Nelems: 3}, 32),
		{Name: "flag", Type: u32, Offset: 80 * 8, BitfieldSize: 1},
	}}
	return &Types{Spec: specFromTypes(t, []btf.Type{s})}
}

func TestMemberPaths(t *testing.T) {
	ty := memberSpec(t)
	for _, tc := range []struct {
		path      string
		off, size uint64
		err       string // "" for none
		noMember  bool
	}{
		{path: "first", off: 0, size: 4},
		{path: "b", off: 8, size: 8}, // through the anonymous union
		{path: "thread.sp", off: 24, size: 8},
		{path: "mem[0].base", off: 32, size: 8},
		{path: "mem[2].size", off: 32 + 2*16 + 8, size: 4},
		{path: "mem", off: 32, size: 48},
		{path: "nope", err: "no such member", noMember: true},
		{path: "thread.nope", err: "no such member", noMember: true},
		{path: "mem[3].base", err: "past its 3 elements"},
		{path: "first[0]", err: "not an array"},
		{path: "mem[x]", err: "bad index"},
		{path: "flag", err: "bitfield"},
	} {
		m, err := ty.Member("thing", tc.path)
		if tc.err == "" {
			if err != nil || m.Off != tc.off || m.Size != tc.size {
				t.Errorf("%s: %+v, %v; want offset %d size %d", tc.path, m, err, tc.off, tc.size)
			}
			continue
		}
		var le *LayoutError
		if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrLayout) || !errors.As(err, &le) ||
			le.Type != "thing" || le.Member != tc.path || errors.Is(err, ErrNoMember) != tc.noMember {
			t.Errorf("%s: %v; want a LayoutError saying %q (ErrNoMember %v)", tc.path, err, tc.err, tc.noMember)
		}
	}
	if _, err := ty.Member("absent", "x"); !errors.Is(err, ErrLayout) || !errors.Is(err, btf.ErrNotFound) {
		t.Errorf("missing struct: %v", err)
	}
	// Field checks the size the reader wants.
	if f, err := ty.Field("thing", "thread.sp", 8); err != nil || f != (Field{24, 8}) {
		t.Errorf("Field(thread.sp) = %+v, %v", f, err)
	}
	if _, err := ty.Field("thing", "first", 8); !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "is 4 bytes, want 8") {
		t.Errorf("Field(first, 8): %v", err)
	}
	if _, err := ty.Field("thing", "thread", 0); err == nil {
		t.Error("a 16-byte struct member read as a scalar")
	}
}
