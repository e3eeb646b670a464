package dump

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"

	lzo "github.com/anchore/go-lzo"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/kinst/kinst/core/internal/sparse"
)

// The kdump-compressed format, as makedumpfile writes it (its
// diskdump_mod.h) and QEMU's dump-guest-memory kdump-* formats:
//
//	block 0                      disk_dump_header ("KDUMP   ")
//	blocks 1 .. sub_hdr_size     kdump_sub_header, VMCOREINFO, ELF notes
//	bitmap_blocks                1st bitmap (page in memory), 2nd bitmap (page dumped)
//	then                         one page_desc per set bit of the 2nd bitmap
//	then                         page data, each page compressed on its own
//
// A block is the page size. The n-th dumped page (in frame order) has the
// n-th descriptor, so a frame's descriptor is a rank query on the 2nd
// bitmap (package sparse).
const (
	kdumpFormat     = "kdump"
	kdumpSignature  = "KDUMP   "
	kdumpHeaderSize = 464 // sizeof(struct disk_dump_header) on x86-64

	// disk_dump_header fields
	kdHdrVersion      = 8
	kdHdrRelease      = 12 + 2*65 // utsname.release
	kdHdrStatus       = 424
	kdHdrBlockSize    = 428
	kdHdrSubHdrSize   = 432
	kdHdrBitmapBlocks = 436
	kdHdrMaxMapnr     = 440

	// kdump_sub_header fields, with the header version that added them
	kdSubPhysBase      = 0
	kdSubVMCoreInfoOff = 32 // v3
	kdSubVMCoreInfoLen = 40
	kdSubNoteOff       = 48 // v4
	kdSubNoteLen       = 56
	kdSubMaxMapnr64    = 96 // v6
	kdSubSize          = 104

	kdDescSize = 24 // page_desc: offset, size, flags, page_flags

	// page_desc.flags and disk_dump_header.status bits
	kdZlib       = 0x1
	kdLZO        = 0x2
	kdSnappy     = 0x4
	kdIncomplete = 0x8
	kdZstd       = 0x20
	kdCodecs     = kdZlib | kdLZO | kdSnappy | kdZstd

	// Limits that keep a hostile header from asking for absurd memory.
	kdMaxBitmap     = 1 << 30  // one bitmap: 8 Gi frames, 32 TiB of 4 KiB pages
	kdMaxVMCoreInfo = 1 << 20  // the kernel's is one page
	kdMaxNotes      = 64 << 20 // a few KiB per CPU
)

func init() {
	register(kdumpFormat, probeKdump, withSize(func(r io.ReaderAt, size int64, c io.Closer) (Dump, error) {
		return newKdump(r, size, size, kdumpFormat, c)
	}))
}

func probeKdump(head []byte) bool { return bytes.HasPrefix(head, []byte(kdumpSignature)) }

// Kdump is an open kdump-compressed dump (standard or flattened). It is
// safe for concurrent use: the fields above mu are set when it opens and
// only read afterwards.
type Kdump struct {
	format     string
	r          io.ReaderAt
	size       int64
	backing    int64 // bytes of input behind r
	closer     io.Closer
	version    int
	blockSize  uint64
	pageShift  uint
	maxMapnr   uint64
	physBase   uint64
	release    string
	incomplete bool // the dumper ran out of space: pages past the end are lost

	dumped  *sparse.Index // the 2nd bitmap
	inRAM   *sparse.Index // the 1st bitmap
	descOff int64
	notes   Notes

	zlibPool sync.Pool // of zlib readers

	zstdOnce sync.Once
	zstd     *zstd.Decoder
	zstdErr  error

	mu        sync.Mutex             // protects cache, pfnCache and descCache
	cache     [kdCacheSlots]kdCached // by stored offset
	pfnCache  [kdCacheSlots]kdCached // by frame, sparing the descriptor read
	descCache [kdDescSlots]kdCached  // blocks of descriptors, by block number
}

