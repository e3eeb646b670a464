// Package slabtest builds synthetic kernels for tests of the slab walk
// and of what is built on it: BTF with the structs the walk reads, laid
// out unlike the real kernel's so that no offset can be assumed, and a
// sparse virtual memory image holding caches, slabs, per-CPU data, node
// lists and sysfs nodes, made from a description of what they hold. The
// image records what a correct walk must find (Cache.Want).
package slabtest

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/internal/btflayout"
	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/internal/btftest"
)

var (
	tU8   = &btf.Int{Name: "u8", Size: 1}
	tU16  = &btf.Int{Name: "u16", Size: 2}
	tU32  = &btf.Int{Name: "unsigned int", Size: 4}
	tI32  = &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	tU64  = &btf.Int{Name: "unsigned long", Size: 8}
	tVoid = &btf.Pointer{Target: &btf.Void{}}
)

func m(name string, t btf.Type, byteOff uint32) btf.Member {
	return btf.Member{Name: name, Type: t, Offset: btf.Bits(8 * byteOff)}
}

// Types is the synthetic kernel's BTF; hardened adds kmem_cache.random
// (CONFIG_SLAB_FREELIST_HARDENED).
func Types(hardened bool) []btf.Type {
	listHead := &btf.Struct{Name: "list_head", Size: 16}
	listHead.Members = []btf.Member{m("next", &btf.Pointer{Target: listHead}, 0), m("prev", &btf.Pointer{Target: listHead}, 8)}
	atomic := &btf.Struct{Name: "", Size: 4, Members: []btf.Member{m("counter", tI32, 0)}}
	atomicLong := &btf.Struct{Name: "", Size: 8, Members: []btf.Member{m("counter", tU64, 0)}}
	rbNode := &btf.Struct{Name: "rb_node", Size: 24}
	rbNode.Members = []btf.Member{m("__rb_parent_color", tU64, 0), m("rb_right", &btf.Pointer{Target: rbNode}, 8), m("rb_left", &btf.Pointer{Target: rbNode}, 16)}
	rbRoot := &btf.Struct{Name: "rb_root", Size: 8, Members: []btf.Member{m("rb_node", &btf.Pointer{Target: rbNode}, 0)}}
	kn := &btf.Struct{Name: "kernfs_node", Size: 96}
	dir := &btf.Struct{Name: "kernfs_elem_dir", Size: 24, Members: []btf.Member{m("subdirs", tU64, 0), m("children", rbRoot, 8), m("root", tVoid, 16)}}
	symlink := &btf.Struct{Name: "kernfs_elem_symlink", Size: 8, Members: []btf.Member{m("target_kn", &btf.Pointer{Target: kn}, 0)}}
	kn.Members = []btf.Member{
		m("count", atomic, 0), m("flags", tU16, 4), m("parent", &btf.Pointer{Target: kn}, 8), m("name", tVoid, 16),
		m("hash", tU32, 24), m("rb", rbNode, 32),
		m("", &btf.Union{Size: 24, Members: []btf.Member{m("dir", dir, 0), m("symlink", symlink, 0)}}, 56),
		m("priv", tVoid, 80), m("id", tU64, 88),
	}
	kobj := &btf.Struct{Name: "kobject", Size: 40, Members: []btf.Member{m("name", tVoid, 0), m("entry", listHead, 8), m("sd", &btf.Pointer{Target: kn}, 32)}}
	oo := &btf.Struct{Name: "kmem_cache_order_objects", Size: 4, Members: []btf.Member{m("x", tU32, 0)}}
	slab := &btf.Struct{Name: "slab", Size: 56}
	cpu := &btf.Struct{Name: "kmem_cache_cpu", Size: 40, Members: []btf.Member{
		m("tid", tU64, 0), m("partial", &btf.Pointer{Target: slab}, 8), m("freelist", tVoid, 16), m("slab", &btf.Pointer{Target: slab}, 24), m("lock", tU64, 32)}}
	node := &btf.Struct{Name: "kmem_cache_node", Size: 64, Members: []btf.Member{
		m("full", listHead, 0), m("list_lock", tU32, 16), m("nr_partial", tU64, 24), m("partial", listHead, 32),
		m("nr_slabs", atomicLong, 48), m("total_objects", atomicLong, 56)}}
	nodes := &btf.Array{Index: tU32, Type: &btf.Pointer{Target: node}, Nelems: 4}
	kc := &btf.Struct{Name: "kmem_cache", Size: 256}
	members := []btf.Member{
		m("name", tVoid, 0), m("flags", tU32, 8), m("cpu_slab", &btf.Pointer{Target: cpu}, 16), m("size", tU32, 24),
		m("object_size", tU32, 28), m("list", listHead, 32), m("offset", tU32, 48), m("cpu_partial", tU32, 52),
		m("oo", oo, 56), m("min", oo, 60), m("refcount", tI32, 64), m("inuse", tU32, 68), m("ctor", tVoid, 72),
		m("align", tU32, 80), m("red_left_pad", tU32, 84), m("kobj", kobj, 88), m("useroffset", tU32, 128),
		m("usersize", tU32, 132), m("node", nodes, 160),
	}
	if hardened {
		members = append(members, m("random", tU64, 144))
	}
	kc.Members = members
	counters := &btf.Struct{Size: 4, Members: []btf.Member{
		{Name: "inuse", Type: tU32, Offset: 0, BitfieldSize: 16},
		{Name: "objects", Type: tU32, Offset: 16, BitfieldSize: 15},
		{Name: "frozen", Type: tU32, Offset: 31, BitfieldSize: 1},
	}}
	slab.Members = []btf.Member{
		m("__page_flags", tU64, 0),
		m("", &btf.Union{Size: 16, Members: []btf.Member{
			m("slab_list", listHead, 0),
			m("", &btf.Struct{Size: 16, Members: []btf.Member{m("next", &btf.Pointer{Target: slab}, 0), m("slabs", tI32, 8)}}, 0),
		}}, 8),
		m("freelist", tVoid, 24), m("slab_cache", &btf.Pointer{Target: kc}, 32),
		m("", &btf.Union{Size: 8, Members: []btf.Member{m("counters", tU64, 0), m("", counters, 0)}}, 40),
		m("__page_refcount", atomic, 48),
	}
	page := &btf.Struct{Name: "page", Size: 64, Members: []btf.Member{
		m("flags", tU64, 0),
		m("", &btf.Union{Size: 40, Members: []btf.Member{m("lru", listHead, 0), m("compound_head", tU64, 0)}}, 8),
		m("_refcount", atomic, 48), m("page_type", tU32, 52), m("pad", tU64, 56),
	}}
	pageflags := &btf.Enum{Name: "pageflags", Size: 4, Values: []btf.EnumValue{{Name: "PG_locked", Value: 0}, {Name: "PG_slab", Value: 9}}}
	kntype := &btf.Enum{Name: "kernfs_node_type", Size: 4, Values: []btf.EnumValue{{Name: "KERNFS_DIR", Value: 1}, {Name: "KERNFS_FILE", Value: 2}, {Name: "KERNFS_LINK", Value: 4}}}
	track := &btf.Struct{Name: "track", Size: 32, Members: []btf.Member{m("addr", tU64, 0), m("handle", tU32, 8), m("cpu", tI32, 12), m("pid", tI32, 16), m("when", tU64, 24)}}
	return []btf.Type{listHead, rbNode, rbRoot, kn, kobj, oo, slab, cpu, node, kc, page, pageflags, kntype, track, tU8}
}

