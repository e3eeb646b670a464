package dumpgen

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// FreeBSD amd64 page-table bits (sys/amd64/include/pmap.h).
const (
	PGValid   = 0x1
	PGRW      = 0x2
	PGPS      = 0x80
	pageSize  = 4096
	superSize = 2 << 20
)

// Mapping maps one kernel virtual page (4 KiB) or superpage (2 MiB) to
// physical memory.
type Mapping struct {
	VA, PA uint64
	Super  bool // 2 MiB page (versions 2 and 3 only)
}

// Minidump describes a FreeBSD amd64 minidump.
type Minidump struct {
	Version           int // 1, 2 or 3
	KernBase          uint64
	DmapBase, DmapEnd uint64
	Msgbuf            []byte
	// MsgbufTrailer follows Msgbuf inside its page-padded part, as the
	// kernel's struct msgbuf does (see MsgbufRing); it must fit there.
	MsgbufTrailer []byte
	DumpAvail     [][2]uint64       // version 3: physical ranges the bitmap covers
	Pages         map[uint64][]byte // physical page address → 4096 bytes, every page dumped
	Maps          []Mapping
	PageTableBase uint64 // where version 2/3 page-table pages go (physical)
	MaxPhys       uint64 // versions 1–2: bitmap covers [0, MaxPhys)
}

// Bytes lays the dump out as minidump_machdep.c writes it: a header page,
// the message buffer, dump_avail (v3), the bitmap, the kernel pmap (v1:
// one PTE per 4 KiB page from KernBase; v2/v3: one PDE per 2 MiB, whose
// page-table pages are themselves dumped), then every dumped page in
// bitmap order. Each part is padded to a page.
func (m *Minidump) Bytes() ([]byte, error) {
	le := binary.LittleEndian
	pages := make(map[uint64][]byte, len(m.Pages))
	for pa, d := range m.Pages {
		if pa%pageSize != 0 || len(d) != pageSize {
			return nil, fmt.Errorf("page %#x: not a page", pa)
		}
		pages[pa] = d
	}
	var pmap []byte
	switch m.Version {
	case 1:
		var n uint64
		for _, mp := range m.Maps {
			if mp.Super {
				return nil, fmt.Errorf("version 1 has no superpages")
			}
			n = max(n, (mp.VA-m.KernBase)/pageSize+1)
		}
		pmap = make([]byte, 8*n)
		for _, mp := range m.Maps {
			le.PutUint64(pmap[8*((mp.VA-m.KernBase)/pageSize):], mp.PA|PGValid|PGRW)
		}
	case 2, 3:
		var n uint64
		for _, mp := range m.Maps {
			n = max(n, (mp.VA-m.KernBase)/superSize+1)
		}
		n = (n + 511) / 512 * 512 // whole pages of PDEs, as the kernel writes
		pmap = make([]byte, 8*n)
		ptp := map[uint64]uint64{} // PDE index → page-table page address
		next := m.PageTableBase
		for _, mp := range m.Maps {
			i := (mp.VA - m.KernBase) / superSize
			if mp.Super {
				le.PutUint64(pmap[8*i:], mp.PA|PGValid|PGRW|PGPS)
				continue
			}
			pt, ok := ptp[i]
			if !ok {
				pt, next = next, next+pageSize
				ptp[i] = pt
				pages[pt] = make([]byte, pageSize)
				le.PutUint64(pmap[8*i:], pt|PGValid|PGRW)
			}
			le.PutUint64(pages[pt][8*((mp.VA>>12)&511):], mp.PA|PGValid|PGRW)
		}
	default:
		return nil, fmt.Errorf("version %d", m.Version)
	}

	// Bit ids: the page number, or (v3) the page's index within the
	// concatenated dump_avail ranges.
	bitID := func(pa uint64) (uint64, bool) {
		if m.Version < 3 {
			return pa / pageSize, pa < m.MaxPhys
		}
		var adj uint64
		for _, r := range m.DumpAvail {
			if pa >= r[0] && pa < r[1] {
				return adj + (pa-r[0])/pageSize, true
			}
			adj += (r[1] - r[0]) / pageSize
		}
		return 0, false
	}
	var nbits uint64
	if m.Version < 3 {
		nbits = m.MaxPhys / pageSize
	} else {
		for _, r := range m.DumpAvail {
			nbits += (r[1] - r[0]) / pageSize
		}
	}
	bitmap := make([]byte, (nbits+63)/64*8)
	addrs := make([]uint64, 0, len(pages))
	for pa := range pages {
		id, ok := bitID(pa)
		if !ok {
			return nil, fmt.Errorf("page %#x outside the dumpable ranges", pa)
		}
		bitmap[id/8] |= 1 << (id % 8)
		addrs = append(addrs, pa)
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i] < addrs[j] })

	var avail []byte
	if m.Version >= 3 {
		avail = make([]byte, 16*(len(m.DumpAvail)+1)) // zero pair ends it
		for i, r := range m.DumpAvail {
			le.PutUint64(avail[16*i:], r[0])
			le.PutUint64(avail[16*i+8:], r[1])
		}
	}

	hdr := make([]byte, pageSize)
	copy(hdr, "minidump FreeBSD/amd64")
	le.PutUint32(hdr[24:], uint32(m.Version))
	le.PutUint32(hdr[28:], uint32(len(m.Msgbuf)))
	le.PutUint32(hdr[32:], uint32(len(bitmap)))
	le.PutUint32(hdr[36:], uint32(len(pmap)))
	le.PutUint64(hdr[40:], m.KernBase)
	le.PutUint64(hdr[48:], m.DmapBase)
	le.PutUint64(hdr[56:], m.DmapEnd)
	if m.Version >= 3 {
		le.PutUint32(hdr[64:], uint32(len(avail)))
	}
	msgPart := append(append([]byte{}, m.Msgbuf...), m.MsgbufTrailer...)
	if len(m.MsgbufTrailer) > 0 && len(msgPart) > (len(m.Msgbuf)+pageSize-1)/pageSize*pageSize {
		return nil, fmt.Errorf("msgbuf trailer of %d bytes does not fit in the %d-byte buffer's last page", len(m.MsgbufTrailer), len(m.Msgbuf))
	}
	out := hdr
	for _, part := range [][]byte{msgPart, avail, bitmap, pmap} {
		out = append(out, part...)
		out = append(out, make([]byte, (pageSize-len(out)%pageSize)%pageSize)...)
	}
	for _, pa := range addrs {
		out = append(out, pages[pa]...)
	}
	return out, nil
}

