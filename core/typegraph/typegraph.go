// Package typegraph types the objects of a kernel's heap that their
// caches do not: the type graph of Cantrill's "Postmortem Object Type
// Identification" (mdb's ::typegraph) over the SLUB heap of core/slab,
// with every type and offset from the kernel's BTF.
//
// Nodes are the allocated objects of every slab cache. Known types come
// from the caches that hold one struct (typeid.CacheTypes: task_struct,
// dentry, filp's file, …) and from the static per-CPU variables and
// other variables BTF types (the roots). Each typed object's pointer
// members, flattened through embedded structs, arrays and unions, are
// read; a pointer that lands in an allocated object makes a claim on
// it: "a struct S lies at offset o of this object". The claims decide
// the types of the objects no cache types (kmalloc-*, kmalloc-cg-*,
// merged caches, caches whose struct is not known, and caches held out
// with Options.HoldOut), in the seed's passes; each pass marks only
// objects the earlier ones left unmarked, and every object a pass marks
// is then propagated from by the conservative rule:
//
//  1. conservative: a pointer to struct S, not in a union and not to a
//     list or tree node, at the object's start, where S fits the object
//     (a kmalloc cache's object holds a struct larger than the next
//     smaller kmalloc size; another cache's within its alignment;
//     a struct ending in a flexible array or run-time-sized member holds
//     at least the part before it). These types are "known" when the
//     chain starts at a cache type or a root.
//  2. arrays: an object claimed as a struct S too small for it, at a
//     multiple of sizeof(S), whose every would-be element holds only
//     null or kernel pointers in S's pointer members (and at least one
//     beyond the first element holds one) is S[n], n = object size /
//     sizeof(S), unless a struct that fits the object holds S at the
//     claimed offset (task_struct.vfork_done points at the completion
//     at 0x40 of a struct kthread, not into an array of completions). Flexible array members are read in every pass: a typed
//     object longer than its struct has its tail read as elements.
//  3. coalescence: an object with claims of several types or offsets is
//     the one struct that fits it and holds every claimed struct at its
//     offset (as a tcp_sock holds sock and sock_common at 0), if exactly
//     one does.
//  4. inference: the rest, from each claim's candidates: the claimed
//     struct itself, if it fits, or the structs that embed it at the
//     claimed offset and fit (so a pointer into the middle of an object
//     types it when the member fits); claims through unions count here.
//     Pointers to list_head, hlist_node, rb_node and the like point into
//     whatever embeds the node. 6.1's BTF says no list's owner type (no
//     decl tags), so the rule is: if the pointing object's own struct
//     has a node of that kind at the target offset and fits the target,
//     the target is that struct (sibling lists: task_struct.children
//     links the children's sibling members, a list of dentries links
//     d_child to d_child); otherwise the containers are the structs with
//     such a node at that offset whose size fits the target's cache, and
//     a single one is taken. A candidate must hold, at every offset a
//     typed pointer outside a union claims, the struct that pointer
//     names (a list sibling rule never overrides a struct device *
//     pointing into the middle of the object). An object takes the
//     candidate most claims agree on alone; a tie leaves it unmarked.
//     Typed pointers decide first, to a fixpoint, then one round with
//     the list nodes too, and so on until a round marks nothing; from
//     the first such round, propagation follows a list of the pointing
//     object's own struct to its end at once.
//
// Beyond the seed's rules, each read as a typed pointer is: a member
// S ** claims an array of pointers to S (the pseudo struct "S *", typed
// S *[n] by the arrays pass); the LSMs' void * security members point
// at blobs laid out as the dump's blob sizes say (lsm.go); heads of
// lists and trees whose entries the kernel fixes point at the entry's
// node (listOwners), an xarray's internal entries at its xa_nodes, the
// maple tree of mm_struct.mm_mt at its VMAs (maple.go); and a typed
// pointer into the kernel image's data reads the struct there as a
// further root (static.go).
//
// A claim that contradicts an object's type (a pointer to S at an
// offset where the object's type holds no S) is a conflict: counted
// per object, and kept with the chain of inference of both the type and
// the contradicting claim (Graph.Conflicts), as the seed suggests for
// finding use-after-free and type confusion.
package typegraph

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/typeid"
)

