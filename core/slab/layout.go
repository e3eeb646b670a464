package slab

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/internal/btflayout"
)

type field = btflayout.Field

// layout holds every offset the walk uses, from the kernel's BTF.
type layout struct {
	// struct kmem_cache
	cacheSize                                                   uint32
	cpuSlab, flags, size, objectSize, offset, oo, min, refcount field
	// flagBits maps the flags word's bits to the Flag constants, where
	// the kernel numbers them (6.10+); nil before.
	flagBits                                                  map[uint64]uint64
	ctor, inuse, align, redLeftPad, name, list, random, node  field
	cpuPartial, cpuPartialSlabs, kobjSD, useroffset, usersize field
	nodeLen                                                   uint32
	// struct kmem_cache_cpu
	cpuSize                                        uint32
	cpuFreelist, cpuTid, cpuSlabSlab, cpuPartialSl field
	// struct kmem_cache_node
	nodeSize                                        uint32
	nrPartial, partial, nrSlabs, totalObjects, full field
	// struct slab (struct page before 5.17)
	slabSize                                               uint32
	slabFlags, slabList, slabNext, slabCache, slabFreelist field
	slabInuse, slabObjects, slabFrozen                     field
	// struct page
	pageSize                                        uint32
	pageFlags, compoundHead, pageRefcount, pageType field
	// Which struct pages head slabs: the PG_slab flag up to 6.9, then a
	// page type (6.10, 6.11: the PG_slab bit of page_type clear under
	// PAGE_TYPE_BASE; 6.12 on: page_type>>24 == PGTY_slab).
	slabBy           slabMark
	pgSlab, typeBase uint64
	// struct list_head
	listNext field
	// struct kernfs_node, for the aliases sysfs shows
	knParent, knName, knRB, knChildren, knTarget, knFlags field
	rbLeft, rbRight, rbRoot                               field
	kernfsLink                                            uint64
	// struct track (slub_debug's SLAB_STORE_USER)
	trackSize                                             uint32
	trackAddr, trackHandle, trackCPU, trackPID, trackWhen field
}

