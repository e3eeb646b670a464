// Package dumpgen writes crash dumps from their format specifications, so
// the readers in package dump can be tested against known content: the
// kdump-compressed format (makedumpfile's diskdump_mod.h layout, every
// header version and page codec), makedumpfile's flattened stream, and
// FreeBSD amd64 minidumps (sys/amd64/include/minidump.h, versions 1–3),
// for which no kernel runs here, and the compressed symbol tables a
// kernel image carries (kallsyms). It is a writer only; nothing in it is
// shared with the readers.
package dumpgen

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// Page codecs, as the page descriptor's flags name them.
const (
	CodecRaw    = 0
	CodecZlib   = 0x1
	CodecLZO    = 0x2
	CodecSnappy = 0x4
	CodecZstd   = 0x20
)

// Kdump describes a kdump-compressed ("KDUMP   ") file.
type Kdump struct {
	HeaderVersion int    // 1..6; 0 means 6
	BlockSize     int    // page size; 0 means 4096
	MaxMapnr      uint64 // number of page frames the bitmaps cover
	Codec         uint32 // one of the Codec constants
	Release       string // utsname.release
	PhysBase      uint64
	VMCoreInfo    string // stored from version 3 on
	Notes         []byte // ELF notes, stored from version 4 on
	// Pages maps a page frame number to its content (BlockSize bytes),
	// for every page the dump holds (second bitmap).
	Pages map[uint64][]byte
	// Excluded lists frames present in memory (first bitmap) that the
	// dumper left out.
	Excluded []uint64
}

// disk_dump_header field offsets (x86-64).
const (
	hdrVersion      = 8
	hdrUtsname      = 12 // 6 × 65 bytes
	hdrStatus       = 424
	hdrBlockSize    = 428
	hdrSubHdrSize   = 432
	hdrBitmapBlocks = 436
	hdrMaxMapnr     = 440
	hdrNrCPUs       = 460
	hdrSize         = 464
	subHdrSize      = 104 // kdump_sub_header through max_mapnr_64
)

