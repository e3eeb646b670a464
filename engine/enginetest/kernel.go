// Package enginetest is an in-memory kernel for tests of the engine and
// of what is built on it: a flat kernel text, a patch heap and a counter
// heap behind engine.Device, with the driver's argument checks.
package enginetest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/internal/x86dec"
)

// Kernel stands in for the driver in unit tests. It never executes
// anything; the live tests do that against the real driver. Lock Mu to
// read or change its fields while an engine uses it.
type Kernel struct {
	Mu       sync.Mutex
	text     memory
	heapBase uint64
	heapNext uint64
	// Allocs are the patch heap's allocations (address: size), Splices
	// the splices installed by id, Counters the counter heap.
	Allocs   map[uint64]int
	Splices  map[uint32]Splice
	nextID   uint32
	Counters []uint64
	// at indexes Splices by address, uses counts the splices to each
	// patch, allocOrder is the allocations in address order (the heap
	// only grows; freed ones stay until skipped): a whole vmlinux's
	// half a million probes must not scan every splice for each.
	at         map[uint64]uint32
	uses       map[uint64]int
	allocOrder []uint64
	// FailSplice makes every splice fail.
	FailSplice bool
	// MaxSplices > 0 fails a splice with ENOSPC when that many are
	// installed, as the driver's full splice table does.
	MaxSplices int
	// MaxAllocs > 0 fails a patch allocation with ENOSPC while that many
	// patches are allocated (a full patch heap).
	MaxAllocs int
	// SpliceCalls and Resplices count successful driver calls; Covering
	// counts the covering splices among SpliceCalls.
	SpliceCalls, Resplices int
	FreeManyCalls          int
	Covering               int
	// Batches counts successful SpliceBatch and UnspliceBatch calls;
	// MaxBatch > 0 is the most ops one takes (default 4096).
	Batches, MaxBatch int
	// Syncs counts CPU synchronisation rounds as the driver makes them:
	// three for each splice, unsplice or re-splice, and for each batch.
	Syncs uint64
}

// Splice is one installed splice.
type Splice struct {
	Addr, Patch uint64
	Orig        []byte
	Kind        string // direct, slot, short, trap
}

var errFault = errors.New("fault")

// errNoSplice is the driver's answer for an unknown splice id.
var errNoSplice = fmt.Errorf("no such splice: %w", syscall.ENOENT)

// New returns a kernel whose text at textAddr is text, with 64 counters
// and a patch heap 1 GiB above the text.
func New(textAddr uint64, text []byte) *Kernel {
	k := NewSpans(textAddr + 0x40000000)
	k.AddText(textAddr, bytes.Clone(text))
	return k
}

// NewSpans returns a kernel with no text yet (AddText maps it), 64
// counters and its patch heap at heapBase.
func NewSpans(heapBase uint64) *Kernel {
	return &Kernel{text: newMemory(), heapBase: heapBase, heapNext: heapBase, Allocs: map[uint64]int{},
		Splices: map[uint32]Splice{}, Counters: make([]uint64, 64), at: map[uint64]uint32{}, uses: map[uint64]int{}}
}

// AddText maps text at addr, which the kernel then owns; it must not
// overlap text already mapped or the patch heap.
func (k *Kernel) AddText(addr uint64, text []byte) {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	k.text.addSpan(addr, text)
}

func (k *Kernel) Read(addr uint64, b []byte) error {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	return k.readLocked(addr, b)
}

func (k *Kernel) readLocked(addr uint64, b []byte) error {
	if !k.text.read(addr, b) {
		for i := range b {
			if _, ok := k.text.get(addr + uint64(i)); !ok {
				return fmt.Errorf("read %#x: %w", addr+uint64(i), errFault)
			}
		}
	}
	return nil
}

func (k *Kernel) PatchAlloc(size int) (uint64, error) {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	a := k.heapNext
	n := uint64(size+63) &^ 63
	if k.MaxAllocs > 0 && len(k.Allocs) >= k.MaxAllocs {
		return 0, fmt.Errorf("patch heap full: %w", syscall.ENOSPC)
	}
	k.heapNext += n
	k.Allocs[a] = size
	k.allocOrder = append(k.allocOrder, a)
	// The heap is readable (int3) to its end, as the driver's is.
	k.text.extend(k.heapBase, int(n), 0xcc)
	return a, nil
}

func (k *Kernel) PatchWrite(addr uint64, code []byte) error {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	if !k.inAlloc(addr, len(code)) {
		return errors.New("write outside an allocation")
	}
	for i, b := range code {
		k.text.set(addr+uint64(i), b)
	}
	return nil
}

