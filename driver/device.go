package driver

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultPath is the device node kerninst.ko creates.
const DefaultPath = "/dev/kerninst"

var (
	// ErrNotLoaded: there is no device node; kerninst.ko is not loaded.
	ErrNotLoaded = errors.New("no /dev/kerninst: load kerninst.ko (insmod kerninst.ko)")
	// ErrBusy: another process holds the device (one kerninstd at a time).
	ErrBusy = errors.New("/dev/kerninst is held by another process (is kerninstd already running?)")
	// ErrStale: the bytes at a splice point are not what the caller analysed.
	ErrStale = errors.New("kernel text changed since it was analysed")
)

// StaleError reports the address whose bytes changed under us.
type StaleError struct{ Addr uint64 }

func (e *StaleError) Error() string {
	return fmt.Sprintf("bytes at %#x are not the expected original: %v", e.Addr, ErrStale)
}

func (e *StaleError) Is(t error) bool { return t == ErrStale }

// Info is the layout of the driver's heaps. It is also the ABI's struct
// ki_info, filled by the INFO ioctl.
type Info struct {
	ABIVersion      uint32
	ChunkSize       uint32 // patch heap allocation granule
	PatchHeap       uint64 // kernel address of the executable patch heap
	PatchHeapSize   uint64
	CounterHeap     uint64 // kernel address of counter slot 0
	CounterHeapSize uint64
	ModuleText      uint64 // kerninst.ko's own memory, never spliced
	ModuleTextSize  uint64
	Splices         uint32 // installed right now
	Int3Hits        uint32 // CPUs the int3 notifier sent to a patch (wraps)
}

// Device is an open /dev/kerninst. Its methods are safe for concurrent
// use; the driver serialises them anyway.
type Device struct {
	f        *os.File
	counters []byte // read-only mapping of the counter heap
	info     Info
	mu       sync.Mutex // protects f against Close during a call
}

// Open opens the device. A previous owner's release may still be restoring
// text, so EBUSY is retried for up to 10 s.
func Open(path string) (*Device, error) {
	if path == "" {
		path = DefaultPath
	}
	deadline := time.Now().Add(10 * time.Second)
	var f *os.File
	for {
		var err error
		f, err = os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			break
		}
		switch {
		case errors.Is(err, os.ErrNotExist):
			return nil, ErrNotLoaded
		case errors.Is(err, syscall.EBUSY) && time.Now().Before(deadline):
			time.Sleep(100 * time.Millisecond)
			continue
		case errors.Is(err, syscall.EBUSY):
			return nil, ErrBusy
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	d := &Device{f: f}
	in, err := d.Info()
	if err != nil {
		f.Close()
		return nil, err
	}
	if in.ABIVersion != abiVersion {
		f.Close()
		return nil, fmt.Errorf("kerninst.ko speaks ABI %d, this kerninstd %d: rebuild and reload the module", in.ABIVersion, abiVersion)
	}
	d.info = in
	m, err := unix.Mmap(int(f.Fd()), 0, int(in.CounterHeapSize), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("mmap counter heap: %w", err)
	}
	d.counters = m
	return d, nil
}

// Close releases the device: the driver restores every splice still
// installed and reclaims the patch heap.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	unix.Munmap(d.counters)
	err := d.f.Close()
	d.f = nil
	return err
}

func (d *Device) ioctl(op string, req uintptr, arg unsafe.Pointer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return fmt.Errorf("kerninst %s: device closed", op)
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), req, uintptr(arg))
	if errno != 0 {
		return fmt.Errorf("kerninst %s: %w", op, errno)
	}
	return nil
}

// Info returns the heap layout and the number of installed splices.
func (d *Device) Info() (Info, error) {
	var in Info
	err := d.ioctl("info", iocInfo, unsafe.Pointer(&in))
	return in, err
}

// Read copies kernel memory at addr into b. An unmapped address is an
// error (EFAULT), never an oops.
func (d *Device) Read(addr uint64, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	r := kiRead{Addr: addr, Buf: uint64(uintptr(unsafe.Pointer(&b[0]))), Len: uint64(len(b))}
	if err := d.ioctl("read", iocRead_, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("%w at %#x+%d", err, addr, len(b))
	}
	return nil
}

// PatchAlloc allocates size bytes of the patch heap, filled with int3.
func (d *Device) PatchAlloc(size int) (uint64, error) {
	a := kiPatchAlloc{Size: uint64(size)}
	if err := d.ioctl("patch alloc", iocPatchAlloc, unsafe.Pointer(&a)); err != nil {
		return 0, err
	}
	return a.Addr, nil
}

// PatchWrite writes code into an allocated patch. Refused while a splice
// sends CPUs there.
func (d *Device) PatchWrite(addr uint64, code []byte) error {
	if len(code) == 0 {
		return nil
	}
	w := kiPatchWrite{Addr: addr, Buf: uint64(uintptr(unsafe.Pointer(&code[0]))), Len: uint64(len(code))}
	return d.ioctl("patch write", iocPatchWrite, unsafe.Pointer(&w))
}

// PatchFree frees the allocation at addr, after waiting (if a splice was
// removed since the last wait) until no task can still run in it.
func (d *Device) PatchFree(addr uint64) error {
	f := kiPatchFree{Addr: addr}
	return d.ioctl("patch free", iocPatchFree, unsafe.Pointer(&f))
}

// Splice overwrites the instruction at addr: orig are the bytes expected
// there, replacement is a jmp rel32 to patch (5 bytes) or an int3 (1
// byte). The driver checks orig first; a mismatch is a *StaleError.
func (d *Device) Splice(addr, patch uint64, orig, replacement []byte) (uint32, error) {
	if len(orig) != len(replacement) || len(orig) == 0 || len(orig) > 15 {
		return 0, fmt.Errorf("kerninst splice: %d original and %d new bytes", len(orig), len(replacement))
	}
	s := kiSplice{Addr: addr, Patch: patch, Len: uint32(len(orig))}
	copy(s.Orig[:], orig)
	copy(s.New[:], replacement)
	if err := d.ioctl("splice", iocSplice, unsafe.Pointer(&s)); err != nil {
		if errors.Is(err, syscall.ESTALE) {
			return 0, &StaleError{Addr: addr}
		}
		return 0, err
	}
	return s.ID, nil
}

// Unsplice restores the original bytes of splice id.
func (d *Device) Unsplice(id uint32) error {
	u := kiUnsplice{ID: id}
	return d.ioctl("unsplice", iocUnsplice, unsafe.Pointer(&u))
}

// ClearCounters zeroes counter slots [first, first+count).
func (d *Device) ClearCounters(first, count int) error {
	c := kiCountersClear{First: uint32(first), Count: uint32(count)}
	return d.ioctl("counters clear", iocCountersClear, unsafe.Pointer(&c))
}

// NumCounters is the number of 64-bit counter slots.
func (d *Device) NumCounters() int { return len(d.counters) / 8 }

// Counter reads slot i with an atomic 64-bit load.
func (d *Device) Counter(i int) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&d.counters[i*8])))
}

// CounterAddr is the kernel address of slot i, for patches to increment.
func (d *Device) CounterAddr(i int) uint64 { return d.info.CounterHeap + uint64(i)*8 }
