package kernel

import (
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/btftest"
)

func TestPrototypesFromBTF(t *testing.T) {
	i32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	u64 := &btf.Int{Name: "u64", Size: 8}
	ptr := &btf.Pointer{Target: i32}
	big := &btf.Struct{Name: "big", Size: 24, Members: []btf.Member{
		{Name: "a", Type: u64}, {Name: "b", Type: u64, Offset: 64}, {Name: "c", Type: u64, Offset: 128}}}
	fn := func(name string, ret btf.Type, params ...btf.Type) *btf.Func {
		fp := &btf.FuncProto{Return: ret}
		for _, p := range params {
			fp.Params = append(fp.Params, btf.FuncParam{Name: "p", Type: p})
		}
		return &btf.Func{Name: name, Type: fp, Linkage: btf.GlobalFunc}
	}
	types := []btf.Type{
		fn("two_args_void", &btf.Void{}, i32, ptr),
		fn("big_arg", u64, big),
		fn("printk_like", i32, ptr, &btf.Void{}),
		fn("no_args", ptr),
	}
	spec := specFromTypes(t, types)
	p, err := PrototypesFromBTF(spec)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]Prototype{
		"two_args_void": {ArgRegs: 2, RetRegs: 0},
		"big_arg":       {ArgRegs: 6, RetRegs: 1}, // aggregate > 8 bytes: conservative
		"printk_like":   {ArgRegs: 6, RetRegs: 1}, // varargs
		"no_args":       {ArgRegs: 0, RetRegs: 1},
	} {
		if got := p[name]; got != want {
			t.Errorf("%s: %+v, want %+v", name, got, want)
		}
	}
}

// specFromTypes marshals types to raw BTF and loads it back, so tests go
// through the same decoding as the kernel's own BTF.
func specFromTypes(t *testing.T, types []btf.Type) *btf.Spec {
	t.Helper()
	return btftest.Spec(t, types...)
}
