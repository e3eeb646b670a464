package typegraph

import (
	"encoding/binary"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/internal/btflayout"
)

// mapleOwners are the maple trees whose entries' type is known: an
// mm_struct's mm_mt maps addresses to its vm_area_structs (mm/mmap.c).
// 6.1 keeps VMAs on no list any more, so the tree is their only link.
var mapleOwners = []struct{ owner, member, entry string }{
	{"mm_struct", "mm_mt.ma_root", "vm_area_struct"},
	// 6.9+: a tmpfs directory's stable offsets (fs/libfs.c:
	// simple_offset_add), a tree of its children's dentries.
	{"shmem_inode_info", "dir_offsets.mt.ma_root", "dentry"},
}

// maple is what reading a maple tree needs (lib/maple_tree.c, 6.1).
type maple struct {
	ok      bool
	owners  map[int32]mapleOwner // owner struct → where its tree's root is and the entry type
	node    int32                // struct maple_node
	r64Slot uint32               // maple_range_64.slot: 16 slots
	a64Slot uint32               // maple_arange_64.slot: 10 slots
}

type mapleOwner struct {
	root  uint32
	entry int32
}

// maple node types (enum maple_type) and the pointer encoding: the root
// is the node | 2 (xa_mk_node), a child node | type << 3 | 4
// (mte_mk_node); a leaf's slots are the entries.
const (
	mapleDense   = 0
	mapleLeaf64  = 1
	mapleRange64 = 2
	mapleArange  = 3
	mapleNodeMsk = 0xff // MAPLE_NODE_MASK
	mapleMaxNode = 1 << 16
)

func (g *Graph) initMaple() {
	b := btflayout.New(g.spec)
	r64, _, err1 := b.Lookup("maple_range_64", "slot")
	a64, _, err2 := b.Lookup("maple_arange_64", "slot")
	var node *btf.Struct
	if err1 != nil || err2 != nil || g.spec.TypeByName("maple_node", &node) != nil {
		return
	}
	g.mt = maple{ok: true, owners: map[int32]mapleOwner{}, node: g.ts.id(node), r64Slot: r64.Off, a64Slot: a64.Off}
	for _, o := range mapleOwners {
		var os, es *btf.Struct
		if g.spec.TypeByName(o.owner, &os) != nil || g.spec.TypeByName(o.entry, &es) != nil {
			continue
		}
		f, _, err := b.Lookup(o.owner, o.member)
		if err != nil {
			continue
		}
		g.mt.owners[g.ts.id(os)] = mapleOwner{root: f.Off, entry: g.ts.id(es)}
	}
}

// scanMaple claims the nodes and entries of the maple tree of a typed
// object whose type owns one.
func (g *Graph) scanMaple(n int32, b []byte, t int32, m Mark) {
	o, ok := g.mt.owners[t]
	if !ok || int(o.root)+8 > len(b) {
		return
	}
	visited := 0
	entry := func(v uint64) {
		if v >= 0xffff800000000000 {
			if tn, toff, ok := g.node(v); ok && tn != n {
				g.claim(claim{tgt: tn, src: n, srcOff: o.root, toff: toff, typ: o.entry}, t, m)
			}
		}
	}
	var walk func(enc uint64, depth int)
	walk = func(enc uint64, depth int) {
		if depth > 16 || visited > mapleMaxNode {
			return
		}
		if depth == 0 && (enc&3 != 2 || enc < 4096) { // not a node (xa_is_node): the root is an entry
			entry(enc)
			return
		}
		visited++
		typ := (enc >> 3) & 0xf

		addr := enc &^ mapleNodeMsk
		var off, nslots uint32
		switch typ {
		case mapleLeaf64, mapleRange64:
			off, nslots = g.mt.r64Slot, 16
		case mapleArange:
			off, nslots = g.mt.a64Slot, 10
		default:
			return
		}
		nn, noff, ok := g.node(addr)
		if !ok || noff != 0 {
			return
		}
		g.claim(claim{tgt: nn, src: n, srcOff: o.root, toff: 0, typ: g.mt.node}, t, m)
		nb := g.bytes(nn)
		if nb == nil || int(off+8*nslots) > len(nb) {
			return
		}
		for i := uint32(0); i < nslots; i++ {
			v := binary.LittleEndian.Uint64(nb[off+8*i:])
			if v == 0 {
				continue
			}
			if typ == mapleLeaf64 {
				entry(v) // a leaf's slots are the entries
				continue
			}
			walk(v, depth+1)
		}
	}
	walk(binary.LittleEndian.Uint64(b[o.root:]), 0)
}
