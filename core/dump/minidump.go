package dump

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/kinst/kinst/core/internal/sparse"
)

// FreeBSD amd64 minidumps (sys/amd64/include/minidump.h, written by
// sys/amd64/amd64/minidump_machdep.c, read by libkvm's
// kvm_minidump_amd64.c). The file, each part padded to a 4 KiB page:
//
//	header     magic "minidump FreeBSD/amd64", version, msgbufsize,
//	           bitmapsize, pmapsize, kernbase, dmapbase, dmapend,
//	           dumpavailsize (v3)
//	msgbuf     the kernel message buffer
//	dump_avail (v3) pairs of physical [start, end), ended by a zero pair
//	bitmap     one bit per physical page (v3: per page of the dump_avail
//	           ranges, in order); set bits are the dumped pages
//	pmap       v1: one PTE per 4 KiB of kernel VA from kernbase;
//	           v2, v3: one PDE per 2 MiB of kernel VA from kernbase
//	pages      the dumped pages, in bitmap order
//
// Kernel virtual addresses translate through the pmap (from kernbase up)
// or the direct map [dmapbase, dmapend).
const (
	minidumpFormat = "freebsd-minidump"
	minidumpMagic  = "minidump FreeBSD/amd64\x00"
	minidumpHdrLen = 72
	mdPageSize     = 4096

	mdPGValid   = 0x1
	mdPGPS      = 0x80
	mdPGFrame   = 0x000ffffffffff000
	mdPGPSFrame = 0x000fffffffe00000
	mdSuperSize = 2 << 20

	mdMaxPart = 1 << 30 // msgbuf, bitmap, pmap: each far smaller on real machines
)

func init() {
	register(minidumpFormat, probeMinidump, withSize(func(r io.ReaderAt, size int64, c io.Closer) (Dump, error) {
		return newMinidump(r, size, c)
	}))
}

func probeMinidump(head []byte) bool { return bytes.HasPrefix(head, []byte(minidumpMagic)) }

// Minidump is an open FreeBSD amd64 minidump. Nothing changes after it
// opens, so it is safe for concurrent use.
type Minidump struct {
	r      io.ReaderAt
	size   int64
	closer io.Closer

	// From the header: the minidump version (1–3), the kernel VA the
	// pmap starts at, and the direct map's virtual range.
	Version           int
	KernBase          uint64
	DmapBase, DmapEnd uint64

	msgbuf    []byte
	msgTail   []byte  // the rest of msgbuf's last page (see MessageBufferTail)
	dumpAvail []Range // v3; nil: the bitmap counts pages from address 0
	bitmap    *sparse.Index
	pmap      []uint64 // v1: PTEs; v2, v3: PDEs
	pagesOff  int64
}

// MessageBuffer is the kernel message buffer the dump carries, as the
// kernel's ring holds it (the oldest text may follow the newest).
func (m *Minidump) MessageBuffer() []byte { return m.msgbuf }

// MessageBufferTail is the rest of the message buffer's last page in the
// file. The kernel writes whole pages from msg_ptr, and msgbufinit puts
// the kernel's struct msgbuf (with the ring's write sequence number)
// right after the msg_size bytes of text, so with a page-aligned
// kern.msgbufsize, the default, the struct is here. Empty when the
// buffer ends on a page boundary.
func (m *Minidump) MessageBufferTail() []byte { return m.msgTail }

// DumpAvail is the version 3 header's dump_avail list: the physical
// ranges whose pages the bitmap numbers, in order. Nil before version 3,
// where the bitmap numbers every page from address 0.
func (m *Minidump) DumpAvail() []Range { return m.dumpAvail }

// BitmapPages is how many physical pages the bitmap describes (dumped
// or not): the machine's memory as the dump saw it, in pages.
func (m *Minidump) BitmapPages() uint64 { return m.bitmap.Len() }

// DumpedPages is how many pages the file holds (the bitmap's set bits).
func (m *Minidump) DumpedPages() uint64 { return m.bitmap.Count() }

// PmapEntries is the number of entries in the dump's kernel pmap: PTEs
// (one per 4 KiB from KernBase) in version 1, PDEs (one per 2 MiB) after.
func (m *Minidump) PmapEntries() int { return len(m.pmap) }

