package cpuquirk

import (
	"errors"
	"testing"
)

// TestCheck runs the check on the CPU the tests run on. It fails on an
// affected CPU (QEMU TCG before 8.0 with cx16): that is the finding, and
// kerninstd refuses to splice there.
func TestCheck(t *testing.T) {
	if !hasCX16() {
		t.Skip("no cmpxchg16b on this CPU: nothing to check")
	}
	err := Check()
	if errors.Is(err, ErrStaleCmpxchg16bFlags) {
		t.Fatalf("affected CPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestSequenceSetsZF checks that the sequence ran as written: cmpxchg16b
// over zeros with zeros to compare succeeds and sets ZF, which the flags
// pushed after it show on any CPU.
func TestSequenceSetsZF(t *testing.T) {
	if !hasCX16() {
		t.Skip("no cmpxchg16b on this CPU")
	}
	var mem [4]uint64
	const zf = 1 << 6
	if f := cmpxchg16bFlags(&mem, probeBits); f&zf == 0 {
		t.Fatalf("flags after cmpxchg16b %#x: ZF clear", f)
	}
}
