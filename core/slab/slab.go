// Package slab reads the SLUB allocator's state out of a kernel's
// memory: every kmem_cache, every slab of each, and the state of every
// object (allocated or free), the way the kernel itself would see them.
//
// It needs of the kernel only what Kernel lists: virtual reads, a few
// symbols, the BTF (every offset comes from it), and the per-CPU offsets.
//
// Where slabs are found: the kernel keeps a slab on a list only when it
// needs to find it again. Each node's partial list holds slabs with free
// objects; the full list exists with slub_debug only; each CPU has its
// slab (kmem_cache_cpu.slab, with its lockless freelist) and a chain of
// per-CPU partial slabs. A full slab without debugging is on no list:
// the only complete account is the memory map, so the walk reads every
// struct page (vmemmap) and takes those with PG_slab set, each naming its
// kmem_cache in slab_cache, as crash's `kmem -s` and drgn do. The lists
// and per-CPU data then say where each slab is, and their own counters
// (nr_partial, nr_slabs, total_objects, each slab's inuse) are checked
// against what the walk found: a disagreement is an Anomaly, counted and
// kept, never a hang or a crash.
//
// Free objects: an object is free when it is on its slab's freelist, or
// on the lockless per-CPU freelist (kmem_cache_cpu.freelist) of the CPU
// whose slab it is. Free pointers are decoded as freelist_ptr does
// (mm/slub.c, 6.1): with CONFIG_SLAB_FREELIST_HARDENED the stored value
// is ptr ^ s->random ^ swab(address of the pointer); the pointer lives at
// s->offset in the object.
package slab

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	"github.com/cilium/ebpf/btf"
)

// Kernel is what the walk needs of a kernel view, live or dump.
type Kernel interface {
	// ReadVirt fills p from kernel virtual memory at va.
	ReadVirt(p []byte, va uint64) error
	// SymbolAddr is the address of a kernel symbol.
	SymbolAddr(name string) (uint64, error)
	// BTF is the kernel's type information.
	BTF() (*btf.Spec, error)
	// PerCPUOffsets is __per_cpu_offset for every possible CPU.
	PerCPUOffsets() ([]uint64, error)
}

// Cache flags (include/linux/slab.h, mm/slab.h).
const (
	FlagConsistencyChecks = 0x00000100
	FlagRedZone           = 0x00000400
	FlagPoison            = 0x00000800
	FlagKmalloc           = 0x00001000
	FlagHWCacheAlign      = 0x00002000
	FlagCacheDMA          = 0x00004000
	FlagCacheDMA32        = 0x00008000
	FlagStoreUser         = 0x00010000
	FlagReclaimAccount    = 0x00020000
	FlagPanic             = 0x00040000
	FlagTypesafeByRCU     = 0x00080000
	FlagMemSpread         = 0x00100000
	FlagTrace             = 0x00200000
	FlagDebugObjects      = 0x00400000
	FlagNoLeakTrace       = 0x00800000
	FlagFailSlab          = 0x02000000
	FlagAccount           = 0x04000000
	FlagNoUserFlags       = 0x10000000
	flagCmpxchgDouble     = 0x40000000
	flagObjectPoison      = 0x80000000
	// Flags of kernels that number them (enum _slab_flag_bits, 6.10+)
	// and that 6.1 does not have: bits of kinst's own, past 32.
	flagNoMerge    = 1 << 32
	flagSkipKfence = 1 << 33
	flagNoObjExt   = 1 << 34

	// debugFlags is SLAB_DEBUG_FLAGS: caches with any of them keep full
	// lists and run the debug paths (kmem_cache_debug).
	debugFlags = FlagRedZone | FlagPoison | FlagStoreUser | FlagTrace | FlagConsistencyChecks
)