// Spec marshals types to BTF and loads them back, as a kernel's BTF.
func Spec(t testing.TB, types []btf.Type) *btf.Spec {
	t.Helper()
	return btftest.Spec(t, types...)
}

// Addresses of the synthetic kernel.
const (
	PageSize    = 4096
	PageOffset  = 0xffff888000000000
	Vmemmap     = 0xffffea0000000000
	DataBase    = 0xffffffff82000000 // symbols and other kernel data
	PerCPUBase  = 0xffffc00000000000 // per-CPU areas, 1 MiB apart
	SectionPFNs = 1 << 15            // pages of one 128 MiB memory section
	MaxPFN      = 2 * SectionPFNs    // two sections of "memory", whose maps are mostly absent
	NCPU        = 2
	// The struct pages that exist: pfns 0-4095 and 6144-8191.
	MapPages = 6144
)

// Image is the synthetic kernel: sparse virtual memory and symbols. It
// implements slab.Kernel.
type Image struct {
	Spec     *btf.Spec
	Pages    map[uint64][]byte
	Syms     map[string]uint64
	CPUs     []uint64
	Reads    int // ReadVirt calls, to bound the work a test may cause
	Caches   []*Cache
	Hardened bool
	b        *btflayout.Builder
	fields   map[[2]string]btflayout.Field
	dataNext uint64
	metaPFN  uint64
	slabPFN  uint64
	strs     map[string]uint64
	// depotNext is the next free offset of the stack depot's pool.
	depotNext uint64
}

