// Package btflayout resolves struct member paths against BTF into byte
// offsets and sizes (bitfields included), and reads and writes the
// members so described: the postmortem readers take every offset from
// the kernel's own BTF this way, never from constants.
package btflayout

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/kbtf"
)

// Field is where a struct member lives: its byte offset and size, and
// for a bitfield the bit position and width within the bytes at Off.
type Field struct {
	Off, Size   uint32
	Shift, Bits uint8 // Bits == 0: not a bitfield
	OK          bool  // the member exists in this kernel's BTF
}

// End is the first byte after the field.
func (f Field) End() uint32 { return f.Off + f.Size }

// U64 reads the field from a buffer holding the struct (little endian);
// 0 if the field is absent or the buffer too short.
func (f Field) U64(b []byte) uint64 {
	if !f.OK || int(f.End()) > len(b) {
		return 0
	}
	var v uint64
	switch f.Size {
	case 1:
		v = uint64(b[f.Off])
	case 2:
		v = uint64(binary.LittleEndian.Uint16(b[f.Off:]))
	case 4:
		v = uint64(binary.LittleEndian.Uint32(b[f.Off:]))
	default:
		v = binary.LittleEndian.Uint64(b[f.Off:])
	}
	if f.Bits != 0 {
		v = (v >> f.Shift) & (1<<f.Bits - 1)
	}
	return v
}

// I64 reads a signed field, sign-extended from its size or width.
func (f Field) I64(b []byte) int64 {
	v := f.U64(b)
	w := 8 * uint(f.Size)
	if f.Bits != 0 {
		w = uint(f.Bits)
	}
	if w >= 64 {
		return int64(v)
	}
	return int64(v<<(64-w)) >> (64 - w)
}

// Put writes v into the field of a buffer holding the struct.
func (f Field) Put(b []byte, v uint64) {
	if !f.OK || int(f.End()) > len(b) {
		return
	}
	var old uint64
	for i := uint32(0); i < f.Size; i++ {
		old |= uint64(b[f.Off+i]) << (8 * i)
	}
	if f.Bits != 0 {
		mask := uint64(1<<f.Bits-1) << f.Shift
		v = old&^mask | (v<<f.Shift)&mask
	}
	for i := uint32(0); i < f.Size; i++ {
		b[f.Off+i] = byte(v >> (8 * i))
	}
}

// Builder resolves member paths, collecting the missing required ones
// into one error.
type Builder struct {
	Spec   *btf.Spec
	errs   []error
	tcache map[string]btf.Type
}

// New returns a Builder over spec.
func New(spec *btf.Spec) *Builder { return &Builder{Spec: spec} }

// Type finds a struct or union by name.
func (b *Builder) Type(name string) (btf.Type, error) {
	if t, ok := b.tcache[name]; ok {
		if t == nil {
			return nil, fmt.Errorf("struct %s: not in BTF", name)
		}
		return t, nil
	}
	var t btf.Type
	var s *btf.Struct
	if err := b.Spec.TypeByName(name, &s); err == nil {
		t = s
	} else {
		var u *btf.Union
		if err2 := b.Spec.TypeByName(name, &u); err2 == nil {
			t = u
		}
	}
	if b.tcache == nil {
		b.tcache = map[string]btf.Type{}
	}
	b.tcache[name] = t
	if t == nil {
		return nil, fmt.Errorf("struct %s: not in BTF", name)
	}
	return t, nil
}

// Has says whether the struct or union exists.
func (b *Builder) Has(name string) bool {
	_, err := b.Type(name)
	return err == nil
}

// Sizeof is a struct's size, recorded as an error if it is missing.
func (b *Builder) Sizeof(name string) uint32 {
	t, err := b.Type(name)
	if err != nil {
		b.errs = append(b.errs, err)
		return 0
	}
	n, err := btf.Sizeof(t)
	if err != nil {
		b.errs = append(b.errs, fmt.Errorf("sizeof %s: %w", name, err))
		return 0
	}
	return uint32(n)
}

// Lookup resolves "a.b.c" in struct name through anonymous members.
func (b *Builder) Lookup(name, path string) (Field, btf.Type, error) {
	t, err := b.Type(name)
	if err != nil {
		return Field{}, nil, err
	}
	var bits btf.Bits
	var m btf.Member
	for _, part := range strings.Split(path, ".") {
		var ok bool
		m, ok = kbtf.Member(t, part)
		if !ok {
			return Field{}, nil, fmt.Errorf("struct %s has no member %s", name, path)
		}
		bits += m.Offset
		t = m.Type
	}
	f := Field{OK: true}
	if m.BitfieldSize != 0 {
		f.Off, f.Shift, f.Bits = uint32(bits)/8, uint8(uint32(bits)%8), uint8(m.BitfieldSize)
		switch n := (uint32(f.Shift) + uint32(f.Bits) + 7) / 8; {
		case n <= 1:
			f.Size = 1
		case n <= 2:
			f.Size = 2
		case n <= 4:
			f.Size = 4
		default:
			f.Size = 8
		}
		return f, t, nil
	}
	if bits%8 != 0 {
		return Field{}, nil, fmt.Errorf("struct %s member %s is not byte aligned", name, path)
	}
	n, err := btf.Sizeof(t)
	if err != nil {
		return Field{}, nil, fmt.Errorf("struct %s member %s: %w", name, path, err)
	}
	f.Off, f.Size = uint32(bits/8), uint32(n)
	return f, t, nil
}

// Need resolves the first of paths that exists, recording an error if
// none does.
func (b *Builder) Need(name string, paths ...string) Field {
	f := b.Opt(name, paths...)
	if !f.OK {
		b.errs = append(b.errs, fmt.Errorf("struct %s has none of the members %s", name, strings.Join(paths, ", ")))
	}
	return f
}

// Opt resolves the first of paths that exists; a Field with OK false if
// none does (a member that depends on the kernel's configuration).
func (b *Builder) Opt(name string, paths ...string) Field {
	for _, p := range paths {
		if f, _, err := b.Lookup(name, p); err == nil {
			return f
		}
	}
	return Field{}
}

// ArrayLen is the element count of an array member (0 if it is not one).
func (b *Builder) ArrayLen(name, path string) uint32 {
	_, t, err := b.Lookup(name, path)
	if err != nil {
		return 0
	}
	if a, ok := btf.UnderlyingType(t).(*btf.Array); ok {
		return a.Nelems
	}
	return 0
}

// Fail records an error of the caller's.
func (b *Builder) Fail(err error) { b.errs = append(b.errs, err) }

// Err joins every error recorded.
func (b *Builder) Err() error { return errors.Join(b.errs...) }

// EnumValue is the value of an enumerator of the enum called enumName.
func EnumValue(spec *btf.Spec, enumName, value string) (uint64, bool) {
	var e *btf.Enum
	if err := spec.TypeByName(enumName, &e); err != nil {
		return 0, false
	}
	for _, v := range e.Values {
		if v.Name == value {
			return v.Value, true
		}
	}
	return 0, false
}
