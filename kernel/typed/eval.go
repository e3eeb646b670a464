package typed

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/kbtf"
)

// Reader reads kernel memory (a dump's, or the running kernel's).
type Reader interface {
	Read(addr uint64, b []byte) error
}

// Env is what an expression is evaluated against: a kernel's memory,
// its BTF and symbols.
type Env struct {
	Mem  Reader
	Spec *btf.Spec
	// Symbol is the address of a kernel symbol (a per-CPU variable's is
	// its offset in each CPU's area).
	Symbol func(name string) (uint64, bool)
	// SymbolAt names an address as SYM+0xOFF, for pointers; nil: none.
	SymbolAt func(addr uint64) (string, bool)
	// Describe says what a pointer that names no symbol points to (a
	// heap object, a task's stack: whattype's answer); nil: nothing.
	Describe func(addr uint64) (string, bool)
	// VarType is the declared type of a global variable that BTF does not
	// describe (BTF gives the types of per-CPU variables only): from a
	// debug vmlinux's DWARF. Nil: such variables need a cast.
	VarType func(name string) (btf.Type, error)
	// PerCPU is a per-CPU variable's address on cpu.
	PerCPU func(offset uint64, cpu int) (uint64, error)

	percpuOnce sync.Once
	percpu     map[string]*btf.Var // the per-CPU variables BTF types
}

// Errors matched with errors.Is.
var (
	// ErrNoType: a name or type BTF (and DWARF) do not know.
	ErrNoType = errors.New("no such type")
	// ErrNoSymbol: a name that is neither a symbol nor a variable.
	ErrNoSymbol = errors.New("no such symbol")
	// ErrBadOperand: an operator applied to a value it does not take.
	ErrBadOperand = errors.New("bad operand")
)

// Value is the result of an expression: an object in memory at Addr
// (an lvalue), or a scalar computed by the expression (Imm).
type Value struct {
	Type     btf.Type
	Addr     uint64
	InMem    bool   // Addr holds the value; else Imm does
	Imm      uint64 // a scalar's bits
	Bitfield *bitfield
	// PerCPU: the value is a per-CPU variable, CPU 0's copy unless
	// per_cpu() picked another; Offset is its offset in each CPU's area.
	PerCPU bool
	Offset uint64
}

// bitfield is where a bitfield member's bits are within its unit.
type bitfield struct {
	offset, size uint32 // in bits, from Addr
}

var (
	longType  = &btf.Int{Name: "long", Size: 8, Encoding: btf.Signed}
	ulongType = &btf.Int{Name: "unsigned long", Size: 8}
)

// Eval evaluates expr.
func (e *Env) Eval(expr string) (Value, error) {
	n, err := parse(expr)
	if err != nil {
		return Value{}, err
	}
	return e.eval(n)
}

