package typed

import (
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/kernel"
)

// MaxElements bounds the elements of one array that Tree expands; the
// rest are counted in Node.More.
const MaxElements = 256

// Node is a value as a tree: its JSON is `kinst core … p EXPR --json`.
// A struct or union has Members, an array Elements; a scalar has Value
// (a number, a string for a char array, a bool, an enumerator's name).
type Node struct {
	Name     string `json:"name,omitempty"`
	Type     string `json:"type"`
	Address  string `json:"address,omitempty"` // where it is in memory
	Value    any    `json:"value,omitempty"`
	Pointer  string `json:"pointer,omitempty"` // a pointer's value, hex
	Symbol   string `json:"symbol,omitempty"`  // what a pointer points to, SYM+0xOFF
	What     string `json:"what,omitempty"`    // else what it points to: whattype's answer
	Members  []Node `json:"members,omitempty"`
	Elements []Node `json:"elements,omitempty"`
	More     int    `json:"more,omitempty"`  // elements left out (MaxElements)
	Error    string `json:"error,omitempty"` // why its memory could not be read
}

// Tree reads v and everything it holds (not what its pointers point to).
func (e *Env) Tree(name string, v Value) Node {
	n := Node{Name: name, Type: TypeString(v.Type)}
	if v.InMem && v.Bitfield == nil {
		n.Address = fmt.Sprintf("%#x", v.Addr)
	}
	switch t := btf.UnderlyingType(v.Type).(type) {
	case *btf.Struct, *btf.Union:
		var members []btf.Member
		if s, ok := t.(*btf.Struct); ok {
			members = s.Members
		} else {
			members = t.(*btf.Union).Members
		}
		for _, m := range members {
			mv, err := e.memberOf(v, m)
			if err != nil {
				n.Members = append(n.Members, Node{Name: m.Name, Type: TypeString(m.Type), Error: err.Error()})
				continue
			}
			n.Members = append(n.Members, e.Tree(m.Name, mv))
		}
	case *btf.Array:
		if isChar(t.Type) {
			b := make([]byte, t.Nelems)
			if err := e.Mem.Read(v.Addr, b); err != nil {
				n.Error = err.Error()
				return n
			}
			n.Value = cString(b)
			return n
		}
		size, err := btf.Sizeof(t.Type)
		if err != nil {
			n.Error = err.Error()
			return n
		}
		for i := uint32(0); i < t.Nelems; i++ {
			if i == MaxElements {
				n.More = int(t.Nelems - i)
				break
			}
			n.Elements = append(n.Elements, e.Tree("", Value{Type: t.Type, Addr: v.Addr + uint64(i)*uint64(size), InMem: true}))
		}
	default:
		e.scalarNode(&n, v)
	}
	return n
}

// memberOf is v's member m (m as BTF lists it, anonymous ones included).
func (e *Env) memberOf(v Value, m btf.Member) (Value, error) {
	if !v.InMem {
		return Value{}, fmt.Errorf("%w: not in memory", ErrBadOperand)
	}
	mv := Value{Type: m.Type, Addr: v.Addr + uint64(m.Offset/8), InMem: true}
	if m.BitfieldSize != 0 || m.Offset%8 != 0 {
		mv.Addr, mv.Bitfield = v.Addr, &bitfield{offset: uint32(m.Offset), size: uint32(m.BitfieldSize)}
	}
	return mv, nil
}

// scalarNode fills in n for a scalar value.
func (e *Env) scalarNode(n *Node, v Value) {
	switch t := btf.UnderlyingType(v.Type).(type) {
	case *btf.Int, *btf.Enum, *btf.Pointer:
		x, err := e.scalar(v)
		if err != nil {
			n.Error = err.Error()
			return
		}
		switch t := t.(type) {
		case *btf.Int:
			switch {
			case t.Encoding&btf.Bool != 0:
				n.Value = x != 0
			case t.Encoding&btf.Signed != 0:
				n.Value = int64(x)
			default:
				n.Value = x
			}
		case *btf.Enum:
			n.Value = enumName(t, x)
		case *btf.Pointer:
			n.Pointer = fmt.Sprintf("%#x", x)
			if x != 0 && e.SymbolAt != nil {
				if s, ok := e.SymbolAt(x); ok {
					n.Symbol = s
				}
			}
			if x != 0 && n.Symbol == "" && e.Describe != nil {
				n.What, _ = e.Describe(x)
			}
		}
	case *btf.FuncProto, *btf.Func:
		n.Address = fmt.Sprintf("%#x", v.Addr)
	case *btf.Void, *btf.Fwd:
		n.Error = "an incomplete type: cast it"
	case *btf.Float:
		n.Error = "a floating-point value (the kernel holds none kinst prints)"
	default:
		n.Error = fmt.Sprintf("cannot print a %T", t)
	}
}

// enumName is x as its enumerator's name, else the number.
func enumName(t *btf.Enum, x uint64) any {
	for _, v := range t.Values {
		if v.Value == x || t.Size < 8 && v.Value == x&(1<<(8*t.Size)-1) {
			return v.Name
		}
	}
	if t.Signed {
		return int64(x)
	}
	return x
}

