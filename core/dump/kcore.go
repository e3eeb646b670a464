package dump

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// /proc/kcore: the running kernel's memory as an ELF core (fs/proc/kcore.c),
// what drgn and crash read on a live system. Its PT_LOADs map kernel
// virtual addresses: the direct map (KCORE_RAM, one per range of System
// RAM), the kernel image (KCORE_TEXT), vmalloc and module space
// (KCORE_VMALLOC) and the vmemmap (KCORE_VMEMMAP). Since Linux 4.11
// p_paddr holds the physical address of RAM and text segments and -1 for
// the others, and since 4.19 a VMCOREINFO note is among its notes (with
// a zeroed NT_PRSTATUS, NT_PRPSINFO and NT_TASKSTRUCT). So kcore is read
// as physical memory, through the RAM segments, and the kernel view
// translates virtual addresses through the kernel's page tables as it
// does for any dump. Reading needs root (CAP_SYS_RAWIO) and a kernel not
// in lockdown.
//
// The memory changes while it is read: the reader gives what each read
// returned at that moment, and the walks above it bound every list and
// count what does not add up.

const kcoreFormat = "kcore"

// KcorePath is where the running kernel's memory is.
const KcorePath = "/proc/kcore"

func init() { register(kcoreFormat, probeKcore, openKcore) }

// Live is implemented by dumps of a running system (/proc/kcore): their
// memory changes while it is read and they record no CPU registers.
type Live interface {
	Live() bool
}

// IsLive says whether d is a running system's memory.
func IsLive(d Dump) bool {
	l, ok := d.(Live)
	return ok && l.Live()
}

// noPaddr is kcore's p_paddr for segments that are not linearly mapped
// physical memory (vmalloc, modules, vmemmap).
const noPaddr = ^uint64(0)

// probeKcore recognises kcore's headers: an ELF64 x86-64 core with a
// PT_LOAD whose p_paddr is -1 (no vmcore has one).
func probeKcore(head []byte) bool {
	if !bytes.HasPrefix(head, elfMagic) || len(head) < ehdrSize || head[4] != 2 || head[5] != 1 {
		return false
	}
	le := binary.LittleEndian
	if le.Uint16(head[16:]) != 4 || le.Uint16(head[54:]) != phdrSize {
		return false
	}
	phoff, phnum := le.Uint64(head[32:]), uint64(le.Uint16(head[56:]))
	for i := uint64(0); i < phnum; i++ {
		o := phoff + i*phdrSize
		if o+phdrSize > uint64(len(head)) || o < phoff {
			break
		}
		p := head[o:]
		if le.Uint32(p) == ptLoad && le.Uint64(p[24:]) == noPaddr {
			return true
		}
	}
	return false
}

// kcoreSegment is a PT_LOAD as kcore describes it.
type kcoreSegment struct {
	vaddr, paddr, size, off uint64
}

// Kcore is an opened /proc/kcore. Reads are preads of the file; it is
// safe for concurrent use.
type Kcore struct {
	r     io.ReaderAt
	c     io.Closer
	segs  []elfSegment   // physical: the RAM and text segments, disjoint
	virt  []kcoreSegment // every PT_LOAD, by virtual address
	notes *Notes
	ncpu  int
}

func openKcore(f *os.File) (Dump, error) {
	return OpenKcore(f, f, possibleCPUs("/sys/devices/system/cpu/possible"))
}

// OpenKcore reads kcore's headers from r. ncpu is how many CPU ids the
// machine has (the running system's /sys/devices/system/cpu/possible):
// kcore records no CPU state, so CPUs returns that many entries without
// registers. On success the Kcore owns c.
func OpenKcore(r io.ReaderAt, c io.Closer, ncpu int) (*Kcore, error) {
	corrupt := func(off int64, format string, a ...any) error {
		return &CorruptError{kcoreFormat, off, fmt.Sprintf(format, a...)}
	}
	var eh [ehdrSize]byte
	if _, err := r.ReadAt(eh[:], 0); err != nil {
		return nil, kcoreErr(err)
	}
	le := binary.LittleEndian
	if !bytes.Equal(eh[:4], elfMagic) || eh[4] != 2 || eh[5] != 1 || le.Uint16(eh[16:]) != 4 || le.Uint16(eh[18:]) != 62 {
		return nil, corrupt(0, "not an x86-64 ELF64 core")
	}
	phoff, phentsize, phnum := le.Uint64(eh[32:]), le.Uint16(eh[54:]), uint64(le.Uint16(eh[56:]))
	if phentsize != phdrSize || phnum == 0 || phnum >= 0xffff || phoff > 1<<20 {
		return nil, corrupt(32, "%d program headers of %d bytes at %#x", phnum, phentsize, phoff)
	}
	ph := make([]byte, phnum*phdrSize)
	if _, err := r.ReadAt(ph, int64(phoff)); err != nil {
		return nil, corrupt(int64(phoff), "program headers: %v", kcoreErr(err))
	}
	k := &Kcore{r: r, c: c, ncpu: max(ncpu, 1), notes: &Notes{}}
	for i := uint64(0); i < phnum; i++ {
		p := ph[i*phdrSize:]
		at := int64(phoff + i*phdrSize)
		typ, off, vaddr, paddr, filesz, memsz := le.Uint32(p), le.Uint64(p[8:]), le.Uint64(p[16:]), le.Uint64(p[24:]), le.Uint64(p[32:]), le.Uint64(p[40:])
		switch typ {
		case ptNote:
			if filesz > maxNoteSize {
				return nil, corrupt(at, "note segment of %d bytes", filesz)
			}
			b := make([]byte, filesz)
			if _, err := r.ReadAt(b, int64(off)); err != nil {
				return nil, corrupt(int64(off), "notes: %v", kcoreErr(err))
			}
			n, err := ParseNotes(b, kcoreFormat, int64(off))
			if err != nil {
				return nil, err
			}
			if n.VMCoreInfo != "" {
				k.notes.VMCoreInfo = n.VMCoreInfo
			}
		case ptLoad:
			if memsz == 0 || off > 1<<63-memsz {
				continue
			}
			k.virt = append(k.virt, kcoreSegment{vaddr: vaddr, paddr: paddr, size: memsz, off: off})
			if paddr != noPaddr && paddr+memsz > paddr {
				k.segs = append(k.segs, elfSegment{start: paddr, memsz: memsz, filesz: memsz, off: off})
			}
		}
	}
	if len(k.segs) == 0 {
		return nil, corrupt(int64(phoff), "no PT_LOAD with a physical address: kcore of a kernel before 4.11, which the reader does not know")
	}
	// The kernel image's segment lies inside a RAM one, with the same
	// bytes: keep each physical page once.
	k.segs = disjoint(k.segs)
	sort.Slice(k.virt, func(i, j int) bool { return k.virt[i].vaddr < k.virt[j].vaddr })
	return k, nil
}

