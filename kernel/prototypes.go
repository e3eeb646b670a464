package kernel

import (
	"errors"

	"github.com/cilium/ebpf/btf"
)

// Prototype is what the kernel ABI lets a call read and return, from a
// function's BTF prototype: how many integer argument registers it reads
// and how many it returns a value in.
type Prototype struct {
	ArgRegs int // argument registers read (RDI, RSI, RDX, RCX, R8, R9 in order)
	RetRegs int // 0 void, 1 RAX, 2 RAX:RDX
}

// Prototypes maps function names to prototypes. Functions without BTF
// (assembly, most of entry code) are absent and treated conservatively.
type Prototypes map[string]Prototype

// MaxArgRegs is how many integer registers the x86-64 calling convention
// passes arguments in; a count this high means "maybe all of them".
const MaxArgRegs = 6

// PrototypesFromBTF collects every function prototype of a BTF spec.
// A name that appears with several prototypes (static functions) keeps
// the most demanding one.
func PrototypesFromBTF(spec *btf.Spec) (Prototypes, error) {
	p := Prototypes{}
	for t, err := range spec.All() {
		if err != nil {
			return nil, err
		}
		fn, ok := t.(*btf.Func)
		if !ok {
			continue
		}
		fp, ok := fn.Type.(*btf.FuncProto)
		if !ok {
			continue
		}
		pr := Prototype{ArgRegs: argRegCount(fp), RetRegs: regsFor(fp.Return)}
		if old, ok := p[fn.Name]; ok {
			pr.ArgRegs = max(pr.ArgRegs, old.ArgRegs)
			pr.RetRegs = max(pr.RetRegs, old.RetRegs)
		}
		p[fn.Name] = pr
	}
	if len(p) == 0 {
		return nil, errors.New("BTF has no function prototypes")
	}
	return p, nil
}

// argRegCount counts the integer registers a call passes. Anything it
// cannot place for certain (floats, large aggregates, varargs) counts as
// all six.
func argRegCount(fp *btf.FuncProto) int {
	n := 0
	for i, p := range fp.Params {
		if _, void := p.Type.(*btf.Void); void || p.Type == nil {
			if i == len(fp.Params)-1 {
				return MaxArgRegs // "...": varargs
			}
		}
		r := regsFor(p.Type)
		if r < 0 {
			return MaxArgRegs
		}
		n += r
	}
	return min(n, MaxArgRegs)
}

// regsFor is how many integer registers a value of type t occupies: 0 for
// void, 1 or 2 for scalars and small aggregates, -1 when unsure.
func regsFor(t btf.Type) int {
	t = btf.UnderlyingType(t)
	switch t.(type) {
	case *btf.Void:
		return 0
	case *btf.Float:
		return -1
	case *btf.Struct, *btf.Union:
		sz, err := btf.Sizeof(t)
		if err != nil || sz > 8 {
			return -1 // may be split or passed in memory: stay conservative
		}
		return 1
	}
	sz, err := btf.Sizeof(t)
	switch {
	case err != nil:
		return -1
	case sz <= 8:
		return 1
	case sz <= 16:
		return 2
	}
	return -1
}