// Bytes lays the dump out as makedumpfile does: header block, sub-header
// blocks (sub-header, VMCOREINFO, notes), the two bitmaps, one page
// descriptor per dumped page, then the page data, pages of zeros sharing
// one copy.
func (k *Kdump) Bytes() ([]byte, error) {
	ver := k.HeaderVersion
	if ver == 0 {
		ver = 6
	}
	bs := k.BlockSize
	if bs == 0 {
		bs = 4096
	}
	le := binary.LittleEndian
	pfns := make([]uint64, 0, len(k.Pages))
	for p, d := range k.Pages {
		if p >= k.MaxMapnr {
			return nil, fmt.Errorf("pfn %#x beyond max_mapnr %#x", p, k.MaxMapnr)
		}
		if len(d) != bs {
			return nil, fmt.Errorf("pfn %#x: %d bytes, want %d", p, len(d), bs)
		}
		pfns = append(pfns, p)
	}
	sort.Slice(pfns, func(i, j int) bool { return pfns[i] < pfns[j] })

	// Sub-header area: the sub-header, then VMCOREINFO, then notes.
	sub := make([]byte, subHdrSize)
	le.PutUint64(sub[0:], k.PhysBase)
	var extra []byte
	if ver >= 3 && k.VMCoreInfo != "" {
		le.PutUint64(sub[32:], uint64(bs+subHdrSize))
		le.PutUint64(sub[40:], uint64(len(k.VMCoreInfo)))
		extra = append(extra, k.VMCoreInfo...)
	}
	if ver >= 4 && len(k.Notes) > 0 {
		le.PutUint64(sub[48:], uint64(bs+subHdrSize+len(extra)))
		le.PutUint64(sub[56:], uint64(len(k.Notes)))
		extra = append(extra, k.Notes...)
	}
	if ver >= 2 {
		le.PutUint64(sub[16:], 0)
		le.PutUint64(sub[24:], k.MaxMapnr)
	}
	if ver >= 6 {
		le.PutUint64(sub[80:], 0)
		le.PutUint64(sub[88:], k.MaxMapnr)
		le.PutUint64(sub[96:], k.MaxMapnr)
	}
	sub = append(sub, extra...)
	subBlocks := (len(sub) + bs - 1) / bs

	bmLen := (int(k.MaxMapnr+7)/8 + bs - 1) / bs * bs
	bm1, bm2 := make([]byte, bmLen), make([]byte, bmLen)
	for _, p := range pfns {
		bm1[p/8] |= 1 << (p % 8)
		bm2[p/8] |= 1 << (p % 8)
	}
	for _, p := range k.Excluded {
		if p < k.MaxMapnr {
			bm1[p/8] |= 1 << (p % 8)
		}
	}
	bitmapBlocks := 2 * bmLen / bs

	hdr := make([]byte, bs)
	copy(hdr, "KDUMP   ")
	le.PutUint32(hdr[hdrVersion:], uint32(ver))
	copy(hdr[hdrUtsname:], "Linux")
	copy(hdr[hdrUtsname+2*65:], k.Release)
	copy(hdr[hdrUtsname+4*65:], "x86_64")
	le.PutUint32(hdr[hdrStatus:], k.Codec)
	le.PutUint32(hdr[hdrBlockSize:], uint32(bs))
	le.PutUint32(hdr[hdrSubHdrSize:], uint32(subBlocks))
	le.PutUint32(hdr[hdrBitmapBlocks:], uint32(bitmapBlocks))
	if ver < 6 || k.MaxMapnr <= 0xffffffff {
		le.PutUint32(hdr[hdrMaxMapnr:], uint32(k.MaxMapnr))
	}
	le.PutUint32(hdr[hdrNrCPUs:], 1)

	out := append(hdr, sub...)
	out = append(out, make([]byte, (1+subBlocks)*bs-len(out))...)
	out = append(out, bm1...)
	out = append(out, bm2...)
	descOff := len(out)
	dataOff := descOff + 24*len(pfns)
	out = append(out, make([]byte, dataOff-descOff)...)

	type desc struct {
		off         int64
		size, flags uint32
	}
	var zeroPage *desc // pages of zeros share one stored copy
	zero := make([]byte, bs)
	for i, p := range pfns {
		d := k.Pages[p]
		isZero := bytes.Equal(d, zero)
		if isZero && zeroPage != nil {
			putDesc(out[descOff+24*i:], zeroPage.off, zeroPage.size, zeroPage.flags)
			continue
		}
		c, err := compress(k.Codec, d)
		if err != nil {
			return nil, err
		}
		stored, flags := d, uint32(0)
		if c != nil && len(c) < bs { // makedumpfile keeps the smaller form
			stored, flags = c, k.Codec
		}
		dd := desc{int64(len(out)), uint32(len(stored)), flags}
		if isZero {
			zeroPage = &dd
		}
		putDesc(out[descOff+24*i:], dd.off, dd.size, dd.flags)
		out = append(out, stored...)
	}
	return out, nil
}

func putDesc(b []byte, off int64, size, flags uint32) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], uint64(off))
	le.PutUint32(b[8:], size)
	le.PutUint32(b[12:], flags)
	le.PutUint64(b[16:], 0)
}

var (
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
	zstdErr  error
)

func compress(codec uint32, d []byte) ([]byte, error) {
	switch codec {
	case CodecRaw:
		return nil, nil
	case CodecZlib:
		var b bytes.Buffer
		w := zlib.NewWriter(&b)
		w.Write(d)
		if err := w.Close(); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	case CodecLZO:
		return LZO(d), nil
	case CodecSnappy:
		return s2.EncodeSnappy(nil, d), nil
	case CodecZstd:
		zstdOnce.Do(func() { zstdEnc, zstdErr = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1)) })
		if zstdErr != nil {
			return nil, zstdErr
		}
		return zstdEnc.EncodeAll(d, nil), nil
	}
	return nil, fmt.Errorf("unknown codec %#x", codec)
}

