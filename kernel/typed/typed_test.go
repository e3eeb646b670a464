package typed

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/btftest"
	"github.com/kinst/kinst/kernel"
)

// memory is a fake kernel memory: bytes at addresses.
type memory map[uint64]byte

func (m memory) Read(addr uint64, b []byte) error {
	for i := range b {
		v, ok := m[addr+uint64(i)]
		if !ok {
			return fmt.Errorf("read %#x: not in the dump", addr+uint64(i))
		}
		b[i] = v
	}
	return nil
}

func (m memory) put(addr uint64, b []byte) {
	for i, v := range b {
		m[addr+uint64(i)] = v
	}
}

func (m memory) u64(addr, v uint64) { m.put(addr, binary.LittleEndian.AppendUint64(nil, v)) }
func (m memory) u32(addr uint64, v uint32) {
	m.put(addr, binary.LittleEndian.AppendUint32(nil, v))
}

// fixture is a kernel with
//
//	struct list_head { struct list_head *next, *prev; };
//	enum state { RUNNING = 0, SLEEPING = 1 };
//	struct task {                 // 64 bytes
//		int pid;                  // 0
//		unsigned int flags:3;     // 32..34 bits
//		unsigned int prio:5;      // 35..39
//		char comm[16];            // 8
//		struct list_head tasks;   // 24
//		enum state state;         // 40
//		struct task *parent;      // 48
//		u64 stamp;                // 56 (a typedef)
//	};
//	struct task init_task;        // at 0x1000 (DWARF-typed)
//	struct task cpu_task;         // per-CPU, offset 0x40; CPU n's area at 0x10000*(n+1)
//
// and a list of init_task and two more tasks at 0x2000 and 0x3000.
func fixture(t *testing.T) (*Env, memory) {
	t.Helper()
	i32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	u64i := &btf.Int{Name: "long long unsigned int", Size: 8}
	u64 := &btf.Typedef{Name: "u64", Type: u64i}
	char := &btf.Int{Name: "char", Size: 1, Encoding: btf.Signed | btf.Char}
	lh := &btf.Struct{Name: "list_head", Size: 16}
	lhp := &btf.Pointer{Target: lh}
	lh.Members = []btf.Member{{Name: "next", Type: lhp}, {Name: "prev", Type: lhp, Offset: 64}}
	state := &btf.Enum{Name: "state", Size: 4, Values: []btf.EnumValue{{Name: "RUNNING", Value: 0}, {Name: "SLEEPING", Value: 1}}}
	task := &btf.Struct{Name: "task", Size: 64}
	task.Members = []btf.Member{
		{Name: "pid", Type: i32},
		{Name: "flags", Type: u32, Offset: 32, BitfieldSize: 3},
		{Name: "prio", Type: u32, Offset: 35, BitfieldSize: 5},
		{Name: "comm", Type: &btf.Array{Type: char, Index: u32, Nelems: 16}, Offset: 64},
		{Name: "tasks", Type: lh, Offset: 192},
		{Name: "state", Type: state, Offset: 320},
		{Name: "parent", Type: &btf.Pointer{Target: task}, Offset: 384},
		{Name: "stamp", Type: u64, Offset: 448},
	}
	cpuTask := &btf.Var{Name: "cpu_task", Type: task, Linkage: btf.GlobalVar}
	ds := &btf.Datasec{Name: ".data..percpu", Size: 0x80, Vars: []btf.VarSecinfo{{Type: cpuTask, Offset: 0x40, Size: 64}}}
	spec := btftest.Spec(t, task, ds, u64)
	m := memory{}
	tasks := []uint64{0x1000, 0x2000, 0x3000}
	for i, a := range tasks {
		m.put(a, make([]byte, 64))
		m.u32(a, uint32(i))
		m.put(a+4, []byte{5 | 17<<3}) // flags 5, prio 17
		m.put(a+8, []byte(fmt.Sprintf("task%d", i)))
		m.u64(a+24, tasks[(i+1)%3]+24)
		m.u64(a+32, tasks[(i+2)%3]+24)
		m.u32(a+40, uint32(i%2))
		m.u64(a+48, 0x1000)
		m.u64(a+56, 1<<40+uint64(i))
	}
	for cpu := range 2 {
		a := uint64(0x10000*(cpu+1)) + 0x40
		m.put(a, make([]byte, 64))
		m.u32(a, uint32(100+cpu))
	}
	syms := map[string]uint64{"init_task": 0x1000, "cpu_task": 0x40, "untyped": 0x1000}
	var taskT btf.Type
	env := &Env{
		Mem:  m,
		Spec: spec,
		Symbol: func(n string) (uint64, bool) {
			a, ok := syms[n]
			return a, ok
		},
		SymbolAt: func(a uint64) (string, bool) {
			if a == 0x1000 {
				return "init_task+0x0", true
			}
			return "", false
		},
		VarType: func(n string) (btf.Type, error) {
			if n == "init_task" {
				return taskT, nil
			}
			return nil, ErrNoType
		},
		PerCPU: func(off uint64, cpu int) (uint64, error) {
			if cpu < 0 || cpu > 1 {
				return 0, fmt.Errorf("no CPU %d", cpu)
			}
			return uint64(0x10000*(cpu+1)) + off, nil
		},
	}
	var err error
	if taskT, err = env.LookupType("struct task"); err != nil {
		t.Fatal(err)
	}
	return env, m
}

