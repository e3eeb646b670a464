package slab

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/internal/btflayout"
	"github.com/kinst/kinst/internal/btftest"
)

// How a struct page says it heads a slab, in each kernel's way.
func TestIsSlabMarks(t *testing.T) {
	page := func(flags uint64, pageType uint32) []byte {
		b := make([]byte, 64)
		binary.LittleEndian.PutUint64(b[0:], flags)
		binary.LittleEndian.PutUint32(b[48:], pageType)
		return b
	}
	flags := btflayout.Field{Off: 0, Size: 8, OK: true}
	ptype := btflayout.Field{Off: 48, Size: 4, OK: true}
	for _, c := range []struct {
		name string
		l    layout
		b    []byte
		want bool
	}{
		{"6.1 PG_slab set", layout{slabBy: slabByFlag, pgSlab: 9, pageFlags: flags, pageType: ptype}, page(1<<9, 0), true},
		{"6.1 PG_slab clear", layout{slabBy: slabByFlag, pgSlab: 9, pageFlags: flags, pageType: ptype}, page(1<<8, 0xffffffff), false},
		{"6.12 PGTY_slab", layout{slabBy: slabByType, pgSlab: 0xf5, pageFlags: flags, pageType: ptype}, page(1<<9, 0xf5000000), true},
		{"6.12 buddy", layout{slabBy: slabByType, pgSlab: 0xf5, pageFlags: flags, pageType: ptype}, page(1<<9, 0xf0000000), false},
		{"6.12 no type (mapcount -1)", layout{slabBy: slabByType, pgSlab: 0xf5, pageFlags: flags, pageType: ptype}, page(0, 0xffffffff), false},
		{"6.10 PG_slab clear under base", layout{slabBy: slabByTypeBit, pgSlab: 0x00100000, typeBase: 0xf0000000, pageFlags: flags, pageType: ptype}, page(0, 0xffefffff&0xf0ffffff), true},
		{"6.10 no type", layout{slabBy: slabByTypeBit, pgSlab: 0x00100000, typeBase: 0xf0000000, pageFlags: flags, pageType: ptype}, page(0, 0xffffffff), false},
	} {
		if got := c.l.isSlab(c.b); got != c.want {
			t.Errorf("%s: isSlab %v, want %v", c.name, got, c.want)
		}
	}
}

// From 6.10 the SLAB_ flags are bits numbered by enum _slab_flag_bits;
// a cache's flags word is read into the fixed values of the Flag
// constants (6.1's), so STORE_USER (bit 7 of 6.12's word) finds the
// tracks and a flag the constants lack prints by name. Without the enum
// the word is taken as it is.
func TestFlagBits(t *testing.T) {
	var vals []btf.EnumValue
	for i, n := range []string{"CONSISTENCY_CHECKS", "RED_ZONE", "POISON", "KMALLOC", "HWCACHE_ALIGN", "CACHE_DMA", "CACHE_DMA32",
		"STORE_USER", "PANIC", "TYPESAFE_BY_RCU", "TRACE", "NOLEAKTRACE", "NO_MERGE", "ACCOUNT", "NO_USER_FLAGS", "SKIP_KFENCE",
		"RECLAIM_ACCOUNT", "OBJECT_POISON", "CMPXCHG_DOUBLE", "NO_OBJ_EXT", "FLAGS_LAST_BIT"} {
		vals = append(vals, btf.EnumValue{Name: "_SLAB_" + n, Value: uint64(i)})
	}
	spec := btftest.Spec(t, &btf.Enum{Name: "_slab_flag_bits", Size: 4, Values: vals})
	bits := flagBits(spec)
	for _, tc := range []struct {
		raw  uint64
		want []string
	}{
		{0x80, []string{"STORE_USER"}},
		{1<<3 | 1<<12, []string{"KMALLOC", "NO_MERGE"}},
		{1<<1 | 1<<2 | 1<<7 | 1<<17, []string{"RED_ZONE", "POISON", "STORE_USER", "__OBJECT_POISON"}},
		{1 << 21, []string{"0x2000000000000000"}}, // a bit the enum does not name
	} {
		if got := FlagNames(canonicalFlags(tc.raw, bits)); !slices.Equal(got, tc.want) {
			t.Errorf("6.12 flags %#x: %v, want %v", tc.raw, got, tc.want)
		}
	}
	c := &Cache{Flags: canonicalFlags(0x80, bits), Offset: 64, Inuse: 64}
	if c.TrackOffset() != 72 {
		t.Errorf("STORE_USER by 6.12's numbering: tracks at %d, want 72", c.TrackOffset())
	}
	if got := canonicalFlags(FlagStoreUser, flagBits(btftest.Spec(t, &btf.Int{Name: "int", Size: 4}))); got != FlagStoreUser {
		t.Errorf("6.1's flags %#x read as %#x", FlagStoreUser, got)
	}
}
