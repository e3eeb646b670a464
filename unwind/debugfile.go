package unwind

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/internal/elfsym"
)

// DebugSearch says where the separate debug file of a stripped ELF file
// is looked for, in gdb's order: the build-id path
// /usr/lib/debug/.build-id/xx/rest.debug, then the .gnu_debuglink name
// (with its CRC checked) in the file's directory, its .debug
// subdirectory and under /usr/lib/debug, then debuginfod servers.
type DebugSearch struct {
	// Root is prepended to every local path looked at ("" for /).
	Root string
	// Debuginfod are the servers asked for a build id's debug file
	// (GET URL/buildid/ID/debuginfo); none when empty.
	Debuginfod []string
	// CacheDir keeps what debuginfod served, as CacheDir/ID/debuginfo;
	// "" keeps nothing (every run asks again).
	CacheDir string
	// Timeout bounds one debuginfod request; Budget all of them for one
	// Cache, so a slow or dead server holds a profile up for at most that
	// long (defaults 5 s and 15 s).
	Timeout, Budget time.Duration
	// Client does the requests (nil: http.DefaultClient).
	Client *http.Client

	mu    sync.Mutex
	spent time.Duration
}

// DebugSearchFromEnv is the search of the environment: servers from
// DEBUGINFOD_URLS (space-separated, as elfutils reads it), their request
// timeout from DEBUGINFOD_TIMEOUT (seconds), and the cache in
// $KINST_CACHE/debuginfod, else the user cache directory
// ($XDG_CACHE_HOME or ~/.cache)/kinst/debuginfod.
func DebugSearchFromEnv() *DebugSearch {
	s := &DebugSearch{Debuginfod: strings.Fields(os.Getenv("DEBUGINFOD_URLS"))}
	if v, err := strconv.ParseFloat(os.Getenv("DEBUGINFOD_TIMEOUT"), 64); err == nil && v > 0 {
		s.Timeout = time.Duration(v * float64(time.Second))
	}
	if v := os.Getenv("KINST_CACHE"); v != "" {
		s.CacheDir = filepath.Join(v, "debuginfod")
	} else if d, err := os.UserCacheDir(); err == nil {
		s.CacheDir = filepath.Join(d, "kinst", "debuginfod")
	}
	return s
}

// DebugInfo is what the debug information of one file gives: the
// separate debug file's symbols (a stripped file keeps only .dynsym) and
// the DWARF line tables, of the debug file or of the file itself.
type DebugInfo struct {
	// Path is the file read; Via how it was found: "build-id",
	// "debuglink", "debuginfod", or "self" (the file's own DWARF).
	Path, Via string
	// Symbols are the debug file's .symtab, else the functions its DWARF
	// describes; nil when it has neither.
	Symbols *elfsym.Table
	// Err says why no debug file was found, or what went wrong reading
	// one; set also when Path is, if only part of it could be read.
	Err error

	lineOnce sync.Once
	lines    *debuginfo.File
	lineErr  error
}

// Lines are the DWARF line tables of Path, opened on first use (the
// sections are inflated then: names alone do not need them). nil
// without a debug file or line tables.
func (d *DebugInfo) Lines() (*debuginfo.File, error) {
	if d.Path == "" {
		return nil, d.Err
	}
	d.lineOnce.Do(func() { d.lines, d.lineErr = debuginfo.Open(d.Path) })
	return d.lines, d.lineErr
}

// debugState is a File's debug information, looked for on first use.
type debugState struct {
	search   *DebugSearch
	hasDWARF bool   // the file has .debug_info and .debug_line of its own
	link     string // .gnu_debuglink name; "" without one
	linkCRC  uint32
	once     sync.Once
	info     atomic.Pointer[DebugInfo]
	// goSyms name a stripped Go binary's functions (-s: no .symtab)
	// from .gopclntab; nil for other files.
	goSyms *elfsym.Table
}

// newDebugState reads what the search needs of ef, and the names of
// .gopclntab when the file is stripped.
func newDebugState(ef *elf.File, s *DebugSearch, stripped bool) *debugState {
	d := &debugState{search: s}
	if stripped {
		d.goSyms, _ = goSymbols(ef) // nil without .gopclntab
	}
	if sec := ef.Section(".debug_info"); sec != nil && sec.Type != elf.SHT_NOBITS {
		if l := ef.Section(".debug_line"); l != nil && l.Type != elf.SHT_NOBITS {
			d.hasDWARF = true
		}
	}
	if sec := ef.Section(".gnu_debuglink"); sec != nil {
		if b, err := sec.Data(); err == nil {
			d.link, d.linkCRC, _ = parseDebuglink(b)
		}
	}
	return d
}

