package driver

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/patchheap"
)

// DefaultPath is the device node kerninst.ko creates.
const DefaultPath = "/dev/kerninst"

// maxRead is the most the driver copies in one READ ioctl.
const maxRead = 1 << 20

// openRetry is how long Open retries a busy device: a previous owner's
// release may still be restoring text.
const openRetry = 10 * time.Second

var (
	// ErrNotLoaded: there is no kerninst device; the module is not loaded.
	ErrNotLoaded = errors.New("no /dev/kerninst: load kerninst.ko (insmod kerninst.ko)")
	// ErrBusy: another process holds the device (one owner at a time).
	ErrBusy = errors.New("/dev/kerninst is held by another process (is kerninstd already running?)")
	// ErrStale: the bytes at a splice point are not the ones the caller
	// expected; the text changed since it was analysed.
	ErrStale = errors.New("kernel text changed since it was analysed")
	// ErrClosed: the Device was closed.
	ErrClosed = errors.New("kerninst device closed")
)

// StaleError reports the address whose bytes are not the expected
// original. errors.Is(err, ErrStale) holds for it.
type StaleError struct{ Addr uint64 }

func (e *StaleError) Error() string {
	return fmt.Sprintf("bytes at %#x are not the expected original: %v", e.Addr, ErrStale)
}

// Is makes errors.Is(err, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Device is an open /dev/kerninst: the process holding it owns every
// splice it makes and the patch heap, which it allocates itself (a
// patchheap.Heap); closing it -- explicitly, by exit or by a crash -- makes
// the driver restore all of them.
//
// A Device is safe for concurrent use. The driver serialises its calls;
// Close waits for calls in progress.
type Device struct {
	// mu: Close holds it for writing; every other method holds it for
	// reading, so neither the fd nor the counter mapping goes away under
	// a call.
	mu       sync.RWMutex
	fd       int    // -1 once closed
	counters []byte // read-only mapping of the counter heap
	info     Info   // from Open; immutable
	// heapMu guards heap, after mu. PatchFree holds it across the
	// driver's write, so a patch is allocated again only once it is int3.
	heapMu sync.Mutex
	heap   *patchheap.Heap
	// sys issues one ioctl (sysIoctl; unit tests stand in for the driver).
	sys func(fd int, req uintptr, arg unsafe.Pointer) unix.Errno
}

// Open opens the device at path (DefaultPath if empty), checks that the
// driver speaks this package's ABI and maps the counter heap read-only.
// The driver zeroes every counter at open.
//
// A busy device is retried for up to 10 s, since a previous owner's
// release may still be restoring its splices; after that the error is
// ErrBusy. A missing device is ErrNotLoaded.
func Open(path string) (*Device, error) {
	if path == "" {
		path = DefaultPath
	}
	deadline := time.Now().Add(openRetry)
	var fd int
	for {
		var err error
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			break
		}
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENXIO):
			return nil, fmt.Errorf("open %s: %w", path, ErrNotLoaded)
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
			continue
		case errors.Is(err, unix.EBUSY):
			return nil, fmt.Errorf("open %s: %w", path, ErrBusy)
		case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
			return nil, fmt.Errorf("open %s: %w (needs root: CAP_SYS_ADMIN)", path, err)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	d := &Device{fd: fd, sys: sysIoctl}
	in, err := d.Info()
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if in.ABIVersion != abiVersion {
		unix.Close(fd)
		return nil, fmt.Errorf("kerninst.ko speaks ABI %d, this program %d: rebuild and reload the module", in.ABIVersion, abiVersion)
	}
	if in.CounterHeapSize == 0 || in.CounterHeapSize%8 != 0 || in.CounterHeapSize > 1<<30 {
		unix.Close(fd)
		return nil, fmt.Errorf("kerninst.ko reports a counter heap of %d bytes", in.CounterHeapSize)
	}
	heap, err := patchheap.New(in.PatchHeap, in.PatchHeapSize, uint64(in.ChunkSize))
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kerninst.ko reports a bad patch heap: %w", err)
	}
	m, err := unix.Mmap(fd, 0, int(in.CounterHeapSize), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap counter heap: %w", err)
	}
	d.info = in
	d.counters = m
	d.heap = heap
	return d, nil
}