var flagNames = []struct {
	bit  uint64
	name string
}{
	{FlagConsistencyChecks, "CONSISTENCY_CHECKS"}, {FlagRedZone, "RED_ZONE"}, {FlagPoison, "POISON"},
	{FlagKmalloc, "KMALLOC"}, {FlagHWCacheAlign, "HWCACHE_ALIGN"}, {FlagCacheDMA, "CACHE_DMA"},
	{FlagCacheDMA32, "CACHE_DMA32"}, {FlagStoreUser, "STORE_USER"}, {FlagReclaimAccount, "RECLAIM_ACCOUNT"},
	{FlagPanic, "PANIC"}, {FlagTypesafeByRCU, "TYPESAFE_BY_RCU"}, {FlagMemSpread, "MEM_SPREAD"},
	{FlagTrace, "TRACE"}, {FlagDebugObjects, "DEBUG_OBJECTS"}, {FlagNoLeakTrace, "NOLEAKTRACE"},
	{FlagFailSlab, "FAILSLAB"}, {FlagAccount, "ACCOUNT"}, {FlagNoUserFlags, "NO_USER_FLAGS"},
	{flagCmpxchgDouble, "__CMPXCHG_DOUBLE"}, {flagObjectPoison, "__OBJECT_POISON"},
	{flagNoMerge, "NO_MERGE"}, {flagSkipKfence, "SKIP_KFENCE"}, {flagNoObjExt, "NO_OBJ_EXT"},
}

// flagBits maps a kernel's numbered flags (enum _slab_flag_bits: from
// 6.10 the SLAB_ flags are bits in the order of that enum, no longer
// the fixed values above) to the Flag constants; nil where the kernel
// has no such enum and its flags are those values already.
func flagBits(spec *btf.Spec) map[uint64]uint64 {
	var e *btf.Enum
	if spec.TypeByName("_slab_flag_bits", &e) != nil {
		return nil
	}
	out := map[uint64]uint64{}
	for _, v := range e.Values {
		name := strings.TrimPrefix(v.Name, "_SLAB_")
		for _, n := range flagNames {
			if strings.TrimPrefix(n.name, "__") == name {
				out[v.Value] = n.bit
			}
		}
	}
	return out
}

// canonicalFlags is a kmem_cache's flags word as the Flag constants
// spell it: bits the kernel's enum numbers, mapped; a bit it does not
// name moved past the constants (bit 40 on), to print as a number
// rather than pass for another flag.
func canonicalFlags(raw uint64, bits map[uint64]uint64) uint64 {
	if bits == nil {
		return raw
	}
	var out uint64
	for b := uint64(0); b < 64; b++ {
		if raw&(1<<b) == 0 {
			continue
		}
		if f, ok := bits[b]; ok {
			out |= f
		} else if b < 24 {
			out |= 1 << (40 + b)
		}
	}
	return out
}

// FlagNames spells a cache's flags as the kernel's SLAB_ names.
func FlagNames(f uint64) []string {
	var out []string
	for _, n := range flagNames {
		if f&n.bit != 0 {
			out = append(out, n.name)
			f &^= n.bit
		}
	}
	if f != 0 {
		out = append(out, fmt.Sprintf("%#x", f))
	}
	return out
}

// Cache is one kmem_cache.
type Cache struct {
	Addr       uint64 // the struct kmem_cache
	Name       string
	Aliases    []string // other names of a merged cache (sysfs links), sorted
	Refcount   int      // 1 + the number of caches merged into this one
	SysfsName  string   // the cache's sysfs directory (":A-0000192" for a mergeable one)
	Flags      uint64
	ObjectSize uint32 // what the caller asked for
	Size       uint32 // the slot: object, metadata and alignment
	Offset     uint32 // free pointer offset in the object
	Inuse      uint32 // offset of the metadata after the object
	Align      uint32
	RedLeftPad uint32 // left red zone (slub_debug=Z)
	Ctor       uint64 // constructor, 0 if none
	Random     uint64 // s->random, the freelist hardening key
	Hardened   bool   // CONFIG_SLAB_FREELIST_HARDENED: free pointers are obfuscated
	Order      int    // page order of a slab (s->oo)
	PerSlab    int    // objects per slab of that order
	UserOffset uint32 // usercopy region
	UserSize   uint32

	cpuSlab uint64   // the __percpu kmem_cache_cpu
	nodes   []uint64 // kmem_cache_node per node (0: none)
	sysfsKN uint64   // kobj.sd

	// Filled by Heap.Walk.
	Slabs []*Slab
	Stats Stats
}

