// Package typeid identifies the types of kernel objects in a dump: what
// an address is (whattype) and, for heap objects, which struct it holds.
//
// Today a heap object's type comes from its cache where the cache holds
// one struct (CacheTypes: source "cache"); objects of the general and
// merged caches stay untyped until the type graph propagates types into
// them from the pointers of typed objects.
package typeid

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/internal/kbtf"
)

// Symbol is a kernel or module symbol.
type Symbol struct {
	Name, Module string
	Addr, Size   uint64 // Size 0: unknown
	Type         byte   // kallsyms letter
}

// Task is one task of the kernel.
type Task struct {
	Addr uint64 // task_struct
	PID  int
	Comm string
}

// Kernel is what type identification needs of a kernel view: what the
// slab walk needs, and symbols by address and the tasks.
type Kernel interface {
	slab.Kernel
	SymbolAt(addr uint64) (Symbol, bool)
	Tasks() ([]Task, error)
}

// What kinds of memory an address can be in.
const (
	KindSlab     = "slab object"
	KindStack    = "task stack"
	KindSymbol   = "kernel symbol"
	KindPerCPU   = "per-CPU variable"
	KindVmalloc  = "vmalloc"
	KindFreePage = "free page"
	KindPage     = "page"
	KindNone     = "not a heap object"
)

// Result is what whattype says of one address; its JSON is
// `kinst core DUMP whattype ADDR --json`.
type Result struct {
	Address string  `json:"address"`
	Kind    string  `json:"kind"`
	Cache   *string `json:"cache"`
	Object  *string `json:"object"`
	State   *string `json:"state"` // allocated or free
	Type    *string `json:"type"`
	Offset  *int64  `json:"offset"` // from the object's start
	Member  *string `json:"member"`
	Source  *string `json:"source"` // how the type was found: "cache", "percpu", "symbol" (the variable's BTF type), or the type graph's pass (core/typegraph)
	// How explains Source, or why there is no type.
	How    string `json:"how,omitempty"`
	Region string `json:"region,omitempty"` // within a slab slot: object, left red zone, metadata, slab tail
	Slab   string `json:"slab,omitempty"`   // the struct slab
	List   string `json:"list,omitempty"`   // where the kernel keeps the slab, if a CPU holds it
	// Symbol is SYM+0xOFF for an address in the kernel's or a module's
	// image.
	Symbol string   `json:"symbol,omitempty"`
	Task   *TaskRef `json:"task,omitempty"` // KindStack: whose stack
	CPU    *int     `json:"cpu,omitempty"`  // KindPerCPU: whose copy
	PFN    *uint64  `json:"pfn,omitempty"`  // KindFreePage, KindPage
	Detail string   `json:"detail,omitempty"`
	// With slub_debug=U (SLAB_STORE_USER), who last allocated and freed
	// the object.
	Allocated *TrackRef `json:"allocated_by,omitempty"`
	Freed     *TrackRef `json:"freed_by,omitempty"`
	// For a type the type graph found: the pointers it followed, from a
	// cache-typed object or a variable to this object, and the chains of
	// the pointers that contradict the type.
	Chain     []Step   `json:"chain,omitempty"`
	Conflicts [][]Step `json:"conflicts,omitempty"`
}

// Step is one pointer of a chain of type inference.
type Step struct {
	From   string `json:"from"`   // the object ("0x… (cache)") or variable holding the pointer
	Member string `json:"member"` // the pointer's member path in it
	To     string `json:"to"`     // the object pointed into, and the offset
	Type   string `json:"type"`   // the struct the pointer's type names
}

// TrackRef is one of slub_debug's tracks: the caller, the task, the CPU
// and the time in jiffies.
type TrackRef struct {
	Function string `json:"function"`
	PID      int    `json:"pid"`
	CPU      int    `json:"cpu"`
	Jiffies  uint64 `json:"jiffies"`
}

// TaskRef names a task.
type TaskRef struct {
	Address string `json:"address"`
	PID     int    `json:"pid"`
	Comm    string `json:"comm"`
}

// Identifier answers whattype for one kernel.
type Identifier struct {
	k     Kernel
	spec  *btf.Spec
	Heap  *slab.Heap
	types map[*slab.Cache]CacheType
	pcpu  *perCPU
}

