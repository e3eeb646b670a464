package engine

import "github.com/kinst/kinst/driver"

// Device is what the engine needs of the driver (driver.Device implements
// it); unit tests substitute an in-memory kernel (enginetest.Kernel).
type Device interface {
	Read(addr uint64, b []byte) error
	PatchAlloc(size int) (uint64, error)
	PatchWrite(addr uint64, code []byte) error
	// PatchWriteMany writes several patches with as few system calls as
	// it can (adjacent allocations in one).
	PatchWriteMany(ps []driver.PatchCode) error
	PatchFree(addr uint64) error
	Splice(addr, patch uint64, orig, new []byte) (uint32, error)
	SpliceSlot(addr, patch uint64, orig, new []byte) (uint32, error)
	SpliceCovering(addr, patch uint64, orig, new []byte) (uint32, error)
	FinishCovering() (int, error)
	Resplice(id uint32, patch uint64) error
	Unsplice(id uint32) error
	// SpliceBatch and UnspliceBatch do up to BatchMax splices or
	// unsplices in one round of CPU synchronisations, all or none; a
	// refused op fails the batch with a *driver.BatchError naming it.
	SpliceBatch(ops []driver.SpliceOp) ([]uint32, error)
	UnspliceBatch(ids []uint32) error
	BatchMax() int
	Counter(slot int) uint64
	CounterAddr(slot int) uint64
	NumCounters() int
	ClearCounters(first, count int) error
}
