package kerninstdtest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/arch/x86/x86asm"
)

// Kernel is an in-memory kernel behind kerninstd's Device interface: a
// flat text, a patch heap and a counter heap, with the driver's argument
// checks. It never executes anything: Count and Time stand in for the
// kernel running instrumented code, by adding to the counters an
// installed patch updates. It serves tests of what is built on the
// daemon (reports, the API); it must not stand in for the driver in a
// test that proves a capability, which runs against the real driver in
// the live tests.
type Kernel struct {
	mu       sync.Mutex
	text     map[uint64]byte
	heapBase uint64
	heapNext uint64
	allocs   map[uint64]int
	splices  map[uint32]splice
	nextID   uint32
	counters []uint64
}

type splice struct {
	addr, patch uint64
	orig        []byte
	kind        string // direct, slot, short, trap
}

var errFault = errors.New("fault")

// NewKernel returns a kernel whose text is text at textAddr, with a
// patch heap 1 GiB above it and 256 counter slots just below the heap.
func NewKernel(textAddr uint64, text []byte) *Kernel {
	k := &Kernel{text: make(map[uint64]byte), heapBase: textAddr + 0x40000000, allocs: map[uint64]int{},
		splices: map[uint32]splice{}, counters: make([]uint64, 256)}
	k.heapNext = k.heapBase
	for i, b := range text {
		k.text[textAddr+uint64(i)] = b
	}
	return k
}

func (k *Kernel) Read(addr uint64, b []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.readLocked(addr, b)
}

func (k *Kernel) readLocked(addr uint64, b []byte) error {
	for i := range b {
		v, ok := k.text[addr+uint64(i)]
		if !ok {
			return fmt.Errorf("read %#x: %w", addr+uint64(i), errFault)
		}
		b[i] = v
	}
	return nil
}

func (k *Kernel) PatchAlloc(size int) (uint64, error) {
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

func (k *Kernel) PatchWrite(addr uint64, code []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	ok := false
	for a, sz := range k.allocs {
		ok = ok || addr >= a && addr+uint64(len(code)) <= a+uint64(sz)
	}
	if !ok {
		return errors.New("write outside an allocation")
	}
	for i, b := range code {
		k.text[addr+uint64(i)] = b
	}
	return nil
}

func (k *Kernel) PatchFree(addr uint64) error {
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

func (k *Kernel) Splice(addr, patch uint64, orig, new []byte) (uint32, error) {
	return k.splice(addr, patch, orig, new, false)
}

func (k *Kernel) SpliceSlot(addr, patch uint64, orig, new []byte) (uint32, error) {
	return k.splice(addr, patch, orig, new, true)
}

// SpliceCovering writes the jmp at once: there are no tasks to wait for.
func (k *Kernel) SpliceCovering(addr, patch uint64, orig, new []byte) (uint32, error) {
	if len(new) != 5 || new[0] != 0xe9 {
		return 0, errors.New("a covering splice is a jmp rel32")
	}
	return k.splice(addr, patch, orig, new, false)
}

// FinishCovering has nothing left to write.
func (k *Kernel) FinishCovering() (int, error) { return 0, nil }

// splice checks what the driver checks: the replacement's kind and
// target, the original bytes, no overlap.
func (k *Kernel) splice(addr, patch uint64, orig, new []byte, slot bool) (uint32, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
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
	k.splices[k.nextID] = splice{addr: addr, patch: patch, orig: bytes.Clone(orig), kind: kind}
	return k.nextID, nil
}

func (k *Kernel) Resplice(id uint32, patch uint64) error {
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
		var rel [4]byte
		binary.LittleEndian.PutUint32(rel[:], uint32(int32(patch-(s.addr+5))))
		for i, b := range rel {
			k.text[s.addr+1+uint64(i)] = b
		}
	}
	s.patch = patch
	k.splices[id] = s
	return nil
}

func (k *Kernel) Unsplice(id uint32) error {
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

func (k *Kernel) Counter(slot int) uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.counters[slot]
}

func (k *Kernel) CounterAddr(slot int) uint64 { return k.counterBase() + uint64(slot)*8 }
func (k *Kernel) NumCounters() int            { return len(k.counters) }
func (k *Kernel) counterBase() uint64         { return k.heapBase - 0x10000 }

func (k *Kernel) ClearCounters(first, count int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := first; i < first+count; i++ {
		k.counters[i] = 0
	}
	return nil
}

// Count stands in for n executions of the instruction at addr: every
// counter its patch increments (lock incq) goes up by n.
func (k *Kernel) Count(addr uint64, n uint64) error {
	return k.Time(addr, n, 0)
}

// Time stands in for n calls of a timed function whose entry is spliced
// at addr, that took ticks TSC ticks in all and left nobody inside: the
// calls counter its entry patch increments goes up by n and the timer
// word it adds to by ticks·2^16 (see metrics' timer words). Counters of
// the probes sharing the patch go up by n too.
func (k *Kernel) Time(addr uint64, n, ticks uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	uses, err := k.counterUses(addr)
	if err != nil {
		return err
	}
	for _, u := range uses {
		switch u.op {
		case x86asm.INC:
			k.counters[u.slot] += n
		case x86asm.ADD:
			k.counters[u.slot] += ticks << 16
		}
	}
	return nil
}

type counterUse struct {
	op   x86asm.Op
	slot int
}

// counterUses decodes the patch spliced at addr and lists the
// RIP-relative counter accesses it makes.
func (k *Kernel) counterUses(addr uint64) ([]counterUse, error) {
	var sp *splice
	for _, s := range k.splices {
		if s.addr == addr {
			sp = &s
		}
	}
	if sp == nil {
		return nil, fmt.Errorf("no splice at %#x", addr)
	}
	patch := sp.patch
	if sp.kind == "short" { // jmp rel8 to a slot holding jmp rel32 to the patch
		var j [5]byte
		if err := k.readLocked(patch, j[:]); err != nil || j[0] != 0xe9 {
			return nil, fmt.Errorf("slot at %#x holds no jmp", patch)
		}
		patch = patch + 5 + uint64(int64(int32(binary.LittleEndian.Uint32(j[1:]))))
	}
	size, ok := k.allocs[patch]
	if !ok {
		return nil, fmt.Errorf("no patch at %#x", patch)
	}
	code := make([]byte, size)
	if err := k.readLocked(patch, code); err != nil {
		return nil, err
	}
	lo, hi := k.counterBase(), k.counterBase()+uint64(len(k.counters))*8
	var uses []counterUse
	for off := 0; off < len(code); {
		in, err := x86asm.Decode(code[off:], 64)
		if err != nil {
			break
		}
		next := patch + uint64(off+in.Len)
		for _, a := range in.Args {
			// x86asm gives a disp32 as its 32 bits, not sign-extended.
			if m, ok := a.(x86asm.Mem); ok && m.Base == x86asm.RIP {
				if t := next + uint64(int64(int32(m.Disp))); t >= lo && t < hi {
					uses = append(uses, counterUse{op: in.Op, slot: int((t - lo) / 8)})
				}
			}
		}
		off += in.Len
	}
	return uses, nil
}
