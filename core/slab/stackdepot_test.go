package slab_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/slab"
	"github.com/kinst/kinst/core/slab/slabtest"
)

// depotLayout is one kernel generation's stack depot: the handle's
// parts (union handle_parts), the record (struct stack_record) and the
// pools' symbol.
type depotLayout struct {
	name    string
	pools   string
	index   string // the pool index's member
	idxBits uint32
	plus1   bool   // the index is stored plus one (6.8+)
	recOff  uint32 // struct stack_record's handle
	sizeOff uint32 // … and size
	entries uint32 // … and entries
	anonArr bool   // entries inside an anonymous union (6.8+)
}

var depotLayouts = []depotLayout{
	{name: "6.1", pools: "stack_slabs", index: "slabindex", idxBits: 16, recOff: 16, sizeOff: 12, entries: 24},
	{name: "6.12", pools: "stack_pools", index: "pool_index_plus_1", idxBits: 17, plus1: true, recOff: 24, sizeOff: 20, entries: 32, anonArr: true},
}

func bitfield(name string, t btf.Type, off, bits uint32) btf.Member {
	return btf.Member{Name: name, Type: t, Offset: btf.Bits(off), BitfieldSize: btf.Bits(bits)}
}

// types is the layout's BTF: handle_parts and stack_record.
func (l depotLayout) types() []btf.Type {
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	u64 := &btf.Int{Name: "long unsigned int", Size: 8}
	parts := &btf.Struct{Size: 4, Members: []btf.Member{
		bitfield(l.index, u32, 0, l.idxBits), bitfield("offset", u32, l.idxBits, 10), bitfield("extra", u32, 27, 5)}}
	if !l.plus1 {
		parts.Members = append(parts.Members[:2], bitfield("valid", u32, 26, 1), parts.Members[2])
	}
	hp := &btf.Union{Name: "handle_parts", Size: 4, Members: []btf.Member{{Name: "handle", Type: u32}, {Type: parts}}}
	arr := &btf.Array{Index: u32, Type: u64, Nelems: 0}
	entries := btf.Member{Name: "entries", Type: arr, Offset: btf.Bits(8 * l.entries)}
	if l.anonArr {
		arr.Nelems = 64
		entries = btf.Member{Type: &btf.Union{Size: 512, Members: []btf.Member{{Name: "entries", Type: arr}}}, Offset: btf.Bits(8 * l.entries)}
	}
	rec := &btf.Struct{Name: "stack_record", Size: l.entries, Members: []btf.Member{
		{Name: "hash", Type: u32, Offset: btf.Bits(8 * (l.sizeOff - 4))},
		{Name: "size", Type: u32, Offset: btf.Bits(8 * l.sizeOff)},
		{Name: "handle", Type: hp, Offset: btf.Bits(8 * l.recOff)},
		entries,
	}}
	return append(slabtest.Types(false), hp, rec)
}

// handle is the handle of pool idx, offset off (16-byte units).
func (l depotLayout) handle(idx, off uint32) uint32 {
	if l.plus1 {
		idx++
	} else {
		off |= 1 << 10 // valid
	}
	return idx | off<<l.idxBits
}

// The depot of each kernel generation, built from its BTF: a handle's
// frames, innermost first; no stack for handle 0; a record that names
// another handle, an absurd frame count or a pool never allocated is an
// error, not a stack.
func TestStackDepot(t *testing.T) {
	for _, l := range depotLayouts {
		t.Run(l.name, func(t *testing.T) {
			im := slabtest.NewImageTypes(t, false, l.types())
			pools := im.Alloc(8 * 4)
			im.Syms[l.pools] = pools
			pool := im.Alloc(16384)
			im.U64(pools+8*2, pool) // pool 2; 0, 1 and 3 unallocated
			frames := []uint64{0xffffffff81234567, 0xffffffff81000010, 0xffffffffc0001234}
			put := func(off uint32, own uint32, frames []uint64) {
				rec := pool + uint64(off)<<4
				im.Write(rec+uint64(l.recOff), []byte{byte(own), byte(own >> 8), byte(own >> 16), byte(own >> 24)})
				n := uint32(len(frames))
				im.Write(rec+uint64(l.sizeOff), []byte{byte(n), byte(n >> 8), 0, 0})
				for i, f := range frames {
					im.U64(rec+uint64(l.entries)+8*uint64(i), f)
				}
			}
			good := l.handle(2, 5)
			put(5, good, frames)
			put(40, l.handle(2, 41), frames) // names a neighbour
			put(60, l.handle(2, 60), nil)    // no frames
			d, err := slab.NewStackDepot(im)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := d.Stack(good); err != nil || !slices.Equal(got, frames) {
				t.Errorf("handle %#x: %#x, %v; want %#x", good, got, err, frames)
			}
			// Extra bits (stack_depot_set_extra_bits) do not change the stack.
			if got, err := d.Stack(good | 3<<27); err != nil || !slices.Equal(got, frames) {
				t.Errorf("handle with extra bits: %#x, %v", got, err)
			}
			if got, err := d.Stack(0); err != nil || got != nil {
				t.Errorf("handle 0: %#x, %v; want no stack", got, err)
			}
			for _, h := range []uint32{l.handle(2, 40), l.handle(2, 60), l.handle(3, 5)} {
				if got, err := d.Stack(h); err == nil {
					t.Errorf("handle %#x: %#x, want an error", h, got)
				}
			}
		})
	}
	im := slabtest.NewImage(t, false)
	if _, err := slab.NewStackDepot(im); !errors.Is(err, slab.ErrNoStackDepot) {
		t.Errorf("a kernel without a depot: %v", err)
	}
}