// Close unmaps the counters and closes the device. The driver then puts
// back the original bytes of every splice still installed, waits until no
// task can be running in a patch, and refills the patch heap with int3; a
// following Open (by anyone) waits for that. Close after Close is a no-op.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fd < 0 {
		return nil
	}
	err := unix.Munmap(d.counters)
	d.counters = nil
	if cerr := unix.Close(d.fd); err == nil {
		err = cerr
	}
	d.fd = -1
	if err != nil {
		return fmt.Errorf("kerninst close: %w", err)
	}
	return nil
}

// ioctl issues one request; the caller holds d.mu for reading.
func (d *Device) ioctl(op string, req uintptr, arg unsafe.Pointer) error {
	if d.fd < 0 {
		return fmt.Errorf("kerninst %s: %w", op, ErrClosed)
	}
	if errno := d.sys(d.fd, req, arg); errno != 0 {
		return fmt.Errorf("kerninst %s: %w", op, errno)
	}
	return nil
}

func sysIoctl(fd int, req uintptr, arg unsafe.Pointer) unix.Errno {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	return errno
}

// Info returns the driver's heap layout and how many splices are
// installed now.
func (d *Device) Info() (Info, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var in Info
	err := d.ioctl("info", iocInfo, unsafe.Pointer(&in))
	return in, err
}

// Read copies len(b) bytes of kernel memory at addr into b. Memory the
// kernel cannot read without faulting (unmapped, user addresses) is an
// error wrapping unix.EFAULT, never an oops. It is the text reader the
// analysis uses on a live kernel.
func (d *Device) Read(addr uint64, b []byte) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for off := 0; off < len(b); off += maxRead {
		n := min(len(b)-off, maxRead)
		r := kiRead{Addr: addr + uint64(off), Buf: uint64(uintptr(unsafe.Pointer(&b[off]))), Len: uint64(n)}
		err := d.ioctl("read", iocReadMem, unsafe.Pointer(&r))
		runtime.KeepAlive(b)
		if err != nil {
			return fmt.Errorf("%w at %#x+%d", err, r.Addr, n)
		}
	}
	return nil
}

