package dump

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sort"

	"golang.org/x/sys/unix"
)

// ELF vmcores: QEMU's dump-guest-memory (without paging) and kdump's
// /proc/vmcore. Each PT_LOAD maps a physical range (p_paddr) to file
// bytes; PT_NOTE holds NT_PRSTATUS per CPU, VMCOREINFO and, from QEMU,
// a "QEMU" note per CPU with the control registers.

const elfFormat = "elf"

func init() { register(elfFormat, probeELF, openELF) }

var elfMagic = []byte{0x7f, 'E', 'L', 'F'}

// probeELF takes ELF cores but /proc/kcore's, which kcore.go reads.
func probeELF(head []byte) bool { return bytes.HasPrefix(head, elfMagic) && !probeKcore(head) }

// elfSegment is one PT_LOAD: physical [start, start+memsz) with the first
// filesz bytes at file offset off; the rest reads as zeros.
type elfSegment struct {
	start, memsz, filesz, off uint64
}

// segmentAt finds the segment of segs (sorted, disjoint) that holds
// physical address a.
func segmentAt(segs []elfSegment, a uint64) (elfSegment, bool) {
	i := sort.Search(len(segs), func(i int) bool { return segs[i].start+segs[i].memsz > a })
	if i == len(segs) || segs[i].start > a {
		return elfSegment{}, false
	}
	return segs[i], true
}

// physRanges lists the segments' physical ranges.
func physRanges(segs []elfSegment) []Range {
	r := make([]Range, len(segs))
	for i, s := range segs {
		r[i] = Range{s.start, s.start + s.memsz}
	}
	return r
}

// ELF is an opened ELF vmcore. It is immutable after OpenELF and safe for
// concurrent reads.
type ELF struct {
	f     *os.File
	data  []byte // the whole file, mmapped; nil when mmap failed
	size  int64
	segs  []elfSegment // sorted by start, disjoint
	notes *Notes
}

const (
	ehdrSize = 64
	phdrSize = 56
	ptLoad   = 1
	ptNote   = 4
	// maxPhnum and maxNoteSize bound what a header may ask us to read.
	maxPhnum    = 1 << 20
	maxNoteSize = 64 << 20
)

func openELF(f *os.File) (Dump, error) { return OpenELF(f) }

// OpenELF reads an ELF vmcore's headers and notes. On success the ELF
// owns f.
func OpenELF(f *os.File) (*ELF, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	e := &ELF{f: f, size: st.Size()}
	corrupt := func(off int64, format string, a ...any) error {
		return &CorruptError{elfFormat, off, fmt.Sprintf(format, a...)}
	}
	var eh [ehdrSize]byte
	if _, err := f.ReadAt(eh[:], 0); err != nil {
		return nil, corrupt(0, "ELF header: %v", err)
	}
	if !bytes.Equal(eh[:4], elfMagic) {
		return nil, corrupt(0, "no ELF magic")
	}
	if eh[4] != 2 || eh[5] != 1 {
		return nil, corrupt(4, "class %d, data %d: only little-endian ELF64 vmcores are supported", eh[4], eh[5])
	}
	le := binary.LittleEndian
	if t := le.Uint16(eh[16:]); t != 4 { // ET_CORE
		return nil, corrupt(16, "ELF type %d is not ET_CORE", t)
	}
	if m := le.Uint16(eh[18:]); m != 62 { // EM_X86_64
		return nil, corrupt(18, "machine %d is not x86-64", m)
	}
	phoff, phentsize, phnum := le.Uint64(eh[32:]), le.Uint16(eh[54:]), uint64(le.Uint16(eh[56:]))
	if phentsize != phdrSize {
		return nil, corrupt(54, "program header size %d, want %d", phentsize, phdrSize)
	}
	if phnum == 0xffff { // PN_XNUM: the real count is in section 0's sh_info
		shoff := le.Uint64(eh[40:])
		var sh [64]byte
		if _, err := f.ReadAt(sh[:], int64(shoff)); err != nil || shoff > uint64(e.size) {
			return nil, corrupt(40, "PN_XNUM section header at %#x unreadable", shoff)
		}
		phnum = uint64(le.Uint32(sh[44:]))
	}
	if phnum == 0 || phnum > maxPhnum || phoff > uint64(e.size) || phnum*phdrSize > uint64(e.size)-phoff {
		return nil, corrupt(32, "%d program headers at %#x do not fit in the %d-byte file", phnum, phoff, e.size)
	}
	ph := make([]byte, phnum*phdrSize)
	if _, err := f.ReadAt(ph, int64(phoff)); err != nil {
		return nil, corrupt(int64(phoff), "program headers: %v", err)
	}
	var noteBlobs [][]byte
	var noteOffs []int64
	for i := uint64(0); i < phnum; i++ {
		p := ph[i*phdrSize:]
		at := int64(phoff + i*phdrSize)
		typ, off, paddr, filesz, memsz := le.Uint32(p), le.Uint64(p[8:]), le.Uint64(p[24:]), le.Uint64(p[32:]), le.Uint64(p[40:])
		if typ != ptLoad && typ != ptNote {
			continue
		}
		if off > uint64(e.size) || filesz > uint64(e.size)-off {
			return nil, corrupt(at, "segment %d: %d bytes at file offset %#x run past the end of the %d-byte file (truncated dump?)", i, filesz, off, e.size)
		}
		switch typ {
		case ptNote:
			if filesz > maxNoteSize {
				return nil, corrupt(at, "note segment of %d bytes", filesz)
			}
			b := make([]byte, filesz)
			if _, err := f.ReadAt(b, int64(off)); err != nil {
				return nil, corrupt(int64(off), "notes: %v", err)
			}
			noteBlobs, noteOffs = append(noteBlobs, b), append(noteOffs, int64(off))
		case ptLoad:
			if memsz < filesz {
				return nil, corrupt(at, "segment %d: memsz %#x < filesz %#x", i, memsz, filesz)
			}
			if memsz == 0 {
				continue
			}
			if paddr+memsz < paddr {
				return nil, corrupt(at, "segment %d: physical range %#x+%#x wraps", i, paddr, memsz)
			}
			e.segs = append(e.segs, elfSegment{start: paddr, memsz: memsz, filesz: filesz, off: off})
		}
	}
	if len(e.segs) == 0 {
		return nil, corrupt(int64(phoff), "no PT_LOAD segment: no memory in this dump")
	}
	e.segs = disjoint(e.segs)
	e.notes = &Notes{}
	for i, b := range noteBlobs {
		n, err := ParseNotes(b, elfFormat, noteOffs[i])
		if err != nil {
			return nil, err
		}
		e.notes.CPUs = append(e.notes.CPUs, n.CPUs...)
		e.notes.QEMU = e.notes.QEMU || n.QEMU
		if n.VMCoreInfo != "" {
			e.notes.VMCoreInfo = n.VMCoreInfo
		}
		if n.Process != nil {
			e.notes.Process = n.Process
		}
	}
	for i := range e.notes.CPUs {
		e.notes.CPUs[i].Index = i
	}
	// Map the file so that reads are copies, not system calls; fall back
	// to pread where mapping fails.
	if e.size > 0 && int64(int(e.size)) == e.size {
		if m, err := unix.Mmap(int(f.Fd()), 0, int(e.size), unix.PROT_READ, unix.MAP_SHARED); err == nil {
			e.data = m
		}
	}
	return e, nil
}