func newMinidump(r io.ReaderAt, size int64, closer io.Closer) (*Minidump, error) {
	corrupt := func(off int64, f string, a ...any) error {
		return &CorruptError{minidumpFormat, off, fmt.Sprintf(f, a...)}
	}
	m := &Minidump{r: r, size: size, closer: closer}
	hdr := make([]byte, minidumpHdrLen)
	if err := m.readFull(hdr, 0, "header"); err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(hdr, []byte(minidumpMagic)) {
		return nil, corrupt(0, "no %q magic", minidumpMagic[:len(minidumpMagic)-1])
	}
	le := binary.LittleEndian
	m.Version = int(le.Uint32(hdr[24:]))
	if m.Version < 1 || m.Version > 3 {
		return nil, corrupt(24, "minidump version %d (this reader knows 1 to 3)", m.Version)
	}
	msgbufSize := uint64(le.Uint32(hdr[28:]))
	bitmapSize := uint64(le.Uint32(hdr[32:]))
	pmapSize := uint64(le.Uint32(hdr[36:]))
	m.KernBase = le.Uint64(hdr[40:])
	m.DmapBase = le.Uint64(hdr[48:])
	m.DmapEnd = le.Uint64(hdr[56:])
	var availSize uint64
	if m.Version >= 3 {
		availSize = uint64(le.Uint32(hdr[64:]))
	}
	if m.DmapEnd < m.DmapBase {
		return nil, corrupt(56, "direct map ends (%#x) before it starts (%#x)", m.DmapEnd, m.DmapBase)
	}
	for _, p := range []struct {
		n   uint64
		at  int64
		who string
	}{{msgbufSize, 28, "msgbuf"}, {bitmapSize, 32, "bitmap"}, {pmapSize, 36, "pmap"}, {availSize, 64, "dump_avail"}} {
		if p.n > mdMaxPart || p.n > uint64(size) {
			return nil, corrupt(p.at, "%s of %d bytes in a %d-byte file", p.who, p.n, size)
		}
	}
	round := func(n uint64) int64 { return int64((n + mdPageSize - 1) &^ (mdPageSize - 1)) }
	off := int64(mdPageSize)

	m.msgbuf = make([]byte, msgbufSize)
	if err := m.readFull(m.msgbuf, off, "msgbuf"); err != nil {
		return nil, err
	}
	// The tail is a convenience (struct msgbuf); a short file leaves it
	// empty here and fails below, where the parts that matter are read.
	if tail := make([]byte, round(msgbufSize)-int64(msgbufSize)); len(tail) > 0 {
		if m.readFull(tail, off+int64(msgbufSize), "msgbuf") == nil {
			m.msgTail = tail
		}
	}
	off += round(msgbufSize)

	if availSize > 0 {
		if availSize%16 != 0 {
			return nil, corrupt(64, "dump_avail of %d bytes is not a whole number of (start, end) pairs", availSize)
		}
		b := make([]byte, availSize)
		if err := m.readFull(b, off, "dump_avail"); err != nil {
			return nil, err
		}
		for i := 0; i < len(b); i += 16 {
			r := Range{le.Uint64(b[i:]), le.Uint64(b[i+8:])}
			if r.End == 0 {
				break // the zero pair ends the list
			}
			if r.End < r.Start || len(m.dumpAvail) > 0 && r.Start < m.dumpAvail[len(m.dumpAvail)-1].End {
				return nil, corrupt(off+int64(i), "dump_avail range [%#x, %#x) is reversed or out of order", r.Start, r.End)
			}
			m.dumpAvail = append(m.dumpAvail, r)
		}
		if len(m.dumpAvail) == 0 {
			m.dumpAvail = []Range{} // v3 with no memory: every bit id is invalid
		}
	}
	off += round(availSize)

	bm := make([]byte, bitmapSize)
	if err := m.readFull(bm, off, "bitmap"); err != nil {
		return nil, err
	}
	m.bitmap = sparse.New(bm, bitmapSize*8)
	off += round(bitmapSize)

	pm := make([]byte, pmapSize&^7)
	if err := m.readFull(pm, off, "pmap"); err != nil {
		return nil, err
	}
	m.pmap = make([]uint64, len(pm)/8)
	for i := range m.pmap {
		m.pmap[i] = le.Uint64(pm[8*i:])
	}
	off += round(pmapSize)

	m.pagesOff = off
	if n := m.bitmap.Count(); n > uint64(size)/mdPageSize || off+int64(n)*mdPageSize > size {
		return nil, corrupt(off, "the bitmap names %d pages but only %d bytes follow", n, size-min(off, size))
	}
	return m, nil
}

func (m *Minidump) readFull(p []byte, off int64, what string) error {
	return readFullAt(m.r, m.size, p, off, minidumpFormat, what)
}

// bitID is the bitmap bit of the page holding pa (libkvm's
// _kvm_pa_bit_id): the page number, or in v3 the page's index within
// the dump_avail ranges taken in order.
func (m *Minidump) bitID(pa uint64) (uint64, bool) {
	if m.dumpAvail == nil {
		return pa / mdPageSize, true
	}
	var adj uint64
	for _, r := range m.dumpAvail {
		first, end := r.Start/mdPageSize, (r.End+mdPageSize-1)/mdPageSize
		if pa/mdPageSize >= first && pa/mdPageSize < end {
			return adj + pa/mdPageSize - first, true
		}
		adj += end - first
	}
	return 0, false
}