// PatchAlloc allocates size bytes of the executable patch heap (rounded
// up to Info.ChunkSize, first fit) and returns its kernel address. The
// memory holds int3 until written, and lies within rel32 reach of kernel
// and module text. The allocator is this process's (no system call).
// Errors wrap patchheap.ErrFull and unix.ENOSPC when no free run is long
// enough.
func (d *Device) PatchAlloc(size int) (uint64, error) {
	if size <= 0 {
		return 0, fmt.Errorf("kerninst patch alloc: size %d", size)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.fd < 0 {
		return 0, fmt.Errorf("kerninst patch alloc: %w", ErrClosed)
	}
	d.heapMu.Lock()
	defer d.heapMu.Unlock()
	addr, err := d.heap.Alloc(size)
	if errors.Is(err, patchheap.ErrFull) {
		return 0, fmt.Errorf("kerninst patch alloc: %w (%w)", err, unix.ENOSPC)
	}
	if err != nil {
		return 0, fmt.Errorf("kerninst patch alloc: %w", err)
	}
	return addr, nil
}

// PatchWrite writes code at addr, which with len(code) must lie in the
// patch heap (normally inside one allocation). The driver refuses it
// (unix.EBUSY) while an installed splice sends CPUs into any of those
// bytes' chunks. Memory no splice has sent CPUs into since the driver last
// waited is written at once; other memory only after the driver waited
// until no task can still be running in it.
func (d *Device) PatchWrite(addr uint64, code []byte) error {
	if len(code) == 0 {
		return nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.patchWrite("patch write", addr, code)
}

// PatchCode is one patch for PatchWriteMany: code to write at Addr, the
// start of an allocation.
type PatchCode struct {
	Addr uint64
	Code []byte
}

// PatchWriteMany writes several patches as PatchWrite does, with one
// system call for each run of adjacent allocations (the rest of each
// allocation in the run is written as int3, which free and unused patch
// memory always is). On error some patches may be written and others
// not; none is spliced yet, so the caller frees them all.
func (d *Device) PatchWriteMany(ps []PatchCode) error {
	sorted := slices.Clone(ps)
	slices.SortFunc(sorted, func(a, b PatchCode) int { return cmp.Compare(a.Addr, b.Addr) })
	d.mu.RLock()
	defer d.mu.RUnlock()
	var run []byte
	var start, end uint64 // the run [start, end): whole allocations
	flush := func() error {
		if len(run) == 0 {
			return nil
		}
		err := d.patchWrite("patch write", start, run)
		run = nil
		return err
	}
	for _, p := range sorted {
		if len(p.Code) == 0 {
			continue
		}
		d.heapMu.Lock()
		n, ok := d.heap.Len(p.Addr)
		d.heapMu.Unlock()
		if !ok || uint64(len(p.Code)) > n {
			return fmt.Errorf("kerninst patch write: %#x+%d is not within an allocation", p.Addr, len(p.Code))
		}
		if len(run) > 0 && p.Addr != end {
			if err := flush(); err != nil {
				return err
			}
		}
		if len(run) == 0 {
			start = p.Addr
		}
		run = append(run, p.Code...)
		for uint64(len(run)) < p.Addr-start+n {
			run = append(run, 0xcc)
		}
		end = p.Addr + n
	}
	return flush()
}

// patchWrite is PatchWrite; the caller holds d.mu for reading.
func (d *Device) patchWrite(op string, addr uint64, code []byte) error {
	w := kiPatchWrite{Addr: addr, Buf: uint64(uintptr(unsafe.Pointer(&code[0]))), Len: uint64(len(code))}
	err := d.ioctl(op, iocPatchWrite, unsafe.Pointer(&w))
	runtime.KeepAlive(code)
	if err != nil {
		return fmt.Errorf("%w at %#x+%d", err, addr, len(code))
	}
	return nil
}

// PatchFree refills the allocation starting at addr with int3, through
// the driver, and only then frees it. Like PatchWrite the refill is
// refused (unix.EBUSY; the allocation stays allocated) while a splice
// sends CPUs into it, and waits until no task can still be running in a
// patch a removed or re-pointed splice led to. An addr that starts no
// allocation wraps patchheap.ErrNotAllocated and unix.EINVAL.
func (d *Device) PatchFree(addr uint64) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	d.heapMu.Lock()
	defer d.heapMu.Unlock()
	n, ok := d.heap.Len(addr)
	if !ok {
		return fmt.Errorf("kerninst patch free: %w: %#x (%w)", patchheap.ErrNotAllocated, addr, unix.EINVAL)
	}
	if err := d.patchWrite("patch free", addr, bytes.Repeat([]byte{0xcc}, int(n))); err != nil {
		return err
	}
	_, err := d.heap.Free(addr)
	return err
}

// PatchFreeMany is PatchFree of each of addrs, with one system call for
// each run of adjacent allocations (a whole-kernel session frees half a
// million patches). Where a run's refill is refused, each of its patches
// is freed alone, so errs[i] is addrs[i]'s own answer.
func (d *Device) PatchFreeMany(addrs []uint64) []error {
	errs := make([]error, len(addrs))
	order := make([]int, len(addrs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(addrs[a], addrs[b]) })
	free1 := func(i int) { errs[i] = d.PatchFree(addrs[i]) }
	var run []int // indexes into addrs of adjacent allocations
	var end uint64
	flush := func() {
		if len(run) == 0 {
			return
		}
		if len(run) == 1 {
			free1(run[0])
			run = run[:0]
			return
		}
		start := addrs[run[0]]
		d.mu.RLock()
		d.heapMu.Lock()
		err := d.patchWrite("patch free", start, bytes.Repeat([]byte{0xcc}, int(end-start)))
		if err == nil {
			for _, i := range run {
				_, errs[i] = d.heap.Free(addrs[i])
			}
		}
		d.heapMu.Unlock()
		d.mu.RUnlock()
		if err != nil {
			for _, i := range run {
				free1(i)
			}
		}
		run = run[:0]
	}
	for _, i := range order {
		d.heapMu.Lock()
		n, ok := d.heap.Len(addrs[i])
		d.heapMu.Unlock()
		if !ok || len(run) > 0 && (addrs[i] != end || end-addrs[run[0]] >= maxFreeRun) {
			flush()
		}
		if !ok {
			errs[i] = fmt.Errorf("kerninst patch free: %w: %#x (%w)", patchheap.ErrNotAllocated, addrs[i], unix.EINVAL)
			continue
		}
		run, end = append(run, i), addrs[i]+n
	}
	flush()
	return errs
}

// maxFreeRun bounds the bytes one PatchFreeMany system call refills.
const maxFreeRun = 1 << 20

// patchLen is the length of the allocation that starts at patch, or 0:
// the bytes the driver keeps from being rewritten while a splice leads
// there. The driver refuses 0 for a splice to the patch heap, and any
// other length for a jmp rel8, whose target is a slot, not the heap.
func (d *Device) patchLen(patch uint64) uint32 {
	d.heapMu.Lock()
	defer d.heapMu.Unlock()
	n, _ := d.heap.Len(patch)
	return uint32(n)
}

// Splice overwrites the first len(orig) bytes of the one instruction at
// addr with replacement, one of:
//   - "e9 rel32" jumping to patch (5 bytes; a longer instruction's other
//     bytes stay as they are, unexecuted): a direct splice;
//   - "eb rel8" jumping to an installed springboard slot (2 bytes; patch
//     must be the slot's address, see SpliceSlot);
//   - a single int3: a trap splice, the driver's int3 notifier sends every
//     CPU that reaches addr to patch.
//
// For "e9" and int3, patch must be the start of an allocation that already
// holds its code (PatchAlloc; the driver is told its length).
//
// The driver first checks that the bytes at addr are orig -- if not,
// nothing is written and the error is a *StaleError -- then writes with
// the kernel's own cross-modification protocol (int3, sync every CPU,
// tail, sync, first byte, sync), so no CPU ever runs a torn instruction.
// Other refusals wrap unix.EPERM (not kernel text, or the driver's own),
// unix.EEXIST (overlaps an installed splice), unix.EBUSY (an int3 is
// already there) and unix.EINVAL (a malformed request, a patch that starts
// no allocation, or a jmp rel8 that does not land on an installed slot).
func (d *Device) Splice(addr, patch uint64, orig, replacement []byte) (id uint32, err error) {
	return d.splice(addr, patch, orig, replacement, 0)
}

// SpliceSlot writes a springboard slot: "e9 rel32" to patch, over 5 bytes
// of padding at addr that the analysis proved are never executed (orig may
// be int3 padding). Springboard splices (jmp rel8) may then jump to it;
// Unsplice of a slot is refused (unix.EBUSY) while one does.
func (d *Device) SpliceSlot(addr, patch uint64, orig, replacement []byte) (id uint32, err error) {
	return d.splice(addr, patch, orig, replacement, spliceSlot)
}

// SpliceCovering arms a direct splice ("e9 rel32" to patch) whose 5 bytes
// span the instruction at addr and whole instructions after it, all of
// which the patch runs. The caller must have proved that nothing jumps
// between them. Only the int3 is written: the splice works as a trap
// splice until FinishCovering writes the jmp.
func (d *Device) SpliceCovering(addr, patch uint64, orig, replacement []byte) (id uint32, err error) {
	return d.splice(addr, patch, orig, replacement, spliceCover)
}

// FinishCovering waits for an RCU-tasks grace period (tens of
// milliseconds, more under load; the driver's lock is free meanwhile, so
// other calls go on), then writes the jmp of every covering splice armed
// before the call and still installed: by then no task stopped between
// the covered instructions can still resume inside the jmp. It returns how
// many it wrote.
func (d *Device) FinishCovering() (int, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var f kiCoverFinish
	if err := d.ioctl("cover finish", iocCoverFinish, unsafe.Pointer(&f)); err != nil {
		return 0, err
	}
	return int(f.Done), nil
}

func (d *Device) splice(addr, patch uint64, orig, replacement []byte, flags uint32) (id uint32, err error) {
	if len(orig) != len(replacement) || len(orig) == 0 || len(orig) > maxInsn {
		return 0, fmt.Errorf("kerninst splice at %#x: %d original and %d new bytes", addr, len(orig), len(replacement))
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	s := kiSplice{Addr: addr, Patch: patch, Len: uint32(len(orig)), Flags: flags, PatchLen: d.patchLen(patch)}
	copy(s.Orig[:], orig)
	copy(s.New[:], replacement)
	if err := d.ioctl("splice", iocSplice, unsafe.Pointer(&s)); err != nil {
		if errors.Is(err, unix.ESTALE) {
			return 0, fmt.Errorf("kerninst splice: %w", &StaleError{Addr: addr})
		}
		return 0, fmt.Errorf("%w at %#x", err, addr)
	}
	return s.ID, nil
}

// Resplice points installed splice id at another allocated patch without
// a moment where the point runs neither: a direct splice or slot has its
// jmp rel32 rewritten with the same protocol (a CPU that hits the
// transient int3 goes to the new patch), a trap splice just changes where
// its int3 sends CPUs. patch must start an allocation, as for Splice. The
// old patch may still be running on a preempted task; PatchFree waits for
// that. A springboard splice is re-pointed through its slot (unix.EINVAL
// here).
func (d *Device) Resplice(id uint32, patch uint64) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	r := kiResplice{ID: id, Patch: patch, PatchLen: d.patchLen(patch)}
	if err := d.ioctl("resplice", iocResplice, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("%w (id %d → %#x)", err, id, patch)
	}
	return nil
}

// Unsplice puts back the original bytes of splice id with the same
// protocol. A task preempted inside the patch may still be running there
// when it returns; PatchWrite and PatchFree wait for such tasks. Errors
// wrap unix.ENOENT for an unknown id.
func (d *Device) Unsplice(id uint32) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	u := kiUnsplice{ID: id}
	if err := d.ioctl("unsplice", iocUnsplice, unsafe.Pointer(&u)); err != nil {
		return fmt.Errorf("%w (id %d)", err, id)
	}
	return nil
}

