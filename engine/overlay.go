package engine

import (
	"bytes"
	"sync"
)

// overlay remembers the original bytes of everything the engine has written
// into kernel text (spliced instructions and springboard slots), so that
// analysis always sees the kernel's own code: a jmp rel32 written over a
// 7-byte instruction would otherwise throw the linear sweep off for the
// rest of the function, and a second request at a trap-spliced point would
// find "someone else's" int3.
type overlay struct {
	// mu is held for writing around every change to kernel text (the
	// entry is added before a splice is written and dropped after the
	// bytes are back) and for reading around every analysis read, so a
	// read never sees a spliced byte without its original.
	mu sync.RWMutex
	// short holds the entries of up to shortOrig bytes (a coverage
	// session keeps one per block: an int3, a jmp rel8, a jmp rel32);
	// long the rare longer ones. An address is in one at most. Protected
	// by mu.
	short addrMap[shortBytes]
	long  addrMap[[]byte]
}

// shortOrig is the most bytes an entry of overlay.short holds: every
// splice the engine writes (5 bytes at most) fits, in 8 bytes.
const shortOrig = 7

// shortBytes is an entry of overlay.short.
type shortBytes struct {
	n uint8
	b [shortOrig]byte
}

// maxOrig bounds the length of one entry: an instruction (15 bytes at
// most), or the 5 bytes of a covering splice or a springboard slot.
const maxOrig = 15

// putLocked enters orig at addr. The caller holds o.mu for writing.
func (o *overlay) putLocked(addr uint64, orig []byte) {
	if len(orig) <= shortOrig {
		var e shortBytes
		e.n = uint8(copy(e.b[:], orig))
		o.short.set(addr, e)
		o.long.del(addr)
		return
	}
	o.long.set(addr, bytes.Clone(orig[:min(len(orig), maxOrig)]))
	o.short.del(addr)
}

// spliced runs write (a splice of orig's bytes at addr) with addr's
// original bytes in the overlay; they stay only if write succeeds.
func (o *overlay) spliced(addr uint64, orig []byte, write func() error) error {
	return o.splicedMany([]uint64{addr}, [][]byte{orig}, write)
}

// splicedMany is spliced for a batch: origs[i] is at addrs[i].
func (o *overlay) splicedMany(addrs []uint64, origs [][]byte, write func() error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, a := range addrs {
		o.putLocked(a, origs[i])
	}
	err := write()
	if err != nil {
		o.dropLocked(addrs...)
	}
	return err
}

// restored runs restore (an unsplice at addr) and drops addr's entry if
// it succeeds.
func (o *overlay) restored(addr uint64, restore func() error) error {
	return o.restoredMany([]uint64{addr}, restore)
}

// restoredMany is restored for a batch.
func (o *overlay) restoredMany(addrs []uint64, restore func() error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	err := restore()
	if err == nil {
		o.dropLocked(addrs...)
	}
	return err
}

// forget drops addr's entry: its bytes went back without the engine (the
// driver restored them as their module was unloaded).
func (o *overlay) forget(addr uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dropLocked(addr)
}

// dropLocked drops the entries of addrs. The caller holds o.mu for
// writing.
func (o *overlay) dropLocked(addrs ...uint64) {
	for _, a := range addrs {
		o.short.del(a)
		o.long.del(a)
	}
}

// lenLocked is the number of entries. The caller holds o.mu.
func (o *overlay) lenLocked() int { return o.short.len() + o.long.len() }

// textView reads kernel memory as the kernel's own code: live bytes with
// the engine's splices replaced by the original bytes.
type textView struct {
	dev interface{ Read(uint64, []byte) error }
	ov  *overlay
}

func (v textView) Read(addr uint64, b []byte) error {
	v.ov.mu.RLock()
	defer v.ov.mu.RUnlock()
	if err := v.dev.Read(addr, b); err != nil {
		return err
	}
	end := addr + uint64(len(b))
	put := func(a uint64, orig []byte) {
		oe := a + uint64(len(orig))
		if a >= end || oe <= addr {
			return
		}
		lo, hi := max(a, addr), min(oe, end)
		copy(b[lo-addr:hi-addr], orig[lo-a:hi-a])
	}
	// Only the entries that can overlap b: those starting up to
	// maxOrig bytes before it (a coverage session has one per block).
	lo := max(addr, maxOrig) - maxOrig
	for a, e := range v.ov.short.within(lo, end) {
		put(a, e.b[:e.n])
	}
	for a, l := range v.ov.long.within(lo, end) {
		put(a, l)
	}
	return nil
}

// len is the number of spliced ranges with original bytes kept.
func (o *overlay) len() int {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.lenLocked()
}