// pageOffset is the file offset of the dumped page holding pa.
func (m *Minidump) pageOffset(pa uint64) (int64, bool) {
	id, ok := m.bitID(pa)
	if !ok {
		return 0, false
	}
	rank, ok := m.bitmap.Rank(id)
	if !ok {
		return 0, false
	}
	return m.pagesOff + int64(rank)*mdPageSize, true
}

func (m *Minidump) Format() string     { return minidumpFormat }
func (m *Minidump) VMCoreInfo() string { return "" }

// CPUs is empty: a minidump records no registers (the dumping thread's
// are in the kernel's dumppcb, in memory).
func (m *Minidump) CPUs() []CPU { return nil }

// PhysRanges lists the runs of dumped pages.
func (m *Minidump) PhysRanges() []Range {
	var rs []Range
	m.bitmap.Runs(func(s, e uint64) bool {
		if m.dumpAvail == nil {
			rs = append(rs, Range{s * mdPageSize, e * mdPageSize})
			return true
		}
		// Map bit ids back through dump_avail, splitting at range ends.
		var adj uint64
		for _, r := range m.dumpAvail {
			first, end := r.Start/mdPageSize, (r.End+mdPageSize-1)/mdPageSize
			lo, hi := max(s, adj), min(e, adj+end-first)
			if lo < hi {
				rs = append(rs, Range{(first + lo - adj) * mdPageSize, (first + hi - adj) * mdPageSize})
			}
			adj += end - first
		}
		return true
	})
	return rs
}

// ReadPhys reads physical memory.
func (m *Minidump) ReadPhys(p []byte, addr uint64) (int, error) {
	return m.read(p, addr, true)
}

// ReadVirt reads kernel virtual memory through the dump's pmap (from
// kernbase) or the direct map.
func (m *Minidump) ReadVirt(p []byte, addr uint64) (int, error) {
	return m.read(p, addr, false)
}

func (m *Minidump) read(p []byte, addr uint64, phys bool) (int, error) {
	n := 0
	for n < len(p) {
		a := addr + uint64(n)
		pa := a
		if !phys {
			var err error
			if pa, err = m.translate(a); err != nil {
				return n, err
			}
		}
		off, ok := m.pageOffset(pa)
		if !ok {
			// A mapped virtual page that was not dumped names its
			// physical address; an unmapped one its virtual address.
			return n, &NotPresentError{Addr: pa, Physical: true}
		}
		in := pa % mdPageSize
		chunk := min(uint64(len(p)-n), mdPageSize-in)
		if err := m.readFull(p[n:n+int(chunk)], off+int64(in), "page"); err != nil {
			return n, err
		}
		n += int(chunk)
	}
	return n, nil
}

// translate maps a kernel virtual address to a physical one, as libkvm's
// _amd64_minidump_vatop and _vatop_v1 do.
func (m *Minidump) translate(va uint64) (uint64, error) {
	notMapped := &NotPresentError{Addr: va}
	switch {
	case va >= m.KernBase:
		if m.Version == 1 {
			i := (va - m.KernBase) / mdPageSize
			if i >= uint64(len(m.pmap)) || m.pmap[i]&mdPGValid == 0 {
				return 0, notMapped
			}
			return m.pmap[i]&mdPGFrame | va%mdPageSize, nil
		}
		i := (va - m.KernBase) / mdSuperSize
		if i >= uint64(len(m.pmap)) || m.pmap[i]&mdPGValid == 0 {
			return 0, notMapped
		}
		pde := m.pmap[i]
		if pde&mdPGPS != 0 {
			return pde&mdPGPSFrame | va%mdSuperSize, nil
		}
		// A 4 KiB mapping: the page-table page is itself in the dump.
		ptAddr := pde&mdPGFrame + 8*((va/mdPageSize)%512)
		var b [8]byte
		if _, err := m.ReadPhys(b[:], ptAddr); err != nil {
			if errors.Is(err, ErrNotPresent) {
				return 0, &CorruptError{minidumpFormat, -1, fmt.Sprintf("page-table page %#x for VA %#x is not in the dump", pde&mdPGFrame, va)}
			}
			return 0, err
		}
		pte := binary.LittleEndian.Uint64(b[:])
		if pte&mdPGValid == 0 {
			return 0, notMapped
		}
		return pte&mdPGFrame | va%mdPageSize, nil
	case va >= m.DmapBase && va < m.DmapEnd:
		return va - m.DmapBase, nil
	}
	return 0, notMapped
}

func (m *Minidump) Close() error {
	if m.closer != nil {
		return m.closer.Close()
	}
	return nil
}
