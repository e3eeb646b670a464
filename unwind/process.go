package unwind

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/internal/elfsym"
)

// ProcessMemory reads another process's memory with process_vm_readv,
// which needs ptrace access to it (same user, or CAP_SYS_PTRACE) but does
// not stop it. Whole pages are read and kept until Reset, so an unwind
// costs about one system call per stack page. Not safe for concurrent use.
type ProcessMemory struct {
	pid   int
	pages map[uint64][]byte
}

// NewProcessMemory reads the memory of process pid.
func NewProcessMemory(pid int) *ProcessMemory {
	return &ProcessMemory{pid: pid, pages: map[uint64][]byte{}}
}

// Reset forgets the cached pages: call it before each new sample, since
// the stack changes while the thread runs.
func (m *ProcessMemory) Reset() { clear(m.pages) }

const pageSize = 4096

// ReadMemory implements MemReader.
func (m *ProcessMemory) ReadMemory(addr uint64, p []byte) error {
	for len(p) > 0 {
		base := addr &^ (pageSize - 1)
		page, ok := m.pages[base]
		if !ok {
			page = make([]byte, pageSize)
			if err := m.readv(base, page); err != nil {
				// A page that cannot be read whole: read just what is asked.
				return m.readv(addr, p)
			}
			m.pages[base] = page
		}
		n := copy(p, page[addr-base:])
		p, addr = p[n:], addr+uint64(n)
	}
	return nil
}

func (m *ProcessMemory) readv(addr uint64, p []byte) error {
	local := []unix.Iovec{{Base: &p[0]}}
	local[0].SetLen(len(p))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(p)}}
	n, err := unix.ProcessVMReadv(m.pid, local, remote, 0)
	if err != nil {
		return fmt.Errorf("process_vm_readv pid %d at %#x: %w", m.pid, addr, err)
	}
	if n != len(p) {
		return fmt.Errorf("process_vm_readv pid %d at %#x: short read (%d of %d bytes)", m.pid, addr, n, len(p))
	}
	return nil
}

// ErrNotBlocked is returned by SyscallRegs for a thread that is running
// (its registers cannot be had without stopping it).
var ErrNotBlocked = errors.New("thread is running")

// SyscallRegs reads the user registers of a thread that is blocked from
// /proc/PID/task/TID/syscall ("NR ARGS… SP PC"): nr is the system call
// number, or -1 when the thread is blocked outside a system call (a page
// fault, for instance). BP is not available there and is 0.
func SyscallRegs(pid, tid int) (regs Regs, nr int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/syscall", pid, tid))
	if err != nil {
		return Regs{}, 0, err
	}
	return parseSyscall(strings.TrimSpace(string(b)))
}

func parseSyscall(s string) (Regs, int, error) {
	f := strings.Fields(s)
	if len(f) == 1 && f[0] == "running" {
		return Regs{}, 0, ErrNotBlocked
	}
	if len(f) != 3 && len(f) != 9 {
		return Regs{}, 0, fmt.Errorf("unexpected syscall file %q", s)
	}
	nr, err := strconv.Atoi(f[0])
	if err != nil {
		return Regs{}, 0, fmt.Errorf("unexpected syscall file %q: %w", s, err)
	}
	sp, err1 := strconv.ParseUint(strings.TrimPrefix(f[len(f)-2], "0x"), 16, 64)
	pc, err2 := strconv.ParseUint(strings.TrimPrefix(f[len(f)-1], "0x"), 16, 64)
	if err1 != nil || err2 != nil {
		return Regs{}, 0, fmt.Errorf("unexpected syscall file %q", s)
	}
	return Regs{PC: pc, SP: sp}, nr, nil
}

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End, Offset uint64
	Perms              string // "r-xp"
	Inode              uint64
	Path               string // "" for anonymous memory, "[stack]", …
}

// ReadMaps reads /proc/PID/maps.
func ReadMaps(pid int) ([]Mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseMaps(f)
}

// ParseMaps parses the lines of a /proc/PID/maps file.
func ParseMaps(r io.Reader) ([]Mapping, error) {
	var maps []Mapping
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		// START-END PERMS OFFSET DEV INODE [PATH]; the path may hold spaces.
		f := strings.SplitN(line, " ", 6)
		if len(f) < 5 {
			return nil, fmt.Errorf("maps line %d: malformed %q", n, line)
		}
		start, end, ok := strings.Cut(f[0], "-")
		var m Mapping
		var errs [4]error
		m.Start, errs[0] = strconv.ParseUint(start, 16, 64)
		m.End, errs[1] = strconv.ParseUint(end, 16, 64)
		m.Offset, errs[2] = strconv.ParseUint(f[2], 16, 64)
		m.Inode, errs[3] = strconv.ParseUint(f[4], 10, 64)
		if !ok || errors.Join(errs[:]...) != nil {
			return nil, fmt.Errorf("maps line %d: malformed %q", n, line)
		}
		m.Perms = f[1]
		if len(f) == 6 {
			m.Path = strings.TrimLeft(f[5], " ")
		}
		maps = append(maps, m)
	}
	return maps, sc.Err()
}