// Options tune a graph.
type Options struct {
	// HoldOut names caches whose types the graph treats as unknown: their
	// objects are typed by inference only and checked against the cache's
	// own type (Report.HeldOut).
	HoldOut []string
	// ByHand sets the types of objects (istype): each address must be an
	// allocated object's start, each type a BTF struct. They are known
	// types as the caches' are, and the passes run from them.
	ByHand []ByHand
}

// ByHand is one type set by hand.
type ByHand struct {
	Addr uint64
	Type string
}

// Mark says how an object got its type.
type Mark uint8

const (
	Unmarked    Mark = iota
	ByCache          // its cache holds one struct
	Known            // conservative propagation from known types
	Conjectured      // a later pass, or propagation from a conjecture
	Hand             // set by hand (Options.ByHand)
)

// Pass names, in the order they run.
const (
	PassCache        = "cache"
	PassConservative = "conservative"
	PassArrays       = "arrays"
	PassCoalescence  = "coalescence"
	PassInference    = "inference"
)

var passNames = []string{PassCache, PassConservative, PassArrays, PassCoalescence, PassInference}

const (
	flagLink uint8 = 1 << iota
	flagUnion
)

// claim is one pointer into an object of unknown type.
type claim struct {
	tgt    int32  // the node pointed into
	src    int32  // the pointing node, or -1-root
	srcOff uint32 // the pointer's offset in its source
	toff   uint32 // offset in the target
	typ    int32  // the pointed-at struct
	flags  uint8
	next   int32 // next claim on the same node
}

// root is a variable typed by BTF.
type root struct {
	name string
	addr uint64
	typ  btf.Type
	mark Mark // Known, or Conjectured for static data reached from a conjecture
}

// Graph is a heap typed by propagation.
type Graph struct {
	k    slab.Kernel
	spec *btf.Spec
	heap *slab.Heap
	ts   *types

	slabs     []*slab.Slab
	first     []int32 // node index of each slab's object 0
	pfnSlab   []int32
	pfnBase   uint64
	cacheIdx  map[*slab.Cache]int
	caches    []*cacheInfo
	nodeSlab  []int32
	mem       [][]byte // each slab's bytes, read on demand
	readFails int

	typ     []int32 // node → struct type id, -1 none
	arr     []int32 // node → array length (0: not an array)
	mark    []Mark
	pass    []uint8 // node → index in passNames of the pass that marked it
	from    []int32 // node → the claim that typed it (-1: its cache)
	head    []int32 // node → first pending claim
	claims  []claim
	roots   []root
	conf    map[int32][]int32 // node → claims that contradict its type
	queue   []int32
	curPass uint8
	mt      maple
	static  staticData
	rootq   []int32 // static roots to read
	lsm     []lsmBlob
	chase   bool // claims of list nodes of the pointing struct decide at once
	cpus    []uint64

	objects  int
	rep      Report
	held     map[*slab.Cache]typeid.CacheType
	trueType map[*slab.Cache]int32
}

// cacheInfo is a cache as the graph sees it.
type cacheInfo struct {
	c       *slab.Cache
	typ     int32 // from the cache, -1 if the graph is to infer its objects'
	kmalloc bool
	lo      uint32 // a kmalloc cache's objects are larger than this
}

// kmallocSizes are the kmalloc caches' sizes (KMALLOC_MIN_SIZE 8).
var kmallocSizes = []uint32{8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152}