// Debug says whether slub_debug is on for the cache (red zones,
// poisoning, tracking or consistency checks).
func (c *Cache) Debug() bool { return c.Flags&debugFlags != 0 }

// TrackOffset is where the allocation and free tracks (struct track)
// live after an object, or -1 without SLAB_STORE_USER (get_track).
func (c *Cache) TrackOffset() int {
	if c.Flags&FlagStoreUser == 0 {
		return -1
	}
	if c.Offset >= c.Inuse { // freeptr_outside_object
		return int(c.Inuse) + 8
	}
	return int(c.Inuse)
}

// Stats are a cache's counts from the walk.
type Stats struct {
	Slabs     int
	Objects   int // every object of every slab
	Allocated int
	Free      int // on a slab's freelist or its CPU's lockless freelist
	// FreePerCPU are the free objects of CPU slabs and per-CPU partial
	// slabs: /proc/slabinfo counts them as active (it subtracts only the
	// free objects of the nodes' partial lists).
	FreePerCPU int
	CPUSlabs   int // slabs some CPU allocates from
	CPUPartial int // slabs on per-CPU partial lists
	Partial    int // slabs on the nodes' partial lists
	Full       int // slabs on the nodes' full lists (slub_debug)
	Unlisted   int // slabs on no list: full slabs without slub_debug
	Anomalies  int
	// The kernel's own counters, summed over nodes; -1 where the kernel
	// keeps none (nr_slabs and total_objects need CONFIG_SLUB_DEBUG).
	NodeSlabs, NodeObjects, NodePartial int
}

// SlabinfoActive is what /proc/slabinfo shows as active_objs for this
// walk: every object less the free ones on the nodes' partial lists.
func (s Stats) SlabinfoActive() int { return s.Allocated + s.FreePerCPU }

// ListKind says where the kernel keeps a slab.
type ListKind uint8

const (
	Unlisted    ListKind = iota // on no list (a full slab without slub_debug)
	CPUSlab                     // a CPU's slab (kmem_cache_cpu.slab)
	CPUPartial                  // on a CPU's partial chain
	NodePartial                 // on a node's partial list
	NodeFull                    // on a node's full list (slub_debug)
)

func (k ListKind) String() string {
	return [...]string{"unlisted", "cpu", "cpu-partial", "partial", "full"}[k]
}

// Slab is one slab: a struct slab (the struct page of the slab's first
// page) and the objects in its memory.
type Slab struct {
	Addr     uint64 // the struct slab
	PFN      uint64
	Base     uint64 // slab_address: the first byte of its memory
	Cache    *Cache
	Objects  int // slab->objects
	Inuse    int // slab->inuse
	Frozen   bool
	Freelist uint64 // slab->freelist
	List     ListKind
	Where    int // the CPU or node of List
	NFree    int // free objects the walk found
	free     []uint64
	walked   bool
}

// Object is the address of object i (after the left red zone).
func (s *Slab) Object(i int) uint64 {
	return s.Base + uint64(i)*uint64(s.Cache.Size) + uint64(s.Cache.RedLeftPad)
}

// Free reports whether object i is free.
func (s *Slab) Free(i int) bool {
	return i >= 0 && i < s.Objects && s.free != nil && s.free[i/64]&(1<<(i%64)) != 0
}

// End is the first byte after the slab's objects.
func (s *Slab) End() uint64 { return s.Base + uint64(s.Objects)*uint64(s.Cache.Size) }

