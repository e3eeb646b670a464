package kerninstd

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
)

// fakeKernel stands in for the driver in unit tests: a flat kernel text, a
// patch heap and a counter heap, with the driver's argument checks. It
// never executes anything; the live tests do that against the real driver.
type fakeKernel struct {
	mu         sync.Mutex
	text       map[uint64]byte
	heapBase   uint64
	heapNext   uint64
	allocs     map[uint64]int
	splices    map[uint32]fakeSplice
	nextID     uint32
	counters   []uint64
	failSplice bool
}

type fakeSplice struct {
	addr, patch uint64
	orig        []byte
}

var errFakeFault = errors.New("fault")

func newFakeKernel(textAddr uint64, text []byte) *fakeKernel {
	k := &fakeKernel{text: make(map[uint64]byte), heapBase: textAddr + 0x40000000, allocs: map[uint64]int{},
		splices: map[uint32]fakeSplice{}, counters: make([]uint64, 64)}
	k.heapNext = k.heapBase
	for i, b := range text {
		k.text[textAddr+uint64(i)] = b
	}
	return k
}

func (k *fakeKernel) Read(addr uint64, b []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := range b {
		v, ok := k.text[addr+uint64(i)]
		if !ok {
			return fmt.Errorf("read %#x: %w", addr+uint64(i), errFakeFault)
		}
		b[i] = v
	}
	return nil
}

func (k *fakeKernel) PatchAlloc(size int) (uint64, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	a := k.heapNext
	k.heapNext += uint64(size+63) &^ 63
	k.allocs[a] = size
	for i := 0; i < size; i++ {
		k.text[a+uint64(i)] = 0xcc
	}
	return a, nil
}

func (k *fakeKernel) PatchWrite(addr uint64, code []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.inAlloc(addr, len(code)) {
		return errors.New("write outside an allocation")
	}
	for i, b := range code {
		k.text[addr+uint64(i)] = b
	}
	return nil
}

func (k *fakeKernel) inAlloc(addr uint64, n int) bool {
	for a, sz := range k.allocs {
		if addr >= a && addr+uint64(n) <= a+uint64(sz) {
			return true
		}
	}
	return false
}

func (k *fakeKernel) PatchFree(addr uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.allocs[addr]; !ok {
		return errors.New("free of unallocated patch")
	}
	for _, s := range k.splices {
		if s.patch == addr {
			return errors.New("busy")
		}
	}
	delete(k.allocs, addr)
	return nil
}

func (k *fakeKernel) Splice(addr, patch uint64, orig, new []byte) (uint32, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failSplice {
		return 0, errors.New("injected splice failure")
	}
	if len(orig) != len(new) || !(len(new) == 5 && new[0] == 0xe9) {
		return 0, errors.New("bad splice arguments")
	}
	if _, ok := k.allocs[patch]; !ok {
		return 0, errors.New("patch not allocated")
	}
	for i, b := range orig {
		if k.text[addr+uint64(i)] != b {
			return 0, errors.New("stale")
		}
	}
	for i, b := range new {
		k.text[addr+uint64(i)] = b
	}
	k.nextID++
	k.splices[k.nextID] = fakeSplice{addr: addr, patch: patch, orig: bytes.Clone(orig)}
	return k.nextID, nil
}

func (k *fakeKernel) Unsplice(id uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, ok := k.splices[id]
	if !ok {
		return errors.New("no such splice")
	}
	for i, b := range s.orig {
		k.text[s.addr+uint64(i)] = b
	}
	delete(k.splices, id)
	return nil
}

func (k *fakeKernel) Counter(slot int) uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.counters[slot]
}

func (k *fakeKernel) CounterAddr(slot int) uint64 { return k.heapBase - 0x10000 + uint64(slot)*8 }
func (k *fakeKernel) NumCounters() int            { return len(k.counters) }

func (k *fakeKernel) ClearCounters(first, count int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := first; i < first+count; i++ {
		k.counters[i] = 0
	}
	return nil
}
