package process

import (
	"fmt"
	"os"
)

// memFile is /proc/PID/mem: reads and writes of the process's memory,
// its read-only text included (the kernel writes through the page
// tables as ptrace's POKETEXT does).
type memFile struct {
	f *os.File
}

func openMem(pid int) (*memFile, error) {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return &memFile{f: f}, nil
}

func (m *memFile) read(addr uint64, b []byte) error {
	n, err := m.f.ReadAt(b, int64(addr))
	if err != nil && n < len(b) {
		return fmt.Errorf("read %d bytes at %#x: %w", len(b), addr, err)
	}
	return nil
}

func (m *memFile) write(addr uint64, b []byte) error {
	n, err := m.f.WriteAt(b, int64(addr))
	if err != nil && n < len(b) {
		return fmt.Errorf("write %d bytes at %#x: %w", len(b), addr, err)
	}
	return nil
}

func (m *memFile) close() error {
	if m == nil {
		return nil
	}
	return m.f.Close()
}
