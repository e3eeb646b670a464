package typeid

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/slab/slabtest"
)

var (
	u8  = &btf.Int{Name: "unsigned char", Size: 1}
	u32 = &btf.Int{Name: "unsigned int", Size: 4}
	u64 = &btf.Int{Name: "unsigned long", Size: 8}
)

func mem(name string, t btf.Type, byteOff uint32) btf.Member {
	return btf.Member{Name: name, Type: t, Offset: btf.Bits(8 * byteOff)}
}

// Types the synthetic caches hold.
func objectTypes() []btf.Type {
	qstr := &btf.Struct{Name: "qstr", Size: 16, Members: []btf.Member{
		mem("", &btf.Union{Size: 8, Members: []btf.Member{
			mem("", &btf.Struct{Size: 8, Members: []btf.Member{mem("hash", u32, 0), mem("len", u32, 4)}}, 0),
			mem("hash_len", u64, 0),
		}}, 0),
		mem("name", &btf.Pointer{Target: u8}, 8),
	}}
	dentry := &btf.Struct{Name: "dentry", Size: 64, Members: []btf.Member{
		mem("d_flags", u32, 0), {Name: "d_bits", Type: u32, Offset: 36, BitfieldSize: 3},
		mem("d_parent", u64, 8), mem("d_name", qstr, 16), mem("d_iname", &btf.Array{Index: u32, Type: u8, Nelems: 24}, 32),
		// 56..63: padding
	}}
	fpregs := &btf.Union{Name: "fpregs_state", Size: 512, Members: []btf.Member{mem("__padding", &btf.Array{Index: u32, Type: u8, Nelems: 512}, 0)}}
	task := &btf.Struct{Name: "task_struct", Size: 1024, Members: []btf.Member{
		mem("flags", u32, 0), mem("stack", &btf.Pointer{Target: &btf.Void{}}, 8), mem("signal", u64, 16),
		mem("thread", &btf.Struct{Name: "thread_struct", Size: 1024 - 512, Members: []btf.Member{mem("sp", u64, 0), mem("regs", fpregs, 0)}}, 512),
	}}
	// thread_struct above starts regs at 0 within it for brevity: the
	// variable part begins at task_struct+512.
	pid := &btf.Struct{Name: "pid", Size: 16, Members: []btf.Member{mem("count", u32, 0), mem("level", u32, 4),
		mem("numbers", &btf.Array{Index: u32, Type: u64, Nelems: 0}, 16)}}
	inode := &btf.Struct{Name: "inode", Size: 96, Members: []btf.Member{mem("i_mode", u32, 0)}}
	thing := &btf.Struct{Name: "thing", Size: 40, Members: []btf.Member{mem("a", u64, 0)}}
	wrong := &btf.Struct{Name: "wrongsize", Size: 48, Members: []btf.Member{mem("a", u64, 0)}}
	rq := &btf.Struct{Name: "rq", Size: 64, Members: []btf.Member{mem("lock", u64, 0), mem("nr_running", u32, 8)}}
	percpu := &btf.Datasec{Name: ".data..percpu", Size: 0x9000, Vars: []btf.VarSecinfo{
		{Type: &btf.Var{Name: "runqueues", Type: rq, Linkage: btf.GlobalVar}, Offset: 0x8000, Size: 64},
		{Type: &btf.Var{Name: "current_task", Type: &btf.Pointer{Target: task}, Linkage: btf.GlobalVar}, Offset: 0x8040, Size: 8},
	}}
	return []btf.Type{dentry, task, pid, inode, thing, wrong, percpu}
}