// ClearCounters zeroes counter slots [first, first+count).
func (d *Device) ClearCounters(first, count int) error {
	if first < 0 || count < 0 || first > d.NumCounters() || count > d.NumCounters()-first {
		return fmt.Errorf("kerninst counters clear: slots [%d, %d+%d) outside [0, %d)", first, first, count, d.NumCounters())
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	c := kiCountersClear{First: uint32(first), Count: uint32(count)}
	return d.ioctl("counters clear", iocCountersClear, unsafe.Pointer(&c))
}

// NumCounters is the number of 64-bit counter slots.
func (d *Device) NumCounters() int { return int(d.info.CounterHeapSize / 8) }

// Counter reads slot i with one atomic 64-bit load from the read-only
// mapping (no system call). It panics if i is out of range, and returns 0
// after Close.
func (d *Device) Counter(i int) uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.counters == nil {
		return 0
	}
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&d.counters[i*8 : i*8+8][0])))
}

// ReadCounters loads slots [first, first+len(dst)) into dst, each with an
// atomic load, and returns how many it read (fewer at the end of the
// heap, none after Close).
func (d *Device) ReadCounters(first int, dst []uint64) int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if first < 0 || d.counters == nil {
		return 0
	}
	n := 0
	for ; n < len(dst) && first+n < len(d.counters)/8; n++ {
		dst[n] = atomic.LoadUint64((*uint64)(unsafe.Pointer(&d.counters[(first+n)*8])))
	}
	return n
}