func (e *Env) eval(n node) (Value, error) {
	switch n := n.(type) {
	case number:
		return Value{Type: longType, Imm: n.v}, nil
	case ident:
		return e.variable(n.name)
	case member:
		x, err := e.eval(n.x)
		if err != nil {
			return Value{}, err
		}
		if n.arrow {
			if x, err = e.deref(x, n.x); err != nil {
				return Value{}, err
			}
		}
		return e.member(x, n.name, n.x)
	case index:
		x, err := e.eval(n.x)
		if err != nil {
			return Value{}, err
		}
		i, err := e.eval(n.i)
		if err != nil {
			return Value{}, err
		}
		iv, err := e.scalar(i)
		if err != nil {
			return Value{}, err
		}
		return e.index(x, int64(iv), n)
	case unary:
		x, err := e.eval(n.x)
		var ut *UntypedError
		if n.op == '&' && errors.As(err, &ut) {
			// &SYMBOL of a variable without a type: its address, a
			// void * to cast.
			return Value{Type: &btf.Pointer{Target: &btf.Void{}}, Imm: ut.Addr}, nil
		}
		if err != nil {
			return Value{}, err
		}
		switch n.op {
		case '*':
			return e.deref(x, n.x)
		case '&':
			if !x.InMem || x.Bitfield != nil {
				return Value{}, fmt.Errorf("%w: &%s: not an object in memory", ErrBadOperand, n.x)
			}
			return Value{Type: &btf.Pointer{Target: x.Type}, Imm: x.Addr}, nil
		default: // '-'
			v, err := e.scalar(x)
			if err != nil {
				return Value{}, err
			}
			return Value{Type: longType, Imm: -v}, nil
		}
	case binop:
		return e.arith(n)
	case cast:
		x, err := e.eval(n.x)
		if err != nil {
			return Value{}, err
		}
		t, err := e.lookupType(n.t)
		if err != nil {
			return Value{}, err
		}
		return e.cast(x, t, n)
	case sizeof:
		var t btf.Type
		if n.t != nil {
			var err error
			if t, err = e.lookupType(*n.t); err != nil {
				return Value{}, err
			}
		} else {
			x, err := e.eval(n.x)
			if err != nil {
				return Value{}, err
			}
			t = x.Type
		}
		size, err := btf.Sizeof(t)
		if err != nil {
			return Value{}, fmt.Errorf("sizeof %s: %w", n, err)
		}
		return Value{Type: ulongType, Imm: uint64(size)}, nil
	case containerOf:
		x, err := e.eval(n.x)
		if err != nil {
			return Value{}, err
		}
		p, err := e.scalar(x)
		if err != nil {
			return Value{}, err
		}
		t, err := e.lookupType(n.t)
		if err != nil {
			return Value{}, err
		}
		off, err := OffsetOf(t, n.member)
		if err != nil {
			return Value{}, err
		}
		return Value{Type: &btf.Pointer{Target: t}, Imm: p - off}, nil
	case perCPU:
		x, err := e.eval(n.x)
		if err != nil {
			return Value{}, err
		}
		c, err := e.eval(n.cpu)
		if err != nil {
			return Value{}, err
		}
		cpu, err := e.scalar(c)
		if err != nil {
			return Value{}, err
		}
		if !x.PerCPU {
			return Value{}, fmt.Errorf("%w: per_cpu(%s, …): not a per-CPU variable", ErrBadOperand, n.x)
		}
		a, err := e.PerCPU(x.Offset, int(cpu))
		if err != nil {
			return Value{}, err
		}
		x.Addr = a
		return x, nil
	}
	return Value{}, fmt.Errorf("cannot evaluate %s", n)
}

// variable is a global or per-CPU variable, or a symbol without a type
// (an error that says how to give it one).
func (e *Env) variable(name string) (Value, error) {
	addr, ok := e.Symbol(name)
	if !ok {
		return Value{}, fmt.Errorf("%w: %s", ErrNoSymbol, name)
	}
	if v, ok := e.perCPUVars()[name]; ok {
		// Its symbol is an offset into each CPU's area: per_cpu() picks
		// the copy; alone it is CPU 0's.
		if e.PerCPU == nil {
			return Value{}, fmt.Errorf("%w: %s is a per-CPU variable and this kernel view has no per-CPU areas", ErrBadOperand, name)
		}
		a, err := e.PerCPU(addr, 0)
		if err != nil {
			return Value{}, fmt.Errorf("%s on CPU 0: %w", name, err)
		}
		return Value{Type: v.Type, Addr: a, InMem: true, PerCPU: true, Offset: addr}, nil
	}
	var v *btf.Var
	if e.Spec != nil && e.Spec.TypeByName(name, &v) == nil {
		return Value{Type: v.Type, Addr: addr, InMem: true}, nil
	}
	if e.VarType != nil {
		t, err := e.VarType(name)
		if err == nil {
			return Value{Type: t, Addr: addr, InMem: true}, nil
		}
		if !errors.Is(err, ErrNoType) {
			return Value{}, err
		}
	}
	return Value{}, &UntypedError{Name: name, Addr: addr}
}

// UntypedError is a symbol whose type kinst does not know.
type UntypedError struct {
	Name string
	Addr uint64
}