func TestMemberPath(t *testing.T) {
	types := objectTypes()
	dentry, task, pid := types[0], types[1], types[2]
	for _, c := range []struct {
		t    btf.Type
		off  uint64
		want string
	}{
		{dentry, 0, "dentry.d_flags"},
		{dentry, 2, "dentry.d_flags+0x2"},
		{dentry, 4, "dentry.d_bits"},
		{dentry, 8, "dentry.d_parent"},
		{dentry, 16, "dentry.d_name.hash"},
		{dentry, 20, "dentry.d_name.len"},
		{dentry, 24, "dentry.d_name.name"},
		{dentry, 27, "dentry.d_name.name+0x3"},
		{dentry, 35, "dentry.d_iname[3]"},
		{dentry, 60, "dentry+0x3c (padding)"},
		{dentry, 64, "dentry+0x40 (past the end)"},
		{task, 16, "task_struct.signal"},
		{task, 520, "task_struct.thread.regs.__padding[8]"},
		{pid, 40, "pid.numbers[3]"},
		{pid, 44, "pid.numbers[3]+0x4"},
		{&btf.Pointer{Target: task}, 0, "task_struct *"},
		{&btf.Array{Index: u32, Type: &btf.Pointer{Target: &btf.Void{}}, Nelems: 4}, 17, "void *[4][2]+0x1"},
	} {
		if got := MemberPath(c.t, c.off); got != c.want {
			t.Errorf("%s+%#x: %q, want %q", typeName(c.t), c.off, got, c.want)
		}
	}
}

func TestCacheTypes(t *testing.T) {
	spec := slabtest.Spec(t, append(slabtest.Types(false), objectTypes()...))
	for _, c := range []struct {
		cache    slab.Cache
		want     string
		howWords string
	}{
		{slab.Cache{Name: "dentry", ObjectSize: 64, Refcount: 1}, "dentry", "named after the struct (struct dentry), sizes equal (64)"},
		{slab.Cache{Name: "task_struct", ObjectSize: 700, Refcount: 1}, "task_struct", "its last member thread.regs (at 512) has the size the kernel chose at run time"},
		{slab.Cache{Name: "task_struct", ObjectSize: 500, Refcount: 1}, "", "struct task_struct is 1024 bytes, the objects 500"},
		{slab.Cache{Name: "pid", ObjectSize: 24, Refcount: 1}, "pid", "numbers"},
		{slab.Cache{Name: "inode_cache", ObjectSize: 96, Refcount: 1}, "inode", "the kernel's dedicated cache for this struct"},
		{slab.Cache{Name: "thing_cachep", ObjectSize: 40, Refcount: 1}, "thing", `with "_cachep" appended`},
		{slab.Cache{Name: "wrongsize", ObjectSize: 40, Refcount: 1}, "", "struct wrongsize is 48 bytes, the objects 40"},
		{slab.Cache{Name: "dentry", ObjectSize: 64, Refcount: 3, Aliases: []string{"a", "b"}}, "", "merged cache: holds the objects of 2 other cache(s) too (a, b)"},
		{slab.Cache{Name: "kmalloc-64", ObjectSize: 64, Refcount: -1}, "", "general-purpose kmalloc cache"},
		{slab.Cache{Name: "nosuch", ObjectSize: 64, Refcount: 1}, "", "no struct is named after the cache"},
	} {
		ct := cacheType(spec, &c.cache)
		if ct.Name != c.want || (ct.Type == nil) != (c.want == "") || !strings.Contains(ct.How, c.howWords) {
			t.Errorf("%s (%d bytes): %q (%s), want %q with %q", c.cache.Name, c.cache.ObjectSize, ct.Name, ct.How, c.want, c.howWords)
		}
	}
}

// fakeKernel adds symbols by address and tasks to the synthetic image.
type fakeKernel struct {
	*slabtest.Image
	syms  []Symbol
	tasks []Task
}

func (k *fakeKernel) SymbolAt(addr uint64) (Symbol, bool) {
	for _, s := range k.syms {
		if addr >= s.Addr && addr < s.Addr+s.Size {
			return s, true
		}
	}
	return Symbol{}, false
}

func (k *fakeKernel) Tasks() ([]Task, error) { return k.tasks, nil }

