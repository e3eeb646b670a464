package typegraph

import (
	"encoding/binary"
	"fmt"
	"sort"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/internal/btflayout"
	"github.com/kinst/kinst/core/typeid"
)

// Lock kinds.
const (
	KindMutex    = "mutex"
	KindRWSem    = "rwsem"
	KindSpinlock = "spinlock"
)

// syncStructs are the kernel's sleeping and spinning locks, by struct
// name (a spinlock_t is struct spinlock around struct raw_spinlock).
var syncStructs = map[string]string{
	"mutex": KindMutex, "rw_semaphore": KindRWSem, "spinlock": KindSpinlock, "raw_spinlock": KindSpinlock,
}

// falseSharing are the synchronization primitives findfalse looks for in
// an array's elements: the locks, seqlocks and wait queue heads (by
// struct or typedef name).
var falseSharing = map[string]bool{
	"mutex": true, "rw_semaphore": true, "spinlock": true, "raw_spinlock": true, "seqlock_t": true,
	"wait_queue_head": true, "rwlock_t": true, "qrwlock": true,
}

// lockSite is a lock in a type: its kind and offset.
type lockSite struct {
	kind string
	off  uint32
	t    *btf.Struct
}

// lockPath is the member path of the lock at off in t: the path to the
// lock itself, not into its first word.
func lockPath(t btf.Type, s lockSite) string {
	p := typeid.MemberPath(t, uint64(s.off))
	inner := typeid.MemberPath(s.t, 0)
	return strings.TrimSuffix(p, inner[len(s.t.Name):])
}

// lockSites lists the locks of a type, not looking inside a lock (a
// mutex's wait_lock is the mutex's own).
func (g *Graph) lockSites(t btf.Type, base uint32, depth int, out *[]lockSite) {
	if depth > maxDepth || len(*out) >= maxSlots {
		return
	}
	switch c := btf.UnderlyingType(t).(type) {
	case *btf.Struct:
		if k, ok := syncStructs[c.Name]; ok {
			*out = append(*out, lockSite{k, base, c})
			return
		}
		for _, m := range c.Members {
			if m.BitfieldSize == 0 && m.Offset%8 == 0 {
				g.lockSites(m.Type, base+uint32(m.Offset.Bytes()), depth+1, out)
			}
		}
	case *btf.Union:
		// A union's first member: the others are other readings.
		if len(c.Members) > 0 {
			g.lockSites(c.Members[0].Type, base+uint32(c.Members[0].Offset.Bytes()), depth+1, out)
		}
	case *btf.Array:
		es, err := btf.Sizeof(c.Type)
		if err != nil || es == 0 {
			return
		}
		var one []lockSite
		g.lockSites(c.Type, 0, depth+1, &one)
		for i := uint32(0); i < min(c.Nelems, maxArrayElem) && len(one) > 0; i++ {
			for _, l := range one {
				*out = append(*out, lockSite{l.kind, base + i*uint32(es) + l.off, l.t})
			}
		}
	}
}

// TaskRef names a task that holds or waits for a lock.
type TaskRef struct {
	Address string `json:"address"`
	PID     int    `json:"pid"`
	Comm    string `json:"comm"`
}

// Lock is a held lock of findlocks.
type Lock struct {
	Address string     `json:"address"`
	Kind    string     `json:"kind"`
	HeldBy  *TaskRef   `json:"held_by"`
	Waiters []*TaskRef `json:"waiters"`
	In      string     `json:"in"`
	// Beyond the shape: the owner word when it names no task
	// (a reader-owned rwsem's last reader, or a stale owner), the
	// readers of a read-held rwsem, and the object's cache.
	Owner   string `json:"owner,omitempty"`
	Readers int    `json:"readers,omitempty"`
	Cache   string `json:"cache,omitempty"`
}

// lockLayout is what reading locks needs of the BTF.
type lockLayout struct {
	mutexOwner, mutexWait    btflayout.Field
	rwCount, rwOwner, rwWait btflayout.Field
	mwTask, rwwTask          btflayout.Field // the waiters' task pointers, from their list_head
	mwList, rwwList          btflayout.Field
	spinVal                  btflayout.Field
	taskPID, taskComm        btflayout.Field
	task                     int32
}