// kcoreErr explains the errors reading kcore gives.
func kcoreErr(err error) error {
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("%w (reading %s needs root, CAP_SYS_RAWIO, and a kernel not in lockdown)", err, KcorePath)
	}
	return err
}

// possibleCPUs counts the CPU ids of a cpulist file ("0-3,8"); 1 when
// it cannot be read.
func possibleCPUs(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 1
	}
	n, ok := countCPUList(string(b))
	if !ok {
		return 1
	}
	return n
}

// countCPUList counts the ids of a kernel cpulist: the highest id plus
// one, since CPU ids index per-CPU data up to nr_cpu_ids.
func countCPUList(s string) (int, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	hi := -1
	for _, part := range strings.Split(s, ",") {
		a, b, isRange := strings.Cut(part, "-")
		lo, err := strconv.Atoi(a)
		if err != nil || lo < 0 {
			return 0, false
		}
		top := lo
		if isRange {
			if top, err = strconv.Atoi(b); err != nil || top < lo {
				return 0, false
			}
		}
		if top >= 1<<16 {
			return 0, false
		}
		hi = max(hi, top)
	}
	return hi + 1, true
}

func (k *Kcore) Format() string     { return kcoreFormat }
func (k *Kcore) VMCoreInfo() string { return k.notes.VMCoreInfo }
func (k *Kcore) Live() bool         { return true }

// CPUs lists the machine's CPU ids, without registers: a running
// system's registers are not in kcore.
func (k *Kcore) CPUs() []CPU {
	out := make([]CPU, k.ncpu)
	for i := range out {
		out[i].Index = i
	}
	return out
}

// PhysRanges lists the physical ranges of the RAM (and text) segments.
func (k *Kcore) PhysRanges() []Range { return physRanges(k.segs) }

// Segments lists kcore's PT_LOADs by virtual address: start, size, and
// the physical address (^0 for vmalloc, modules and the vmemmap).
func (k *Kcore) Segments() []struct{ Vaddr, Paddr, Size uint64 } {
	out := make([]struct{ Vaddr, Paddr, Size uint64 }, len(k.virt))
	for i, s := range k.virt {
		out[i].Vaddr, out[i].Paddr, out[i].Size = s.vaddr, s.paddr, s.size
	}
	return out
}

// ReadPhys reads physical memory through the RAM segments. An address
// in no segment is not present; a page the kernel refuses to copy
// (kcore gives EFAULT) is an error naming it.
func (k *Kcore) ReadPhys(p []byte, addr uint64) (int, error) {
	done := 0
	for done < len(p) {
		a := addr + uint64(done)
		s, ok := segmentAt(k.segs, a)
		if !ok {
			return done, &NotPresentError{Addr: a, Physical: true}
		}
		n := min(uint64(len(p)-done), s.start+s.memsz-a)
		m, err := k.r.ReadAt(p[done:done+int(n)], int64(s.off+(a-s.start)))
		done += m
		if err != nil && m < int(n) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return done, fmt.Errorf("kcore: physical address %#x: %w", addr+uint64(done), kcoreErr(err))
		}
	}
	return done, nil
}

func (k *Kcore) Close() error {
	if k.c == nil {
		return nil
	}
	return k.c.Close()
}

// isKcorePath says whether path names /proc/kcore (directly or by a
// link).
func isKcorePath(path string) bool {
	if filepath.Clean(path) == KcorePath {
		return true
	}
	r, err := filepath.EvalSymlinks(path)
	return err == nil && r == KcorePath
}

// ReadVirt reads kernel virtual memory through kcore's own segments (the
// kernel image, the direct map, vmalloc and modules), without the page
// tables: what a live reader needs before, or instead of, a kernel view.
// It reads all of p or fails naming the first address it could not read.
func (k *Kcore) ReadVirt(p []byte, addr uint64) error {
	done := 0
	for done < len(p) {
		a := addr + uint64(done)
		i := sort.Search(len(k.virt), func(i int) bool { return k.virt[i].vaddr+k.virt[i].size > a })
		if i == len(k.virt) || k.virt[i].vaddr > a {
			return &NotPresentError{Addr: a}
		}
		s := k.virt[i]
		n := min(uint64(len(p)-done), s.vaddr+s.size-a)
		m, err := k.r.ReadAt(p[done:done+int(n)], int64(s.off+(a-s.vaddr)))
		done += m
		if err != nil && m < int(n) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("kcore: address %#x: %w", addr+uint64(done), kcoreErr(err))
		}
	}
	return nil
}