// parseDebuglink reads a .gnu_debuglink section: a NUL-terminated file
// name, padding to 4 bytes, and the CRC-32 of the debug file.
func parseDebuglink(b []byte) (name string, crc uint32, ok bool) {
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	at := (n + 4) &^ 3
	if n == 0 || at+4 > len(b) {
		return "", 0, false
	}
	return string(b[:n]), binary.LittleEndian.Uint32(b[at:]), true
}

// Debug returns the file's debug information, looking for it on first
// call (the later calls return the same). path is the file as the
// process names it (its mapping's path): the directory .gnu_debuglink
// names are looked for in.
func (f *File) Debug(path string) *DebugInfo {
	d := f.debug
	if d == nil {
		return &DebugInfo{Err: errors.New("no debug search configured")}
	}
	d.once.Do(func() { d.info.Store(d.find(f, path)) })
	return d.info.Load()
}

// LookupSymbol names a link-time address of the file: by its own
// symbols, else, for a stripped file (only .dynsym, or none), by
// .gopclntab for a Go binary, else by its separate debug file's (see
// Debug; path is the file as the process names it).
func (f *File) LookupSymbol(path string, addr uint64) (elfsym.Symbol, uint64, bool) {
	if f.Symbols != nil {
		if sym, off, ok := f.Symbols.Lookup(addr); ok {
			return sym, off, true
		}
	}
	if f.stripped() && f.debug != nil && f.debug.goSyms != nil {
		if sym, off, ok := f.debug.goSyms.Lookup(addr); ok {
			return sym, off, true
		}
	}
	if f.stripped() {
		if d := f.Debug(path); d.Symbols != nil {
			return d.Symbols.Lookup(addr)
		}
	}
	return elfsym.Symbol{}, 0, false
}

// stripped reports whether the file's names are its dynamic symbols
// alone (or none): a separate debug file can name its internal
// functions.
func (f *File) stripped() bool {
	return f.Symbols == nil || f.Symbols.Source() == ".dynsym"
}

func (d *debugState) find(f *File, path string) *DebugInfo {
	if d.hasDWARF {
		info := &DebugInfo{Path: f.Path, Via: "self"}
		if f.stripped() { // DWARF kept, symbols stripped: name by DWARF
			info.symbolsFromDWARF()
		}
		return info
	}
	s := d.search
	var tried []string
	try := func(p, via string, check func(string) error) *DebugInfo {
		if _, err := os.Stat(p); err != nil {
			tried = append(tried, p+": not there")
			return nil
		}
		if err := check(p); err != nil {
			tried = append(tried, err.Error())
			return nil
		}
		return openDebug(p, via)
	}
	checkID := func(p string) error {
		ef, err := elfsym.OpenFile(p)
		if err != nil {
			return err
		}
		defer ef.Close()
		if id, _ := elfsym.BuildID(ef); id != f.BuildID {
			return fmt.Errorf("%s: build id %q, want %s", p, id, f.BuildID)
		}
		return nil
	}
	if p := debuginfo.BuildIDPath(f.BuildID); p != "" {
		if info := try(filepath.Join(s.Root, p), "build-id", checkID); info != nil {
			return info
		}
	}
	if d.link != "" {
		dir := filepath.Dir(path)
		checkCRC := func(p string) error {
			crc, err := fileCRC(p)
			if err != nil {
				return err
			}
			if crc != d.linkCRC {
				return fmt.Errorf("%s: CRC %08x, .gnu_debuglink wants %08x", p, crc, d.linkCRC)
			}
			return nil
		}
		for _, p := range []string{filepath.Join(dir, d.link), filepath.Join(dir, ".debug", d.link), filepath.Join("/usr/lib/debug", dir, d.link)} {
			p = filepath.Join(s.Root, p)
			if filepath.Clean(p) == filepath.Clean(filepath.Join(s.Root, path)) {
				continue // the file itself
			}
			if info := try(p, "debuglink", checkCRC); info != nil {
				return info
			}
		}
	}
	if len(s.Debuginfod) > 0 && f.BuildID != "" {
		p, err := s.fetch(f.BuildID)
		if err == nil {
			if err = checkID(p); err == nil {
				return openDebug(p, "debuginfod")
			}
		}
		tried = append(tried, err.Error())
	}
	what := "no separate debug file"
	if f.BuildID == "" {
		what += " (the file has no build id)"
	}
	if len(tried) > 0 {
		what += "; tried " + strings.Join(tried, "; ")
	}
	if len(s.Debuginfod) == 0 {
		what += " (install its -dbg or -dbgsym package, or set DEBUGINFOD_URLS)"
	}
	return &DebugInfo{Err: errors.New(what)}
}