var _ slab.Kernel = (*Image)(nil)

// ReadVirt reads the image's memory.
func (im *Image) ReadVirt(p []byte, va uint64) error {
	im.Reads++
	for done := 0; done < len(p); {
		a := va + uint64(done)
		pg := im.Pages[a&^(PageSize-1)]
		if pg == nil {
			return fmt.Errorf("virtual address %#x is not mapped", a)
		}
		done += copy(p[done:], pg[a&(PageSize-1):])
	}
	return nil
}

// SymbolAddr looks a symbol up.
func (im *Image) SymbolAddr(name string) (uint64, error) {
	if a, ok := im.Syms[name]; ok {
		return a, nil
	}
	return 0, fmt.Errorf("%q: no such kernel symbol", name)
}

// BTF is the image's types.
func (im *Image) BTF() (*btf.Spec, error) { return im.Spec, nil }

// PerCPUOffsets are the CPUs' per-CPU area offsets.
func (im *Image) PerCPUOffsets() ([]uint64, error) { return im.CPUs, nil }

// Field resolves a member of the image's BTF (it panics on a member the
// synthetic BTF lacks: a broken test).
func (im *Image) Field(st, path string) btflayout.Field {
	k := [2]string{st, path}
	if f, ok := im.fields[k]; ok {
		return f
	}
	f, _, err := im.b.Lookup(st, path)
	if err != nil {
		panic(err)
	}
	im.fields[k] = f
	return f
}

// Off is a member's byte offset.
func (im *Image) Off(st, path string) uint64 { return uint64(im.Field(st, path).Off) }

// Sizeof is a struct's size.
func (im *Image) Sizeof(st string) uint64 { return uint64(im.b.Sizeof(st)) }

func (im *Image) page(a uint64) []byte {
	p := im.Pages[a&^(PageSize-1)]
	if p == nil {
		p = make([]byte, PageSize)
		im.Pages[a&^(PageSize-1)] = p
	}
	return p
}

// Write stores bytes, mapping pages as needed.
func (im *Image) Write(a uint64, b []byte) {
	for len(b) > 0 {
		n := copy(im.page(a)[a&(PageSize-1):], b)
		a, b = a+uint64(n), b[n:]
	}
}

// U64 stores a word.
func (im *Image) U64(a, v uint64) { im.Write(a, binary.LittleEndian.AppendUint64(nil, v)) }

// Get64 loads a word (0 if unmapped).
func (im *Image) Get64(a uint64) uint64 {
	var b [8]byte
	im.ReadVirt(b[:], a)
	return binary.LittleEndian.Uint64(b[:])
}

