package typegraph

import (
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab/slabtest"
)

// lockTypes are 6.1's lock structs, reduced to the members findlocks
// reads, and a holder struct with a mutex, an rwsem, a spinlock and an
// array of small structs that each hold a spinlock.
func lockTypes(list *btf.Struct) []btf.Type {
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	u8 := &btf.Int{Name: "char", Size: 1}
	atomicLong := &btf.Struct{Name: "", Size: 8, Members: []btf.Member{mem("counter", u64, 0)}}
	atomic := &btf.Struct{Name: "", Size: 4, Members: []btf.Member{mem("counter", u32, 0)}}
	qspin := &btf.Struct{Name: "qspinlock", Size: 4, Members: []btf.Member{mem("val", atomic, 0)}}
	raw := &btf.Struct{Name: "raw_spinlock", Size: 4, Members: []btf.Member{mem("raw_lock", qspin, 0)}}
	mutex := &btf.Struct{Name: "mutex", Size: 32, Members: []btf.Member{mem("owner", atomicLong, 0), mem("wait_lock", raw, 8), mem("wait_list", list, 16)}}
	rwsem := &btf.Struct{Name: "rw_semaphore", Size: 40, Members: []btf.Member{mem("count", atomicLong, 0), mem("owner", atomicLong, 8), mem("wait_lock", raw, 16), mem("wait_list", list, 24)}}
	task := &btf.Struct{Name: "task_struct", Size: 32, Members: []btf.Member{mem("pid", u32, 0), mem("comm", &btf.Array{Index: u32, Type: u8, Nelems: 16}, 8), mem("x", u64, 24)}}
	mw := &btf.Struct{Name: "mutex_waiter", Size: 24, Members: []btf.Member{mem("list", list, 0), mem("task", ptr(task), 16)}}
	rw := &btf.Struct{Name: "rwsem_waiter", Size: 32, Members: []btf.Member{mem("list", list, 0), mem("task", ptr(task), 16), mem("type", u32, 24)}}
	elem := &btf.Struct{Name: "slot", Size: 16, Members: []btf.Member{mem("lock", raw, 0), mem("n", u32, 4), mem("p", u64, 8)}}
	holder := &btf.Struct{Name: "holder", Size: 208, Members: []btf.Member{mem("m", mutex, 0), mem("s", rwsem, 32), mem("l", raw, 72),
		mem("slots", &btf.Array{Index: u32, Type: elem, Nelems: 8}, 80)}}
	return []btf.Type{mutex, rwsem, task, mw, rw, holder}
}

func TestFindLocks(t *testing.T) {
	base := slabtest.Types(false)
	var list *btf.Struct
	for _, ty := range base {
		if s, ok := ty.(*btf.Struct); ok && s.Name == "list_head" {
			list = s
		}
	}
	im := slabtest.NewImageTypes(t, false, append(base, lockTypes(list)...))
	tc := im.AddCache("task_struct", 32, 32, 0, 0)
	hc := im.AddCache("holder", 208, 208, 0, 0)
	ts := im.AddSlab(tc, tc.PerSlab, nil)
	hs := im.AddSlab(hc, hc.PerSlab, nil)
	im.Finish()
	t0, t1 := tc.Obj(ts, 0), tc.Obj(ts, 1)
	for i, tk := range []uint64{t0, t1} {
		im.Put(tk, "task_struct", "pid", uint64(100+i))
		im.Write(tk+8, []byte([]string{"owner", "waiter"}[i]))
	}
	h0, h1, h2 := hc.Obj(hs, 0), hc.Obj(hs, 1), hc.Obj(hs, 2)
	// h0: its mutex held by task 100 with task 101 waiting, its rwsem
	// held by one reader, its spinlock held.
	im.U64(h0, t0|1)
	w := im.Alloc(24)
	head := h0 + 16
	im.U64(head, w)
	im.U64(head+8, w)
	im.U64(w, head)
	im.U64(w+8, head)
	im.U64(w+16, t1)
	im.U64(h0+32, 1<<8)
	im.Write(h0+72, []byte{1, 0, 0, 0})
	// h1: a mutex whose owner is no task; h2: nothing held, empty lists.
	im.U64(h1, h2)
	for _, h := range []uint64{h1, h2} {
		im.U64(h+16, h+16)
		im.U64(h+24, h+16)
		im.U64(h+56, h+56)
		im.U64(h+64, h+56)
	}
	im.U64(h0+56, h0+56)
	im.U64(h0+64, h0+56)

	g := buildImageGraph(t, im)
	locks, implausible, err := g.FindLocks()
	if err != nil {
		t.Fatal(err)
	}
	if implausible != 1 {
		t.Errorf("implausible = %d, want 1 (h1's owner is no task)", implausible)
	}
	if len(locks) != 3 {
		t.Fatalf("locks: %+v", locks)
	}
	m, s, sp := locks[0], locks[1], locks[2]
	if m.Kind != KindMutex || m.In != "holder.m" || m.HeldBy == nil || m.HeldBy.PID != 100 || m.HeldBy.Comm != "owner" ||
		len(m.Waiters) != 1 || m.Waiters[0].PID != 101 || m.Waiters[0].Comm != "waiter" {
		t.Errorf("mutex: %+v", m)
	}
	if s.Kind != KindRWSem || s.In != "holder.s" || s.HeldBy != nil || s.Readers != 1 || len(s.Waiters) != 0 {
		t.Errorf("rwsem: %+v", s)
	}
	if sp.Kind != KindSpinlock || sp.In != "holder.l" || sp.HeldBy != nil {
		t.Errorf("spinlock: %+v", sp)
	}

	fs := g.FindFalse()
	if len(fs) != hc.PerSlab {
		t.Fatalf("findfalse: %d arrays, want one per holder (%d)", len(fs), hc.PerSlab)
	}
	if f := fs[0]; f.In != "holder.slots" || f.Type != "struct slot[8]" || f.ElementSize != 16 || f.TotalSize != 128 || f.Primitive != "raw_spinlock" {
		t.Errorf("findfalse: %+v", f)
	}
}