func (k *Kernel) inAlloc(addr uint64, n int) bool {
	i := sort.Search(len(k.allocOrder), func(i int) bool { return k.allocOrder[i] > addr }) - 1
	if i < 0 {
		return false
	}
	a := k.allocOrder[i]
	sz, ok := k.Allocs[a]
	return ok && addr+uint64(n) <= a+uint64(sz)
}

func (k *Kernel) PatchFree(addr uint64) error {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	if _, ok := k.Allocs[addr]; !ok {
		return errors.New("free of unallocated patch")
	}
	if k.uses[addr] > 0 {
		return errors.New("busy")
	}
	delete(k.Allocs, addr)
	return nil
}

// PatchFreeMany is PatchFree of each, as the driver's batched form
// answers it; FreeManyCalls counts its calls.
func (k *Kernel) PatchFreeMany(addrs []uint64) []error {
	errs := make([]error, len(addrs))
	for i, a := range addrs {
		errs[i] = k.PatchFree(a)
	}
	k.Mu.Lock()
	k.FreeManyCalls++
	k.Mu.Unlock()
	return errs
}

func (k *Kernel) Splice(addr, patch uint64, orig, new []byte) (uint32, error) {
	return k.splice(addr, patch, orig, new, false)
}

func (k *Kernel) SpliceSlot(addr, patch uint64, orig, new []byte) (uint32, error) {
	return k.splice(addr, patch, orig, new, true)
}

// FinishCovering has nothing left to write.
func (k *Kernel) FinishCovering() (int, error) { return 0, nil }

// SpliceCovering is a direct splice to the fake (it has no tasks to wait
// for: the jmp is written at once); it counts the calls.
func (k *Kernel) SpliceCovering(addr, patch uint64, orig, new []byte) (uint32, error) {
	if len(new) != 5 || new[0] != 0xe9 {
		return 0, errors.New("fake: a covering splice is a jmp rel32")
	}
	id, err := k.splice(addr, patch, orig, new, false)
	if err == nil {
		k.Covering++
	}
	return id, err
}

// splice checks what the driver checks: the replacement's kind and
// target, the original bytes, no overlap.
func (k *Kernel) splice(addr, patch uint64, orig, new []byte, slot bool) (uint32, error) {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	if k.FailSplice {
		return 0, errors.New("injected splice failure")
	}
	if k.MaxSplices > 0 && len(k.Splices) >= k.MaxSplices {
		return 0, fmt.Errorf("kerninst splice: %w", syscall.ENOSPC)
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
		id, ok := k.at[patch]
		if !ok || k.Splices[id].Kind != "slot" {
			return 0, errors.New("jmp rel8 not to a slot")
		}
	} else if _, ok := k.Allocs[patch]; !ok {
		return 0, errors.New("patch not allocated")
	}
	for a := addr - maxSpliceLen + 1; a < addr+uint64(len(orig)); a++ {
		if id, ok := k.at[a]; ok && addr < a+uint64(len(k.Splices[id].Orig)) {
			return 0, errors.New("overlaps a splice")
		}
	}
	for i, b := range orig {
		if v, _ := k.text.get(addr + uint64(i)); v != b {
			return 0, errors.New("stale")
		}
	}
	for i, b := range new {
		k.text.set(addr+uint64(i), b)
	}
	k.nextID++
	k.Splices[k.nextID] = Splice{Addr: addr, Patch: patch, Orig: bytes.Clone(orig), Kind: kind}
	k.at[addr] = k.nextID
	k.uses[patch]++
	k.SpliceCalls++
	k.Syncs += 3
	return k.nextID, nil
}

// PatchWriteMany writes each patch as PatchWrite does.
func (k *Kernel) PatchWriteMany(ps []driver.PatchCode) error {
	for _, p := range ps {
		if err := k.PatchWrite(p.Addr, p.Code); err != nil {
			return err
		}
	}
	return nil
}

// BatchMax is the fake driver's batch size; a test may lower it
// (MaxBatch) to make the engine split its batches.
func (k *Kernel) BatchMax() int {
	if k.MaxBatch > 0 {
		return k.MaxBatch
	}
	return 4096
}

// SpliceBatch splices each op as Splice (or SpliceCovering) would, all or
// none: a refused op takes the ones before it back out and fails the
// batch with a *driver.BatchError naming it. It counts the batches.
func (k *Kernel) SpliceBatch(ops []driver.SpliceOp) ([]uint32, error) {
	if len(ops) > k.BatchMax() {
		return nil, fmt.Errorf("fake: batch of %d", len(ops))
	}
	ids := make([]uint32, 0, len(ops))
	for i, op := range ops {
		var id uint32
		var err error
		switch {
		case op.Covering:
			id, err = k.SpliceCovering(op.Addr, op.Patch, op.Orig, op.New)
		case op.Slot:
			id, err = k.SpliceSlot(op.Addr, op.Patch, op.Orig, op.New)
		default:
			id, err = k.Splice(op.Addr, op.Patch, op.Orig, op.New)
		}
		if err != nil {
			for _, id := range ids {
				k.Unsplice(id)
			}
			return nil, &driver.BatchError{Op: "splice", Index: i, Where: fmt.Sprintf("%#x", op.Addr), Err: err}
		}
		ids = append(ids, id)
	}
	k.Mu.Lock()
	k.Batches++
	k.Syncs -= 3*uint64(len(ops)) - 3 // one round for the batch
	k.Mu.Unlock()
	return ids, nil
}