// New prepares type identification over a heap.
func New(k Kernel, h *slab.Heap) (*Identifier, error) {
	spec, err := k.BTF()
	if err != nil {
		return nil, err
	}
	return &Identifier{k: k, spec: spec, Heap: h, types: CacheTypes(spec, h)}, nil
}

// Spec is the kernel's BTF.
func (id *Identifier) Spec() *btf.Spec { return id.spec }

// CacheType is the type the cache says its objects have.
func (id *Identifier) CacheType(c *slab.Cache) CacheType { return id.types[c] }

func ptr[T any](v T) *T { return &v }

// WhatType says what addr is: a slab object (its cache, the object's
// start and state, and its type and member where known), a task's
// stack, a kernel symbol, vmalloc space, a free or allocated page, or
// none of these.
func (id *Identifier) WhatType(addr uint64) (*Result, error) {
	r := &Result{Address: fmt.Sprintf("%#x", addr)}
	h := id.Heap
	o, err := h.Lookup(addr)
	switch {
	case err == nil:
		id.slabObject(r, o)
		return r, nil
	case !errors.Is(err, slab.ErrNotSlab):
		return nil, err
	}
	if t, ok := id.stackOf(addr); ok {
		r.Kind, r.Task = KindStack, t
		return r, nil
	}
	if cpu, v, off, ok := id.perCPUVar(addr); ok {
		r.Kind, r.CPU = KindPerCPU, &cpu
		r.Symbol = fmt.Sprintf("%s+%#x", v.Name, off)
		id.varType(r, v, off, "percpu")
		return r, nil
	}
	if s, ok := id.k.SymbolAt(addr); ok && (s.Size == 0 || addr-s.Addr < s.Size) {
		r.Kind = KindSymbol
		r.Symbol = fmt.Sprintf("%s+%#x", s.Name, addr-s.Addr)
		if s.Module != "" {
			r.Symbol += " [" + s.Module + "]"
		}
		r.Detail = fmt.Sprintf("type %c", s.Type)
		var v *btf.Var
		if s.Module == "" && id.spec.TypeByName(s.Name, &v) == nil {
			id.varType(r, v, addr-s.Addr, "symbol")
		}
		return r, nil
	}
	if vb, err := id.symbolValue("vmalloc_base"); err == nil && addr >= vb && addr < h.Vmemmap {
		r.Kind, r.Detail = KindVmalloc, "in vmalloc or ioremap space, not a task's stack"
		return r, nil
	}
	if h.InDirectMap(addr) {
		pg, err := h.PageAt(addr)
		if err != nil {
			return nil, err
		}
		r.PFN = &pg.PFN
		if pg.Free {
			r.Kind, r.Detail = KindFreePage, "the page's reference count is 0: free in the page allocator"
		} else {
			r.Kind, r.Detail = KindPage, fmt.Sprintf("an allocated page, not a slab (flags %#x): page cache, user memory, a large kmalloc or the kernel's own", pg.Flags)
		}
		return r, nil
	}
	r.Kind = KindNone
	return r, nil
}