// File is what unwinding and symbolisation need of one ELF file.
type File struct {
	Path    string
	BuildID string        // "" when the file has none
	Table   *Table        // nil when the file has no CFI
	Symbols *elfsym.Table // nil when the file has no symbols
	// Segments map the file's offsets to link-time addresses.
	Segments elfsym.Segments
}

// Cache holds Files by GNU build id (by device and inode for files
// without one), so a library mapped by many processes is compiled once.
// Safe for concurrent use; mu protects both maps.
type Cache struct {
	mu      sync.Mutex
	byID    map[string]*File
	byInode map[fileKey]*File
}

type fileKey struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{byID: map[string]*File{}, byInode: map[fileKey]*File{}}
}

// Len is the number of distinct files cached.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byInode)
}

// Open returns the File at path, reading and compiling it on first use.
// A file without CFI or symbols is not an error: its Table or Symbols
// is nil.
func (c *Cache) Open(path string) (*File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	key := fileKey{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		key.dev, key.ino = st.Dev, st.Ino
	}
	c.mu.Lock()
	f, ok := c.byInode[key]
	c.mu.Unlock()
	if ok {
		return f, nil
	}
	ef, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer ef.Close()
	id, _ := elfsym.BuildID(ef)
	c.mu.Lock()
	if f, ok := c.byID[id]; ok && id != "" {
		c.byInode[key] = f
		c.mu.Unlock()
		return f, nil
	}
	c.mu.Unlock()
	f = &File{Path: path, BuildID: id}
	f.Segments = elfsym.LoadSegments(ef)
	if f.Table, err = Compile(ef); err != nil && !errors.Is(err, ErrNoCFI) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.Symbols, err = elfsym.Read(ef); err != nil && !errors.Is(err, elfsym.ErrNoSymbols) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if id != "" {
		if old, ok := c.byID[id]; ok { // compiled concurrently
			f = old
		}
		c.byID[id] = f
	}
	c.byInode[key] = f
	return f, nil
}

// procMapping is an executable file mapping with its file.
type procMapping struct {
	Mapping
	file *File
	bias uint64
}

// Process is the unwinding view of one process: its executable file
// mappings with their Files, and its memory. Build it again after the
// process maps new code (dlopen).
type Process struct {
	Pid  int
	Mem  *ProcessMemory
	maps []procMapping // by Start
	// Missing are executable mappings whose file could not be read,
	// with the reason.
	Missing map[string]error
}

// Process reads pid's mappings and opens their files through the cache.
// Files are opened through /proc/PID/map_files (exact, even when deleted
// or in another mount namespace), else /proc/PID/root.
func (c *Cache) Process(pid int) (*Process, error) {
	maps, err := ReadMaps(pid)
	if err != nil {
		return nil, err
	}
	p := &Process{Pid: pid, Mem: NewProcessMemory(pid), Missing: map[string]error{}}
	for _, m := range maps {
		if len(m.Perms) < 3 || m.Perms[2] != 'x' || m.Inode == 0 || !strings.HasPrefix(m.Path, "/") {
			continue
		}
		f, err := c.Open(fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, m.Start, m.End))
		if err != nil {
			f, err = c.Open(fmt.Sprintf("/proc/%d/root%s", pid, strings.TrimSuffix(m.Path, " (deleted)")))
		}
		if err != nil {
			p.Missing[m.Path] = err
			continue
		}
		bias, err := f.Segments.LoadBias(m.Start, m.Offset)
		if err != nil {
			p.Missing[m.Path] = err
			continue
		}
		p.maps = append(p.maps, procMapping{Mapping: m, file: f, bias: bias})
	}
	sort.Slice(p.maps, func(i, j int) bool { return p.maps[i].Start < p.maps[j].Start })
	return p, nil
}

func (p *Process) mapping(pc uint64) *procMapping {
	i := sort.Search(len(p.maps), func(i int) bool { return p.maps[i].End > pc })
	if i < len(p.maps) && p.maps[i].Start <= pc {
		return &p.maps[i]
	}
	return nil
}

// FindRow implements Finder over the process's mappings.
func (p *Process) FindRow(pc uint64) (Row, error) {
	m := p.mapping(pc)
	if m == nil || m.file.Table == nil {
		return Row{}, &NoFDEError{PC: pc}
	}
	return TableFinder{Table: m.file.Table, Bias: m.bias}.FindRow(pc)
}

// Unwind unwinds a thread of the process from regs (see Stack).
func (p *Process) Unwind(regs Regs, max int) []uint64 {
	p.Mem.Reset()
	return Stack(regs, p.Mem, p, max)
}

// Symbol names a pc of the process.
type Symbol struct {
	File   string // the mapping's path
	Name   string // "" when no symbol covers the pc
	Offset uint64 // from Name, or from the file's load address without one
}

// Symbolize names pc: the function containing it and the offset in it.
func (p *Process) Symbolize(pc uint64) (Symbol, bool) {
	m := p.mapping(pc)
	if m == nil {
		return Symbol{}, false
	}
	s := Symbol{File: m.Path, Offset: pc - m.bias}
	if m.file.Symbols != nil {
		if sym, off, ok := m.file.Symbols.Lookup(pc - m.bias); ok {
			s.Name, s.Offset = sym.Name, off
		}
	}
	return s, true
}