// Page-table walks read a few words from the same pages over and over;
// a small direct-mapped cache of decompressed pages spares re-inflating
// them.
const (
	kdCacheBits     = 8
	kdCacheSlots    = 1 << kdCacheBits
	kdDescsPerBlock = 170 // 4080 bytes of descriptors per read
	kdDescSlots     = 16
)

type kdCached struct {
	key  uint64 // file offset of the stored page, or frame number
	data []byte // nil: empty slot
}

func kdSlot(key uint64) uint64 { return key * 0x9e3779b97f4a7c15 >> (64 - kdCacheBits) }

// newKdump reads a standard kdump-compressed file from r (size bytes).
// backing is how many bytes really stand behind r (a flattened stream
// may describe a large file with holes); the bitmaps must fit in it, so
// a forged header cannot make the reader allocate more than the input.
func newKdump(r io.ReaderAt, size, backing int64, format string, closer io.Closer) (*Kdump, error) {
	k := &Kdump{format: format, r: r, size: size, backing: backing, closer: closer}
	corrupt := func(off int64, f string, a ...any) error {
		return &CorruptError{format, off, fmt.Sprintf(f, a...)}
	}
	hdr := make([]byte, kdumpHeaderSize)
	if err := k.readFull(hdr, 0, "disk_dump_header"); err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(hdr, []byte(kdumpSignature)) {
		return nil, corrupt(0, "no %q signature", kdumpSignature)
	}
	le := binary.LittleEndian
	k.version = int(int32(le.Uint32(hdr[kdHdrVersion:])))
	if k.version < 1 {
		return nil, corrupt(kdHdrVersion, "header version %d (kdump uses 1 and later)", k.version)
	}
	k.release = cstring(hdr[kdHdrRelease : kdHdrRelease+65])
	status := le.Uint32(hdr[kdHdrStatus:])
	k.incomplete = status&kdIncomplete != 0
	bs := int32(le.Uint32(hdr[kdHdrBlockSize:]))
	if bs < 4096 || bs > 1<<16 || bs&(bs-1) != 0 {
		return nil, corrupt(kdHdrBlockSize, "block size %d (want a power of two from 4096 to 65536)", bs)
	}
	k.blockSize = uint64(bs)
	k.pageShift = uint(bits.TrailingZeros64(k.blockSize))
	subBlocks := int32(le.Uint32(hdr[kdHdrSubHdrSize:]))
	bitmapBlocks := uint64(le.Uint32(hdr[kdHdrBitmapBlocks:]))
	if subBlocks < 0 || uint64(subBlocks) > uint64(size)/k.blockSize {
		return nil, corrupt(kdHdrSubHdrSize, "sub-header of %d blocks in a %d-byte file", subBlocks, size)
	}
	if bitmapBlocks == 0 || bitmapBlocks%2 != 0 {
		return nil, corrupt(kdHdrBitmapBlocks, "%d bitmap blocks (want an even number: two bitmaps)", bitmapBlocks)
	}
	bitmapLen := bitmapBlocks / 2 * k.blockSize
	if bitmapLen > kdMaxBitmap || 2*bitmapLen > uint64(backing) {
		return nil, corrupt(kdHdrBitmapBlocks, "bitmaps of %d bytes each exceed the %d-byte limit or the %d-byte input", bitmapLen, kdMaxBitmap, backing)
	}
	bitmapOff := (1 + uint64(subBlocks)) * k.blockSize
	k.descOff = int64(bitmapOff + 2*bitmapLen)
	if uint64(k.descOff) > uint64(size) {
		return nil, corrupt(kdHdrBitmapBlocks, "bitmaps end at %#x, past the end of the %d-byte file", k.descOff, size)
	}
	k.maxMapnr = uint64(le.Uint32(hdr[kdHdrMaxMapnr:]))

	// The sub-header (block 1), as much of it as this version defines.
	if subBlocks > 0 {
		sub := make([]byte, kdSubSize)
		if err := k.readFull(sub, int64(k.blockSize), "kdump_sub_header"); err != nil {
			return nil, err
		}
		k.physBase = le.Uint64(sub[kdSubPhysBase:])
		if m := le.Uint64(sub[kdSubMaxMapnr64:]); k.version >= 6 && m != 0 {
			k.maxMapnr = m
		}
		if k.version >= 3 {
			off, n := int64(le.Uint64(sub[kdSubVMCoreInfoOff:])), le.Uint64(sub[kdSubVMCoreInfoLen:])
			b, err := k.readBlob(off, n, kdMaxVMCoreInfo, int64(k.blockSize)+kdSubVMCoreInfoOff, "VMCOREINFO")
			if err != nil {
				return nil, err
			}
			k.notes.VMCoreInfo = cstring(b)
		}
		if k.version >= 4 {
			off, n := int64(le.Uint64(sub[kdSubNoteOff:])), le.Uint64(sub[kdSubNoteLen:])
			b, err := k.readBlob(off, n, kdMaxNotes, int64(k.blockSize)+kdSubNoteOff, "ELF notes")
			if err != nil {
				return nil, err
			}
			if len(b) > 0 {
				notes, err := ParseNotes(b, format, off)
				if err != nil {
					return nil, err
				}
				vmci := k.notes.VMCoreInfo
				k.notes = *notes
				if vmci != "" {
					k.notes.VMCoreInfo = vmci
				}
			}
		}
	}
	if k.maxMapnr > bitmapLen*8 {
		return nil, corrupt(kdHdrMaxMapnr, "max_mapnr %#x exceeds the %d-byte bitmap", k.maxMapnr, bitmapLen)
	}

	// The 2nd bitmap says which pages are dumped; the 1st, which were in
	// memory, so that a page left out can be told from one never there.
	bm := make([]byte, (k.maxMapnr+7)/8)
	if err := k.readFull(bm, int64(bitmapOff+bitmapLen), "2nd bitmap"); err != nil {
		return nil, err
	}
	k.dumped = sparse.New(bm, k.maxMapnr)
	if err := k.readFull(bm, int64(bitmapOff), "1st bitmap"); err != nil {
		return nil, err
	}
	k.inRAM = sparse.New(bm, k.maxMapnr)
	if n := k.dumped.Count(); !k.incomplete && (n > uint64(size) || uint64(k.descOff)+n*kdDescSize > uint64(size)) {
		return nil, corrupt(k.descOff, "%d page descriptors run past the end of the %d-byte file", n, size)
	}
	return k, nil
}