// openDebug reads a debug file's line tables and symbols.
func openDebug(p, via string) *DebugInfo {
	info := &DebugInfo{Path: p, Via: via}
	info.Symbols, info.Err = elfsym.Open(p)
	if errors.Is(info.Err, elfsym.ErrNoSymbols) {
		info.symbolsFromDWARF() // no .symtab
	}
	return info
}

// symbolsFromDWARF names the functions the file's DWARF describes.
func (d *DebugInfo) symbolsFromDWARF() {
	var lines *debuginfo.File
	if lines, d.Err = d.Lines(); lines != nil {
		d.Symbols, d.Err = lines.FuncSymbols()
	}
}

// fileCRC is the CRC-32 (IEEE, as .gnu_debuglink's) of a whole file.
func fileCRC(p string) (uint32, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h := crc32.NewIEEE()
	if _, err := io.Copy(h, f); err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return h.Sum32(), nil
}

// fetch returns the path of the debug file of build id, from the cache
// or downloaded into it (a temporary file when there is no cache).
func (s *DebugSearch) fetch(id string) (string, error) {
	for _, c := range id {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return "", fmt.Errorf("debuginfod: malformed build id %q", id)
		}
	}
	if s.CacheDir != "" {
		p := filepath.Join(s.CacheDir, id, "debuginfo")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	var errs []string
	for _, u := range s.Debuginfod {
		p, err := s.get(strings.TrimSuffix(u, "/")+"/buildid/"+id+"/debuginfo", id)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err.Error())
	}
	return "", errors.New(strings.Join(errs, "; "))
}

// get downloads url into the cache, within the request timeout and what
// is left of the budget.
func (s *DebugSearch) get(url, id string) (string, error) {
	timeout, budget := s.Timeout, s.Budget
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if budget <= 0 {
		budget = 15 * time.Second
	}
	s.mu.Lock()
	left := budget - s.spent
	s.mu.Unlock()
	if left <= 0 {
		return "", fmt.Errorf("debuginfod %s: not asked: the %v allowed for debuginfod in this run are spent", url, budget)
	}
	timeout = min(timeout, left)
	t0 := time.Now()
	defer func() {
		s.mu.Lock()
		s.spent += time.Since(t0)
		s.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("debuginfod %s: %w", url, err)
	}
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("debuginfod %s: no answer within %v", url, timeout)
		}
		var ue *neturl.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the method and URL said already
		}
		return "", fmt.Errorf("debuginfod %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("debuginfod %s: %s", url, resp.Status)
	}
	dir := os.TempDir()
	if s.CacheDir != "" {
		dir = filepath.Join(s.CacheDir, id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", fmt.Errorf("debuginfod cache: %w", err)
		}
	}
	tmp, err := os.CreateTemp(dir, ".debuginfo-*")
	if err != nil {
		return "", fmt.Errorf("debuginfod cache: %w", err)
	}
	_, err = io.Copy(tmp, resp.Body)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		if ctx.Err() != nil {
			return "", fmt.Errorf("debuginfod %s: download not done within %v", url, timeout)
		}
		return "", fmt.Errorf("debuginfod %s: %w", url, err)
	}
	if s.CacheDir == "" {
		return tmp.Name(), nil
	}
	p := filepath.Join(dir, "debuginfo")
	if err := os.Rename(tmp.Name(), p); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("debuginfod cache: %w", err)
	}
	return p, nil
}

// SourceLine is the source file and line of a pc of the process, from
// the DWARF of its file or of the file's separate debug file (looked for
// on first use, see File.Debug).
func (p *Process) SourceLine(pc uint64) (debuginfo.Line, bool) {
	m := p.mapping(pc)
	if m == nil {
		return debuginfo.Line{}, false
	}
	lines, _ := m.file.Debug(m.Path).Lines()
	if lines == nil {
		return debuginfo.Line{}, false
	}
	l, err := lines.LineAt(pc - m.bias)
	if err != nil || l.Line == 0 {
		return debuginfo.Line{}, false
	}
	return l, true
}

// Mapped reports whether pc is in one of the process's executable file
// mappings (without symbolising it).
func (p *Process) Mapped(pc uint64) bool { return p.mapping(pc) != nil }

// DebugNotes are, per mapped file whose names or lines could not be
// completed from debug information looked for so far, why not.
func (p *Process) DebugNotes() map[string]string {
	out := map[string]string{}
	for _, m := range p.maps {
		d := m.file.debug
		if d == nil {
			continue
		}
		if info := d.info.Load(); info != nil && info.Err != nil {
			out[m.Path] = info.Err.Error()
		}
	}
	return out
}
