package enginetest

import (
	"bytes"
	"sort"
)

// memory is the in-memory kernel's address space: the text it was made
// with in flat spans (a whole vmlinux is tens of megabytes: a byte map
// would take gigabytes), everything written elsewhere (the patch heap)
// byte by byte.
type memory struct {
	spans []span // sorted by addr, disjoint
	bytes map[uint64]byte
}

// span is a run of text at addr.
type span struct {
	addr uint64
	b    []byte
}

func newMemory() memory { return memory{bytes: map[uint64]byte{}} }

// addSpan maps b at addr; it must not overlap a span already there.
func (m *memory) addSpan(addr uint64, b []byte) {
	i := sort.Search(len(m.spans), func(i int) bool { return m.spans[i].addr > addr })
	m.spans = append(m.spans, span{})
	copy(m.spans[i+1:], m.spans[i:])
	m.spans[i] = span{addr: addr, b: b}
}

// find returns the span holding addr.
func (m *memory) find(addr uint64) (*span, bool) {
	i := sort.Search(len(m.spans), func(i int) bool { return m.spans[i].addr > addr }) - 1
	if i < 0 || addr-m.spans[i].addr >= uint64(len(m.spans[i].b)) {
		return nil, false
	}
	return &m.spans[i], true
}

func (m *memory) get(addr uint64) (byte, bool) {
	if s, ok := m.find(addr); ok {
		return s.b[addr-s.addr], true
	}
	v, ok := m.bytes[addr]
	return v, ok
}

func (m *memory) set(addr uint64, v byte) {
	if s, ok := m.find(addr); ok {
		s.b[addr-s.addr] = v
		return
	}
	m.bytes[addr] = v
}

// read copies len(b) bytes at addr into b; false if any is unmapped.
func (m *memory) read(addr uint64, b []byte) bool {
	if s, ok := m.find(addr); ok && addr+uint64(len(b)) <= s.addr+uint64(len(s.b)) {
		copy(b, s.b[addr-s.addr:])
		return true
	}
	for i := range b {
		v, ok := m.get(addr + uint64(i))
		if !ok {
			return false
		}
		b[i] = v
	}
	return true
}

// extend maps n more bytes of fill at the end of the span at addr,
// making it if there is none (the patch heap, which only grows).
func (m *memory) extend(addr uint64, n int, fill byte) {
	i := sort.Search(len(m.spans), func(i int) bool { return m.spans[i].addr >= addr })
	if i == len(m.spans) || m.spans[i].addr != addr {
		m.addSpan(addr, nil)
	}
	m.spans[i].b = append(m.spans[i].b, bytes.Repeat([]byte{fill}, n)...)
}