func TestWhatType(t *testing.T) {
	im := slabtest.NewImageTypes(t, true, append(slabtest.Types(true), objectTypes()...))
	dc := im.AddCache("dentry", 64, 64, 0, 0)
	ds := im.AddSlab(dc, 64, []int{9})
	im.SetCPUSlab(dc, 1, ds, []int{10})
	tc := im.AddCache("task_struct", 700, 704, 0, 1)
	ts := im.AddSlab(tc, tc.PerSlab, nil)
	km := im.AddCache("kmalloc-64", 64, 64, 0, 0)
	im.Put(km.Addr, "kmem_cache", "refcount", ^uint64(0))
	ks := im.AddSlab(km, 64, nil)
	mc := im.AddCache("signal_cache", 96, 96, 0, 0)
	mc.Aliases = []string{"UDP"}
	msl := im.AddSlab(mc, mc.PerSlab, nil)
	im.Finish()
	// The task's stack, in vmalloc space.
	task := tc.Obj(ts, 1)
	const stack = 0xffffc90000a00000
	im.Put(task, "task_struct", "stack", stack)
	im.Syms["vmalloc_base"] = im.Alloc(8)
	im.U64(im.Syms["vmalloc_base"], 0xffffc90000000000)
	im.Syms["__start_init_task"], im.Syms["__end_init_task"] = 0xffffffff82800000, 0xffffffff82804000
	im.Syms["__per_cpu_start"] = 0
	// A page that is not a slab, allocated; and a free one.
	im.Put(im.StructPage(300), "page", "_refcount.counter", 1)
	k := &fakeKernel{Image: im,
		syms:  []Symbol{{Name: "jiffies", Addr: 0xffffffff82001000, Size: 8, Type: 'D'}},
		tasks: []Task{{Addr: tc.Obj(ts, 0), PID: 1, Comm: "init"}, {Addr: task, PID: 42, Comm: "worker"}}}
	h, err := slab.Open(k)
	if err != nil {
		t.Fatal(err)
	}
	id, err := New(k, h)
	if err != nil {
		t.Fatal(err)
	}
	str := func(p *string) string {
		if p == nil {
			return "-"
		}
		return *p
	}
	for _, c := range []struct {
		addr uint64
		want string // kind cache object state type member source
	}{
		{dc.Obj(ds, 3) + 27, "slab object|dentry|" + hex(dc.Obj(ds, 3)) + "|allocated|dentry|dentry.d_name.name+0x3|cache"},
		{dc.Obj(ds, 9), "slab object|dentry|" + hex(dc.Obj(ds, 9)) + "|free|dentry|dentry.d_flags|cache"},
		{dc.Obj(ds, 10) + 8, "slab object|dentry|" + hex(dc.Obj(ds, 10)) + "|free|dentry|dentry.d_parent|cache"},
		{task + 16, "slab object|task_struct|" + hex(task) + "|allocated|task_struct|task_struct.signal|cache"},
		{task + 702, "slab object|task_struct|" + hex(task) + "|allocated|task_struct|-|cache"}, // slot padding
		{km.Obj(ks, 5) + 1, "slab object|kmalloc-64|" + hex(km.Obj(ks, 5)) + "|allocated|-|-|-"},
		{mc.Obj(msl, 2), "slab object|signal_cache|" + hex(mc.Obj(msl, 2)) + "|allocated|-|-|-"},
		{stack + 0x3ff8, "task stack|-|-|-|-|-|-"},
		{0xffffffff82001004, "kernel symbol|-|-|-|-|-|-"},
		{0xffffc90000b00000, "vmalloc|-|-|-|-|-|-"},
		{slabtest.PerCPUBase + 1<<20 + 0x8008, "per-CPU variable|-|-|-|rq|rq.nr_running|percpu"},
		{slabtest.PerCPUBase + 0x8040, "per-CPU variable|-|-|-|task_struct *|task_struct *|percpu"},
		{slabtest.PageOffset + 300*slabtest.PageSize + 5, "page|-|-|-|-|-|-"},
		{slabtest.PageOffset + 301*slabtest.PageSize, "free page|-|-|-|-|-|-"},
		{0xffff800000000000, "not a heap object|-|-|-|-|-|-"},
	} {
		r, err := id.WhatType(c.addr)
		if err != nil {
			t.Errorf("%#x: %v", c.addr, err)
			continue
		}
		got := strings.Join([]string{r.Kind, str(r.Cache), str(r.Object), str(r.State), str(r.Type), str(r.Member), str(r.Source)}, "|")
		if got != c.want {
			t.Errorf("%#x: %s, want %s (%+v)", c.addr, got, c.want, r)
		}
		switch r.Kind {
		case KindStack:
			if r.Task == nil || r.Task.PID != 42 {
				t.Errorf("stack of %+v", r.Task)
			}
		case KindPerCPU:
			if r.CPU == nil || (*r.CPU != 1 && r.Symbol == "runqueues+0x8") || !strings.HasPrefix(r.Symbol, "runqueues+0x8") && r.Symbol != "current_task+0x0" {
				t.Errorf("per-CPU %+v", r)
			}
		case KindSymbol:
			if r.Symbol != "jiffies+0x4" {
				t.Errorf("symbol %q", r.Symbol)
			}
		case KindSlab:
			if r.Offset == nil || uint64(*r.Offset) != c.addr-mustHex(*r.Object) {
				t.Errorf("offset %v", r.Offset)
			}
		}
	}
	// A struct page that cannot be read: an error, not a wrong answer.
	delete(im.Pages, slabtest.Vmemmap+5000*im.Sizeof("page")&^(slabtest.PageSize-1))
	if _, err := id.WhatType(slabtest.PageOffset + 5000*slabtest.PageSize); err == nil {
		t.Errorf("an unreadable struct page gave no error")
	}
}

