// Package sparse maps the set bits of a page bitmap to their rank: the
// position of a present page among the pages a dump stores. Dumps that
// skip absent pages (kdump's second bitmap, FreeBSD minidumps) store the
// n-th present page n-th, so finding a page's data is a rank query.
//
// The index keeps one cached count per block of BlockBits bits (the
// method libkvm adopted in 2016, replacing a hash table with one entry per
// present page) and counts forward or backward from the nearer cached
// count, so a lookup touches at most BlockBits/2 bits and the index costs
// 8 bytes per block on top of the bitmap itself.
package sparse

import (
	"encoding/binary"
	"math/bits"
)

// BlockBits is the number of bitmap bits per cached count.
const BlockBits = 1024

const wordsPerBlock = BlockBits / 64

// Index answers rank queries over a bitmap. It is read-only after New and
// safe for concurrent use.
type Index struct {
	words  []uint64 // the bitmap, bit i is words[i/64] bit i%64
	nbits  uint64
	counts []uint64 // counts[b]: set bits before bit b*BlockBits; one extra at the end
}

// New indexes a bitmap given as bytes, bit i being bit i%8 of byte i/8
// (the byte order kdump and FreeBSD's little-endian uint64 bitmaps share).
// Bits at or past nbits are ignored; nbits is clipped to len(bm)*8.
func New(bm []byte, nbits uint64) *Index {
	if max := uint64(len(bm)) * 8; nbits > max {
		nbits = max
	}
	nw := (nbits + 63) / 64
	words := make([]uint64, nw)
	var tail [8]byte
	for i := range words {
		if off := i * 8; off+8 <= len(bm) {
			words[i] = binary.LittleEndian.Uint64(bm[off:])
		} else {
			tail = [8]byte{}
			copy(tail[:], bm[off:])
			words[i] = binary.LittleEndian.Uint64(tail[:])
		}
	}
	if r := nbits % 64; r != 0 {
		words[nw-1] &= (1 << r) - 1
	}
	return fromWords(words, nbits)
}

func fromWords(words []uint64, nbits uint64) *Index {
	nblocks := (uint64(len(words)) + wordsPerBlock - 1) / wordsPerBlock
	counts := make([]uint64, nblocks+1)
	var c uint64
	for b := uint64(0); b < nblocks; b++ {
		counts[b] = c
		end := min((b+1)*wordsPerBlock, uint64(len(words)))
		for _, w := range words[b*wordsPerBlock : end] {
			c += uint64(bits.OnesCount64(w))
		}
	}
	counts[nblocks] = c
	return &Index{words: words, nbits: nbits, counts: counts}
}

// Len is the number of bits the bitmap holds.
func (x *Index) Len() uint64 { return x.nbits }

// Count is the number of set bits.
func (x *Index) Count() uint64 { return x.counts[len(x.counts)-1] }

// Test reports whether bit i is set.
func (x *Index) Test(i uint64) bool {
	return i < x.nbits && x.words[i/64]&(1<<(i%64)) != 0
}

// Rank returns the number of set bits before bit i and whether bit i is
// set; ok is false for a clear bit or one out of range.
func (x *Index) Rank(i uint64) (rank uint64, ok bool) {
	if !x.Test(i) {
		return 0, false
	}
	w := i / 64
	below := uint64(bits.OnesCount64(x.words[w] & (1<<(i%64) - 1)))
	b := i / BlockBits
	first := b * wordsPerBlock
	if i%BlockBits < BlockBits/2 {
		// Forward from this block's count.
		c := x.counts[b]
		for _, v := range x.words[first:w] {
			c += uint64(bits.OnesCount64(v))
		}
		return c + below, true
	}
	// Backward from the next block's count.
	c := x.counts[b+1]
	for _, v := range x.words[w+1 : min(first+wordsPerBlock, uint64(len(x.words)))] {
		c -= uint64(bits.OnesCount64(v))
	}
	return c - uint64(bits.OnesCount64(x.words[w])) + below, true
}

// Runs calls fn for each maximal run [start, end) of set bits, in order,
// until fn returns false.
func (x *Index) Runs(fn func(start, end uint64) bool) {
	var start uint64
	in := false
	for wi, w := range x.words {
		base := uint64(wi) * 64
		if !in && w == 0 || in && w == ^uint64(0) {
			continue
		}
		for bit := uint64(0); bit < 64; bit++ {
			set := w&(1<<bit) != 0
			if set && !in {
				start, in = base+bit, true
			} else if !set && in {
				in = false
				if !fn(start, base+bit) {
					return
				}
			}
		}
	}
	if in {
		fn(start, min(uint64(len(x.words))*64, x.nbits))
	}
}

// Bytes is the memory the index holds: the bitmap words and the counts.
func (x *Index) Bytes() int { return 8*len(x.words) + 8*len(x.counts) }
