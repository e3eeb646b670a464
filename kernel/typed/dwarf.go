package typed

import (
	"debug/dwarf"
	"fmt"

	"github.com/cilium/ebpf/btf"
)

// FromDWARF is the BTF type that a variable's DWARF type names: structs,
// unions, enums, typedefs and base types by name, pointers and arrays
// built around them, qualifiers dropped. (BTF and DWARF come from the
// same build: pahole made one from the other.)
func (e *Env) FromDWARF(t dwarf.Type) (btf.Type, error) {
	switch t := t.(type) {
	case *dwarf.QualType:
		return e.FromDWARF(t.Type)
	case *dwarf.PtrType:
		if _, void := t.Type.(*dwarf.VoidType); void || t.Type == nil {
			return &btf.Pointer{Target: &btf.Void{}}, nil
		}
		inner, err := e.FromDWARF(t.Type)
		if err != nil {
			return nil, err
		}
		return &btf.Pointer{Target: inner}, nil
	case *dwarf.ArrayType:
		inner, err := e.FromDWARF(t.Type)
		if err != nil {
			return nil, err
		}
		n := t.Count
		if n < 0 {
			n = 0 // a flexible array
		}
		return &btf.Array{Type: inner, Index: &btf.Int{Name: "unsigned int", Size: 4}, Nelems: uint32(n)}, nil
	case *dwarf.StructType:
		kind := "struct"
		if t.Kind == "union" {
			kind = "union"
		}
		if t.StructName == "" {
			return nil, fmt.Errorf("%w: an anonymous %s", ErrNoType, kind)
		}
		return e.namedType(kind, t.StructName)
	case *dwarf.EnumType:
		return e.namedType("enum", t.EnumName)
	case *dwarf.TypedefType:
		return e.namedType("", t.Name)
	case *dwarf.FuncType:
		return &btf.FuncProto{Return: &btf.Void{}}, nil
	case *dwarf.VoidType:
		return &btf.Void{}, nil
	}
	if n := t.Common().Name; n != "" {
		return e.namedType("", n)
	}
	return nil, fmt.Errorf("%w: DWARF type %s", ErrNoType, t)
}
