package slab

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kinst/kinst/core/internal/btflayout"
)

// ErrNoStackDepot is matched when the kernel has no stack depot to read
// (CONFIG_STACKDEPOT off, or its pools' symbol or types missing).
var ErrNoStackDepot = errors.New("no stack depot")

// maxDepotFrames bounds a stack read from the depot: 6.12 keeps at most
// CONFIG_STACKDEPOT_MAX_FRAMES (64), earlier kernels what the saver
// asked, never more than this in practice.
const maxDepotFrames = 256

// StackDepot reads the kernel's stack depot (lib/stackdepot.c), where
// slub_debug=U's tracks keep the whole stack of an allocation or a free
// (struct track's handle), as page_owner and KASAN keep theirs. A
// handle names a pool (stack_pools, stack_slabs before 6.3) and an
// offset in it, in 16-byte units (DEPOT_STACK_ALIGN, STACK_ALLOC_ALIGN:
// 4 on every kernel so far); the record there holds the frames.
type StackDepot struct {
	k     Kernel
	pools uint64 // the array of pool addresses
	// The handle's parts (union handle_parts): the pool's index (plus
	// one from 6.8, where 0 is no stack), the offset.
	index, offset btflayout.Field
	plus1         bool
	// The record (struct stack_record): its own handle, frame count,
	// frames.
	recHandle, recSize btflayout.Field
	entries            uint32
}

// depotAlign is log2 of the unit of a handle's offset.
const depotAlign = 4

// NewStackDepot finds the depot's pools and layout from the kernel's
// symbols and BTF.
func NewStackDepot(k Kernel) (*StackDepot, error) {
	spec, err := k.BTF()
	if err != nil {
		return nil, err
	}
	d := &StackDepot{k: k}
	for _, name := range []string{"stack_pools", "stack_slabs"} {
		if a, err := k.SymbolAddr(name); err == nil {
			d.pools = a
			break
		}
	}
	if d.pools == 0 {
		return nil, fmt.Errorf("%w: neither stack_pools nor stack_slabs is a kernel symbol (CONFIG_STACKDEPOT off?)", ErrNoStackDepot)
	}
	lb := btflayout.New(spec)
	d.index = lb.Opt("handle_parts", "pool_index_plus_1")
	d.plus1 = d.index.OK
	if !d.plus1 {
		d.index = lb.Need("handle_parts", "pool_index", "slabindex")
	}
	d.offset = lb.Need("handle_parts", "offset")
	d.recHandle = lb.Need("stack_record", "handle.handle")
	d.recSize = lb.Need("stack_record", "size")
	d.entries = lb.Need("stack_record", "entries").Off
	if err := lb.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoStackDepot, err)
	}
	return d, nil
}

// Stack is the stack a handle names, innermost frame first; nil for the
// handle 0 (none saved). A handle whose record does not name it back,
// or holds an implausible frame count, is an error: the depot is read
// from a dump, and a wrong read must not pass for a stack.
func (d *StackDepot) Stack(handle uint32) ([]uint64, error) {
	var h [4]byte
	binary.LittleEndian.PutUint32(h[:], handle)
	idx, off := d.index.U64(h[:]), d.offset.U64(h[:])
	if d.plus1 {
		if idx == 0 {
			return nil, nil
		}
		idx--
	} else if handle == 0 {
		return nil, nil
	}
	var p [8]byte
	if err := d.k.ReadVirt(p[:], d.pools+8*idx); err != nil {
		return nil, fmt.Errorf("stack depot pool %d: %w", idx, err)
	}
	pool := binary.LittleEndian.Uint64(p[:])
	if pool == 0 {
		return nil, fmt.Errorf("stack depot handle %#x: pool %d is not allocated", handle, idx)
	}
	rec := pool + off<<depotAlign
	hdr := make([]byte, d.entries)
	if err := d.k.ReadVirt(hdr, rec); err != nil {
		return nil, fmt.Errorf("stack depot record %#x: %w", rec, err)
	}
	var own [4]byte
	binary.LittleEndian.PutUint32(own[:], uint32(d.recHandle.U64(hdr)))
	if d.index.U64(own[:]) != d.index.U64(h[:]) || d.offset.U64(own[:]) != off {
		return nil, fmt.Errorf("stack depot handle %#x: the record at %#x names %#x", handle, rec, d.recHandle.U64(hdr))
	}
	n := d.recSize.U64(hdr)
	if n == 0 || n > maxDepotFrames {
		return nil, fmt.Errorf("stack depot handle %#x: %d frames", handle, n)
	}
	b := make([]byte, 8*n)
	if err := d.k.ReadVirt(b, rec+uint64(d.entries)); err != nil {
		return nil, fmt.Errorf("stack depot record %#x: %w", rec, err)
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out, nil
}

// Stack is the stack a track's handle names in the kernel's stack depot
// (StackDepot.Stack), the depot found on first use; nil for the handle 0.
func (h *Heap) Stack(handle uint32) ([]uint64, error) {
	if handle == 0 {
		return nil, nil
	}
	h.depotOnce.Do(func() { h.depot, h.depotErr = NewStackDepot(h.k) })
	if h.depotErr != nil {
		return nil, h.depotErr
	}
	return h.depot.Stack(handle)
}