func (e *UntypedError) Error() string {
	return fmt.Sprintf("%s (%#x) has no type: the kernel's BTF describes per-CPU variables only; name its type with a cast, (struct T *)&%s, or give --vmlinux a debug vmlinux (its DWARF has every variable's)",
		e.Name, e.Addr, e.Name)
}

func (e *UntypedError) Is(t error) bool { return t == ErrNoType }

// perCPUVars are the variables of BTF's .data..percpu section by name.
func (e *Env) perCPUVars() map[string]*btf.Var {
	e.percpuOnce.Do(func() {
		e.percpu = map[string]*btf.Var{}
		if e.Spec == nil {
			return
		}
		var ds *btf.Datasec
		if e.Spec.TypeByName(".data..percpu", &ds) != nil {
			return
		}
		for _, vs := range ds.Vars {
			if v, ok := vs.Type.(*btf.Var); ok {
				e.percpu[v.Name] = v
			}
		}
	})
	return e.percpu
}

// IsPerCPU says whether name is a per-CPU variable.
func (e *Env) IsPerCPU(name string) bool {
	_, ok := e.perCPUVars()[name]
	return ok
}

// member is x.name.
func (e *Env) member(x Value, name string, of node) (Value, error) {
	u := btf.UnderlyingType(x.Type)
	switch u.(type) {
	case *btf.Struct, *btf.Union:
	default:
		return Value{}, fmt.Errorf("%w: %s is a %s, not a struct or union (member %s)", ErrBadOperand, of, TypeString(x.Type), name)
	}
	m, ok := kbtf.Member(u, name)
	if !ok {
		return Value{}, &NoMemberError{Type: TypeString(x.Type), Member: name}
	}
	if !x.InMem {
		return Value{}, fmt.Errorf("%w: %s is not in memory", ErrBadOperand, of)
	}
	v := Value{Type: m.Type, Addr: x.Addr + uint64(m.Offset/8), InMem: true}
	if m.BitfieldSize != 0 {
		v.Addr = x.Addr
		v.Bitfield = &bitfield{offset: uint32(m.Offset), size: uint32(m.BitfieldSize)}
	} else if m.Offset%8 != 0 {
		v.Addr = x.Addr
		v.Bitfield = &bitfield{offset: uint32(m.Offset), size: 0}
	}
	return v, nil
}

// NoMemberError names a member a struct does not have.
type NoMemberError struct{ Type, Member string }

func (e *NoMemberError) Error() string { return fmt.Sprintf("%s has no member %s", e.Type, e.Member) }

func (e *NoMemberError) Is(t error) bool { return t == ErrNoType }

// deref is *x.
func (e *Env) deref(x Value, of node) (Value, error) {
	p, ok := btf.UnderlyingType(x.Type).(*btf.Pointer)
	if !ok {
		if a, isArr := btf.UnderlyingType(x.Type).(*btf.Array); isArr && x.InMem {
			return Value{Type: a.Type, Addr: x.Addr, InMem: true}, nil
		}
		return Value{}, fmt.Errorf("%w: %s is a %s, not a pointer", ErrBadOperand, of, TypeString(x.Type))
	}
	if _, void := btf.UnderlyingType(p.Target).(*btf.Void); void {
		return Value{}, fmt.Errorf("%w: %s is a void pointer: cast it, (struct T *)%s", ErrBadOperand, of, of)
	}
	a, err := e.scalar(x)
	if err != nil {
		return Value{}, err
	}
	if a == 0 {
		return Value{}, fmt.Errorf("%w: %s is NULL", ErrBadOperand, of)
	}
	return Value{Type: p.Target, Addr: a, InMem: true}, nil
}