func newLayout(spec *btf.Spec) (*layout, error) {
	lb := btflayout.New(spec)
	l := &layout{}
	const kc = "kmem_cache"
	l.cacheSize = lb.Sizeof(kc)
	l.cpuSlab = lb.Need(kc, "cpu_slab")
	l.flags = lb.Need(kc, "flags")
	l.flagBits = flagBits(spec)
	l.size = lb.Need(kc, "size")
	l.objectSize = lb.Need(kc, "object_size")
	l.offset = lb.Need(kc, "offset")
	l.oo = lb.Need(kc, "oo.x", "oo")
	l.min = lb.Opt(kc, "min.x", "min")
	l.refcount = lb.Need(kc, "refcount")
	l.ctor = lb.Need(kc, "ctor")
	l.inuse = lb.Need(kc, "inuse")
	l.align = lb.Opt(kc, "align")
	l.redLeftPad = lb.Opt(kc, "red_left_pad")
	l.name = lb.Need(kc, "name")
	l.list = lb.Need(kc, "list")
	l.random = lb.Opt(kc, "random") // CONFIG_SLAB_FREELIST_HARDENED
	l.node = lb.Need(kc, "node")
	l.nodeLen = lb.ArrayLen(kc, "node")
	l.cpuPartial = lb.Opt(kc, "cpu_partial")
	l.cpuPartialSlabs = lb.Opt(kc, "cpu_partial_slabs")
	l.kobjSD = lb.Opt(kc, "kobj.sd") // CONFIG_SYSFS
	l.useroffset = lb.Opt(kc, "useroffset")
	l.usersize = lb.Opt(kc, "usersize")

	const kcc = "kmem_cache_cpu"
	l.cpuSize = lb.Sizeof(kcc)
	l.cpuFreelist = lb.Need(kcc, "freelist")
	l.cpuTid = lb.Opt(kcc, "tid")
	l.cpuSlabSlab = lb.Need(kcc, "slab", "page") // page before 5.17
	l.cpuPartialSl = lb.Opt(kcc, "partial")      // CONFIG_SLUB_CPU_PARTIAL

	const kcn = "kmem_cache_node"
	l.nodeSize = lb.Sizeof(kcn)
	l.nrPartial = lb.Need(kcn, "nr_partial")
	l.partial = lb.Need(kcn, "partial")
	l.nrSlabs = lb.Opt(kcn, "nr_slabs.counter") // CONFIG_SLUB_DEBUG
	l.totalObjects = lb.Opt(kcn, "total_objects.counter")
	l.full = lb.Opt(kcn, "full")

	sl := "slab"
	if !lb.Has(sl) {
		sl = "page" // the slab fields lived in struct page before 5.17
	}
	l.slabSize = lb.Sizeof(sl)
	l.slabFlags = lb.Need(sl, "__page_flags", "flags")
	l.slabList = lb.Need(sl, "slab_list", "lru")
	l.slabNext = lb.Opt(sl, "next")
	l.slabCache = lb.Need(sl, "slab_cache")
	l.slabFreelist = lb.Need(sl, "freelist")
	l.slabInuse = lb.Need(sl, "inuse")
	l.slabObjects = lb.Need(sl, "objects")
	l.slabFrozen = lb.Need(sl, "frozen")

	l.pageSize = lb.Sizeof("page")
	l.pageFlags = lb.Need("page", "flags")
	l.compoundHead = lb.Need("page", "compound_head")
	l.pageRefcount = lb.Need("page", "_refcount.counter", "_refcount")
	l.pageType = lb.Opt("page", "page_type")
	var ok bool
	if l.pgSlab, ok = btflayout.EnumValue(spec, "pageflags", "PG_slab"); ok {
		l.slabBy = slabByFlag
	} else if l.pgSlab, ok = btflayout.EnumValue(spec, "pagetype", "PGTY_slab"); ok && l.pageType.OK {
		l.slabBy = slabByType
	} else if l.pgSlab, ok = btflayout.EnumValue(spec, "pagetype", "PG_slab"); ok && l.pageType.OK {
		l.slabBy = slabByTypeBit
		if l.typeBase, ok = btflayout.EnumValue(spec, "pagetype", "PAGE_TYPE_BASE"); !ok {
			l.typeBase = 0xf0000000
		}
	} else {
		lb.Fail(errors.New("neither enum pageflags' PG_slab nor enum pagetype's PGTY_slab (with page.page_type) says which pages are slabs"))
	}
	l.listNext = lb.Need("list_head", "next")

	l.knParent = lb.Opt("kernfs_node", "parent")
	l.knName = lb.Opt("kernfs_node", "name")
	l.knRB = lb.Opt("kernfs_node", "rb")
	l.knChildren = lb.Opt("kernfs_node", "dir.children")
	l.knTarget = lb.Opt("kernfs_node", "symlink.target_kn")
	l.knFlags = lb.Opt("kernfs_node", "flags")
	l.rbLeft = lb.Opt("rb_node", "rb_left")
	l.rbRight = lb.Opt("rb_node", "rb_right")
	l.rbRoot = lb.Opt("rb_root", "rb_node")
	if v, ok := btflayout.EnumValue(spec, "kernfs_node_type", "KERNFS_LINK"); ok {
		l.kernfsLink = v
	}

	if lb.Has("track") {
		l.trackSize = lb.Sizeof("track")
		l.trackAddr = lb.Opt("track", "addr")
		l.trackHandle = lb.Opt("track", "handle")
		l.trackCPU = lb.Opt("track", "cpu")
		l.trackPID = lb.Opt("track", "pid")
		l.trackWhen = lb.Opt("track", "when")
	}
	if err := lb.Err(); err != nil {
		return nil, fmt.Errorf("BTF: %w", err)
	}
	if l.pageSize == 0 || l.slabSize > l.pageSize {
		return nil, fmt.Errorf("BTF: struct page is %d bytes, the slab view of it %d", l.pageSize, l.slabSize)
	}
	return l, nil
}

// aliasesKnown says whether sysfs's kernfs nodes can be read for the
// names of merged caches.
func (l *layout) aliasesKnown() bool {
	return l.kobjSD.OK && l.knParent.OK && l.knName.OK && l.knRB.OK && l.knChildren.OK &&
		l.knTarget.OK && l.knFlags.OK && l.rbLeft.OK && l.rbRight.OK && l.rbRoot.OK && l.kernfsLink != 0
}

// slabMark is how a struct page says it heads a slab.
type slabMark uint8

const (
	slabByFlag    slabMark = iota // PG_slab in page.flags (up to 6.9)
	slabByTypeBit                 // page_type & (PAGE_TYPE_BASE|PG_slab) == PAGE_TYPE_BASE (6.10, 6.11)
	slabByType                    // page_type>>24 == PGTY_slab (6.12 on)
)

// isSlab reports whether the struct page in b heads a slab (the compound
// head test is the caller's).
func (l *layout) isSlab(b []byte) bool {
	switch l.slabBy {
	case slabByType:
		return l.pageType.U64(b)>>24&0xff == l.pgSlab
	case slabByTypeBit:
		return l.pageType.U64(b)&(l.typeBase|l.pgSlab) == l.typeBase
	}
	return l.pageFlags.U64(b)&(1<<l.pgSlab) != 0
}
