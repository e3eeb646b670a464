package offcpu

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// stackMemory reads a blocked thread's stack with process_vm_readv into a
// few fixed chunk slots, reused from sample to sample, so that unwinding
// allocates nothing. An unwind touches a few hundred bytes above sp, so
// small chunks copy less than whole pages would.
type stackMemory struct {
	pid    int
	tags   [stackSlots]uint64 // chunk address + 1; 0 is empty
	next   int                // slot to evict next
	slots  [stackSlots][stackChunk]byte
	local  [1]unix.Iovec
	remote [1]unix.RemoteIovec
}

const (
	stackChunk = 1024
	stackSlots = 16
)

// reset forgets the cached chunks and points the reader at pid.
func (m *stackMemory) reset(pid int) {
	m.pid = pid
	m.tags = [stackSlots]uint64{}
	m.next = 0
}

// ReadMemory implements unwind.MemReader.
func (m *stackMemory) ReadMemory(addr uint64, p []byte) error {
	for len(p) > 0 {
		base := addr &^ (stackChunk - 1)
		chunk, err := m.chunk(base)
		if err != nil {
			return err
		}
		n := copy(p, chunk[addr-base:])
		p, addr = p[n:], addr+uint64(n)
	}
	return nil
}

func (m *stackMemory) chunk(base uint64) (*[stackChunk]byte, error) {
	for i := range m.tags {
		if m.tags[i] == base+1 {
			return &m.slots[i], nil
		}
	}
	i := m.next
	m.next = (m.next + 1) % stackSlots
	m.tags[i] = 0
	m.local[0] = unix.Iovec{Base: &m.slots[i][0]}
	m.local[0].SetLen(stackChunk)
	m.remote[0] = unix.RemoteIovec{Base: uintptr(base), Len: stackChunk}
	n, err := unix.ProcessVMReadv(m.pid, m.local[:], m.remote[:], 0)
	if err != nil {
		return nil, fmt.Errorf("reading the stack of pid %d at %#x: %w", m.pid, base, err)
	}
	if n != stackChunk {
		return nil, fmt.Errorf("reading the stack of pid %d at %#x: short read", m.pid, base)
	}
	m.tags[i] = base + 1
	return &m.slots[i], nil
}