// scalarOf evaluates expr to a number, pointer or enum.
func scalarOf(t *testing.T, e *Env, expr string) (uint64, error) {
	v, err := e.Eval(expr)
	if err != nil {
		return 0, err
	}
	return e.scalar(v)
}

func TestEval(t *testing.T) {
	e, _ := fixture(t)
	for _, tc := range []struct {
		expr string
		want uint64
	}{
		{"init_task.pid", 0},
		{"init_task.tasks.next->next", 0x3000 + 24},
		{"container_of(init_task.tasks.next, struct task, tasks)->pid", 1},
		{"((struct task *)0x2000)->pid", 1},
		{"(*(struct task *)0x3000).pid", 2},
		{"((struct task)0x3000).pid", 2},
		{"init_task.parent->parent->stamp", 1 << 40},
		{"init_task.flags", 5},
		{"init_task.prio", 17},
		{"init_task.comm[4]", '0'},
		{"*init_task.comm", 't'},
		{"&init_task.comm[2]", 0x1000 + 8 + 2},
		{"&init_task.tasks", 0x1000 + 24},
		{"sizeof(struct task)", 64},
		{"sizeof(init_task.comm)", 16},
		{"sizeof init_task", 64},
		{"(struct task *)0x1000 + 2", 0x1000 + 128},
		{"&((struct task *)0x2000)->stamp - 8", 0x2000 + 56 - 64}, // a u64 * steps by 8
		{"((struct task *)0x1000)[64].pid", 1},
		{"cpu_task.pid", 100},
		{"per_cpu(cpu_task, 1).pid", 101},
		{"(u64)init_task.stamp", 1 << 40},
		{"(unsigned int)0x123456789", 0x23456789},
		{"(int)-1", ^uint64(0)},
		{"(enum state)1", 1},
		{"((struct task *)&untyped)->pid", 0},
		{"&untyped", 0x1000},
	} {
		got, err := scalarOf(t, e, tc.expr)
		if err != nil || got != tc.want {
			t.Errorf("%s = %#x, %v; want %#x", tc.expr, got, err, tc.want)
		}
	}
}

func TestEvalErrors(t *testing.T) {
	e, _ := fixture(t)
	for _, tc := range []struct {
		expr   string
		is     error
		saying string
	}{
		{"untyped.pid", ErrNoType, "has no type"},
		{"nosuch", ErrNoSymbol, "nosuch"},
		{"init_task.nosuch", ErrNoType, "struct task has no member nosuch"},
		{"init_task.pid.x", ErrBadOperand, "not a struct"},
		{"*init_task", ErrBadOperand, "not a pointer"},
		{"init_task.comm[16]", ErrBadOperand, "past its 16"},
		{"(struct nosuch *)0", ErrNoType, "struct nosuch"},
		{"per_cpu(init_task, 0)", ErrBadOperand, "not a per-CPU"},
		{"per_cpu(cpu_task, 7)", nil, "no CPU 7"},
		{"((struct task *)0)->pid", ErrBadOperand, "is NULL"},
		{"((struct task *)0x9000)->pid", nil, "not in the dump"},
		{"&init_task.flags", ErrBadOperand, "not an object"},
		{"init_task.", nil, "want a member name"},
		{"init_task.pid +", nil, "ends too soon"},
		{"init_task $", nil, `unexpected '$'`},
		{"(init_task.pid", nil, `want ")"`},
	} {
		v, err := e.Eval(tc.expr)
		if err == nil {
			_, err = e.scalar(v)
		}
		if err == nil || tc.is != nil && !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.saying) {
			t.Errorf("%s: %v; want an error saying %q (is %v)", tc.expr, err, tc.saying, tc.is)
		}
	}
	var se *SyntaxError
	if _, err := e.Eval("init_task.pid )"); !errors.As(err, &se) || se.Pos != 14 {
		t.Errorf("syntax error %v; want one at column 15", err)
	}
}

