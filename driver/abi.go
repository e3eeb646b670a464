package driver

// Mirrors of the structs in driver/linux/kerninst_uapi.h (ABI version 1).
// TestABILayout checks sizes and ioctl numbers against a C compiler.

const abiVersion = 1

// struct ki_info is Info (device.go), which the ioctl fills directly.

type kiRead struct {
	Addr, Buf, Len uint64
}

type kiPatchAlloc struct {
	Size, Addr uint64
}

type kiPatchWrite struct {
	Addr, Buf, Len uint64
}

type kiPatchFree struct {
	Addr uint64
}

type kiSplice struct {
	Addr  uint64
	Patch uint64
	Len   uint32
	ID    uint32
	Orig  [16]byte
	New   [16]byte
}

type kiUnsplice struct {
	ID, Pad uint32
}

type kiCountersClear struct {
	First, Count uint32
}

// ioctl numbers: _IOC(dir, 0xB7, nr, size).
const (
	iocWrite = 1
	iocRead  = 2
	iocMagic = 0xB7
)

func ioc(dir, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | iocMagic<<8 | nr
}

var (
	iocInfo          = ioc(iocRead, 0, 64)
	iocRead_         = ioc(iocWrite, 1, 24)
	iocPatchAlloc    = ioc(iocRead|iocWrite, 2, 16)
	iocPatchWrite    = ioc(iocWrite, 3, 24)
	iocPatchFree     = ioc(iocWrite, 4, 8)
	iocSplice        = ioc(iocRead|iocWrite, 5, 56)
	iocUnsplice      = ioc(iocWrite, 6, 8)
	iocCountersClear = ioc(iocWrite, 7, 8)
)