// Put writes member path of struct st at base.
func (im *Image) Put(base uint64, st, path string, v uint64) {
	f := im.Field(st, path)
	b := make([]byte, f.End())
	im.ReadVirt(b[f.Off:], base+uint64(f.Off))
	f.Put(b, v)
	im.Write(base+uint64(f.Off), b[f.Off:])
}

// Alloc returns zeroed kernel data (in the image mapping).
func (im *Image) Alloc(n uint64) uint64 {
	a := im.dataNext
	im.dataNext += (n + 63) &^ 63
	im.Write(a, make([]byte, n))
	return a
}

// Str stores a NUL-terminated string.
func (im *Image) Str(s string) uint64 {
	if a, ok := im.strs[s]; ok {
		return a
	}
	a := im.Alloc(uint64(len(s)) + 1)
	im.Write(a, []byte(s))
	im.strs[s] = a
	return a
}

// NewImage makes a kernel with no caches yet.
func NewImage(t testing.TB, hardened bool) *Image {
	return NewImageTypes(t, hardened, Types(hardened))
}

// NewImageTypes makes a kernel whose BTF holds extra types beyond Types
// (the structs a test's caches hold).
func NewImageTypes(t testing.TB, hardened bool, types []btf.Type) *Image {
	spec := Spec(t, types)
	im := &Image{Spec: spec, Pages: map[uint64][]byte{}, Syms: map[string]uint64{}, strs: map[string]uint64{},
		b: btflayout.New(spec), fields: map[[2]string]btflayout.Field{},
		dataNext: DataBase, metaPFN: 16, slabPFN: 256, Hardened: hardened}
	for _, s := range []string{"slab_caches", "page_offset_base", "vmemmap_base", "max_pfn", "nr_node_ids"} {
		im.Syms[s] = im.Alloc(16)
	}
	head := im.Syms["slab_caches"]
	im.U64(head, head)
	im.U64(head+8, head)
	im.U64(im.Syms["page_offset_base"], PageOffset)
	im.U64(im.Syms["vmemmap_base"], Vmemmap)
	im.U64(im.Syms["max_pfn"], MaxPFN)
	im.Write(im.Syms["nr_node_ids"], []byte{1, 0, 0, 0})
	for c := 0; c < NCPU; c++ {
		im.CPUs = append(im.CPUs, PerCPUBase+uint64(c)<<20)
	}
	ps := im.Sizeof("page")
	for pfn := uint64(0); pfn < 8192; pfn += PageSize / ps {
		if pfn < 4096 || pfn >= 6144 {
			im.page(Vmemmap + pfn*ps)
		}
	}
	return im
}

// Cache is one synthetic cache and what a walk must find in it.
type Cache struct {
	Name                string
	Addr, CPUSlab, Node uint64
	ObjSize, Size       uint32
	Offset, RedLeft     uint32
	Flags               uint64
	Order, PerSlab      int
	Random              uint64
	Slabs               []*Slab
	Aliases             []string // set before Finish
	SysfsKN             uint64
	Want                slab.Stats
}

// Slab is one synthetic slab.
type Slab struct {
	PFN     uint64
	Addr    uint64 // struct slab
	Base    uint64
	Objects int
	Free    []int // slab->freelist, in order
	CPUFree []int // the CPU's lockless freelist, if a CPU slab
}

// StructPage is the struct page of a pfn.
func (im *Image) StructPage(pfn uint64) uint64 { return Vmemmap + pfn*im.Sizeof("page") }

func (im *Image) metaPage() uint64 {
	a := PageOffset + im.metaPFN*PageSize
	im.metaPFN++
	im.Write(a, make([]byte, PageSize))
	return a
}