func (k *Kdump) readFull(p []byte, off int64, what string) error {
	return readFullAt(k.r, k.size, p, off, k.format, what)
}

// readBlob reads an (offset, size) area the sub-header points to.
func (k *Kdump) readBlob(off int64, n, limit uint64, fieldOff int64, what string) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if n > limit || n > uint64(k.backing) {
		return nil, &CorruptError{k.format, fieldOff, fmt.Sprintf("%s of %d bytes exceeds the %d-byte limit", what, n, limit)}
	}
	b := make([]byte, n)
	if err := k.readFull(b, off, what); err != nil {
		return nil, err
	}
	return b, nil
}

func (k *Kdump) Format() string     { return k.format }
func (k *Kdump) VMCoreInfo() string { return k.notes.VMCoreInfo }
func (k *Kdump) CPUs() []CPU        { return k.notes.CPUs }

// Release is the kernel release the header's utsname records.
func (k *Kdump) Release() string { return k.release }

// PhysBase is the kernel's phys_base the sub-header records (x86-64).
func (k *Kdump) PhysBase() uint64 { return k.physBase }

// HeaderVersion is the disk_dump_header version (1–6 and later).
func (k *Kdump) HeaderVersion() int { return k.version }

// RAMBytes is the memory the machine had: the pages of the 1st bitmap.
func (k *Kdump) RAMBytes() uint64 { return k.inRAM.Count() << k.pageShift }

// PhysRanges lists the runs of dumped pages.
func (k *Kdump) PhysRanges() []Range {
	var rs []Range
	k.dumped.Runs(func(s, e uint64) bool {
		rs = append(rs, Range{s << k.pageShift, e << k.pageShift})
		return true
	})
	return rs
}

