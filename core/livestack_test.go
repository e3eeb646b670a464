package core

import "testing"

// The live part of a switched-out task's stack starts at its saved
// stack pointer; where the pointer is unknown or off the stack, the
// whole stack is read; a task without a stack has none.
func TestLiveStack(t *testing.T) {
	const base, size = 0xffffc90000010000, 16 << 10
	var k Kernel
	for _, tc := range []struct {
		name   string
		task   Task
		lo, hi uint64
		ok     bool
	}{
		{"switched out", Task{stack: base, hasStack: true, threadSP: base + 0x3e48}, base + 0x3e48, base + size, true},
		{"unaligned pointer", Task{stack: base, hasStack: true, threadSP: base + 0x3e4c}, base + 0x3e48, base + size, true},
		{"no saved pointer", Task{stack: base, hasStack: true}, base, base + size, true},
		{"pointer off the stack", Task{stack: base, hasStack: true, threadSP: base + size + 8}, base, base + size, true},
		{"exited", Task{hasStack: true}, 0, 0, false},
	} {
		lo, hi, ok := k.LiveStack(tc.task, size)
		if lo != tc.lo || hi != tc.hi || ok != tc.ok {
			t.Errorf("%s: [%#x, %#x) %v; want [%#x, %#x) %v", tc.name, lo, hi, ok, tc.lo, tc.hi, tc.ok)
		}
	}
}