// AddCache creates a kmem_cache and links it on slab_caches. With
// slab.FlagRedZone, objects have an 8-byte left red zone.
func (im *Image) AddCache(name string, objSize, size uint32, flags uint64, order int) *Cache {
	c := &Cache{Name: name, ObjSize: objSize, Size: size, Flags: flags, Order: order}
	c.Offset = (objSize / 2) &^ 7
	if flags&slab.FlagRedZone != 0 {
		c.RedLeft = 8
	}
	c.PerSlab = int((PageSize << order) / uint64(size))
	c.Addr = im.metaPage()
	c.Node = c.Addr + 2048
	c.CPUSlab = uint64(0x1000 + 0x100*len(im.Caches)) // a __percpu offset
	const kc = "kmem_cache"
	if im.Hardened {
		c.Random = 0x5a5a_1234_9876_0000 + uint64(len(im.Caches))*0x1111
		im.Put(c.Addr, kc, "random", c.Random)
	}
	im.Put(c.Addr, kc, "name", im.Str(name))
	im.Put(c.Addr, kc, "flags", flags)
	im.Put(c.Addr, kc, "size", uint64(size))
	im.Put(c.Addr, kc, "object_size", uint64(objSize))
	im.Put(c.Addr, kc, "offset", uint64(c.Offset))
	im.Put(c.Addr, kc, "inuse", uint64((objSize+7)&^7))
	im.Put(c.Addr, kc, "red_left_pad", uint64(c.RedLeft))
	im.Put(c.Addr, kc, "oo.x", uint64(order)<<16|uint64(c.PerSlab))
	im.Put(c.Addr, kc, "refcount", 1)
	im.Put(c.Addr, kc, "cpu_slab", c.CPUSlab)
	im.Put(c.Addr, kc, "node", c.Node)
	for _, lh := range []uint64{c.Node + im.Off("kmem_cache_node", "partial"), c.Node + im.Off("kmem_cache_node", "full")} {
		im.U64(lh, lh)
		im.U64(lh+8, lh)
	}
	for _, off := range im.CPUs {
		im.Write(c.CPUSlab+off, make([]byte, im.Sizeof("kmem_cache_cpu")))
	}
	head := im.Syms["slab_caches"]
	entry := c.Addr + im.Off(kc, "list")
	prev := im.Get64(head + 8)
	im.U64(entry, head)
	im.U64(entry+8, prev)
	im.U64(prev, entry)
	im.U64(head+8, entry)
	im.Caches = append(im.Caches, c)
	return c
}

// AddSlab creates a slab of c whose freelist holds the objects free, in
// that order; fewer objects than c.PerSlab make a fallback-order slab.
func (im *Image) AddSlab(c *Cache, objects int, free []int) *Slab {
	pfn := (im.slabPFN + (1<<c.Order - 1)) &^ (1<<c.Order - 1)
	im.slabPFN = pfn + 1<<c.Order
	s := &Slab{PFN: pfn, Addr: im.StructPage(pfn), Base: PageOffset + pfn*PageSize, Objects: objects, Free: free}
	im.Write(s.Base, make([]byte, PageSize<<c.Order))
	for i := 1; i < 1<<c.Order; i++ {
		im.Put(im.StructPage(pfn+uint64(i)), "page", "compound_head", s.Addr|1)
	}
	pgSlab, _ := btflayout.EnumValue(im.Spec, "pageflags", "PG_slab")
	im.Put(s.Addr, "slab", "__page_flags", 1<<pgSlab)
	im.Put(s.Addr, "slab", "slab_cache", c.Addr)
	im.Put(s.Addr, "slab", "objects", uint64(objects))
	im.Put(s.Addr, "slab", "__page_refcount.counter", 1)
	im.Put(s.Addr, "slab", "freelist", im.Chain(c, s, free))
	im.Put(s.Addr, "slab", "inuse", uint64(objects-len(free)))
	c.Slabs = append(c.Slabs, s)
	c.Want.Slabs++
	c.Want.Objects += objects
	c.Want.Free += len(free)
	c.Want.NodeSlabs++
	c.Want.NodeObjects += objects
	return s
}

// Obj is the address of object i of slab s.
func (c *Cache) Obj(s *Slab, i int) uint64 {
	return s.Base + uint64(i)*uint64(c.Size) + uint64(c.RedLeft)
}

