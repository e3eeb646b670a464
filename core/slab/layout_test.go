package slab

import (
	"encoding/binary"
	"testing"

	"github.com/kinst/kinst/core/internal/btflayout"
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