// ReadPhys reads physical memory, page by page.
func (k *Kdump) ReadPhys(p []byte, addr uint64) (int, error) {
	n := 0
	for n < len(p) {
		a := addr + uint64(n)
		page, err := k.page(a >> k.pageShift)
		if err != nil {
			if errors.Is(err, ErrNotPresent) {
				pfn := a >> k.pageShift
				err = &NotPresentError{Addr: a, Physical: true, Excluded: k.inRAM.Test(pfn) && !k.dumped.Test(pfn)}
			}
			return n, err
		}
		n += copy(p[n:], page[a&(k.blockSize-1):])
	}
	return n, nil
}

// page returns frame pfn's content; the slice must not be modified.
func (k *Kdump) page(pfn uint64) ([]byte, error) {
	fslot := &k.pfnCache[kdSlot(pfn)]
	k.mu.Lock()
	if fslot.data != nil && fslot.key == pfn {
		d := fslot.data
		k.mu.Unlock()
		return d, nil
	}
	k.mu.Unlock()
	rank, ok := k.dumped.Rank(pfn)
	if !ok {
		return nil, ErrNotPresent
	}
	descAt := k.descOff + int64(rank)*kdDescSize
	desc, err := k.descriptor(rank)
	if err != nil {
		if k.incomplete {
			return nil, ErrNotPresent
		}
		return nil, err
	}
	le := binary.LittleEndian
	off := int64(le.Uint64(desc[0:]))
	size := le.Uint32(desc[8:])
	flags := le.Uint32(desc[12:])
	corrupt := func(f string, a ...any) error {
		return &CorruptError{k.format, descAt, fmt.Sprintf("page descriptor of frame %#x: ", pfn) + fmt.Sprintf(f, a...)}
	}
	codec := flags & kdCodecs
	switch {
	case size == 0 || uint64(size) > k.blockSize:
		return nil, corrupt("size %d (block size %d)", size, k.blockSize)
	case codec == 0 && uint64(size) != k.blockSize:
		return nil, corrupt("uncompressed page of %d bytes (block size %d)", size, k.blockSize)
	case codec&(codec-1) != 0:
		return nil, corrupt("flags %#x name several codecs", flags)
	case off < 0 || off > k.size || int64(size) > k.size-off:
		if k.incomplete {
			return nil, ErrNotPresent
		}
		return nil, corrupt("data at %#x+%d is outside the %d-byte file", off, size, k.size)
	}
	// Cached by data offset: repeated reads of a page, and the pages
	// of zeros that share one stored copy, decode once.
	slot := &k.cache[kdSlot(uint64(off))]
	k.mu.Lock()
	if slot.data != nil && slot.key == uint64(off) {
		d := slot.data
		fslot.key, fslot.data = pfn, d
		k.mu.Unlock()
		return d, nil
	}
	k.mu.Unlock()
	raw := make([]byte, size)
	if err := k.readFull(raw, off, "page data"); err != nil {
		return nil, err
	}
	data := raw
	if codec != 0 {
		var err error
		if data, err = k.decompress(codec, raw); err != nil {
			return nil, &CorruptError{k.format, off, fmt.Sprintf("frame %#x: %v", pfn, err)}
		}
	}
	k.mu.Lock()
	slot.key, slot.data = uint64(off), data
	fslot.key, fslot.data = pfn, data
	k.mu.Unlock()
	return data, nil
}

