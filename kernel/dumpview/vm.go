package dumpview

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kinst/kinst/core/dump"
)

const (
	// startKernelMap is __START_KERNEL_map: the kernel image is mapped
	// linearly from here, at phys_base.
	startKernelMap = 0xffffffff80000000
	pageSize       = 4096
	pageMask       = pageSize - 1
	// pteAddrMask keeps a page-table entry's physical address bits
	// (12–51); the NX bit and the memory-encryption bit fall outside.
	pteAddrMask = 0x000ffffffffff000
	ptePresent  = 1
	ptePSE      = 1 << 7 // a 1 GiB (PUD) or 2 MiB (PMD) page
	notMapped   = ^uint64(0)
)

// TranslationError says why a virtual address has no physical page.
type TranslationError struct {
	Addr  uint64
	Level int // page-table level whose entry was not present (5..1)
}

func (e *TranslationError) Error() string {
	return fmt.Sprintf("virtual address %#x is not mapped (level-%d page-table entry not present)", e.Addr, e.Level)
}

// Is lets a missing mapping match dump.ErrNotPresent too.
func (e *TranslationError) Is(t error) bool { return t == dump.ErrNotPresent }

// Translate maps a kernel virtual address to a physical one: the kernel
// image by its linear mapping at phys_base, everything else (direct
// map, vmalloc and module space, stacks) by walking the kernel's page
// tables. Walks are cached per 4 KiB page.
func (v *View) Translate(va uint64) (uint64, error) {
	if va >= startKernelMap && va < v.imageEnd {
		return va - startKernelMap + v.physBase, nil
	}
	page := va &^ pageMask
	v.mu.Lock()
	pa, ok := v.tlb[page]
	v.mu.Unlock()
	if !ok {
		var err error
		pa, err = v.walk(page)
		if err != nil {
			var te *TranslationError
			if !errors.As(err, &te) {
				return 0, err
			}
			pa = notMapped
		}
		v.mu.Lock()
		v.tlb[page] = pa
		v.mu.Unlock()
	}
	if pa == notMapped {
		_, err := v.walk(page)
		return 0, err
	}
	return pa | va&pageMask, nil
}

// walk translates one page through the page tables.
func (v *View) walk(va uint64) (uint64, error) {
	table := v.pgd
	shift := uint(39)
	if v.levels == 5 {
		shift = 48
	}
	var b [8]byte
	for level := v.levels; level >= 1; level-- {
		idx := (va >> shift) & 511
		if _, err := v.Dump.ReadPhys(b[:], table+idx*8); err != nil {
			return 0, fmt.Errorf("page walk of %#x: level-%d table at physical %#x: %w", va, level, table, err)
		}
		e := binary.LittleEndian.Uint64(b[:])
		if e&ptePresent == 0 {
			return 0, &TranslationError{Addr: va, Level: level}
		}
		if (level == 3 || level == 2) && e&ptePSE != 0 {
			size := uint64(1) << shift
			return (e & pteAddrMask &^ (size - 1)) | (va & (size - 1)), nil
		}
		table = e & pteAddrMask
		shift -= 9
	}
	return table, nil
}

// ReadVirt reads kernel virtual memory, page by page.
func (v *View) ReadVirt(p []byte, va uint64) error {
	for done := 0; done < len(p); {
		a := va + uint64(done)
		pa, err := v.Translate(a)
		if err != nil {
			return err
		}
		n := min(len(p)-done, int(pageSize-a&pageMask))
		if a >= startKernelMap && a < v.imageEnd {
			// The image is physically contiguous: read it in one go.
			n = len(p) - done
		}
		// Pages that follow each other physically too (the direct map,
		// a slab of several pages) are read in one go: one read of the
		// dump, one system call on /proc/kcore.
		for done+n < len(p) {
			next, err := v.Translate(a + uint64(n))
			if err != nil || next != pa+uint64(n) {
				break
			}
			n += min(len(p)-done-n, pageSize)
		}
		if _, err := v.Dump.ReadPhys(p[done:done+n], pa); err != nil {
			return fmt.Errorf("reading %#x: %w", a, err)
		}
		done += n
	}
	return nil
}
