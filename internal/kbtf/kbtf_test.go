package kbtf

import (
	"testing"

	"github.com/cilium/ebpf/btf"
)

func TestMemberThroughAnonymous(t *testing.T) {
	i32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	inner := &btf.Union{Size: 8, Members: []btf.Member{{Name: "a", Type: i32}, {Name: "b", Type: i32, Offset: 32}}}
	anon := &btf.Struct{Size: 16, Members: []btf.Member{{Name: "x", Type: i32}, {Name: "", Type: inner, Offset: 64}}}
	outer := &btf.Struct{Name: "s", Size: 40, Members: []btf.Member{
		{Name: "first", Type: i32},
		{Name: "", Type: anon, Offset: 128},
		{Name: "b", Type: i32, Offset: 256}, // a named member wins over a nested one
	}}
	for _, c := range []struct {
		name string
		bits btf.Bits
		ok   bool
	}{
		{"first", 0, true}, {"x", 128, true}, {"a", 192, true}, {"b", 256, true}, {"nope", 0, false},
	} {
		m, ok := Member(&btf.Typedef{Name: "s_t", Type: outer}, c.name)
		if ok != c.ok || (ok && m.Offset != c.bits) {
			t.Errorf("%s: offset %d ok %v, want %d %v", c.name, m.Offset, ok, c.bits, c.ok)
		}
	}
}