func (g *Graph) lockLayout() (*lockLayout, error) {
	b := btflayout.New(g.spec)
	l := &lockLayout{
		mutexOwner: b.Need("mutex", "owner"), mutexWait: b.Need("mutex", "wait_list"),
		rwCount: b.Need("rw_semaphore", "count"), rwOwner: b.Need("rw_semaphore", "owner"), rwWait: b.Need("rw_semaphore", "wait_list"),
		mwList: b.Need("mutex_waiter", "list"), mwTask: b.Need("mutex_waiter", "task"),
		rwwList: b.Need("rwsem_waiter", "list"), rwwTask: b.Need("rwsem_waiter", "task"),
		spinVal:  b.Need("raw_spinlock", "raw_lock"),
		taskPID:  b.Need("task_struct", "pid"),
		taskComm: b.Need("task_struct", "comm"),
	}
	var ts *btf.Struct
	if err := g.spec.TypeByName("task_struct", &ts); err != nil {
		return nil, err
	}
	l.task = g.ts.id(ts)
	return l, b.Err()
}

// maxWaiters bounds a wait list's walk.
const maxWaiters = 4096

func (g *Graph) readU64(a uint64) (uint64, bool) {
	var b [8]byte
	if g.k.ReadVirt(b[:], a) != nil {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[:]), true
}

// taskRef names the task at a, if a is a task_struct the graph typed.
func (g *Graph) taskRef(l *lockLayout, a uint64) *TaskRef {
	n, off, ok := g.node(a)
	if !ok || off != 0 || g.typ[n] != l.task {
		return nil
	}
	b := g.bytes(n)
	if int(l.taskComm.End()) > len(b) {
		return nil
	}
	comm := b[l.taskComm.Off:l.taskComm.End()]
	if i := strings.IndexByte(string(comm), 0); i >= 0 {
		comm = comm[:i]
	}
	return &TaskRef{Address: fmt.Sprintf("%#x", a), PID: int(l.taskPID.I64(b)), Comm: string(comm)}
}

// waiters walks a wait list of entries whose list_head is at listOff
// and task pointer at taskOff.
func (g *Graph) waiters(l *lockLayout, head uint64, listOff, taskOff uint32) []*TaskRef {
	out := []*TaskRef{}
	p, ok := g.readU64(head)
	for i := 0; ok && p != head && p != 0 && i < maxWaiters; i++ {
		w := p - uint64(listOff)
		t, ok2 := g.readU64(w + uint64(taskOff))
		if !ok2 {
			break
		}
		if r := g.taskRef(l, t); r != nil {
			out = append(out, r)
		} else {
			out = append(out, &TaskRef{Address: fmt.Sprintf("%#x", t), PID: -1})
		}
		p, ok = g.readU64(p)
	}
	return out
}