// index is x[i]: an array's element or a pointer's.
func (e *Env) index(x Value, i int64, n index) (Value, error) {
	switch t := btf.UnderlyingType(x.Type).(type) {
	case *btf.Array:
		if !x.InMem {
			return Value{}, fmt.Errorf("%w: %s is not in memory", ErrBadOperand, n.x)
		}
		if i < 0 || uint64(i) >= uint64(t.Nelems) && t.Nelems > 0 {
			return Value{}, fmt.Errorf("%w: %s: index %d past its %d elements", ErrBadOperand, n, i, t.Nelems)
		}
		size, err := btf.Sizeof(t.Type)
		if err != nil {
			return Value{}, err
		}
		return Value{Type: t.Type, Addr: x.Addr + uint64(i)*uint64(size), InMem: true}, nil
	case *btf.Pointer:
		size, err := btf.Sizeof(t.Target)
		if err != nil {
			return Value{}, fmt.Errorf("%w: %s: %v", ErrBadOperand, n, err)
		}
		a, err := e.scalar(x)
		if err != nil {
			return Value{}, err
		}
		return Value{Type: t.Target, Addr: a + uint64(i*int64(size)), InMem: true}, nil
	}
	return Value{}, fmt.Errorf("%w: %s is a %s, not an array or pointer", ErrBadOperand, n.x, TypeString(x.Type))
}

// arith is x + y or x - y, scaled as C scales pointer arithmetic.
func (e *Env) arith(n binop) (Value, error) {
	x, err := e.eval(n.x)
	if err != nil {
		return Value{}, err
	}
	y, err := e.eval(n.y)
	if err != nil {
		return Value{}, err
	}
	a, err := e.scalar(x)
	if err != nil {
		return Value{}, err
	}
	b, err := e.scalar(y)
	if err != nil {
		return Value{}, err
	}
	if p, ok := btf.UnderlyingType(x.Type).(*btf.Pointer); ok {
		if _, py := btf.UnderlyingType(y.Type).(*btf.Pointer); py && n.op == '-' {
			size, err := btf.Sizeof(p.Target)
			if err != nil || size == 0 {
				size = 1
			}
			return Value{Type: longType, Imm: uint64(int64(a-b) / int64(size))}, nil
		}
		size, err := btf.Sizeof(p.Target)
		if err != nil || size == 0 {
			size = 1 // void *: GNU C counts bytes
		}
		b *= uint64(size)
		if n.op == '-' {
			b = -b
		}
		return Value{Type: x.Type, Imm: a + b}, nil
	}
	if n.op == '-' {
		b = -b
	}
	return Value{Type: longType, Imm: a + b}, nil
}

// cast is (t)x. A struct or union type takes x as the address of one,
// as crash's casts do; any other type converts x's value.
func (e *Env) cast(x Value, t btf.Type, n cast) (Value, error) {
	switch btf.UnderlyingType(t).(type) {
	case *btf.Struct, *btf.Union, *btf.Array:
		if u := btf.UnderlyingType(x.Type); x.InMem && sameType(u, btf.UnderlyingType(t)) {
			return Value{Type: t, Addr: x.Addr, InMem: true}, nil
		}
		a, err := e.scalar(x)
		if err != nil {
			return Value{}, err
		}
		return Value{Type: t, Addr: a, InMem: true}, nil
	}
	v, err := e.scalar(x)
	if err != nil {
		return Value{}, err
	}
	if i, ok := btf.UnderlyingType(t).(*btf.Int); ok && i.Size < 8 {
		v &= 1<<(8*i.Size) - 1
		if i.Encoding&btf.Signed != 0 && v>>(8*i.Size-1)&1 == 1 {
			v |= ^uint64(0) << (8 * i.Size)
		}
	}
	return Value{Type: t, Imm: v}, nil
}

func sameType(a, b btf.Type) bool {
	return a == b || TypeString(a) == TypeString(b)
}

// Address is where v is: an object's address in memory, or the value of
// a number or pointer (an address it holds).
func (e *Env) Address(v Value) (uint64, error) {
	if v.InMem && v.Bitfield == nil {
		switch btf.UnderlyingType(v.Type).(type) {
		case *btf.Struct, *btf.Union, *btf.Array:
			return v.Addr, nil
		}
	}
	return e.scalar(v)
}