func TestWrite(t *testing.T) {
	e, _ := fixture(t)
	v, err := e.Eval("init_task")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	Write(&b, e.Tree("init_task", v))
	want := `{
  pid = 0,
  flags = 5,
  prio = 17,
  comm = "task0",
  tasks = {
    next = 0x2018,
    prev = 0x3018,
  },
  state = RUNNING,
  parent = 0x1000 <init_task+0x0>,
  stamp = 1099511627776,
}
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	sel, err := Select(e.Tree("", v), []string{"comm", "tasks.next", "pid"})
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	Write(&b, sel)
	if want := "{\n  comm = \"task0\",\n  tasks.next = 0x2018,\n  pid = 0,\n}\n"; b.String() != want {
		t.Errorf("-m comm,tasks.next,pid:\n%s\nwant\n%s", b.String(), want)
	}
	// A pointer that names no symbol says what it points to.
	e.Describe = func(a uint64) (string, bool) { return fmt.Sprintf("task+%#x", a&0xfff), a&0xfff != 0 }
	b.Reset()
	Write(&b, e.Tree("", mustEval(t, e, "init_task.tasks")))
	if want := "{\n  next = 0x2018 [task+0x18],\n  prev = 0x3018 [task+0x18],\n}\n"; b.String() != want {
		t.Errorf("described pointers:\n%s\nwant\n%s", b.String(), want)
	}
	if p := e.Tree("", mustEval(t, e, "init_task.parent")); p.Symbol != "init_task+0x0" || p.What != "" {
		t.Errorf("a pointer to a symbol: %+v; want the symbol only", p)
	}
	e.Describe = nil
	if _, err := Select(e.Tree("", v), []string{"tasks.nope"}); err == nil || !strings.Contains(err.Error(), "struct list_head has no member nope") {
		t.Errorf("bad -m path: %v", err)
	}
	js, _ := json.Marshal(e.Tree("init_task", v))
	for _, frag := range []string{`"name":"init_task","type":"struct task","address":"0x1000"`, `"name":"comm","type":"char [16]","address":"0x1008","value":"task0"`,
		`"name":"state","type":"enum state","address":"0x1028","value":"RUNNING"`, `"pointer":"0x1000","symbol":"init_task+0x0"`} {
		if !strings.Contains(string(js), frag) {
			t.Errorf("JSON lacks %s:\n%s", frag, js)
		}
	}
}

func TestListEntries(t *testing.T) {
	e, m := fixture(t)
	task, _ := e.LookupType("struct task")
	got, err := e.ListEntries(0x1000+24, task, "tasks", 100)
	if err != nil || fmt.Sprint(got) != fmt.Sprint([]uint64{0x2000, 0x3000}) {
		t.Errorf("entries %#x, %v; want 0x2000 0x3000", got, err)
	}
	if got, err := e.ListEntries(0x1000+24, task, "tasks", 1); err == nil || len(got) != 1 {
		t.Errorf("limit 1: %#x, %v; want one entry and an error", got, err)
	}
	if _, err := e.ListEntries(0x1000+24, task, "comm", 10); err == nil || !strings.Contains(err.Error(), "not a struct list_head") {
		t.Errorf("a member that is no list_head: %v", err)
	}
	// A loop that never returns to the head: 0x3000 → 0x2000.
	m.u64(0x3000+24, 0x2000+24)
	// (kernel.WalkList's error: where the loop closed.)
	var le *kernel.ListError
	if _, err := e.ListEntries(0x1000+24, task, "tasks", 10); !errors.As(err, &le) || le.At != 0x2018 || !strings.Contains(err.Error(), "loops back") {
		t.Errorf("a loop: %v", err)
	}
}

// node writes an rb_node at a: parent-color, right, left.
func (m memory) node(a, right, left uint64) {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[8:], right)
	binary.LittleEndian.PutUint64(b[16:], left)
	for i, v := range b {
		m[a+uint64(i)] = v
	}
}

// The tree
//
//	        0x400
//	       /     \
//	    0x200   0x500
//	   /     \
//	0x100   0x300
//
// in order is 0x100 … 0x500; a node that points back up is refused.
func TestRBNodes(t *testing.T) {
	m := memory{}
	m.node(0x400, 0x500, 0x200)
	m.node(0x200, 0x300, 0x100)
	m.node(0x100, 0, 0)
	m.node(0x300, 0, 0)
	m.node(0x500, 0, 0)
	e := &Env{Mem: m}
	got, err := e.RBNodes(0x400, 100)
	if err != nil || fmt.Sprint(got) != "[256 512 768 1024 1280]" {
		t.Errorf("in order: %v, %v", got, err)
	}
	if got, err := e.RBNodes(0, 100); err != nil || len(got) != 0 {
		t.Errorf("empty tree: %v, %v", got, err)
	}
	m.node(0x300, 0, 0x400) // 0x300's left is the root: a cycle
	if _, err := e.RBNodes(0x400, 100); err == nil || !strings.Contains(err.Error(), "seen twice") {
		t.Errorf("a cycle: %v", err)
	}
	delete(m, 0x500)
	m.node(0x300, 0, 0)
	if _, err := e.RBNodes(0x400, 100); err == nil || !strings.Contains(err.Error(), "not in the dump") {
		t.Errorf("an unreadable node: %v", err)
	}
}

// An hlist: head → 0x100 → 0x200 → NULL; a loop is refused.
func TestHlistNodes(t *testing.T) {
	m := memory{}
	m.u64(0x10, 0x100)
	m.u64(0x100, 0x200)
	m.u64(0x200, 0)
	e := &Env{Mem: m}
	if got, err := e.hlistNodes(0x10, 10); err != nil || fmt.Sprint(got) != "[256 512]" {
		t.Errorf("hlist: %v, %v", got, err)
	}
	m.u64(0x200, 0x100)
	if _, err := e.hlistNodes(0x10, 10); err == nil || !strings.Contains(err.Error(), "loops back to 0x100") {
		t.Errorf("a loop: %v", err)
	}
}

func mustEval(t *testing.T, e *Env, expr string) Value {
	t.Helper()
	v, err := e.Eval(expr)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// An xarray of two levels: pointer entries in index order, value,
// sibling and empty entries left out, a single entry at the root read as
// itself, and a node met twice an error.
func TestXArrayEntries(t *testing.T) {
	ptr := &btf.Pointer{Target: &btf.Void{}}
	u8 := &btf.Int{Name: "unsigned char", Size: 1}
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	xa := &btf.Struct{Name: "xarray", Size: 16, Members: []btf.Member{btftest.Member("xa_flags", u32, 4), btftest.Member("xa_head", ptr, 8)}}
	node := &btf.Struct{Name: "xa_node", Size: 8 + 64*8, Members: []btf.Member{btftest.Member("shift", u8, 0),
		btftest.Member("slots", &btf.Array{Type: ptr, Index: u32, Nelems: 64}, 8)}}
	m := memory{}
	for _, a := range []uint64{0x2000, 0x4000} {
		m.put(a, make([]byte, 8+64*8))
	}
	m.put(0x1000, make([]byte, 16))
	m.u64(0x1008, 0x2000|2)
	m.u64(0x2008, 0x3000)
	m.u64(0x2008+8, 0x7)       // a value entry
	m.u64(0x2008+16, 0<<2|2)   // a sibling
	m.u64(0x2008+24, 0x4000|2) // a node
	m.u64(0x4008, 0x5000)
	e := &Env{Mem: m, Spec: btftest.Spec(t, xa, node)}
	if got, err := e.XArrayEntries(0x1000, 100); err != nil || fmt.Sprintf("%#x", got) != "[0x3000 0x5000]" {
		t.Errorf("entries %#x, %v", got, err)
	}
	m.u64(0x4008+8, 0x2000|2) // back to the first node
	if _, err := e.XArrayEntries(0x1000, 100); err == nil || !strings.Contains(err.Error(), "met twice") {
		t.Errorf("a loop: %v", err)
	}
	m.u64(0x1008, 0x6000)
	if got, err := e.XArrayEntries(0x1000, 100); err != nil || fmt.Sprintf("%#x", got) != "[0x6000]" {
		t.Errorf("a single entry: %#x, %v", got, err)
	}
}