// FindLocks lists the held mutexes, rw_semaphores and spinlocks in the
// typed objects and the per-CPU variables: a mutex whose owner word
// names a task, an rwsem with its writer bit or readers counted, a
// spinlock whose locked byte is set. A mutex's or a writer's owner is
// the task its owner word names (less the flag bits); the waiters are
// the tasks on the lock's wait list.
//
// A lock whose words cannot be a held lock's (an owner that is no task,
// a waiter that is no task, a spinlock value no qspinlock takes) is not
// reported but counted: it says the object's type is wrong. Objects the
// array pass typed are left out, the least certain of the conjectures.
func (g *Graph) FindLocks() ([]Lock, int, error) {
	l, err := g.lockLayout()
	if err != nil {
		return nil, 0, err
	}
	if g.cpus == nil {
		g.cpus, _ = g.k.PerCPUOffsets()
	}
	implausible := 0
	sites := map[int32][]lockSite{}
	var out []Lock
	check := func(b []byte, base uint64, ls []lockSite, in func(s lockSite) string, cache string) {
		for _, s := range ls {
			if int(s.off)+16 > len(b) {
				continue
			}
			lb := b[s.off:]
			a := base + uint64(s.off)
			lk := Lock{Address: fmt.Sprintf("%#x", a), Kind: s.kind, Cache: cache, Waiters: []*TaskRef{}}
			switch s.kind {
			case KindMutex:
				if int(l.mutexWait.End()) > len(lb) {
					continue
				}
				owner := l.mutexOwner.U64(lb) &^ 7
				if owner == 0 {
					continue
				}
				lk.HeldBy = g.taskRef(l, owner)
				if lk.HeldBy == nil {
					implausible++ // a held mutex names its owner task
					continue
				}
				lk.Waiters = g.waiters(l, a+uint64(l.mutexWait.Off), l.mwList.Off, l.mwTask.Off)
			case KindRWSem:
				if int(l.rwWait.End()) > len(lb) {
					continue
				}
				count := l.rwCount.U64(lb)
				if count&1 == 0 && count>>8 == 0 {
					continue
				}
				owner := l.rwOwner.U64(lb)
				if count&1 != 0 {
					lk.HeldBy = g.taskRef(l, owner&^7)
				} else {
					lk.Readers = int(count >> 8)
				}
				if count&1 != 0 && lk.HeldBy == nil {
					implausible++ // a writer names itself
					continue
				}
				if lk.HeldBy == nil && owner&^7 != 0 {
					lk.Owner = fmt.Sprintf("%#x", owner&^7)
				}
				lk.Waiters = g.waiters(l, a+uint64(l.rwWait.Off), l.rwwList.Off, l.rwwTask.Off)
			case KindSpinlock:
				// qspinlock (fewer than 16K CPUs): the locked byte is 1,
				// the pending byte 0 or 1, the tail CPU + 1 in the top 14
				// bits.
				v := binary.LittleEndian.Uint32(lb[l.spinVal.Off:])
				if v&0xff == 0 {
					continue
				}
				if v&0xff != 1 || (v>>8)&0xff > 1 || int(v>>18) > len(g.cpus) {
					implausible++
					continue
				}
			}
			for _, w := range lk.Waiters {
				if w.PID < 0 {
					implausible++ // a wait list of tasks only
					lk.Kind = ""
				}
			}
			if lk.Kind == "" {
				continue
			}
			lk.In = in(s)
			out = append(out, lk)
		}
	}
	for n, m := range g.mark {
		nn := int32(n)
		if m == Unmarked || g.isFree(nn) || g.arr[nn] > 0 {
			continue
		}
		t := g.typ[nn]
		ls, ok := sites[t]
		if !ok {
			g.lockSites(g.ts.infos[t].t, 0, 0, &ls)
			sites[t] = ls
		}
		if len(ls) == 0 {
			continue
		}
		b := g.bytes(nn)
		ti := g.ts.info(t)
		cache := g.slabs[g.nodeSlab[nn]].Cache.Name
		for e := 0; e < max(int(g.arr[nn]), 1); e++ {
			eoff := uint32(e) * ti.size
			if int(eoff) >= len(b) {
				break
			}
			check(b[eoff:], g.addr(nn)+uint64(eoff), ls, func(s lockSite) string { return lockPath(ti.t, s) }, cache)
		}
	}
	for _, r := range g.roots {
		var ls []lockSite
		g.lockSites(r.typ, 0, 0, &ls)
		size, err := btf.Sizeof(r.typ)
		if len(ls) == 0 || err != nil || size > 1<<22 {
			continue
		}
		b := make([]byte, size)
		if g.k.ReadVirt(b, r.addr) != nil {
			continue
		}
		check(b, r.addr, ls, func(s lockSite) string { return r.name + " " + lockPath(r.typ, s) }, "")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out, implausible, nil
}

// FalseShare is an array findfalse reports.
type FalseShare struct {
	Address     string `json:"address"`
	In          string `json:"in"` // the member path, or the per-CPU variable
	Cache       string `json:"cache,omitempty"`
	Type        string `json:"type"` // the element type and count, "S[n]"
	ElementSize uint32 `json:"element_size"`
	TotalSize   uint32 `json:"total_size"`
	Primitive   string `json:"primitive"` // the synchronization primitive in each element
}

// cacheLine is x86-64's L1 line.
const cacheLine = 64

// falseArr is an array of a type that findfalse reports.
type falseArr struct {
	off, esize, n uint32
	elem          string
	prim          string
	et            btf.Type
}

// arrayPath is the member path of the array at off in t.
func arrayPath(t btf.Type, a falseArr) string {
	p := typeid.MemberPath(t, uint64(a.off))
	en := typeid.MemberPath(a.et, 0)
	if i := strings.IndexByte(en, '.'); i >= 0 {
		p = strings.TrimSuffix(p, en[i:])
	}
	return strings.TrimSuffix(p, "[0]")
}

// FindFalse lists the seed's candidates for false sharing: arrays (in
// typed objects, per-CPU variables, or objects the array pass typed)
// whose elements are structs smaller than a cache line, whose total size
// exceeds one, and whose element holds a lock, seqlock or wait queue
// head.
func (g *Graph) FindFalse() []FalseShare {
	memo := map[btf.Type][]falseArr{}
	var out []FalseShare
	for n, m := range g.mark {
		nn := int32(n)
		if m == Unmarked || g.isFree(nn) {
			continue
		}
		ti := g.ts.info(g.typ[nn])
		cache := g.slabs[g.nodeSlab[nn]].Cache.Name
		if g.arr[nn] > 0 {
			if prim := primitiveIn(ti.t, 0); prim != "" && ti.size < cacheLine && ti.size*uint32(g.arr[nn]) > cacheLine {
				out = append(out, FalseShare{Address: fmt.Sprintf("%#x", g.addr(nn)), In: g.typeName(nn) + " (array pass)", Cache: cache,
					Type: g.typeName(nn), ElementSize: ti.size, TotalSize: ti.size * uint32(g.arr[nn]), Primitive: prim})
			}
			continue
		}
		for _, a := range g.falseArrays(memo, ti.t) {
			out = append(out, FalseShare{Address: fmt.Sprintf("%#x", g.addr(nn)+uint64(a.off)), In: arrayPath(ti.t, a), Cache: cache,
				Type: fmt.Sprintf("%s[%d]", a.elem, a.n), ElementSize: a.esize, TotalSize: a.esize * a.n, Primitive: a.prim})
		}
	}
	for _, r := range g.roots {
		for _, a := range g.falseArrays(memo, r.typ) {
			out = append(out, FalseShare{Address: fmt.Sprintf("%#x", r.addr+uint64(a.off)), In: r.name + " " + arrayPath(r.typ, a),
				Type: fmt.Sprintf("%s[%d]", a.elem, a.n), ElementSize: a.esize, TotalSize: a.esize * a.n, Primitive: a.prim})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out
}

func (g *Graph) falseArrays(memo map[btf.Type][]falseArr, t btf.Type) []falseArr {
	if v, ok := memo[t]; ok {
		return v
	}
	var out []falseArr
	var walk func(t btf.Type, base uint32, depth int)
	walk = func(t btf.Type, base uint32, depth int) {
		if depth > maxDepth || len(out) > 1024 {
			return
		}
		switch c := btf.UnderlyingType(t).(type) {
		case *btf.Struct:
			for _, m := range c.Members {
				if m.BitfieldSize == 0 && m.Offset%8 == 0 {
					walk(m.Type, base+uint32(m.Offset.Bytes()), depth+1)
				}
			}
		case *btf.Union:
			for _, m := range c.Members {
				if m.BitfieldSize == 0 && m.Offset%8 == 0 {
					walk(m.Type, base+uint32(m.Offset.Bytes()), depth+1)
				}
			}
		case *btf.Array:
			es, err := btf.Sizeof(c.Type)
			if err != nil || es == 0 {
				return
			}
			st := structOf(c.Type)
			if st != nil && es < cacheLine && uint32(es)*c.Nelems > cacheLine {
				if prim := primitiveIn(c.Type, 0); prim != "" {
					out = append(out, falseArr{off: base, esize: uint32(es), n: c.Nelems, elem: typeName(c.Type), prim: prim, et: c.Type})
					return
				}
			}
			if st != nil {
				walk(c.Type, base, depth+1) // arrays within the first element are reported once
			}
		}
	}
	walk(t, 0, 0)
	memo[t] = out
	return out
}

// primitiveIn names the first synchronization primitive in t.
func primitiveIn(t btf.Type, depth int) string {
	if depth > maxDepth {
		return ""
	}
	if td, ok := t.(*btf.Typedef); ok && falseSharing[td.Name] {
		return td.Name
	}
	switch c := t.(type) {
	case *btf.Typedef:
		return primitiveIn(c.Type, depth+1)
	case *btf.Const:
		return primitiveIn(c.Type, depth+1)
	case *btf.Volatile:
		return primitiveIn(c.Type, depth+1)
	case *btf.Struct:
		if falseSharing[c.Name] {
			return c.Name
		}
		for _, m := range c.Members {
			if p := primitiveIn(m.Type, depth+1); p != "" {
				return p
			}
		}
	case *btf.Union:
		for _, m := range c.Members {
			if p := primitiveIn(m.Type, depth+1); p != "" {
				return p
			}
		}
	case *btf.Array:
		if c.Nelems > 0 {
			return primitiveIn(c.Type, depth+1)
		}
	}
	return ""
}

// typeName writes a type as C would, for an array's element.
func typeName(t btf.Type) string {
	if s := structOf(t); s != nil {
		if td, ok := t.(*btf.Typedef); ok {
			return td.Name
		}
		if s.Name != "" {
			return "struct " + s.Name
		}
		return "struct {…}"
	}
	return t.TypeName()
}
