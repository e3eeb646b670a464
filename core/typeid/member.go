package typeid

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf/btf"
)

// maxDepth bounds the descent through nested types.
const maxDepth = 32

// MemberPath names the member of t at byte offset off, as C would write
// it: "task_struct.signal", "dentry.d_name.name+0x3",
// "task_struct.comm[3]". Anonymous structs and unions add nothing to the
// path; in a union the first member that holds the offset is taken. An
// offset between members is "+0xN (padding)" after the path of the
// struct, one past the type's size "+0xN (past the end)".
func MemberPath(t btf.Type, off uint64) string {
	name := typeName(t)
	var b strings.Builder
	b.WriteString(name)
	rest, note := descend(&b, t, off, 0)
	if rest != 0 {
		fmt.Fprintf(&b, "+%#x", rest)
	}
	if note != "" {
		b.WriteString(" (" + note + ")")
	}
	return b.String()
}

// descend appends the path of off within t and returns what is left of
// the offset inside the innermost member, and a note for padding.
func descend(b *strings.Builder, t btf.Type, off uint64, depth int) (uint64, string) {
	if depth > maxDepth {
		return off, ""
	}
	t = btf.UnderlyingType(t)
	switch c := t.(type) {
	case *btf.Struct, *btf.Union:
		var members []btf.Member
		if s, ok := c.(*btf.Struct); ok {
			members = s.Members
		} else {
			members = c.(*btf.Union).Members
		}
		for _, m := range members {
			start := uint64(m.Offset.Bytes())
			var msize uint64
			if m.BitfieldSize != 0 {
				first := uint64(m.Offset) / 8
				last := (uint64(m.Offset) + uint64(m.BitfieldSize) - 1) / 8
				if off < first || off > last {
					continue
				}
				b.WriteString("." + m.Name)
				return off - first, ""
			}
			n, err := btf.Sizeof(m.Type)
			if err != nil {
				continue
			}
			msize = uint64(n)
			if off < start || off >= start+msize {
				// A flexible array member has size 0: it holds whatever
				// follows the struct.
				if a, ok := btf.UnderlyingType(m.Type).(*btf.Array); !(ok && a.Nelems == 0 && off >= start) {
					continue
				}
			}
			if m.Name != "" {
				b.WriteString("." + m.Name)
			}
			return descend(b, m.Type, off-start, depth+1)
		}
		if size, err := btf.Sizeof(t); err == nil && off >= uint64(size) {
			return off, "past the end"
		}
		return off, "padding"
	case *btf.Array:
		es, err := btf.Sizeof(c.Type)
		if err != nil || es == 0 {
			return off, ""
		}
		i := off / uint64(es)
		fmt.Fprintf(b, "[%d]", i)
		return descend(b, c.Type, off-i*uint64(es), depth+1)
	}
	return off, ""
}

// typeName is how a type is written: a struct's or union's tag, a
// typedef's or base type's name, "T *" for a pointer, "T[N]" for an
// array; qualifiers dropped.
func typeName(t btf.Type) string {
	for depth := 0; depth < maxDepth; depth++ {
		switch c := t.(type) {
		case *btf.Pointer:
			return typeName(c.Target) + " *"
		case *btf.Array:
			return fmt.Sprintf("%s[%d]", typeName(c.Type), c.Nelems)
		case *btf.Const:
			t = c.Type
			continue
		case *btf.Volatile:
			t = c.Type
			continue
		case *btf.Restrict:
			t = c.Type
			continue
		case *btf.Void:
			return "void"
		case *btf.FuncProto:
			return "func"
		}
		return t.TypeName()
	}
	return "?"
}