func (id *Identifier) symbolValue(name string) (uint64, error) {
	a, err := id.k.SymbolAddr(name)
	if err != nil {
		return 0, err
	}
	var b [8]byte
	if err := id.k.ReadVirt(b[:], a); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (id *Identifier) slabObject(r *Result, o *slab.Object) {
	c := o.Slab.Cache
	r.Kind = KindSlab
	r.Cache = ptr(c.Name)
	r.Slab = fmt.Sprintf("%#x", o.Slab.Addr)
	r.Region = o.Region.String()
	if o.Slab.List == slab.CPUSlab {
		r.List = fmt.Sprintf("cpu %d slab", o.Slab.Where)
	}
	if o.Index < 0 {
		r.How = "past the slab's last object"
		return
	}
	r.Object = ptr(fmt.Sprintf("%#x", o.Addr))
	r.Offset = ptr(o.Offset)
	if o.Free {
		r.State = ptr("free")
	} else {
		r.State = ptr("allocated")
	}
	if alloc, free, err := id.Heap.Tracks(o); err == nil {
		r.Allocated, r.Freed = id.track(alloc), id.track(free)
	}
	ct := id.types[c]
	r.How = ct.How
	if ct.Type == nil {
		return
	}
	r.Type, r.Source = ptr(ct.Name), ptr("cache")
	if o.Region == slab.InObject {
		r.Member = ptr(MemberPath(ct.Type, uint64(o.Offset)))
	}
}

func (id *Identifier) track(t slab.Track) *TrackRef {
	if t.Addr == 0 {
		return nil
	}
	fn := fmt.Sprintf("%#x", t.Addr)
	if s, ok := id.k.SymbolAt(t.Addr); ok {
		fn = fmt.Sprintf("%s+%#x", s.Name, t.Addr-s.Addr)
	}
	return &TrackRef{Function: fn, PID: t.PID, CPU: t.CPU, Jiffies: t.When}
}

// varType sets the type and member of an address off bytes into a
// variable whose type BTF gives.
func (id *Identifier) varType(r *Result, v *btf.Var, off uint64, source string) {
	name := typeName(v.Type)
	if name == "" {
		return
	}
	r.Type, r.Source, r.Offset = ptr(name), ptr(source), ptr(int64(off))
	r.Member = ptr(MemberPath(v.Type, off))
	r.How = fmt.Sprintf("BTF variable %s", v.Name)
}

// perCPU is the static per-CPU variables: the BTF section .data..percpu
// (its offsets from __per_cpu_start), sorted by offset.
type perCPU struct {
	start uint64
	size  uint64
	vars  []btf.VarSecinfo
	offs  []uint64
}

func (id *Identifier) perCPUSection() *perCPU {
	if id.pcpu != nil {
		return id.pcpu
	}
	id.pcpu = &perCPU{}
	offs, err := id.k.PerCPUOffsets()
	if err != nil {
		return id.pcpu
	}
	if a, err := id.k.SymbolAddr("__per_cpu_start"); err == nil {
		id.pcpu.start = a
	}
	var ds *btf.Datasec
	if id.spec.TypeByName(".data..percpu", &ds) != nil {
		return id.pcpu
	}
	id.pcpu.size, id.pcpu.offs = uint64(ds.Size), offs
	id.pcpu.vars = append([]btf.VarSecinfo(nil), ds.Vars...)
	sort.Slice(id.pcpu.vars, func(i, j int) bool { return id.pcpu.vars[i].Offset < id.pcpu.vars[j].Offset })
	return id.pcpu
}

// perCPUVar finds the static per-CPU variable whose copy on some CPU
// holds addr (its area is __per_cpu_offset[cpu] + __per_cpu_start).
func (id *Identifier) perCPUVar(addr uint64) (int, *btf.Var, uint64, bool) {
	p := id.perCPUSection()
	for cpu, off := range p.offs {
		rel := addr - off - p.start
		if addr < off+p.start || rel >= p.size {
			continue
		}
		i := sort.Search(len(p.vars), func(i int) bool { return uint64(p.vars[i].Offset) > rel }) - 1
		if i < 0 {
			continue
		}
		vs := p.vars[i]
		v, ok := vs.Type.(*btf.Var)
		if !ok || rel >= uint64(vs.Offset)+uint64(vs.Size) {
			continue
		}
		return cpu, v, rel - uint64(vs.Offset), true
	}
	return 0, nil, 0, false
}

// threadSize is the kernel stack's size: __end_init_task less
// __start_init_task (init's stack is THREAD_SIZE long), else 16 KiB,
// x86-64's THREAD_SIZE without KASAN.
func (id *Identifier) threadSize() uint64 {
	s, err1 := id.k.SymbolAddr("__start_init_task")
	e, err2 := id.k.SymbolAddr("__end_init_task")
	if err1 == nil && err2 == nil && e > s && e-s <= 1<<20 {
		return e - s
	}
	return 16 << 10
}

// stackOf finds the task whose kernel stack holds addr.
func (id *Identifier) stackOf(addr uint64) (*TaskRef, bool) {
	st, err := id.spec.AnyTypeByName("task_struct")
	if err != nil {
		return nil, false
	}
	m, ok := kbtf.Member(st, "stack")
	if !ok {
		return nil, false
	}
	tasks, _ := id.k.Tasks()
	size := id.threadSize()
	for _, t := range tasks {
		var b [8]byte
		if id.k.ReadVirt(b[:], t.Addr+uint64(m.Offset.Bytes())) != nil {
			continue
		}
		base := binary.LittleEndian.Uint64(b[:])
		if base != 0 && addr >= base && addr < base+size {
			return &TaskRef{Address: fmt.Sprintf("%#x", t.Addr), PID: t.PID, Comm: t.Comm}, true
		}
	}
	return nil, false
}