// LZO encodes d as a valid LZO1X stream (Linux
// Documentation/staging/lzo.rst). A page that repeats a pattern of up to
// 64 bytes becomes the pattern as literals and one overlapping M3 match;
// anything else one literal run, which is larger than d (a writer then
// stores the page raw).
func LZO(d []byte) []byte {
	n := len(d)
	for p := 1; p <= 64 && p+3 <= n; p++ {
		if !periodic(d, p) {
			continue
		}
		out := literals(nil, d[:p])
		// M3: 001LLLLL, length 2+L, or L=0 and 33 + 255 per zero byte
		// + the final byte; then LE16 (distance-1)<<2 | trailing literals.
		switch m := n - p; {
		case m <= 33:
			out = append(out, 0x20|byte(m-2))
		default:
			out = append(out, 0x20)
			out = appendLength(out, m-33)
		}
		dist := uint16(p-1) << 2
		out = append(out, byte(dist), byte(dist>>8))
		return append(out, 0x11, 0, 0)
	}
	return append(literals(nil, d), 0x11, 0, 0)
}

func periodic(d []byte, p int) bool {
	for i := p; i < len(d); i++ {
		if d[i] != d[i-p] {
			return false
		}
	}
	return true
}

// literals emits the stream's first instruction: a literal run. A first
// byte of 18..255 copies byte-17 literals; 0 starts a long run of 18 +
// the length encoding.
func literals(out, d []byte) []byte {
	switch n := len(d); {
	case n == 0:
		return out
	case n <= 238:
		out = append(out, byte(n+17))
	default:
		out = append(out, 0)
		out = appendLength(out, n-18)
	}
	return append(out, d...)
}

// appendLength writes v (> 0) as zero bytes worth 255 each and a final
// non-zero byte.
func appendLength(out []byte, v int) []byte {
	for v > 255 {
		out = append(out, 0)
		v -= 255
	}
	return append(out, byte(v))
}

// FlattenOptions shapes a flattened stream.
type FlattenOptions struct {
	Chunk int // bytes per record; 0 means 4096
	// Shuffle writes the records in a random order (seeded), as a
	// dumper writing several regions at once might.
	Shuffle bool
	Seed    uint64
	// StaleHeader first writes a record of garbage over the first
	// block, which the real header record later overwrites: the
	// reader must let the later record win.
	StaleHeader bool
}

// Flatten turns a standard file into makedumpfile's flattened stream: a
// 4096-byte header ("makedumpfile", type 1, version 1, big-endian), then
// records of (offset, size) big-endian followed by size bytes, ended by
// an offset of -1.
func Flatten(std []byte, o FlattenOptions) []byte {
	chunk := o.Chunk
	if chunk <= 0 {
		chunk = 4096
	}
	be := binary.BigEndian
	hdr := make([]byte, 4096)
	copy(hdr, "makedumpfile")
	be.PutUint64(hdr[16:], 1)
	be.PutUint64(hdr[24:], 1)
	type rec struct{ off, end int }
	var recs []rec
	for off := 0; off < len(std); off += chunk {
		recs = append(recs, rec{off, min(off+chunk, len(std))})
	}
	if o.Shuffle {
		rng := rand.New(rand.NewPCG(o.Seed, 1))
		rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	}
	out := hdr
	put := func(off int, data []byte) {
		var h [16]byte
		be.PutUint64(h[0:], uint64(off))
		be.PutUint64(h[8:], uint64(len(data)))
		out = append(out, h[:]...)
		out = append(out, data...)
	}
	if o.StaleHeader {
		put(0, bytes.Repeat([]byte{0xa5}, min(4096, len(std))))
	}
	for _, r := range recs {
		put(r.off, std[r.off:r.end])
	}
	var end [16]byte
	be.PutUint64(end[0:], ^uint64(0))
	return append(out, end[:]...)
}