// UnspliceBatch unsplices every id, all or none (every id is checked
// first). It counts the batches.
func (k *Kernel) UnspliceBatch(ids []uint32) error {
	k.Mu.Lock()
	seen := map[uint32]bool{}
	for i, id := range ids {
		if _, ok := k.Splices[id]; !ok || seen[id] {
			k.Mu.Unlock()
			return &driver.BatchError{Op: "unsplice", Index: i, Where: fmt.Sprintf("id %d", id), Err: errNoSplice}
		}
		seen[id] = true
	}
	k.Batches++
	k.Syncs -= 3*uint64(len(ids)) - 3 // one round for the batch
	k.Mu.Unlock()
	for _, id := range ids {
		if err := k.Unsplice(id); err != nil {
			return err
		}
	}
	return nil
}

func (k *Kernel) Resplice(id uint32, patch uint64) error {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	s, ok := k.Splices[id]
	if !ok {
		return errNoSplice
	}
	if _, ok := k.Allocs[patch]; !ok || s.Kind == "short" {
		return errors.New("bad resplice")
	}
	if s.Kind != "trap" {
		d := int32(patch - (s.Addr + 5))
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(d))
		for i := 0; i < 4; i++ {
			k.text.set(s.Addr+1+uint64(i), b[i])
		}
	}
	k.unuse(s.Patch)
	k.uses[patch]++
	s.Patch = patch
	k.Splices[id] = s
	k.Resplices++
	k.Syncs += 3
	return nil
}

func (k *Kernel) Unsplice(id uint32) error {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	s, ok := k.Splices[id]
	if !ok {
		return errNoSplice
	}
	k.undoLocked(id, s)
	k.Syncs += 3
	return nil
}

// undoLocked puts splice id's original bytes back and forgets it. The
// caller holds Mu.
func (k *Kernel) undoLocked(id uint32, s Splice) {
	for i, b := range s.Orig {
		k.text.set(s.Addr+uint64(i), b)
	}
	delete(k.Splices, id)
	delete(k.at, s.Addr)
	k.unuse(s.Patch)
}

// maxSpliceLen bounds a splice's original bytes (a covering run of
// instructions included), for the overlap check.
const maxSpliceLen = 16

// unuse drops one splice's use of patch.
func (k *Kernel) unuse(patch uint64) {
	if k.uses[patch]--; k.uses[patch] <= 0 {
		delete(k.uses, patch)
	}
}

func (k *Kernel) Counter(slot int) uint64 {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	return k.Counters[slot]
}

func (k *Kernel) CounterAddr(slot int) uint64 { return k.counterBase() + uint64(slot)*8 }
func (k *Kernel) counterBase() uint64         { return k.heapBase - 0x10000 }

// PatchHeap is the patch heap's base address.
func (k *Kernel) PatchHeap() uint64 { return k.heapBase }
func (k *Kernel) NumCounters() int  { return len(k.Counters) }

func (k *Kernel) ClearCounters(first, count int) error {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	for i := first; i < first+count; i++ {
		k.Counters[i] = 0
	}
	return nil
}

// AllocsNow returns a copy of the patch heap's allocations.
func (k *Kernel) AllocsNow() map[uint64]int {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	return maps.Clone(k.Allocs)
}

// TextAddr is where Text lies in the kernel New makes with Fixture.
const TextAddr = 0xffffffff81200000

// Text is a filename_lookup shaped like the real one: ftrace nop, short
// prologue instructions, then a 7-byte RIP-relative load (the entry
// point), a test and branch, a call, and a return-thunk jump; padding,
// and next_fn, one ret.
var Text = []byte{
	0x0f, 0x1f, 0x44, 0x00, 0x00, // +0x00 nopl (ftrace site)
	0x55,             // +0x05 push %rbp
	0x48, 0x89, 0xe5, // +0x06 mov %rsp,%rbp
	0x41, 0x54, // +0x09 push %r12
	0x48, 0x8b, 0x05, 0x10, 0x20, 0x30, 0x00, // +0x0b mov 0x302010(%rip),%rax
	0x48, 0x85, 0xc0, // +0x12 test %rax,%rax
	0x74, 0x05, // +0x15 je +0x1c
	0xe8, 0x00, 0x01, 0x00, 0x00, // +0x17 call
	0x41, 0x5c, // +0x1c pop %r12
	0x5d,                         // +0x1e pop %rbp
	0xe9, 0x10, 0x00, 0x00, 0x00, // +0x1f jmp (return thunk)
	0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, // padding to +0x30
	0xc3, // +0x30 next_fn: ret
}