// scalar is x's value as 64 bits: an integer, enum, pointer or bool; an
// array decays to its address.
func (e *Env) scalar(x Value) (uint64, error) {
	if !x.InMem {
		return x.Imm, nil
	}
	u := btf.UnderlyingType(x.Type)
	if _, ok := u.(*btf.Array); ok {
		return x.Addr, nil
	}
	var size uint32
	signed := false
	switch t := u.(type) {
	case *btf.Int:
		size, signed = t.Size, t.Encoding&btf.Signed != 0
	case *btf.Enum:
		size, signed = t.Size, t.Signed
	case *btf.Pointer:
		size = 8
	default:
		return 0, fmt.Errorf("%w: a %s is not a number or pointer", ErrBadOperand, TypeString(x.Type))
	}
	if x.Bitfield != nil {
		return e.readBits(x, signed)
	}
	b := make([]byte, 8)
	if err := e.Mem.Read(x.Addr, b[:size]); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint64(b)
	if signed && size < 8 && v>>(8*size-1)&1 == 1 {
		v |= ^uint64(0) << (8 * size)
	}
	return v, nil
}

// readBits reads a bitfield's value.
func (e *Env) readBits(x Value, signed bool) (uint64, error) {
	bf := x.Bitfield
	size := bf.size
	if size == 0 {
		s, err := btf.Sizeof(x.Type)
		if err != nil {
			return 0, err
		}
		size = uint32(s) * 8
	}
	first := bf.offset / 8
	last := (bf.offset + size - 1) / 8
	b := make([]byte, 16)
	if err := e.Mem.Read(x.Addr+uint64(first), b[:last-first+1]); err != nil {
		return 0, err
	}
	lo := binary.LittleEndian.Uint64(b)
	hi := binary.LittleEndian.Uint64(b[8:])
	shift := bf.offset % 8
	v := lo >> shift
	if shift > 0 {
		v |= hi << (64 - shift)
	}
	if size < 64 {
		v &= 1<<size - 1
		if signed && v>>(size-1)&1 == 1 {
			v |= ^uint64(0) << size
		}
	}
	return v, nil
}

// lookupType finds a type name in BTF.
func (e *Env) lookupType(tn typeName) (btf.Type, error) {
	t, err := e.namedType(tn.kind, tn.name)
	if err != nil {
		return nil, err
	}
	for range tn.stars {
		t = &btf.Pointer{Target: t}
	}
	return t, nil
}

// cNames are base types as C spells them, by the name GCC gives them in
// DWARF and BTF.
var cNames = map[string]string{
	"unsigned long": "long unsigned int", "unsigned long int": "long unsigned int",
	"long": "long int", "signed long": "long int",
	"unsigned": "unsigned int", "signed": "int", "signed int": "int",
	"unsigned short": "short unsigned int", "short": "short int", "unsigned char": "unsigned char",
	"long long": "long long int", "unsigned long long": "long long unsigned int",
	"bool": "_Bool",
}

func (e *Env) namedType(kind, name string) (btf.Type, error) {
	if e.Spec == nil {
		return nil, fmt.Errorf("%w: %s %s: no BTF", ErrNoType, kind, name)
	}
	if kind == "" && name == "void" {
		return &btf.Void{}, nil
	}
	var err error
	switch kind {
	case "struct":
		var s *btf.Struct
		if err = e.Spec.TypeByName(name, &s); err == nil {
			return s, nil
		}
	case "union":
		var u *btf.Union
		if err = e.Spec.TypeByName(name, &u); err == nil {
			return u, nil
		}
	case "enum":
		var en *btf.Enum
		if err = e.Spec.TypeByName(name, &en); err == nil {
			return en, nil
		}
	default:
		if c, ok := cNames[name]; ok {
			name = c
		}
		var td *btf.Typedef
		if err = e.Spec.TypeByName(name, &td); err == nil {
			return td, nil
		}
		var i *btf.Int
		if err = e.Spec.TypeByName(name, &i); err == nil {
			return i, nil
		}
	}
	what := strings.TrimSpace(kind + " " + name)
	if errors.Is(err, btf.ErrMultipleMatches) {
		return nil, fmt.Errorf("%s: BTF has several types of that name", what)
	}
	return nil, fmt.Errorf("%w: %s", ErrNoType, what)
}

