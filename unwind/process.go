package unwind

import (
	"bufio"
	"bytes"
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
// not stop it. A miss reads up to readAhead bytes from the page of the
// address (stacks are read upwards) and keeps the pages until Reset, so a
// user stack usually costs one system call. Not safe for concurrent use.
type ProcessMemory struct {
	pid   int
	pages map[uint64][]byte // page address → its bytes, until Reset
	free  [][]byte          // page buffers for reuse after Reset
}

// NewProcessMemory reads the memory of process pid.
func NewProcessMemory(pid int) *ProcessMemory {
	return &ProcessMemory{pid: pid, pages: map[uint64][]byte{}}
}

// Reset forgets the cached pages: call it before each new sample, since
// the stack changes while the thread runs.
func (m *ProcessMemory) Reset() {
	for _, p := range m.pages {
		m.free = append(m.free, p)
	}
	clear(m.pages)
}

const (
	pageSize  = 4096
	readAhead = 4 * pageSize
)

// ReadMemory implements MemReader.
func (m *ProcessMemory) ReadMemory(addr uint64, p []byte) error {
	for len(p) > 0 {
		base := addr &^ (pageSize - 1)
		page, ok := m.pages[base]
		if !ok {
			if !m.fill(base) {
				// Not even one whole page: read just what is asked.
				return m.readv(addr, p)
			}
			page = m.pages[base]
		}
		n := copy(p, page[addr-base:])
		p, addr = p[n:], addr+uint64(n)
	}
	return nil
}

// fill reads the pages from base on, as far as readAhead and the mapping
// go, and reports whether the page at base was read.
func (m *ProcessMemory) fill(base uint64) bool {
	var buf [readAhead]byte
	n, _ := m.readvPartial(base, buf[:])
	for off := 0; off+pageSize <= n; off += pageSize {
		a := base + uint64(off)
		if _, ok := m.pages[a]; ok {
			continue
		}
		var page []byte
		if k := len(m.free); k > 0 {
			page, m.free = m.free[k-1], m.free[:k-1]
		} else {
			page = make([]byte, pageSize)
		}
		copy(page, buf[off:])
		m.pages[a] = page
	}
	return n >= pageSize
}

// readvPartial reads as much of p as is mapped from addr on.
func (m *ProcessMemory) readvPartial(addr uint64, p []byte) (int, error) {
	local := []unix.Iovec{{Base: &p[0]}}
	local[0].SetLen(len(p))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(p)}}
	return unix.ProcessVMReadv(m.pid, local, remote, 0)
}

func (m *ProcessMemory) readv(addr uint64, p []byte) error {
	n, err := m.readvPartial(addr, p)
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
	// Plain system calls: an os.File costs more than the read here.
	path := "/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/syscall"
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Regs{}, 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var buf [256]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil {
		return Regs{}, 0, &os.PathError{Op: "read", Path: path, Err: err}
	}
	return ParseSyscall(buf[:n])
}

// ParseSyscall parses the text of /proc/PID/task/TID/syscall: "running"
// (ErrNotBlocked), or the system call number (-1 when the thread is
// blocked outside one, e.g. in a page fault), six arguments, then the user
// stack pointer and program counter. It does not allocate on success, so
// samplers can call it for every thread.
func ParseSyscall(b []byte) (regs Regs, nr int, err error) {
	b = bytes.TrimSpace(b)
	if string(b) == "running" {
		return Regs{}, 0, ErrNotBlocked
	}
	text := b
	var f [10][]byte
	n := 0
	for len(b) > 0 && n < len(f) {
		sp := bytes.IndexByte(b, ' ')
		if sp < 0 {
			f[n], b = b, nil
		} else {
			f[n], b = b[:sp], b[sp+1:]
		}
		n++
	}
	bad := func() (Regs, int, error) { return Regs{}, 0, fmt.Errorf("unexpected syscall file %q", text) }
	if n != 3 && n != 9 {
		return bad()
	}
	nr64, err := strconv.ParseInt(string(f[0]), 10, 64)
	sp, ok1 := parseHex(f[n-2])
	pc, ok2 := parseHex(f[n-1])
	if err != nil || !ok1 || !ok2 {
		return bad()
	}
	return Regs{PC: pc, SP: sp}, int(nr64), nil
}

// parseHex parses "0x…" (lower-case hex, as the kernel prints it).
func parseHex(b []byte) (uint64, bool) {
	b = bytes.TrimPrefix(b, []byte("0x"))
	if len(b) == 0 || len(b) > 16 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | uint64(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | uint64(c-'a'+10)
		default:
			return 0, false
		}
	}
	return v, true
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
	debug    *debugState // separate debug file, found on first use
}

// Cache holds Files by GNU build id (by device and inode for files
// without one), so a library mapped by many processes is compiled once.
// Safe for concurrent use; mu protects both maps.
type Cache struct {
	mu      sync.Mutex
	byID    map[string]*File
	byInode map[fileKey]*File
	// Debug says where separate debug files are looked for (set before
	// the first Open; NewCache reads the environment).
	Debug *DebugSearch
}

type fileKey struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{byID: map[string]*File{}, byInode: map[fileKey]*File{}, Debug: DebugSearchFromEnv()}
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
	ef, err := elfsym.OpenFile(path)
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
		return nil, elfsym.WithPath(path, err)
	}
	f.Table = WithGo(f.Table, ef) // Go code without CFI: .gopclntab
	if f.Symbols, err = elfsym.Read(ef); err != nil && !errors.Is(err, elfsym.ErrNoSymbols) {
		return nil, elfsym.WithPath(path, err)
	}
	f.debug = newDebugState(ef, c.Debug, f.stripped())
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
// process maps new code (dlopen). FindRow and Symbolize are safe for
// concurrent use; Unwind is not (Mem caches the pages it reads).
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
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no process %d", pid)
	}
	if err != nil {
		return nil, err
	}
	p := &Process{Pid: pid, Mem: NewProcessMemory(pid), Missing: map[string]error{}}
	// Each file's mappings, for the bias (see elfsym.Segments.MappingBias).
	type fileID struct {
		inode uint64
		path  string
	}
	byFile := map[fileID][]elfsym.Mapping{}
	for _, m := range maps {
		if m.Inode != 0 {
			id := fileID{m.Inode, m.Path}
			byFile[id] = append(byFile[id], elfsym.Mapping{Start: m.Start, End: m.End, Offset: m.Offset, Perms: m.Perms})
		}
	}
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
		bias, err := f.Segments.MappingBias(elfsym.Mapping{Start: m.Start, End: m.End, Offset: m.Offset, Perms: m.Perms},
			byFile[fileID{m.Inode, m.Path}])
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

// FuncStart implements FuncFinder over the process's mappings.
func (p *Process) FuncStart(pc uint64) (uint64, error) {
	m := p.mapping(pc)
	if m == nil || m.file.Table == nil {
		return 0, &NoFDEError{PC: pc}
	}
	return TableFinder{Table: m.file.Table, Bias: m.bias}.FuncStart(pc)
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
	if sym, off, ok := m.file.LookupSymbol(m.Path, pc-m.bias); ok {
		s.Name, s.Offset = sym.Name, off
	}
	return s, true
}
