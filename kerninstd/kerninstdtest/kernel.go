package kerninstdtest

import "github.com/kinst/kinst/engine/enginetest"

// Kernel is the in-memory kernel of package enginetest behind kerninstd's
// device: a flat text, a patch heap and a counter heap, with the driver's
// argument checks. It never executes anything: Count and Time stand in
// for the kernel running instrumented code, by adding to the counters an
// installed patch updates. It serves tests of what is built on the daemon
// (reports, the API); it must not stand in for the driver in a test that
// proves a capability, which runs against the real driver in the live
// tests.
type Kernel = enginetest.Kernel

// NewKernel returns a kernel whose text is text at textAddr, with a
// patch heap 1 GiB above it and 256 counter slots just below the heap.
func NewKernel(textAddr uint64, text []byte) *Kernel {
	k := enginetest.New(textAddr, text)
	k.Counters = make([]uint64, 256)
	return k
}