// CounterAddr is the kernel address of slot i, for patches to increment
// with "lock incq [rip+disp32]".
func (d *Device) CounterAddr(i int) uint64 { return d.info.CounterHeap + uint64(i)*8 }

// SpliceOp is one splice of a batch (SpliceBatch): the bytes at Addr,
// Orig, become New, as for Splice: "e9 rel32" to Patch (a direct splice),
// "eb rel8" to an installed slot (a springboard splice; the slot must be
// installed by an earlier call), or a single int3 (a trap splice). With
// Slot, it is a springboard slot (SpliceSlot); with Covering, the jmp
// spans several whole instructions, as for SpliceCovering: only its int3
// is written until FinishCovering.
type SpliceOp struct {
	Addr, Patch    uint64
	Orig, New      []byte
	Slot, Covering bool
	// Inst is a trap splice's whole instruction: a process device may
	// write a punned jmp over it instead of the int3 (the kernel's
	// driver only writes the int3).
	Inst []byte
}

// BatchError is a batch the driver refused, all of it, because of op
// Index; Err wraps the errno (unix.EEXIST, unix.ENOENT, …) or a
// *StaleError, so errors.Is sees through it.
type BatchError struct {
	Op    string // "splice" or "unsplice"
	Index int
	Where string // the op's address or id
	Err   error
	// Also are further ops of the batch refused with it, in index order,
	// where the device checks every op before it writes any (a process's
	// punned jumps): each is left out of the next try too.
	Also []*BatchError
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("kerninst %s batch refused at op %d (%s): %v", e.Op, e.Index, e.Where, e.Err)
}