// index maps an object address to its index.
func (s *Slab) index(p uint64) (int, bool) {
	start := s.Base + uint64(s.Cache.RedLeftPad)
	if p < start || s.Cache.Size == 0 {
		return 0, false
	}
	d := p - start
	if d%uint64(s.Cache.Size) != 0 || d/uint64(s.Cache.Size) >= uint64(s.Objects) {
		return 0, false
	}
	return int(d / uint64(s.Cache.Size)), true
}

// Anomaly is something in the allocator's state that does not add up.
type Anomaly struct {
	Cache string // the cache's name, "" if none is known
	Slab  uint64 // the struct slab, 0 if the anomaly is not of one slab
	What  string
}

func (a Anomaly) String() string {
	s := a.What
	if a.Slab != 0 {
		s = fmt.Sprintf("slab %#x: %s", a.Slab, s)
	}
	if a.Cache != "" {
		s = a.Cache + ": " + s
	}
	return s
}

// maxAnomalies bounds the anomalies kept (all are counted).
const maxAnomalies = 1000

// Heap is the SLUB allocator of one kernel. It is not safe for
// concurrent use.
type Heap struct {
	k Kernel
	l *layout
	// depot is the stack depot, found by the first Stack (depotOnce);
	// depotErr why not.
	depotOnce sync.Once
	depot     *StackDepot
	depotErr  error
	Caches    []*Cache
	byAddr    map[uint64]*Cache
	cpuOffs   []uint64

	PageOffset uint64 // start of the direct map (page_offset_base)
	Vmemmap    uint64 // the struct page array (vmemmap_base)
	MaxPFN     uint64

	// AliasSource says how Cache.Aliases were found.
	AliasSource string
	// Notes are things the reader should know about this heap's account
	// (defaults taken for missing symbols, memory map holes).
	Notes []string

	anomalies    []Anomaly
	nAnomalies   int
	walked       bool
	bySlab       map[uint64]*Slab // struct slab → slab, after Walk
	VmemmapHoles int              // pages below max_pfn whose struct page could not be read
	PagesScanned uint64           // struct pages read
}

// x86-64 defaults for a kernel without CONFIG_RANDOMIZE_MEMORY (4-level
// paging; Documentation/x86/x86_64/mm.rst).
const (
	defaultPageOffset = 0xffff888000000000
	defaultVmemmap    = 0xffffea0000000000
	pageShift         = 12
	pageSize          = 1 << pageShift
)

// maxPFN bounds the memory map: 4-level x86-64's MAX_PHYSMEM_BITS (46).
const maxPFN = 1 << (46 - pageShift)

// maxCaches bounds the slab_caches walk.
const maxCaches = 1 << 16

