package dump

import (
	"bytes"
	"container/heap"
	"encoding/binary"
	"fmt"
	"io"
	"sort"
)

// makedumpfile's flattened stream (makedumpfile -F, and QEMU 7.2's
// dump-guest-memory kdump-* formats) lets a dumper write a kdump file to
// a pipe: a 4096-byte header ("makedumpfile", then big-endian type 1 and
// version 1), then records of a big-endian (offset, size) pair and size
// bytes that belong at that offset of the standard file, ended by an
// offset of -1. `makedumpfile -R` replays the records into a file. This
// reader indexes the records instead and reads the standard file through
// that index, without a copy; where records overlap the later one wins,
// as it would in the replayed file, and bytes no record wrote read as 0.
const (
	flatFormat     = "kdump-flattened"
	flatSignature  = "makedumpfile"
	flatHeaderSize = 4096
	flatRecordHdr  = 16
)

func init() {
	register(flatFormat, probeFlattened, withSize(func(r io.ReaderAt, size int64, c io.Closer) (Dump, error) {
		return openFlattened(r, size, c)
	}))
}

func probeFlattened(head []byte) bool {
	return len(head) >= 32 && bytes.HasPrefix(head, []byte(flatSignature)) &&
		binary.BigEndian.Uint64(head[16:]) == 1 // TYPE_FLAT_HEADER
}

// openFlattened indexes the stream in r and opens the kdump it carries.
func openFlattened(r io.ReaderAt, size int64, closer io.Closer) (*Kdump, error) {
	fr, err := indexFlattened(r, size)
	if err != nil {
		return nil, err
	}
	k, err := newKdump(fr, fr.size, size, flatFormat, closer)
	if err != nil {
		return nil, err
	}
	return k, nil
}

// flatSegment says that bytes [dst, dst+n) of the standard file are at
// src in the stream.
type flatSegment struct {
	dst, src, n int64
	seq         int // record order, for overlaps
}

// flatReader is the standard file, read through the record index.
type flatReader struct {
	r    io.ReaderAt
	segs []flatSegment // sorted by dst, not overlapping
	size int64         // end of the last record
}

func indexFlattened(r io.ReaderAt, size int64) (*flatReader, error) {
	corrupt := func(off int64, f string, a ...any) error {
		return &CorruptError{flatFormat, off, fmt.Sprintf(f, a...)}
	}
	var hdr [32]byte
	if n, _ := r.ReadAt(hdr[:], 0); n < len(hdr) || !bytes.HasPrefix(hdr[:], []byte(flatSignature)) {
		return nil, corrupt(0, "no %q header", flatSignature)
	}
	be := binary.BigEndian
	if t := be.Uint64(hdr[16:]); t != 1 {
		return nil, corrupt(16, "header type %d (the flattened format is type 1)", t)
	}
	if v := be.Uint64(hdr[24:]); v != 1 {
		return nil, corrupt(24, "flattened format version %d (this reader knows version 1)", v)
	}
	var segs []flatSegment
	pos := int64(flatHeaderSize)
	var rh [flatRecordHdr]byte
	for {
		if size-pos < flatRecordHdr {
			return nil, corrupt(pos, "stream ends without the end record (truncated dump?)")
		}
		if _, err := r.ReadAt(rh[:], pos); err != nil {
			return nil, err
		}
		off, n := int64(be.Uint64(rh[0:])), int64(be.Uint64(rh[8:]))
		if off == -1 {
			break
		}
		if off < 0 || n < 0 || n > size-pos-flatRecordHdr || off > 1<<56 {
			return nil, corrupt(pos, "record for offset %d of %d bytes does not fit the %d-byte stream", off, n, size)
		}
		if n > 0 {
			segs = append(segs, flatSegment{dst: off, src: pos + flatRecordHdr, n: n, seq: len(segs)})
		}
		pos += flatRecordHdr + n
	}
	segs = resolveOverlaps(segs)
	fr := &flatReader{r: r, segs: segs}
	if len(segs) > 0 {
		last := segs[len(segs)-1]
		fr.size = last.dst + last.n
	}
	return fr, nil
}

// resolveOverlaps sorts the segments by destination and, where they
// overlap, keeps the bytes of the later record.
func resolveOverlaps(segs []flatSegment) []flatSegment {
	sort.SliceStable(segs, func(i, j int) bool { return segs[i].dst < segs[j].dst })
	overlap := false
	for i := 1; i < len(segs); i++ {
		if segs[i].dst < segs[i-1].dst+segs[i-1].n {
			overlap = true
			break
		}
	}
	if !overlap {
		return segs
	}
	// Sweep the boundaries; in each elementary interval the active
	// segment with the highest seq wins (a max-heap with lazy removal).
	bounds := make([]int64, 0, 2*len(segs))
	for _, s := range segs {
		bounds = append(bounds, s.dst, s.dst+s.n)
	}
	sort.Slice(bounds, func(i, j int) bool { return bounds[i] < bounds[j] })
	var out []flatSegment
	h := &segHeap{}
	next := 0
	for bi := 0; bi+1 < len(bounds); bi++ {
		lo, hi := bounds[bi], bounds[bi+1]
		if lo == hi {
			continue
		}
		for next < len(segs) && segs[next].dst <= lo {
			heap.Push(h, segs[next])
			next++
		}
		for h.Len() > 0 && (*h)[0].dst+(*h)[0].n <= lo {
			heap.Pop(h)
		}
		if h.Len() == 0 {
			continue
		}
		w := (*h)[0]
		piece := flatSegment{dst: lo, src: w.src + (lo - w.dst), n: hi - lo, seq: w.seq}
		if k := len(out) - 1; k >= 0 && out[k].seq == piece.seq && out[k].dst+out[k].n == lo {
			out[k].n += piece.n
			continue
		}
		out = append(out, piece)
	}
	return out
}

type segHeap []flatSegment

func (h segHeap) Len() int           { return len(h) }
func (h segHeap) Less(i, j int) bool { return h[i].seq > h[j].seq }
func (h segHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *segHeap) Push(x any)        { *h = append(*h, x.(flatSegment)) }
func (h *segHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// ReadAt reads the standard file: bytes no record wrote are zero.
func (fr *flatReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("negative offset")
	}
	n := 0
	i := sort.Search(len(fr.segs), func(i int) bool { return fr.segs[i].dst+fr.segs[i].n > off })
	for n < len(p) {
		at := off + int64(n)
		if at >= fr.size {
			return n, io.EOF
		}
		if i >= len(fr.segs) || fr.segs[i].dst > at {
			// A hole up to the next segment.
			end := fr.size
			if i < len(fr.segs) {
				end = fr.segs[i].dst
			}
			m := int(min(int64(len(p)-n), end-at))
			clear(p[n : n+m])
			n += m
			continue
		}
		s := fr.segs[i]
		m := int(min(int64(len(p)-n), s.dst+s.n-at))
		got, err := fr.r.ReadAt(p[n:n+m], s.src+(at-s.dst))
		n += got
		if got < m {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
		i++
	}
	return n, nil
}