// FreePointer encodes a free pointer as freelist_ptr stores it.
func (im *Image) FreePointer(c *Cache, next, ptrAddr uint64) uint64 {
	if im.Hardened {
		return next ^ c.Random ^ bits.ReverseBytes64(ptrAddr)
	}
	return next
}

// Chain writes a freelist through the objects idx of s; it returns the
// list's head.
func (im *Image) Chain(c *Cache, s *Slab, idx []int) uint64 {
	var next uint64
	for i := len(idx) - 1; i >= 0; i-- {
		o := c.Obj(s, idx[i])
		fp := o + uint64(c.Offset)
		im.U64(fp, im.FreePointer(c, next, fp))
		next = o
	}
	return next
}

// SetCPUSlab makes s the slab of cpu, with lockless free objects.
func (im *Image) SetCPUSlab(c *Cache, cpu int, s *Slab, lockless []int) {
	pc := c.CPUSlab + im.CPUs[cpu]
	im.Put(pc, "kmem_cache_cpu", "slab", s.Addr)
	im.Put(pc, "kmem_cache_cpu", "freelist", im.Chain(c, s, lockless))
	im.Put(s.Addr, "slab", "frozen", 1)
	s.CPUFree = lockless
	c.Want.CPUSlabs++
	c.Want.Free += len(lockless)
	c.Want.FreePerCPU += len(lockless) + len(s.Free)
}

// SetCPUPartial chains slabs on cpu's partial list.
func (im *Image) SetCPUPartial(c *Cache, cpu int, slabs ...*Slab) {
	var next uint64
	for i := len(slabs) - 1; i >= 0; i-- {
		im.Put(slabs[i].Addr, "slab", "next", next)
		im.Put(slabs[i].Addr, "slab", "frozen", 1)
		next = slabs[i].Addr
		c.Want.CPUPartial++
		c.Want.FreePerCPU += len(slabs[i].Free)
	}
	im.Put(c.CPUSlab+im.CPUs[cpu], "kmem_cache_cpu", "partial", next)
}

// AddToNodeList links slabs on node 0's partial (or full) list.
func (im *Image) AddToNodeList(c *Cache, full bool, slabs ...*Slab) {
	head := c.Node + im.Off("kmem_cache_node", "partial")
	if full {
		head = c.Node + im.Off("kmem_cache_node", "full")
	}
	for _, s := range slabs {
		e := s.Addr + im.Off("slab", "slab_list")
		prev := im.Get64(head + 8)
		im.U64(e, head)
		im.U64(e+8, prev)
		im.U64(prev, e)
		im.U64(head+8, e)
		if full {
			c.Want.Full++
		} else {
			c.Want.Partial++
			c.Want.NodePartial++
		}
	}
	if !full {
		im.Put(c.Node, "kmem_cache_node", "nr_partial", uint64(c.Want.Partial))
	}
}

// Finish writes the node counters and the sysfs tree, and completes the
// expected counts.
func (im *Image) Finish() {
	for _, c := range im.Caches {
		im.Put(c.Node, "kmem_cache_node", "nr_slabs.counter", uint64(c.Want.NodeSlabs))
		im.Put(c.Node, "kmem_cache_node", "total_objects.counter", uint64(c.Want.NodeObjects))
		c.Want.Allocated = c.Want.Objects - c.Want.Free
		c.Want.Unlisted = c.Want.Slabs - c.Want.CPUSlabs - c.Want.CPUPartial - c.Want.Partial - c.Want.Full
	}
	im.sysfs()
}