// Open reads the cache descriptors (not yet the slabs: see Walk).
func Open(k Kernel) (*Heap, error) {
	spec, err := k.BTF()
	if err != nil {
		return nil, err
	}
	l, err := newLayout(spec)
	if err != nil {
		return nil, err
	}
	h := &Heap{k: k, l: l, byAddr: map[uint64]*Cache{}}
	head, err := k.SymbolAddr("slab_caches")
	if err != nil {
		return nil, fmt.Errorf("slab_caches: %w (not a SLUB kernel?)", err)
	}
	h.PageOffset = h.symbolValue("page_offset_base", defaultPageOffset)
	h.Vmemmap = h.symbolValue("vmemmap_base", defaultVmemmap)
	if a, err := k.SymbolAddr("max_pfn"); err == nil {
		h.MaxPFN, _ = h.readU64(a)
	}
	if h.MaxPFN == 0 || h.MaxPFN > maxPFN {
		return nil, fmt.Errorf("max_pfn = %#x: not a plausible memory size (at most %#x pages, x86-64's 46-bit physical addresses)", h.MaxPFN, uint64(maxPFN))
	}
	if h.cpuOffs, err = k.PerCPUOffsets(); err != nil {
		return nil, fmt.Errorf("per-CPU offsets: %w", err)
	}
	nodes := int(l.nodeLen)
	if a, err := k.SymbolAddr("nr_node_ids"); err == nil {
		var b [4]byte
		if k.ReadVirt(b[:], a) == nil {
			if n := int(binary.LittleEndian.Uint32(b[:])); n > 0 && n <= nodes {
				nodes = n
			}
		}
	}
	if nodes == 0 {
		nodes = 1
	}
	// The list of caches: slab_caches links kmem_cache.list.
	seen := map[uint64]bool{}
	p, err := h.readU64(head + uint64(l.listNext.Off))
	if err != nil {
		return nil, fmt.Errorf("slab_caches at %#x: %w", head, err)
	}
	for p != head {
		if seen[p] || len(seen) >= maxCaches {
			h.anomaly(Anomaly{What: fmt.Sprintf("slab_caches list loops at %#x without returning to its head; %d caches read", p, len(h.Caches))})
			break
		}
		seen[p] = true
		addr := p - uint64(l.list.Off)
		c, err := h.readCache(addr, nodes)
		if err != nil {
			h.anomaly(Anomaly{What: fmt.Sprintf("kmem_cache at %#x: %v", addr, err)})
		} else {
			h.Caches = append(h.Caches, c)
			h.byAddr[addr] = c
		}
		next, err := h.readU64(p + uint64(l.listNext.Off))
		if err != nil {
			h.anomaly(Anomaly{What: fmt.Sprintf("slab_caches list broken at %#x: %v; %d caches read", p, err, len(h.Caches))})
			break
		}
		p = next
	}
	if len(h.Caches) == 0 {
		return nil, fmt.Errorf("slab_caches at %#x lists no readable cache", head)
	}
	h.findAliases()
	return h, nil
}

func (h *Heap) symbolValue(name string, def uint64) uint64 {
	a, err := h.k.SymbolAddr(name)
	if err == nil {
		if v, err := h.readU64(a); err == nil && v != 0 {
			return v
		}
	}
	h.Notes = append(h.Notes, fmt.Sprintf("%s not readable: assumed %#x (x86-64, 4-level paging, no KASLR of memory)", name, def))
	return def
}