func (e *BatchError) Unwrap() error { return e.Err }

// PatchHeapUsed is the number of patch heap bytes allocated.
func (d *Device) PatchHeapUsed() uint64 {
	d.heapMu.Lock()
	defer d.heapMu.Unlock()
	return d.heap.Used()
}

// BatchMax is the most ops one SpliceBatch or UnspliceBatch takes.
func (d *Device) BatchMax() int { return int(d.info.BatchMax) }

// SpliceBatch installs every op, all or none, with the cross-modification
// protocol run once for the whole batch (int3 at every site, sync every
// CPU; every tail, sync; every first byte, sync), so a batch costs the CPU
// synchronisations of one splice. Each op is checked as Splice checks it,
// and against the others (they must not overlap). It returns the ids in
// the order of ops. An op refused makes the whole batch fail with a
// *BatchError naming it; nothing was written.
func (d *Device) SpliceBatch(ops []SpliceOp) ([]uint32, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	if len(ops) > d.BatchMax() {
		return nil, fmt.Errorf("kerninst splice batch: %d ops, the driver takes at most %d", len(ops), d.BatchMax())
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	ks := make([]kiSplice, len(ops))
	for i, op := range ops {
		if len(op.Orig) != len(op.New) || len(op.Orig) == 0 || len(op.Orig) > maxInsn {
			return nil, fmt.Errorf("kerninst splice at %#x: %d original and %d new bytes", op.Addr, len(op.Orig), len(op.New))
		}
		ks[i] = kiSplice{Addr: op.Addr, Patch: op.Patch, Len: uint32(len(op.Orig)), PatchLen: d.patchLen(op.Patch)}
		switch {
		case op.Slot && op.Covering:
			return nil, fmt.Errorf("kerninst splice at %#x: a slot cannot be a covering splice", op.Addr)
		case op.Slot:
			ks[i].Flags = spliceSlot
		case op.Covering:
			ks[i].Flags = spliceCover
		}
		copy(ks[i].Orig[:], op.Orig)
		copy(ks[i].New[:], op.New)
	}
	b := kiBatch{Ops: uint64(uintptr(unsafe.Pointer(&ks[0]))), N: uint32(len(ks)), Failed: uint32(len(ks))}
	err := d.ioctl("splice batch", iocSpliceBatch, unsafe.Pointer(&b))
	runtime.KeepAlive(ks)
	if err != nil {
		if int(b.Failed) < len(ops) {
			i := int(b.Failed)
			if errors.Is(err, unix.ESTALE) {
				err = &StaleError{Addr: ops[i].Addr}
			}
			return nil, &BatchError{Op: "splice", Index: i, Where: fmt.Sprintf("%#x", ops[i].Addr), Err: err}
		}
		return nil, err
	}
	ids := make([]uint32, len(ks))
	for i := range ks {
		ids[i] = ks[i].ID
	}
	return ids, nil
}

// UnspliceBatch restores every splice of ids, all or none, in one round
// of the protocol. An id the driver refuses (unknown: unix.ENOENT; twice:
// unix.EINVAL; a slot still jumped to: unix.EBUSY) makes the whole batch
// fail with a *BatchError naming it; nothing was written.
func (d *Device) UnspliceBatch(ids []uint32) error {
	if len(ids) == 0 {
		return nil
	}
	if len(ids) > d.BatchMax() {
		return fmt.Errorf("kerninst unsplice batch: %d ids, the driver takes at most %d", len(ids), d.BatchMax())
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	b := kiBatch{Ops: uint64(uintptr(unsafe.Pointer(&ids[0]))), N: uint32(len(ids)), Failed: uint32(len(ids))}
	err := d.ioctl("unsplice batch", iocUnspliceBatch, unsafe.Pointer(&b))
	runtime.KeepAlive(ids)
	if err != nil && int(b.Failed) < len(ids) {
		return &BatchError{Op: "unsplice", Index: int(b.Failed), Where: fmt.Sprintf("id %d", ids[b.Failed]), Err: err}
	}
	return err
}
