package kerninstd

import (
	"bytes"
	"encoding/binary"
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
	// spliceCalls and resplices count successful driver calls.
	spliceCalls, resplices int
	covering               int // of spliceCalls, covering splices
}

type fakeSplice struct {
	addr, patch uint64
	orig        []byte
	kind        string // direct, slot, short, trap
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
	return k.splice(addr, patch, orig, new, false)
}

func (k *fakeKernel) SpliceSlot(addr, patch uint64, orig, new []byte) (uint32, error) {
	return k.splice(addr, patch, orig, new, true)
}

// FinishCovering has nothing left to write.
func (k *fakeKernel) FinishCovering() (int, error) { return 0, nil }

// SpliceCovering is a direct splice to the fake (it has no tasks to wait
// for: the jmp is written at once); it counts the calls.
func (k *fakeKernel) SpliceCovering(addr, patch uint64, orig, new []byte) (uint32, error) {
	if len(new) != 5 || new[0] != 0xe9 {
		return 0, errors.New("fake: a covering splice is a jmp rel32")
	}
	id, err := k.splice(addr, patch, orig, new, false)
	if err == nil {
		k.covering++
	}
	return id, err
}

// splice checks what the driver checks: the replacement's kind and
// target, the original bytes, no overlap.
func (k *fakeKernel) splice(addr, patch uint64, orig, new []byte, slot bool) (uint32, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failSplice {
		return 0, errors.New("injected splice failure")
	}
	if len(orig) != len(new) {
		return 0, errors.New("bad splice arguments")
	}
	kind := ""
	switch {
	case len(new) == 5 && new[0] == 0xe9 && addr+5+uint64(int64(int32(binary.LittleEndian.Uint32(new[1:])))) == patch:
		kind = "direct"
		if slot {
			kind = "slot"
		}
	case !slot && len(new) == 1 && new[0] == 0xcc:
		kind = "trap"
	case !slot && len(new) == 2 && new[0] == 0xeb && addr+2+uint64(int64(int8(new[1]))) == patch:
		kind = "short"
	default:
		return 0, fmt.Errorf("bad splice arguments % x", new)
	}
	if kind == "short" {
		ok := false
		for _, s := range k.splices {
			ok = ok || s.kind == "slot" && s.addr == patch
		}
		if !ok {
			return 0, errors.New("jmp rel8 not to a slot")
		}
	} else if _, ok := k.allocs[patch]; !ok {
		return 0, errors.New("patch not allocated")
	}
	for _, s := range k.splices {
		if addr < s.addr+uint64(len(s.orig)) && addr+uint64(len(orig)) > s.addr {
			return 0, errors.New("overlaps a splice")
		}
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
	k.splices[k.nextID] = fakeSplice{addr: addr, patch: patch, orig: bytes.Clone(orig), kind: kind}
	k.spliceCalls++
	return k.nextID, nil
}

func (k *fakeKernel) Resplice(id uint32, patch uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, ok := k.splices[id]
	if !ok {
		return errors.New("no such splice")
	}
	if _, ok := k.allocs[patch]; !ok || s.kind == "short" {
		return errors.New("bad resplice")
	}
	if s.kind != "trap" {
		d := int32(patch - (s.addr + 5))
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(d))
		for i := 0; i < 4; i++ {
			k.text[s.addr+1+uint64(i)] = b[i]
		}
	}
	s.patch = patch
	k.splices[id] = s
	k.resplices++
	return nil
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