func (h *Heap) readU64(a uint64) (uint64, error) {
	var b [8]byte
	if err := h.k.ReadVirt(b[:], a); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// readString reads a NUL-terminated string of at most max bytes,
// stopping at an unreadable page.
func (h *Heap) readString(a uint64, max int) (string, error) {
	var out []byte
	for len(out) < max {
		n := min(max-len(out), int(pageSize-(a+uint64(len(out)))%pageSize))
		b := make([]byte, n)
		if err := h.k.ReadVirt(b, a+uint64(len(out))); err != nil {
			if len(out) == 0 {
				return "", err
			}
			break
		}
		for i, c := range b {
			if c == 0 {
				return string(append(out, b[:i]...)), nil
			}
		}
		out = append(out, b...)
	}
	return string(out), nil
}

func (h *Heap) anomaly(a Anomaly) {
	h.nAnomalies++
	if len(h.anomalies) < maxAnomalies {
		h.anomalies = append(h.anomalies, a)
	}
}

// Anomalies returns the anomalies kept and how many there were in all.
func (h *Heap) Anomalies() ([]Anomaly, int) { return h.anomalies, h.nAnomalies }

func (h *Heap) cacheAnomaly(c *Cache, s *Slab, format string, args ...any) {
	c.Stats.Anomalies++
	a := Anomaly{Cache: c.Name, What: fmt.Sprintf(format, args...)}
	if s != nil {
		a.Slab = s.Addr
	}
	h.anomaly(a)
}

// maxObjectsPerSlab is the most objects struct slab's 15-bit count holds.
const maxObjectsPerSlab = 1<<15 - 1

func (h *Heap) readCache(addr uint64, nodes int) (*Cache, error) {
	l := h.l
	b := make([]byte, l.cacheSize)
	// Only the nodes' pointers that exist: the kernel sizes a kmem_cache
	// to nr_node_ids of them (kmem_cache's own cache), not the type's
	// MAX_NUMNODES (1024 in Debian's kernels, 8 KiB), so a cache in the
	// last bytes before a page the direct map lacks (the top of memory)
	// was unreadable, and with it every object of its cache (a leak of
	// kinst_leak's unreported, on 6.12, after a burst of splices).
	have := uint32(l.cacheSize)
	if l.node.OK {
		have = min(have, l.node.Off+8*uint32(max(nodes, 1)))
	}
	if err := h.k.ReadVirt(b[:have], addr); err != nil {
		return nil, err
	}
	c := &Cache{
		Addr:       addr,
		Flags:      canonicalFlags(l.flags.U64(b), l.flagBits),
		ObjectSize: uint32(l.objectSize.U64(b)),
		Size:       uint32(l.size.U64(b)),
		Offset:     uint32(l.offset.U64(b)),
		Inuse:      uint32(l.inuse.U64(b)),
		Align:      uint32(l.align.U64(b)),
		RedLeftPad: uint32(l.redLeftPad.U64(b)),
		Ctor:       l.ctor.U64(b),
		Random:     l.random.U64(b),
		Hardened:   l.random.OK,
		Refcount:   int(l.refcount.I64(b)),
		UserOffset: uint32(l.useroffset.U64(b)),
		UserSize:   uint32(l.usersize.U64(b)),
		cpuSlab:    l.cpuSlab.U64(b),
		sysfsKN:    l.kobjSD.U64(b),
	}
	oo := uint32(l.oo.U64(b)) // order << OO_SHIFT | objects
	c.Order, c.PerSlab = int(oo>>16), int(oo&(1<<16-1))
	name, err := h.readString(l.name.U64(b), 64)
	if err != nil {
		return nil, fmt.Errorf("name at %#x: %w", l.name.U64(b), err)
	}
	c.Name = name
	// The layout must make sense before any freelist is decoded with it.
	switch {
	case c.Size == 0 || c.Size > 1<<24:
		return nil, fmt.Errorf("%s: slot size %d", name, c.Size)
	case c.ObjectSize > c.Size:
		return nil, fmt.Errorf("%s: object size %d exceeds the slot size %d", name, c.ObjectSize, c.Size)
	case uint64(c.RedLeftPad)+uint64(c.Offset)+8 > uint64(c.Size):
		return nil, fmt.Errorf("%s: free pointer offset %d (after a %d-byte red zone) outside the %d-byte slot", name, c.Offset, c.RedLeftPad, c.Size)
	case c.RedLeftPad >= c.Size:
		return nil, fmt.Errorf("%s: left red zone %d in a %d-byte slot", name, c.RedLeftPad, c.Size)
	case c.Order > 10 || c.PerSlab == 0 || c.PerSlab > maxObjectsPerSlab || uint64(c.PerSlab)*uint64(c.Size) > pageSize<<c.Order:
		return nil, fmt.Errorf("%s: %d objects of %d bytes in an order-%d slab", name, c.PerSlab, c.Size, c.Order)
	}
	n := min(nodes, int(l.nodeLen))
	for i := 0; i < n; i++ {
		c.nodes = append(c.nodes, binary.LittleEndian.Uint64(b[l.node.Off+8*uint32(i):]))
	}
	return c, nil
}

// Cache finds a cache by name or alias.
func (h *Heap) Cache(name string) (*Cache, bool) {
	for _, c := range h.Caches {
		if c.Name == name {
			return c, true
		}
	}
	for _, c := range h.Caches {
		for _, a := range c.Aliases {
			if a == name {
				return c, true
			}
		}
	}
	return nil, false
}

// CacheAt is the cache whose struct kmem_cache is at addr.
func (h *Heap) CacheAt(addr uint64) (*Cache, bool) {
	c, ok := h.byAddr[addr]
	return c, ok
}