func isChar(t btf.Type) bool {
	i, ok := btf.UnderlyingType(t).(*btf.Int)
	return ok && i.Size == 1 && (i.Encoding&btf.Char != 0 || i.Name == "char" || i.Name == "unsigned char" || i.Name == "signed char")
}

// cString is a char array's text up to its first NUL.
func cString(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// Write prints n as crash's print and struct commands do: members one
// per line, nested structs indented, char arrays as strings, enums by
// name, pointers in hex with what they point to.
func Write(w io.Writer, n Node) {
	var b strings.Builder
	writeNode(&b, n, 0)
	b.WriteByte('\n')
	io.WriteString(w, b.String())
}

func writeNode(b *strings.Builder, n Node, depth int) {
	pad := strings.Repeat("  ", depth+1)
	switch {
	case n.Error != "":
		fmt.Fprintf(b, "<%s>", n.Error)
	case n.Members != nil:
		b.WriteString("{\n")
		for _, m := range n.Members {
			b.WriteString(pad)
			if m.Name != "" {
				b.WriteString(m.Name + " = ")
			}
			writeNode(b, m, depth+1)
			b.WriteString(",\n")
		}
		b.WriteString(strings.Repeat("  ", depth) + "}")
	case n.Elements != nil:
		multi := len(n.Elements) > 0 && (n.Elements[0].Members != nil || n.Elements[0].Elements != nil)
		b.WriteByte('{')
		for i, el := range n.Elements {
			if i > 0 {
				b.WriteString(", ")
			}
			if multi {
				b.WriteString("\n" + pad)
			}
			writeNode(b, el, depth+1)
		}
		if n.More > 0 {
			fmt.Fprintf(b, ", …%d more", n.More)
		}
		if multi {
			b.WriteString("\n" + strings.Repeat("  ", depth))
		}
		b.WriteByte('}')
	case n.Pointer != "":
		b.WriteString(n.Pointer)
		if n.Symbol != "" {
			b.WriteString(" <" + n.Symbol + ">")
		}
		if n.What != "" {
			b.WriteString(" [" + n.What + "]")
		}
	case n.Value != nil:
		switch v := n.Value.(type) {
		case string:
			if strings.HasPrefix(n.Type, "enum ") {
				b.WriteString(v)
			} else {
				b.WriteString(strconv.Quote(v))
			}
		default:
			fmt.Fprint(b, v)
		}
	case n.Address != "":
		b.WriteString(n.Address)
	default:
		b.WriteString("{}")
	}
}

// Select keeps only the named members of a struct's tree, in the order
// given; a path (a.b) picks a nested member and names it by the path.
func Select(n Node, paths []string) (Node, error) {
	out := n
	out.Members = nil
	for _, p := range paths {
		cur := n
		for _, part := range strings.Split(p, ".") {
			found := false
			for _, m := range flatten(cur.Members) {
				if m.Name == part {
					cur, found = m, true
					break
				}
			}
			if !found {
				return Node{}, &NoMemberError{Type: cur.Type, Member: part}
			}
		}
		cur.Name = p
		out.Members = append(out.Members, cur)
	}
	return out, nil
}

// flatten lists members with those of anonymous structs and unions
// lifted, as C names them.
func flatten(ms []Node) []Node {
	var out []Node
	for _, m := range ms {
		if m.Name == "" && m.Members != nil {
			out = append(out, flatten(m.Members)...)
			continue
		}
		out = append(out, m)
	}
	return out
}

// ListEntries walks the list at head (its address) and returns the
// address of each struct of type t whose member path links it, in list
// order. What head is follows from the member's type: a struct
// list_head member is linked from a list_head (the walk ends back at
// head), an hlist_node from an hlist_head (it ends at NULL), an rb_node
// from an rb_root or rb_root_cached (in order). At most limit entries;
// a list that loops or breaks is an error that says where, with the
// entries read before it.
func (e *Env) ListEntries(head uint64, t btf.Type, path string, limit int) ([]uint64, error) {
	off, m, err := memberAt(t, path)
	if err != nil {
		return nil, err
	}
	var nodes []uint64
	switch s, _ := btf.UnderlyingType(m).(*btf.Struct); {
	case s != nil && s.Name == "list_head":
		err = kernel.WalkList(e.Mem, head, 0, limit, func(n uint64) error {
			nodes = append(nodes, n)
			return nil
		})
	case s != nil && s.Name == "hlist_node":
		nodes, err = e.hlistNodes(head, limit)
	case s != nil && s.Name == "rb_node":
		var root uint64
		if root, err = e.readPtr(head); err == nil {
			nodes, err = e.RBNodes(root, limit)
		}
	default:
		return nil, fmt.Errorf("%s.%s is a %s, not a struct list_head, hlist_node or rb_node", TypeString(t), path, TypeString(m))
	}
	out := make([]uint64, len(nodes))
	for i, n := range nodes {
		out[i] = n - off
	}
	return out, err
}

// XArrayEntries walks the xarray at xa (a struct xarray, which is also
// the radix tree and IDR's root) and returns its pointer entries in index
// order: value entries (tagged integers) and the array's own internal
// entries (siblings, retry and zero entries) are left out. Node pointers
// are internal entries above 4096 (include/linux/xarray.h); a node's
// slots are read as many as BTF's xa_node.slots holds. At most limit
// entries and nodes; a node met twice is an error.
func (e *Env) XArrayEntries(xa uint64, limit int) ([]uint64, error) {
	xt, err := e.LookupType("struct xarray")
	if err != nil {
		return nil, err
	}
	nt, err := e.LookupType("struct xa_node")
	if err != nil {
		return nil, err
	}
	headOff, _, err := memberAt(xt, "xa_head")
	if err != nil {
		return nil, err
	}
	slotsOff, st, err := memberAt(nt, "slots")
	if err != nil {
		return nil, err
	}
	arr, ok := btf.UnderlyingType(st).(*btf.Array)
	if !ok || arr.Nelems == 0 || arr.Nelems > 256 {
		return nil, fmt.Errorf("xa_node.slots is a %s, not an array of entries", TypeString(st))
	}
	head, err := e.readPtr(xa + headOff)
	if err != nil {
		return nil, err
	}
	var out []uint64
	seen := map[uint64]bool{}
	buf := make([]byte, 8*arr.Nelems)
	var walk func(entry uint64, depth int) error
	walk = func(entry uint64, depth int) error {
		switch {
		case entry == 0, entry&1 == 1: // empty, or a value entry
			return nil
		case entry&3 == 2 && entry <= 4096: // sibling, retry or zero entry
			return nil
		case entry&3 == 2: // a node
			node := entry - 2
			if seen[node] || depth > 16 {
				return fmt.Errorf("xarray %#x: node %#x met twice or too deep", xa, node)
			}
			seen[node] = true
			if len(seen)+len(out) > limit {
				return fmt.Errorf("xarray %#x: more than %d entries and nodes", xa, limit)
			}
			if err := e.Mem.Read(node+slotsOff, buf); err != nil {
				return fmt.Errorf("xa_node %#x: %w", node, err)
			}
			slots := make([]uint64, arr.Nelems)
			for i := range slots {
				slots[i] = binary.LittleEndian.Uint64(buf[8*i:])
			}
			for _, s := range slots {
				if err := walk(s, depth+1); err != nil {
					return err
				}
			}
			return nil
		}
		if len(out) == limit {
			return fmt.Errorf("xarray %#x: more than %d entries", xa, limit)
		}
		out = append(out, entry)
		return nil
	}
	return out, walk(head, 0)
}

func (e *Env) readPtr(a uint64) (uint64, error) {
	b := make([]byte, 8)
	if err := e.Mem.Read(a, b); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// hlistNodes are the hlist_nodes from the hlist_head at head (first),
// each's next up to NULL.
func (e *Env) hlistNodes(head uint64, limit int) ([]uint64, error) {
	seen := map[uint64]bool{}
	var out []uint64
	next, err := e.readPtr(head)
	for ; err == nil && next != 0; next, err = e.readPtr(next) {
		if seen[next] {
			return out, fmt.Errorf("the hlist loops back to %#x after %d entries", next, len(out))
		}
		if len(out) == limit {
			return out, fmt.Errorf("more than %d entries: stopped", limit)
		}
		seen[next] = true
		out = append(out, next)
	}
	if err != nil {
		return out, fmt.Errorf("hlist entry %d: %w", len(out), err)
	}
	return out, nil
}

// RBNodes are the nodes of the rb-tree whose root node is root, in
// order (struct rb_node: __rb_parent_color, rb_right, rb_left); at most
// limit, and a node met twice is an error.
func (e *Env) RBNodes(root uint64, limit int) ([]uint64, error) {
	type pending struct{ node, right uint64 } // right: read on the way down
	var out []uint64
	var stack []pending
	seen := map[uint64]bool{}
	b := make([]byte, 24)
	for n := root; n != 0 || len(stack) > 0; {
		for n != 0 {
			if seen[n] {
				return out, fmt.Errorf("rb-tree node %#x seen twice: not a tree", n)
			}
			if len(seen) == limit {
				return out, fmt.Errorf("more than %d nodes: stopped", limit)
			}
			seen[n] = true
			if err := e.Mem.Read(n, b); err != nil {
				return out, err
			}
			stack = append(stack, pending{n, binary.LittleEndian.Uint64(b[8:])})
			n = binary.LittleEndian.Uint64(b[16:]) // rb_left
		}
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		out = append(out, top.node)
		n = top.right
	}
	return out, nil
}

// LookupType finds a type written as C writes it ("struct task_struct",
// "u64", "struct page *").
func (e *Env) LookupType(s string) (btf.Type, error) {
	p := &parser{expr: s}
	toks, err := lex(s)
	if err != nil {
		return nil, err
	}
	p.toks = toks
	tn, err := p.parseType()
	if err != nil {
		return nil, err
	}
	if p.i < len(p.toks) {
		return nil, p.errorf("unexpected %q after the type", p.peek())
	}
	return e.lookupType(tn)
}
