package driver

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/patchheap"
)

const (
	testHeap     = 0xffffffffc1000000
	testHeapSize = 4096
)

// fakeDriver stands in for kerninst.ko's ioctls: it records what it is
// asked and answers with fail (0: success).
type fakeDriver struct {
	writes   []fakeWrite
	splices  []kiSplice
	resplice []kiResplice
	fail     unix.Errno
}

type fakeWrite struct {
	addr uint64
	data []byte
}

func (f *fakeDriver) ioctl(fd int, req uintptr, arg unsafe.Pointer) unix.Errno {
	switch req {
	case iocPatchWrite:
		w := (*kiPatchWrite)(arg)
		buf := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&w.Buf))), w.Len)
		f.writes = append(f.writes, fakeWrite{w.Addr, bytes.Clone(buf)})
	case iocSplice:
		s := (*kiSplice)(arg)
		f.splices = append(f.splices, *s)
		s.ID = uint32(len(f.splices))
	case iocResplice:
		f.resplice = append(f.resplice, *(*kiResplice)(arg))
	default:
		return unix.ENOTTY
	}
	return f.fail
}

func newTestDevice(t *testing.T) (*Device, *fakeDriver) {
	t.Helper()
	h, err := patchheap.New(testHeap, testHeapSize, 64)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDriver{}
	return &Device{fd: 100, sys: f.ioctl, heap: h, info: Info{ChunkSize: 64, PatchHeap: testHeap, PatchHeapSize: testHeapSize}}, f
}

// TestPatchHeapThroughDriver: allocation is local; splices tell the driver
// their patch's length; a free is an int3 write of the whole allocation
// through the driver, and the allocation is reused only if it succeeded.
func TestPatchHeapThroughDriver(t *testing.T) {
	d, f := newTestDevice(t)
	p1, err := d.PatchAlloc(100)
	if err != nil || p1 != testHeap {
		t.Fatalf("PatchAlloc(100) = %#x, %v; want %#x", p1, err, uint64(testHeap))
	}
	p2, err := d.PatchAlloc(10)
	if err != nil || p2 != testHeap+128 {
		t.Fatalf("PatchAlloc(10) = %#x, %v; want %#x", p2, err, uint64(testHeap+128))
	}
	if len(f.writes)+len(f.splices) != 0 {
		t.Fatalf("allocation reached the driver: %+v %+v", f.writes, f.splices)
	}

	code := []byte{0x90, 0xc3}
	if err := d.PatchWrite(p2, code); err != nil {
		t.Fatal(err)
	}
	if len(f.writes) != 1 || f.writes[0].addr != p2 || !bytes.Equal(f.writes[0].data, code) {
		t.Fatalf("PatchWrite: driver saw %+v", f.writes)
	}

	const at = 0xffffffff81000000
	tests := []struct {
		name  string
		patch uint64
		repl  []byte
		want  uint32
	}{
		{"direct", p1, []byte{0xe9, 0, 0, 0, 0}, 128},
		{"trap", p2, []byte{0xcc}, 64},
		{"jmp rel8 to a slot", at + 0x40, []byte{0xeb, 0x3e}, 0},
		{"not an allocation", p1 + 64, []byte{0xcc}, 0}, // the driver refuses it
	}
	for _, tc := range tests {
		f.splices = nil
		if _, err := d.Splice(at, tc.patch, make([]byte, len(tc.repl)), tc.repl); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(f.splices) != 1 || f.splices[0].PatchLen != tc.want || f.splices[0].Patch != tc.patch {
			t.Errorf("%s: driver saw %+v; want patch %#x, patch_len %d", tc.name, f.splices, tc.patch, tc.want)
		}
	}
	if err := d.Resplice(1, p2); err != nil || len(f.resplice) != 1 || f.resplice[0].PatchLen != 64 || f.resplice[0].Patch != p2 {
		t.Errorf("Resplice: %v; driver saw %+v, want patch_len 64", err, f.resplice)
	}

	// A refused free leaves the allocation allocated.
	f.writes, f.fail = nil, unix.EBUSY
	if err := d.PatchFree(p1); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("PatchFree refused by the driver: %v, want EBUSY", err)
	}
	f.fail = 0
	if p, err := d.PatchAlloc(64); err != nil || p == p1 {
		t.Fatalf("after a refused free, PatchAlloc(64) = %#x, %v; want not %#x", p, err, p1)
	}
	f.writes = nil
	if err := d.PatchFree(p1); err != nil {
		t.Fatal(err)
	}
	if len(f.writes) != 1 || f.writes[0].addr != p1 || !bytes.Equal(f.writes[0].data, bytes.Repeat([]byte{0xcc}, 128)) {
		t.Fatalf("PatchFree: driver saw %+v; want 128 int3 at %#x", f.writes, p1)
	}
	if p, err := d.PatchAlloc(128); err != nil || p != p1 {
		t.Fatalf("after the free, PatchAlloc(128) = %#x, %v; want %#x again", p, err, p1)
	}

	// Bad frees never reach the driver.
	f.writes = nil
	for _, a := range []uint64{p1 + 64, testHeap + testHeapSize, 0} {
		if err := d.PatchFree(a); !errors.Is(err, patchheap.ErrNotAllocated) || !errors.Is(err, unix.EINVAL) {
			t.Errorf("PatchFree(%#x) = %v; want ErrNotAllocated and EINVAL", a, err)
		}
	}
	if len(f.writes) != 0 {
		t.Errorf("bad frees reached the driver: %+v", f.writes)
	}

	if _, err := d.PatchAlloc(testHeapSize); !errors.Is(err, unix.ENOSPC) || !errors.Is(err, patchheap.ErrFull) {
		t.Errorf("PatchAlloc of more than is free: %v; want ENOSPC", err)
	}
}

func TestClosedDevice(t *testing.T) {
	d, _ := newTestDevice(t)
	d.fd = -1
	if _, err := d.PatchAlloc(64); !errors.Is(err, ErrClosed) {
		t.Errorf("PatchAlloc after Close: %v, want ErrClosed", err)
	}
}