// sysfs builds /sys/kernel/slab: a directory per cache (named by its
// unique id when it has aliases) and a link per name.
func (im *Image) sysfs() {
	const kn = "kernfs_node"
	dir := im.Alloc(im.Sizeof(kn))
	var nodes []uint64
	knode := func(name string, flags uint64, target uint64) uint64 {
		n := im.Alloc(im.Sizeof(kn))
		im.Put(n, kn, "name", im.Str(name))
		im.Put(n, kn, "flags", flags)
		im.Put(n, kn, "parent", dir)
		if target != 0 {
			im.Put(n, kn, "symlink.target_kn", target)
		}
		nodes = append(nodes, n)
		return n
	}
	for _, c := range im.Caches {
		name := c.Name
		if len(c.Aliases) > 0 {
			name = fmt.Sprintf(":%07d", c.Size)
		}
		c.SysfsKN = knode(name, 1, 0)
		im.Put(c.Addr, "kmem_cache", "kobj.sd", c.SysfsKN)
		if len(c.Aliases) > 0 {
			knode(c.Name, 4, c.SysfsKN)
			for _, a := range c.Aliases {
				knode(a, 4, c.SysfsKN)
			}
			im.Put(c.Addr, "kmem_cache", "refcount", uint64(1+len(c.Aliases)))
		}
	}
	// A balanced tree by halving (rb colours do not matter to a reader).
	rbOff := im.Off(kn, "rb")
	var build func(ns []uint64) uint64
	build = func(ns []uint64) uint64 {
		if len(ns) == 0 {
			return 0
		}
		mid := len(ns) / 2
		rb := ns[mid] + rbOff
		im.U64(rb+im.Off("rb_node", "rb_left"), build(ns[:mid]))
		im.U64(rb+im.Off("rb_node", "rb_right"), build(ns[mid+1:]))
		return rb
	}
	im.U64(dir+im.Off(kn, "dir.children.rb_node"), build(nodes))
}

// Clone copies the image, so that a test can damage the copy.
func (im *Image) Clone() *Image {
	cp := *im
	cp.Pages = make(map[uint64][]byte, len(im.Pages))
	for a, p := range im.Pages {
		cp.Pages[a] = append([]byte(nil), p...)
	}
	cp.Reads = 0
	return &cp
}

// DepotTypes are the stack depot's types as 6.1 lays them out (union
// handle_parts, struct stack_record), for an image with a depot.
func DepotTypes() []btf.Type {
	bf := func(name string, off, bits uint32) btf.Member {
		return btf.Member{Name: name, Type: tU32, Offset: btf.Bits(off), BitfieldSize: btf.Bits(bits)}
	}
	parts := &btf.Struct{Size: 4, Members: []btf.Member{bf("slabindex", 0, 16), bf("offset", 16, 10), bf("valid", 26, 1), bf("extra", 27, 5)}}
	hp := &btf.Union{Name: "handle_parts", Size: 4, Members: []btf.Member{{Name: "handle", Type: tU32}, {Type: parts}}}
	rec := &btf.Struct{Name: "stack_record", Size: 24}
	rec.Members = []btf.Member{m("next", &btf.Pointer{Target: rec}, 0), m("hash", tU32, 8), m("size", tU32, 12), m("handle", hp, 16),
		m("entries", &btf.Array{Index: tU32, Type: tU64}, 24)}
	return []btf.Type{hp, rec}
}

// AddStack stores frames in the image's stack depot (stack_slabs, made
// on the first call; the image needs DepotTypes) and gives their handle.
func (im *Image) AddStack(frames []uint64) uint32 {
	const pool = 16384
	if _, ok := im.Syms["stack_slabs"]; !ok {
		im.Syms["stack_slabs"] = im.Alloc(8)
		im.U64(im.Syms["stack_slabs"], im.Alloc(pool))
		im.depotNext = 16 // offset 0 would make handle 0 for pool 0 without the valid bit
	}
	off := im.depotNext
	rec := im.Get64(im.Syms["stack_slabs"]) + off
	im.depotNext += (24 + 8*uint64(len(frames)) + 15) &^ 15
	h := uint32(off>>4)<<16 | 1<<26
	im.Write(rec+16, binary.LittleEndian.AppendUint32(nil, h))
	im.Write(rec+12, binary.LittleEndian.AppendUint32(nil, uint32(len(frames))))
	for i, f := range frames {
		im.U64(rec+24+8*uint64(i), f)
	}
	return h
}