// disjoint sorts segments by physical address and removes overlaps:
// kdump's /proc/vmcore describes the kernel image twice, once in its own
// PT_LOAD (at its text mapping) and once inside the RAM that holds it,
// with the same physical bytes. A segment that another already covers is
// dropped; one that overlaps partly keeps only its new part.
func disjoint(segs []elfSegment) []elfSegment {
	sort.Slice(segs, func(i, j int) bool {
		if segs[i].start != segs[j].start {
			return segs[i].start < segs[j].start
		}
		return segs[i].memsz > segs[j].memsz
	})
	out := segs[:0]
	for _, s := range segs {
		if n := len(out); n > 0 {
			end := out[n-1].start + out[n-1].memsz
			if s.start+s.memsz <= end {
				continue
			}
			if s.start < end {
				cut := end - s.start
				s.start, s.memsz, s.off = end, s.memsz-cut, s.off+cut
				s.filesz -= min(cut, s.filesz)
			}
		}
		out = append(out, s)
	}
	return out
}

func (e *ELF) Format() string     { return elfFormat }
func (e *ELF) VMCoreInfo() string { return e.notes.VMCoreInfo }

// Process is the command whose core this is, when it is a user
// process's (NT_PRPSINFO), not a kernel's; nil otherwise.
func (e *ELF) Process() *ProcessInfo { return e.notes.Process }
func (e *ELF) CPUs() []CPU           { return e.notes.CPUs }

// PhysRanges lists each PT_LOAD's physical range.
func (e *ELF) PhysRanges() []Range { return physRanges(e.segs) }

// ReadPhys copies physical memory at addr into p, across segments. Bytes
// past a segment's filesz (within memsz) read as zeros; an address no
// segment covers is not present.
func (e *ELF) ReadPhys(p []byte, addr uint64) (int, error) {
	done := 0
	for done < len(p) {
		a := addr + uint64(done)
		s, ok := segmentAt(e.segs, a)
		if !ok {
			return done, &NotPresentError{Addr: a, Physical: true}
		}
		rel := a - s.start
		n := min(uint64(len(p)-done), s.memsz-rel)
		dst := p[done : done+int(n)]
		if rel < s.filesz {
			m := min(n, s.filesz-rel)
			if err := e.readFile(dst[:m], int64(s.off+rel)); err != nil {
				return done, err
			}
			clear(dst[m:])
		} else {
			clear(dst)
		}
		done += int(n)
	}
	return done, nil
}

// largeRead is where pread beats copying from the mapping: one copy from
// the page cache instead of a page fault per 4 KiB of a fresh mapping.
const largeRead = 64 << 10

func (e *ELF) readFile(p []byte, off int64) error {
	if e.data != nil && len(p) < largeRead {
		copy(p, e.data[off:])
		return nil
	}
	_, err := e.f.ReadAt(p, off)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

func (e *ELF) Close() error {
	if e.data != nil {
		unix.Munmap(e.data)
		e.data = nil
	}
	return e.f.Close()
}