// OffsetOf is the byte offset of the member path (a.b.c) in t.
func OffsetOf(t btf.Type, path string) (uint64, error) {
	off, _, err := memberAt(t, path)
	return off, err
}

// memberAt is the byte offset and type of the member path in t, through
// anonymous members.
func memberAt(t btf.Type, path string) (uint64, btf.Type, error) {
	var off uint64
	for _, name := range strings.Split(path, ".") {
		m, ok := kbtf.Member(t, name)
		if !ok {
			return 0, nil, &NoMemberError{Type: TypeString(t), Member: name}
		}
		off += uint64(m.Offset / 8)
		t = m.Type
	}
	return off, t, nil
}

// TypeString is t as C writes it: "struct task_struct", "char [16]",
// "struct list_head *", "u64".
func TypeString(t btf.Type) string {
	switch t := t.(type) {
	case nil:
		return "void"
	case *btf.Void:
		return "void"
	case *btf.Struct:
		return "struct " + t.Name
	case *btf.Union:
		return "union " + t.Name
	case *btf.Enum:
		return "enum " + t.Name
	case *btf.Fwd:
		return t.Kind.String() + " " + t.Name
	case *btf.Pointer:
		if fp, ok := btf.UnderlyingType(t.Target).(*btf.FuncProto); ok {
			_ = fp
			return "func *"
		}
		s := TypeString(t.Target)
		if strings.HasSuffix(s, "*") {
			return s + "*"
		}
		return s + " *"
	case *btf.Array:
		return fmt.Sprintf("%s [%d]", TypeString(t.Type), t.Nelems)
	case *btf.Const:
		return "const " + TypeString(t.Type)
	case *btf.Volatile:
		return "volatile " + TypeString(t.Type)
	case *btf.Restrict:
		return TypeString(t.Type)
	case *btf.TypeTag:
		return TypeString(t.Type)
	case *btf.FuncProto:
		return "func"
	}
	if n := t.TypeName(); n != "" {
		return n
	}
	return fmt.Sprintf("%T", t)
}

// Object is the object of type t at addr: what Member, Deref and the
// readers below take, for Go code that walks kernel structures.
func Object(t btf.Type, addr uint64) Value { return Value{Type: t, Addr: addr, InMem: true} }

// Member is v's member at path (a.b.c), through anonymous members.
func (e *Env) Member(v Value, path string) (Value, error) {
	for _, name := range strings.Split(path, ".") {
		var err error
		if v, err = e.member(v, name, ident{name: TypeString(v.Type)}); err != nil {
			return Value{}, err
		}
	}
	return v, nil
}

// Deref is *v for a pointer v (an error for NULL).
func (e *Env) Deref(v Value) (Value, error) {
	return e.deref(v, ident{name: TypeString(v.Type)})
}

// Uint is v's value as a number: an integer, enum, bool or pointer.
func (e *Env) Uint(v Value) (uint64, error) { return e.scalar(v) }

// String is the NUL-terminated string v points to or holds (a char
// array, or a char pointer), at most max bytes.
func (e *Env) String(v Value, max int) (string, error) {
	a, err := e.Address(v)
	if err != nil {
		return "", err
	}
	if arr, ok := btf.UnderlyingType(v.Type).(*btf.Array); ok && int(arr.Nelems) < max {
		max = int(arr.Nelems)
	}
	var out []byte
	buf := make([]byte, 64)
	for len(out) < max {
		// Up to the page's end at most: a short string may end just
		// before an unmapped page.
		at := a + uint64(len(out))
		n := min(len(buf), max-len(out), int(4096-at%4096))
		if err := e.Mem.Read(at, buf[:n]); err != nil {
			return string(out), err
		}
		if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
			return string(append(out, buf[:i]...)), nil
		}
		out = append(out, buf[:n]...)
	}
	return string(out), nil
}
