// Package dumptest is a dump.Dump over sparse physical pages held in
// memory, for unit tests of address translation and of what is decoded
// from a dump's memory (the live tests read real dumps).
package dumptest

import (
	"encoding/binary"

	"github.com/kinst/kinst/core/dump"
)

const (
	pageSize = 4096
	pageMask = pageSize - 1
)

// Mem is a dump with only the pages written to it; reads elsewhere are
// not present. Info is its VMCOREINFO text.
type Mem struct {
	pages map[uint64][]byte
	Info  string
}

// New returns an empty dump.
func New() *Mem { return &Mem{pages: map[uint64][]byte{}} }

// Write puts b at physical address pa.
func (m *Mem) Write(pa uint64, b []byte) {
	for len(b) > 0 {
		p := m.pages[pa&^pageMask]
		if p == nil {
			p = make([]byte, pageSize)
			m.pages[pa&^pageMask] = p
		}
		n := copy(p[pa&pageMask:], b)
		b, pa = b[n:], pa+uint64(n)
	}
}

// Put64 writes v little-endian at pa.
func (m *Mem) Put64(pa, v uint64) { m.Write(pa, binary.LittleEndian.AppendUint64(nil, v)) }

func (m *Mem) Format() string { return "test" }

func (m *Mem) ReadPhys(p []byte, pa uint64) (int, error) {
	for done := 0; done < len(p); {
		a := pa + uint64(done)
		pg := m.pages[a&^pageMask]
		if pg == nil {
			return done, &dump.NotPresentError{Addr: a, Physical: true}
		}
		done += copy(p[done:], pg[a&pageMask:])
	}
	return len(p), nil
}

func (m *Mem) VMCoreInfo() string       { return m.Info }
func (m *Mem) CPUs() []dump.CPU         { return nil }
func (m *Mem) PhysRanges() []dump.Range { return nil }
func (m *Mem) Close() error             { return nil }