// Kallsyms names Text's functions (and exc_int3, on the int3 path, in the
// nops after it).
const Kallsyms = `ffffffff81200000 T filename_lookup
ffffffff81200030 T next_fn
ffffffff81200031 T exc_int3
`

// Fixture returns a kernel holding Text, followed by eight nops, at
// TextAddr, and the path of a kallsyms file naming its functions (in dir).
func Fixture(dir string) (*Kernel, string, error) {
	path := filepath.Join(dir, "kallsyms")
	if err := os.WriteFile(path, []byte(Kallsyms), 0o600); err != nil {
		return nil, "", err
	}
	full := append(bytes.Clone(Text), 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90)
	return New(TextAddr, full), path, nil
}

// TextNow reads Text's bytes as the kernel holds them now.
func (k *Kernel) TextNow() []byte {
	b := make([]byte, len(Text))
	if err := k.Read(TextAddr, b); err != nil {
		panic(err)
	}
	return b
}

// Count stands in for n executions of the instruction at addr: every
// counter its patch increments (lock incq) goes up by n, and every hit
// flag it stores (movb $1, a coverage probe's) is set.
func (k *Kernel) Count(addr uint64, n uint64) error {
	return k.Time(addr, n, 0)
}

// Time stands in for n calls of a timed function whose entry is spliced
// at addr, that took ticks TSC ticks in all and left nobody inside: the
// calls counter its entry patch increments goes up by n and the timer
// word it adds to by ticks·2^16 (see metrics' timer words). Counters of
// the probes sharing the patch go up by n too.
func (k *Kernel) Time(addr uint64, n, ticks uint64) error {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	uses, err := k.counterUses(addr)
	if err != nil {
		return err
	}
	for _, u := range uses {
		switch u.op {
		case x86asm.INC:
			k.Counters[u.slot] += n
		case x86asm.ADD:
			k.Counters[u.slot] += ticks << 16
		case x86asm.MOV: // a coverage probe's movb $1: its flag is set
			if n > 0 {
				k.Counters[u.slot] |= 1
			}
		}
	}
	return nil
}

type counterUse struct {
	op   x86asm.Op
	slot int
}

// counterUses decodes the patch spliced at addr and lists the
// RIP-relative counter accesses it makes. The caller holds Mu.
func (k *Kernel) counterUses(addr uint64) ([]counterUse, error) {
	var sp *Splice
	for _, s := range k.Splices {
		if s.Addr == addr {
			sp = &s
		}
	}
	if sp == nil {
		return nil, fmt.Errorf("no splice at %#x", addr)
	}
	patch := sp.Patch
	if sp.Kind == "short" { // jmp rel8 to a slot holding jmp rel32 to the patch
		var j [5]byte
		if err := k.readLocked(patch, j[:]); err != nil || j[0] != 0xe9 {
			return nil, fmt.Errorf("slot at %#x holds no jmp", patch)
		}
		patch = patch + 5 + uint64(int64(int32(binary.LittleEndian.Uint32(j[1:]))))
	}
	size, ok := k.Allocs[patch]
	if !ok {
		return nil, fmt.Errorf("no patch at %#x", patch)
	}
	code := make([]byte, size)
	if err := k.readLocked(patch, code); err != nil {
		return nil, err
	}
	lo, hi := k.counterBase(), k.counterBase()+uint64(len(k.Counters))*8
	var uses []counterUse
	for off := 0; off < len(code); {
		in, err := x86dec.Decode(code[off:])
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

// Unload stands in for the unloading of a module whose text is [lo, hi):
// every splice there is undone and forgotten, as the driver's module
// notifier does, so that a later unsplice of its id fails with ENOENT. It
// returns how many it undid.
func (k *Kernel) Unload(lo, hi uint64) int {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	n := 0
	for id, s := range k.Splices {
		if s.Addr >= lo && s.Addr < hi {
			k.undoLocked(id, s)
			n++
		}
	}
	return n
}

// Poke changes one byte of text behind the engine's back, as another
// tool patching the kernel would. The caller holds Mu.
func (k *Kernel) Poke(addr uint64, b byte) { k.text.set(addr, b) }

// AllocBytes is the patch heap in use, in bytes.
func (k *Kernel) AllocBytes() uint64 {
	k.Mu.Lock()
	defer k.Mu.Unlock()
	n := 0
	for _, sz := range k.Allocs {
		n += sz
	}
	return uint64(n)
}