// FreeBSD's struct msgbuf (sys/sys/msgbuf.h) on amd64.
const (
	MsgMagic      = 0x063062
	MsgbufHdrSize = 72 // msg_ptr … msg_flags (40 bytes), struct mtx msg_lock (32)
)

// MsgbufRing is the kernel message buffer of kern.msgbufsize total bytes
// after text was written to it: msgbufinit takes sizeof(struct msgbuf)
// from the end for the struct, leaving a ring of total-MsgbufHdrSize
// bytes that msgbuf_addchar fills at msg_wseq % msg_size, the sequence
// numbers counting modulo 16*msg_size. It returns the ring (the
// minidump's msgbuf part) and the struct that follows it, whose msg_ptr
// is ptr.
func MsgbufRing(total int, text []byte, ptr uint64) (ring, hdr []byte) {
	size := total - MsgbufHdrSize
	ring = make([]byte, size)
	seqmod := uint32(16 * size)
	var wseq, rseq uint32
	for _, c := range text {
		ring[int(wseq)%size] = c
		wseq = (wseq + 1) % seqmod
		if (wseq+seqmod-rseq)%seqmod > uint32(size) { // full: the oldest byte is lost
			rseq = (rseq + 1) % seqmod
		}
	}
	le := binary.LittleEndian
	hdr = make([]byte, MsgbufHdrSize)
	le.PutUint64(hdr[0:], ptr)
	le.PutUint32(hdr[8:], MsgMagic)
	le.PutUint32(hdr[12:], uint32(size))
	le.PutUint32(hdr[16:], wseq)
	le.PutUint32(hdr[20:], rseq)
	le.PutUint32(hdr[28:], seqmod)
	le.PutUint32(hdr[32:], 0xffffffff) // msg_lastpri -1
	return ring, hdr
}
