package driver

import "unsafe"

// Mirrors of the structs and ioctl numbers in driver/linux/kerninst_uapi.h.
// Every field has its C type's size and every struct its C layout (no
// implicit padding on amd64); TestABILayout checks this against a C
// compiler and against sizes worked out by hand.

// abiVersion is KI_ABI_VERSION: the driver must report the same.
const abiVersion = 5

// maxInsn is KI_MAX_INSN: the longest x86 instruction.
const maxInsn = 15

// Info is struct ki_info, the layout of the driver's heaps, filled by the
// INFO ioctl.
type Info struct {
	ABIVersion      uint32
	ChunkSize       uint32 // patch heap granule, bytes: patches start on one
	PatchHeap       uint64 // kernel address of the executable patch heap
	PatchHeapSize   uint64 // bytes
	CounterHeap     uint64 // kernel address of counter slot 0
	CounterHeapSize uint64 // bytes; mapped read-only by Open
	ModuleText      uint64 // kerninst.ko's own text, never spliced
	ModuleTextSize  uint64
	Splices         uint32 // splices installed right now
	Int3Hits        uint32 // CPUs the int3 notifier sent to a patch (wraps)
	Syncs           uint64 // rounds of "every CPU runs a serialising instruction" so far
	MaxSplices      uint32 // most splices installed at once
	BatchMax        uint32 // most splices in one SpliceBatch or UnspliceBatch
}

// kiRead is struct ki_read.
type kiRead struct {
	Addr, Buf, Len uint64
}

// kiPatchWrite is struct ki_patch_write.
type kiPatchWrite struct {
	Addr, Buf, Len uint64
}

// kiSplice is struct ki_splice.
type kiSplice struct {
	Addr     uint64
	Patch    uint64
	Len      uint32
	ID       uint32 // out
	Orig     [16]byte
	New      [16]byte
	Flags    uint32 // spliceSlot, spliceCover
	PatchLen uint32 // bytes of patch the splice sends CPUs into; 0 for a jmp rel8
}

// spliceSlot is KI_SPLICE_SLOT: the splice is a springboard slot written
// into padding.
const spliceSlot = 1

// spliceCover is KI_SPLICE_COVER: a direct splice whose jmp spans several
// whole instructions; only its int3 is written until COVER_FINISH.
const spliceCover = 2

// kiCoverFinish is struct ki_cover_finish.
type kiCoverFinish struct {
	Done, Pad uint32
}

// kiResplice is struct ki_resplice.
type kiResplice struct {
	ID, PatchLen uint32
	Patch        uint64
}

// kiUnsplice is struct ki_unsplice.
type kiUnsplice struct {
	ID, Pad uint32
}

// kiBatch is struct ki_batch.
type kiBatch struct {
	Ops    uint64 // user address of []kiSplice or []uint32 ids
	N      uint32
	Failed uint32 // out, also on error: the op refused (N: none)
}

// kiCountersClear is struct ki_counters_clear.
type kiCountersClear struct {
	First, Count uint32
}

// ioctl numbers: the kernel's _IOC(dir, type, nr, size) on x86.
const (
	iocWrite = 1 // _IOC_WRITE: user space writes the argument
	iocRead  = 2 // _IOC_READ: user space reads it back
	iocMagic = 0xB7
)

func ioc(dir, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | iocMagic<<8 | nr
}

var (
	iocInfo          = ioc(iocRead, 0, unsafe.Sizeof(Info{}))
	iocReadMem       = ioc(iocWrite, 1, unsafe.Sizeof(kiRead{}))
	iocPatchWrite    = ioc(iocWrite, 3, unsafe.Sizeof(kiPatchWrite{}))
	iocSplice        = ioc(iocRead|iocWrite, 5, unsafe.Sizeof(kiSplice{}))
	iocUnsplice      = ioc(iocWrite, 6, unsafe.Sizeof(kiUnsplice{}))
	iocCountersClear = ioc(iocWrite, 7, unsafe.Sizeof(kiCountersClear{}))
	iocResplice      = ioc(iocWrite, 8, unsafe.Sizeof(kiResplice{}))
	iocCoverFinish   = ioc(iocRead, 9, unsafe.Sizeof(kiCoverFinish{}))
	iocSpliceBatch   = ioc(iocRead|iocWrite, 10, unsafe.Sizeof(kiBatch{}))
	iocUnspliceBatch = ioc(iocRead|iocWrite, 11, unsafe.Sizeof(kiBatch{}))
)