// descriptor returns the rank-th page descriptor. Descriptors are read
// a block at a time: neighbouring frames' descriptors are neighbours.
func (k *Kdump) descriptor(rank uint64) ([]byte, error) {
	block := rank / kdDescsPerBlock
	slot := &k.descCache[block%kdDescSlots]
	k.mu.Lock()
	if slot.data != nil && slot.key == block {
		d := slot.data
		k.mu.Unlock()
		return d[rank%kdDescsPerBlock*kdDescSize:][:kdDescSize], nil
	}
	k.mu.Unlock()
	off := k.descOff + int64(block*kdDescsPerBlock*kdDescSize)
	n := int64(kdDescsPerBlock * kdDescSize)
	if last := int64(k.dumped.Count()-block*kdDescsPerBlock) * kdDescSize; last < n {
		n = last
	}
	d := make([]byte, n)
	if err := k.readFull(d, off, "page descriptors"); err != nil {
		// Read just this one: the block may run past a truncated end.
		one := make([]byte, kdDescSize)
		if err := k.readFull(one, k.descOff+int64(rank)*kdDescSize, "page descriptor"); err != nil {
			return nil, err
		}
		return one, nil
	}
	k.mu.Lock()
	slot.key, slot.data = block, d
	k.mu.Unlock()
	return d[rank%kdDescsPerBlock*kdDescSize:][:kdDescSize], nil
}

// decompress inflates one page; the result must be exactly one block.
func (k *Kdump) decompress(codec uint32, src []byte) (out []byte, err error) {
	// The codecs are third-party code fed hostile bytes: a panic in one
	// is a corrupt page, not a crash of the reader.
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("%s page: decoder failed: %v", codecName(codec), r)
		}
	}()
	dst := make([]byte, k.blockSize)
	var n int
	switch codec {
	case kdZlib:
		zr, err := k.zlibReader(src)
		if err != nil {
			return nil, fmt.Errorf("zlib page: %v", err)
		}
		defer k.zlibPool.Put(zr)
		n, err = io.ReadFull(zr, dst)
		if err != nil {
			return nil, fmt.Errorf("zlib page: %d bytes inflated, want %d: %v", n, k.blockSize, err)
		}
		var one [1]byte
		if m, _ := zr.Read(one[:]); m != 0 {
			return nil, fmt.Errorf("zlib page inflates to more than %d bytes", k.blockSize)
		}
	case kdLZO:
		n, err = lzo.Decompress(src, dst)
		if err != nil {
			return nil, fmt.Errorf("lzo page: %v", err)
		}
	case kdSnappy:
		m, err := s2.DecodedLen(src)
		if err != nil {
			return nil, fmt.Errorf("snappy page: %v", err)
		}
		if uint64(m) != k.blockSize {
			return nil, fmt.Errorf("snappy page decodes to %d bytes, want %d", m, k.blockSize)
		}
		out, err := s2.Decode(dst, src)
		if err != nil {
			return nil, fmt.Errorf("snappy page: %v", err)
		}
		n = len(out)
	case kdZstd:
		k.zstdOnce.Do(func() {
			k.zstd, k.zstdErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(k.blockSize))
		})
		if k.zstdErr != nil {
			return nil, k.zstdErr
		}
		out, err := k.zstd.DecodeAll(src, dst[:0])
		if err != nil {
			return nil, fmt.Errorf("zstd page: %v", err)
		}
		n, dst = len(out), out
	}
	if uint64(n) != k.blockSize {
		return nil, fmt.Errorf("%s page decodes to %d bytes, want %d", codecName(codec), n, k.blockSize)
	}
	return dst[:n], nil
}

// zlibReader returns a pooled inflater reset to src: a new one per page
// costs more than inflating the page.
func (k *Kdump) zlibReader(src []byte) (io.ReadCloser, error) {
	if zr, ok := k.zlibPool.Get().(io.ReadCloser); ok {
		if err := zr.(zlib.Resetter).Reset(bytes.NewReader(src), nil); err != nil {
			return nil, err
		}
		return zr, nil
	}
	return zlib.NewReader(bytes.NewReader(src))
}

func codecName(c uint32) string {
	switch c {
	case kdZlib:
		return "zlib"
	case kdLZO:
		return "lzo"
	case kdSnappy:
		return "snappy"
	case kdZstd:
		return "zstd"
	}
	return "raw"
}

func (k *Kdump) Close() error {
	if k.zstd != nil {
		k.zstd.Close()
	}
	if k.closer != nil {
		return k.closer.Close()
	}
	return nil
}