func hex(v uint64) string { return fmt.Sprintf("%#x", v) }

func mustHex(s string) uint64 {
	v, _ := strconv.ParseUint(s, 0, 64)
	return v
}

// With slub_debug=U, whattype names who allocated and freed the object.
func TestWhatTypeTracks(t *testing.T) {
	im := slabtest.NewImageTypes(t, false, append(slabtest.Types(false), objectTypes()...))
	c := im.AddCache("dentry", 64, 128, slab.FlagRedZone|slab.FlagStoreUser, 0)
	s := im.AddSlab(c, c.PerSlab, []int{2})
	im.Finish()
	for i, caller := range []uint64{0xffffffff82001004, 0xffffffff82001002} {
		tr := c.Obj(s, 2) + 64 + uint64(i)*im.Sizeof("track") // inuse 64, the free pointer inside the object
		im.U64(tr+im.Off("track", "addr"), caller)
		im.Put(tr, "track", "pid", uint64(100+i))
		im.Put(tr, "track", "when", 5000)
	}
	k := &fakeKernel{Image: im, syms: []Symbol{{Name: "jiffies", Addr: 0xffffffff82001000, Size: 8, Type: 'D'}}}
	h, err := slab.Open(k)
	if err != nil {
		t.Fatal(err)
	}
	id, err := New(k, h)
	if err != nil {
		t.Fatal(err)
	}
	r, err := id.WhatType(c.Obj(s, 2) + 8)
	if err != nil {
		t.Fatal(err)
	}
	if r.Allocated == nil || r.Allocated.Function != "jiffies+0x4" || r.Allocated.PID != 100 || r.Freed == nil ||
		r.Freed.Function != "jiffies+0x2" || r.Freed.PID != 101 || r.Freed.Jiffies != 5000 || *r.State != "free" || *r.Member != "dentry.d_parent" {
		t.Errorf("%+v alloc %+v free %+v", r, r.Allocated, r.Freed)
	}
	if r, _ := id.WhatType(c.Obj(s, 3) - 2); r.Region != "left red zone" || *r.Offset != -2 || r.Member != nil || r.Allocated != nil {
		t.Errorf("left red zone: %+v", r)
	}
}