func isKmalloc(name string) bool {
	for _, p := range []string{"kmalloc-", "dma-kmalloc-"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Build walks the heap if not yet walked and runs every pass. types are
// the caches' own types (typeid.CacheTypes).
func Build(k slab.Kernel, h *slab.Heap, ctypes map[*slab.Cache]typeid.CacheType, opt Options) (*Graph, error) {
	spec, err := k.BTF()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := h.Walk(); err != nil {
		return nil, err
	}
	g := &Graph{k: k, spec: spec, heap: h, ts: newTypes(), cacheIdx: map[*slab.Cache]int{},
		conf: map[int32][]int32{}, held: map[*slab.Cache]typeid.CacheType{}, trueType: map[*slab.Cache]int32{}}
	for _, name := range opt.HoldOut {
		c, ok := h.Cache(name)
		if !ok {
			return nil, fmt.Errorf("hold-out: no cache %q", name)
		}
		g.held[c] = ctypes[c]
	}
	g.initLSM()
	g.initOwners()
	g.initStatic()
	g.index(ctypes)
	g.initMaple()
	if err := g.seed(t0, opt.ByHand); err != nil {
		return nil, err
	}
	g.run(PassConservative, func() {})
	g.run(PassArrays, g.arrays)
	g.run(PassCoalescence, g.coalesce)
	g.run(PassInference, g.infer)
	g.report()
	return g, nil
}

// index numbers every object and maps pages to slabs.
func (g *Graph) index(ctypes map[*slab.Cache]typeid.CacheType) {
	h := g.heap
	n := int32(0)
	for _, c := range h.Caches {
		ci := &cacheInfo{c: c, typ: -1}
		ct := ctypes[c]
		if _, held := g.held[c]; held {
			if st, ok := ct.Type.(*btf.Struct); ok {
				g.trueType[c] = g.ts.id(st)
			}
		} else if st, ok := ct.Type.(*btf.Struct); ok {
			ci.typ = g.ts.id(st)
		}
		if ct.Type == nil {
			// An LSM blob cache holds the blob its name says.
			if t := g.lsmCacheType(c.Name, c.ObjectSize, len(c.Aliases)); t >= 0 {
				if _, held := g.held[c]; held {
					g.trueType[c] = t
				} else {
					ci.typ = t
				}
			}
		}
		if isKmalloc(c.Name) {
			ci.kmalloc = true
			for _, s := range kmallocSizes {
				if s >= c.ObjectSize {
					break
				}
				ci.lo = s
			}
		}
		g.cacheIdx[c] = len(g.caches)
		g.caches = append(g.caches, ci)
		for _, s := range c.Slabs {
			g.slabs = append(g.slabs, s)
			g.first = append(g.first, n)
			n += int32(s.Objects)
		}
	}
	g.pfnBase = h.PageOffset
	g.pfnSlab = make([]int32, h.MaxPFN)
	for i := range g.pfnSlab {
		g.pfnSlab[i] = -1
	}
	g.nodeSlab = make([]int32, n)
	for si, s := range g.slabs {
		pages := (uint64(s.Objects)*uint64(s.Cache.Size) + uint64(s.Cache.RedLeftPad) + 4095) / 4096
		for p := uint64(0); p < pages && s.PFN+p < uint64(len(g.pfnSlab)); p++ {
			g.pfnSlab[s.PFN+p] = int32(si)
		}
		for i := 0; i < s.Objects; i++ {
			g.nodeSlab[g.first[si]+int32(i)] = int32(si)
		}
	}
	g.mem = make([][]byte, len(g.slabs))
	g.typ = make([]int32, n)
	g.arr = make([]int32, n)
	g.mark = make([]Mark, n)
	g.pass = make([]uint8, n)
	g.from = make([]int32, n)
	g.head = make([]int32, n)
	for i := range g.typ {
		g.typ[i], g.from[i], g.head[i] = -1, -1, -1
	}
}

// node finds the allocated object holding a kernel address: its node
// and the offset in it.
func (g *Graph) node(a uint64) (int32, uint32, bool) {
	if a < g.pfnBase {
		return 0, 0, false
	}
	pfn := (a - g.pfnBase) >> 12
	if pfn >= uint64(len(g.pfnSlab)) {
		return 0, 0, false
	}
	si := g.pfnSlab[pfn]
	if si < 0 {
		return 0, 0, false
	}
	s := g.slabs[si]
	c := s.Cache
	start := s.Base + uint64(c.RedLeftPad)
	if a < start {
		return 0, 0, false
	}
	d := a - start
	i := d / uint64(c.Size)
	off := d % uint64(c.Size)
	if i >= uint64(s.Objects) || off >= uint64(c.ObjectSize) || s.Free(int(i)) {
		return 0, 0, false
	}
	return g.first[si] + int32(i), uint32(off), true
}

// Addr is a node's object address.
func (g *Graph) addr(n int32) uint64 {
	si := g.nodeSlab[n]
	return g.slabs[si].Object(int(n - g.first[si]))
}

func (g *Graph) cacheOf(n int32) *cacheInfo {
	return g.caches[g.cacheIdx[g.slabs[g.nodeSlab[n]].Cache]]
}

// bytes reads a node's object.
func (g *Graph) bytes(n int32) []byte {
	si := g.nodeSlab[n]
	s := g.slabs[si]
	c := s.Cache
	if g.mem[si] == nil {
		b := make([]byte, uint64(s.Objects)*uint64(c.Size)+uint64(c.RedLeftPad))
		if err := g.k.ReadVirt(b, s.Base); err != nil {
			g.readFails++
			b = b[:0]
		}
		g.mem[si] = b
	}
	b := g.mem[si]
	off := uint64(c.RedLeftPad) + uint64(n-g.first[si])*uint64(c.Size)
	if off+uint64(c.ObjectSize) > uint64(len(b)) {
		ob := make([]byte, c.ObjectSize)
		if err := g.k.ReadVirt(ob, s.Base+off); err != nil {
			return nil
		}
		return ob
	}
	return b[off : off+uint64(c.ObjectSize)]
}

// fits says whether struct t can be the type of node n's object.
func (g *Graph) fits(ci *cacheInfo, t int32) bool {
	if t == g.ts.str {
		return false // only by its bytes: isString
	}
	ti := g.ts.info(t)
	if ti.ptrTo >= 0 {
		return false // a pointer array: the arrays pass decides
	}
	os := ci.c.ObjectSize
	if ti.size == os {
		return true
	}
	if ti.tail > 0 && ti.tail <= os {
		// A run-time sized tail: the object holds the struct up to it.
		return !ci.kmalloc || ti.size > ci.lo || ti.tail > ci.lo || ti.flexSize > 0
	}
	switch {
	case ti.size > os || ti.size == 0:
		return false
	case ci.kmalloc:
		return ti.size > ci.lo
	}
	// A merged cache's objects are within the slot's alignment of its
	// size (find_mergeable refuses a cache a pointer's size smaller).
	slack := max(uint32(16), ci.c.Align) + 8
	return ti.size+slack > ci.c.Size
}

// seed types the objects of the caches that hold one struct and reads
// the roots.
func (g *Graph) seed(t0 time.Time, hand []ByHand) error {
	for n := range g.typ {
		ci := g.cacheOf(int32(n))
		s := g.slabs[g.nodeSlab[n]]
		if s.Free(int(int32(n) - g.first[g.nodeSlab[n]])) {
			continue
		}
		g.objects++
		if ci.typ >= 0 {
			g.typ[n], g.mark[n] = ci.typ, ByCache
			g.queue = append(g.queue, int32(n))
		}
	}
	for _, bh := range hand {
		n, off, ok := g.node(bh.Addr)
		if !ok || off != 0 {
			return fmt.Errorf("istype: %#x is not the start of an allocated slab object", bh.Addr)
		}
		var st *btf.Struct
		if err := g.spec.TypeByName(bh.Type, &st); err != nil {
			return fmt.Errorf("istype: struct %s: %w", bh.Type, err)
		}
		if g.mark[n] == ByCache {
			return fmt.Errorf("istype: %#x is a %s by its cache already", bh.Addr, g.typeName(n))
		}
		g.typ[n], g.mark[n], g.arr[n] = g.ts.id(st), Hand, 0
		g.queue = append(g.queue, n)
	}
	g.findRoots()
	g.curPass = 1 // what the variables point at is typed as the conservative pass would
	for r := range g.roots {
		g.scanRoot(int32(r))
	}
	g.snapshot(PassCache, time.Since(t0))
	return nil
}

// findRoots lists the per-CPU variables (each CPU's copy), the other
// variables BTF's data sections type, and the knownStatics.
func (g *Graph) findRoots() {
	offs, _ := g.k.PerCPUOffsets()
	pstart, perr := g.k.SymbolAddr("__per_cpu_start")
	for typ, err := range g.spec.All() {
		if err != nil {
			break
		}
		ds, ok := typ.(*btf.Datasec)
		if !ok {
			continue
		}
		for _, vs := range ds.Vars {
			v, ok := vs.Type.(*btf.Var)
			if !ok {
				continue
			}
			if ds.Name == ".data..percpu" {
				if perr != nil {
					continue
				}
				for cpu, off := range offs {
					g.roots = append(g.roots, root{name: fmt.Sprintf("%s (cpu %d)", v.Name, cpu), addr: pstart + off + uint64(vs.Offset), typ: v.Type})
				}
				continue
			}
			a, err := g.k.SymbolAddr(v.Name)
			if err != nil {
				continue
			}
			g.roots = append(g.roots, root{name: v.Name, addr: a, typ: v.Type})
		}
	}
	seen := map[uint64]bool{}
	for _, r := range g.roots {
		seen[r.addr] = true
	}
	for _, r := range g.staticRoots() {
		if !seen[r.addr] {
			g.roots = append(g.roots, r)
		}
	}
}

func (g *Graph) scanRoot(r int32) {
	rt := g.roots[r]
	var sl []slot
	g.ts.flatten(rt.typ, 0, false, 0, &sl)
	if len(sl) == 0 {
		return
	}
	size, err := btf.Sizeof(rt.typ)
	if err != nil || size <= 0 || size > 1<<22 {
		return
	}
	b := make([]byte, size)
	if g.k.ReadVirt(b, rt.addr) != nil {
		return
	}
	m := rt.mark
	if m == Unmarked {
		m = Known
	}
	g.scanSlots(-1-r, b, sl, 0, -1, m)
}

// scan reads node n's pointers by its type.
func (g *Graph) scan(n int32) {
	t := g.typ[n]
	if t < 0 {
		return
	}
	b := g.bytes(n)
	if b == nil {
		return
	}
	ti := g.ts.info(t)
	m := g.mark[n]
	if m == ByCache || m == Hand {
		m = Known
	}
	elems := max(int(g.arr[n]), 1)
	for e := 0; e < elems; e++ {
		g.scanSlots(n, b, ti.slots, uint32(e)*ti.size, t, m)
	}
	if g.mt.ok {
		g.scanMaple(n, b, t, m)
	}
	if ti.flexSize > 0 && g.arr[n] == 0 {
		if fo := ti.tail; fo < uint32(len(b)) {
			for o := fo; o+ti.flexSize <= uint32(len(b)) && o-fo < 1<<16; o += ti.flexSize {
				g.scanSlots(n, b, ti.flexSlots, o, t, m)
			}
		}
	}
}

// scanSlots makes the claims of the pointers sl at base in b.
func (g *Graph) scanSlots(src int32, b []byte, sl []slot, base uint32, srcType int32, m Mark) {
	for _, s := range sl {
		o := base + s.off
		if int(o)+8 > len(b) {
			continue
		}
		v := binary.LittleEndian.Uint64(b[o:])
		if v < 0xffff800000000000 {
			continue
		}
		var tn int32
		var toff uint32
		var ok bool
		switch {
		case s.owned:
			tn, toff, ok = g.ownedTarget(src, s, v)
		case s.xa:
			tn, toff, ok = g.xaTarget(v)
		default:
			tn, toff, ok = g.node(v)
		}
		if !ok && !s.owned && !s.xa && !s.link && !s.union && s.target != g.ts.str {
			g.staticRoot(v, s.target, src, o, m)
		}
		if !ok || tn == src {
			continue
		}
		var fl uint8
		if s.link {
			fl |= flagLink
		}
		if s.union {
			fl |= flagUnion
		}
		g.claim(claim{tgt: tn, src: src, srcOff: o, toff: toff, typ: s.target, flags: fl}, srcType, m)
	}
}

// claim records a pointer into node c.tgt and applies the conservative
// rule to it.
func (g *Graph) claim(c claim, srcType int32, m Mark) {
	n := c.tgt
	decisive := c.flags == 0
	if g.mark[n] != Unmarked {
		// A char * may point at any bytes (a char array member, a
		// buffer): it contradicts no type.
		if decisive && c.typ != g.ts.str && !g.consistent(n, c.typ, c.toff) {
			ci := int32(len(g.claims))
			c.next = -1
			g.claims = append(g.claims, c)
			g.conf[n] = append(g.conf[n], ci)
		}
		return
	}
	ci := int32(len(g.claims))
	c.next = g.head[n]
	g.claims = append(g.claims, c)
	g.head[n] = ci
	if decisive && c.toff == 0 && g.fits(g.cacheOf(n), c.typ) {
		g.set(n, c.typ, 0, m, ci)
		return
	}
	if decisive && c.toff == 0 && c.typ == g.ts.str && g.isString(n) {
		g.set(n, c.typ, int32(g.cacheOf(n).c.ObjectSize), m, ci)
		return
	}
	// Once the inference follows lists, a list of the pointing object's
	// own struct is followed to its end at once (a directory's 100,000
	// dentries are not 100,000 rounds).
	if g.chase && c.flags == flagLink && srcType >= 0 && c.src >= 0 && g.arr[c.src] == 0 {
		ti := g.ts.info(srcType)
		if ti.size > c.toff && g.ts.holdsAt(srcType, c.typ, c.toff) && g.fits(g.cacheOf(n), srcType) && g.agrees(n, srcType) {
			g.set(n, srcType, 0, Conjectured, ci)
		}
	}
}

// isString says whether node n holds a C string from its start: at
// least one printable character, then a NUL within the object. A char *
// at a heap object points at a string (a name kstrdup made) or at a
// byte buffer; only the first is typed.
func (g *Graph) isString(n int32) bool {
	b := g.bytes(n)
	for i, c := range b {
		switch {
		case c == 0:
			return i > 0
		case c < 0x20 && c != '\t' && c != '\n', c > 0x7e:
			return false
		}
	}
	return false
}

// consistent says whether node n's type holds struct t at off.
func (g *Graph) consistent(n int32, t int32, off uint32) bool {
	nt := g.typ[n]
	ti := g.ts.info(nt)
	if g.arr[n] > 0 && ti.size > 0 {
		off %= ti.size
	} else if ti.flexSize > 0 && off >= ti.tail {
		return true // in the flexible tail: not checked
	}
	if off >= ti.size {
		return ti.tail > 0 // a run-time sized tail
	}
	return g.ts.holdsAt(nt, t, off)
}

// set types node n and queues it to be read.
func (g *Graph) set(n int32, t int32, arr int32, m Mark, from int32) {
	g.typ[n], g.arr[n], g.mark[n], g.pass[n], g.from[n] = t, arr, m, g.curPass, from
	g.queue = append(g.queue, n)
}

// propagate reads every queued node in the order queued (breadth
// first: the shortest chains), conservatively typing what its pointers
// reach, until nothing is left.
func (g *Graph) propagate() {
	for i, j := 0, 0; i < len(g.queue) || j < len(g.rootq); {
		if i < len(g.queue) {
			g.scan(g.queue[i])
			i++
			continue
		}
		g.scanRoot(g.rootq[j])
		j++
	}
	g.queue, g.rootq = g.queue[:0], g.rootq[:0]
}

// run runs one pass and the propagation from what it typed.
func (g *Graph) run(name string, pass func()) {
	t0 := time.Now()
	for i, p := range passNames {
		if p == name {
			g.curPass = uint8(i)
		}
	}
	pass()
	g.propagate()
	g.snapshot(name, time.Since(t0))
}

// claimsOf lists node n's pending claims.
func (g *Graph) claimsOf(n int32) []int32 {
	var out []int32
	for c := g.head[n]; c >= 0; c = g.claims[c].next {
		out = append(out, c)
	}
	return out
}

// arrays is pass 2.
func (g *Graph) arrays() {
	for n := range g.mark {
		if g.mark[n] != Unmarked || g.head[n] < 0 {
			continue
		}
		ci := g.cacheOf(int32(n))
		for _, c := range g.claimsOf(int32(n)) {
			cl := g.claims[c]
			if cl.flags != 0 {
				continue
			}
			ti := g.ts.info(cl.typ)
			if ti.size == 0 || ti.size*2 > ci.c.ObjectSize || cl.toff%ti.size != 0 || ti.flexSize > 0 {
				continue
			}
			if ti.ptrTo < 0 && g.embedded(ci, cl.typ, cl.toff) {
				continue // a struct that holds S there explains the pointer as well
			}
			if g.looksArray(int32(n), ti) && (ti.ptrTo < 0 || g.ptrsAgree(int32(n), ti.ptrTo)) {
				g.set(int32(n), cl.typ, int32(ci.c.ObjectSize/ti.size), Conjectured, c)
				break
			}
		}
	}
}

// embedded says whether a struct that fits the cache holds struct t at
// off.
func (g *Graph) embedded(ci *cacheInfo, t int32, off uint32) bool {
	for _, e := range g.ts.embedders(g.spec, t, off) {
		if g.fits(ci, e) {
			return true
		}
	}
	return false
}

// looksArray checks the array hypothesis: every element's pointer
// members hold null or a kernel address, and some element past the
// first holds one.
func (g *Graph) looksArray(n int32, ti *tinfo) bool {
	b := g.bytes(n)
	if b == nil {
		return false
	}
	var plain int
	for _, s := range ti.slots {
		if !s.union {
			plain++
		}
	}
	if plain == 0 {
		return false
	}
	seen := false
	for base := uint32(0); base+ti.size <= uint32(len(b)); base += ti.size {
		for _, s := range ti.slots {
			if s.union {
				continue
			}
			v := binary.LittleEndian.Uint64(b[base+s.off:])
			if v == 0 {
				continue
			}
			if v < 0xffff800000000000 {
				return false
			}
			if base > 0 {
				seen = true
			}
		}
	}
	return seen
}

// ptrsAgree checks a pointer array's elements against what they point
// into: each that lands in a typed object must land on a struct elem
// there (the file pointers of an fdtable land on files).
func (g *Graph) ptrsAgree(n int32, elem int32) bool {
	b := g.bytes(n)
	for o := 0; o+8 <= len(b); o += 8 {
		v := binary.LittleEndian.Uint64(b[o:])
		if v == 0 {
			continue
		}
		if t, toff, ok := g.node(v); ok && g.mark[t] != Unmarked && !g.consistent(t, elem, toff) {
			return false
		}
	}
	return true
}

// candidates are the structs claim c may mean for its target.
func (g *Graph) candidates(ci *cacheInfo, c *claim) []int32 {
	var out []int32
	if c.flags&flagLink != 0 {
		// Sibling lists: the pointing object's own struct, if it has
		// such a node at the target offset and fits the target.
		if st := g.srcType(c); st >= 0 && g.ts.info(st).size > c.toff && g.ts.holdsAt(st, c.typ, c.toff) && g.fits(ci, st) {
			return []int32{st}
		}
	} else if c.toff == 0 && g.fits(ci, c.typ) {
		out = append(out, c.typ)
	}
	for _, e := range g.ts.embedders(g.spec, c.typ, c.toff) {
		if g.fits(ci, e) {
			out = append(out, e)
		}
	}
	return out
}

// srcType is the struct of a claim's pointing object, -1 for a variable.
func (g *Graph) srcType(c *claim) int32 {
	if c.src < 0 {
		return -1
	}
	st := g.typ[c.src]
	if st >= 0 && g.arr[c.src] > 0 {
		return -1
	}
	return st
}

// coalesce is pass 3.
func (g *Graph) coalesce() {
	for n := range g.mark {
		if g.mark[n] != Unmarked || g.head[n] < 0 {
			continue
		}
		cs := g.claimsOf(int32(n))
		type key struct {
			t   int32
			off uint32
		}
		distinct := map[key]bool{}
		for _, c := range cs {
			if g.claims[c].flags == 0 {
				distinct[key{g.claims[c].typ, g.claims[c].toff}] = true
			}
		}
		if len(distinct) < 2 {
			continue
		}
		ci := g.cacheOf(int32(n))
		var first *claim
		var firstIdx int32
		for _, c := range cs {
			if g.claims[c].flags == 0 {
				first, firstIdx = &g.claims[c], c
				break
			}
		}
		var pick int32 = -1
		ok := true
		for _, cand := range g.candidates(ci, first) {
			all := true
			for k := range distinct {
				if !g.ts.holdsAt(cand, k.t, k.off) {
					all = false
					break
				}
			}
			if all {
				if pick >= 0 && pick != cand {
					ok = false
				}
				pick = cand
			}
		}
		if ok && pick >= 0 {
			g.set(int32(n), pick, 0, Conjectured, firstIdx)
		}
	}
}

// infer is pass 4, repeated until it types nothing.
func (g *Graph) infer() {
	// Typed pointers first, to a fixpoint; then one round with the list
	// and tree nodes too, and again.
	var pending []int32
	for round, links := 0, false; round < 256; round++ {
		// The unmarked objects with claims (new claims arrive as each
		// round's types propagate).
		pending = pending[:0]
		for n := range g.mark {
			if g.mark[n] == Unmarked && g.head[n] >= 0 {
				pending = append(pending, int32(n))
			}
		}
		marked := g.inferRound(pending, links)
		if marked > 0 {
			g.propagate()
			links = false
			continue
		}
		if links {
			return
		}
		links, g.chase = true, true
	}
}

// inferRound types the unmarked objects whose claims agree on one
// struct; with links false, the claims of list and tree nodes are left
// out.
func (g *Graph) inferRound(pending []int32, links bool) int {
	marked := 0
	{
		for _, n := range pending {
			ci := g.cacheOf(n)
			votes := map[int32]int{}
			by := map[int32]int32{}
			for c := g.head[n]; c >= 0; c = g.claims[c].next {
				if !links && g.claims[c].flags&flagLink != 0 {
					continue
				}
				cands := g.candidates(ci, &g.claims[c])
				// A candidate must hold what every typed pointer outside
				// a union says is at its offset.
				cands = slices.DeleteFunc(cands, func(t int32) bool { return !g.agrees(n, t) })
				if len(cands) != 1 {
					continue
				}
				votes[cands[0]]++
				if _, ok := by[cands[0]]; !ok {
					by[cands[0]] = c
				}
			}
			best, bestN, tie := int32(-1), 0, false
			for t, v := range votes {
				switch {
				case v > bestN:
					best, bestN, tie = t, v, false
				case v == bestN:
					tie = true
				}
			}
			if best >= 0 && !tie {
				g.set(n, best, 0, Conjectured, by[best])
				marked++
			}
		}
	}
	return marked
}

// agrees says whether struct t holds, at each offset of node n that a
// pointer outside a union claims, the struct that pointer names.
func (g *Graph) agrees(n, t int32) bool {
	for c := g.head[n]; c >= 0; c = g.claims[c].next {
		cl := &g.claims[c]
		if cl.flags != 0 {
			continue
		}
		if cl.toff >= g.ts.info(t).size {
			if g.ts.info(t).tail == 0 {
				return false
			}
			continue
		}
		if !g.ts.holdsAt(t, cl.typ, cl.toff) {
			return false
		}
	}
	return true
}

// snapshot records the counts after a pass.
func (g *Graph) snapshot(name string, d time.Duration) {
	p := PassReport{Pass: name, NS: d.Nanoseconds()}
	for n, m := range g.mark {
		switch m {
		case ByCache, Known, Hand:
			p.Known++
		case Conjectured:
			p.Conjectured++
		}
		if _, ok := g.conf[int32(n)]; ok {
			p.Conflicts++
		}
	}
	p.Unmarked = g.objects - p.Known - p.Conjectured
	g.rep.Passes = append(g.rep.Passes, p)
}

// TypeName writes a node's type: "S" or "S[n]".
func (g *Graph) typeName(n int32) string {
	if g.typ[n] < 0 {
		return ""
	}
	name := g.ts.infos[g.typ[n]].name
	if g.arr[n] > 0 {
		name = fmt.Sprintf("%s[%d]", name, g.arr[n])
	}
	return name
}

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
