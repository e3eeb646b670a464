package kernel

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Symbol is one text symbol of the running kernel or a module.
type Symbol struct {
	Addr   uint64
	Type   byte // kallsyms type letter: 't' or 'T'
	Name   string
	Module string // "" for the core kernel
}

// Symbols is a kallsyms snapshot: text symbols sorted by address, indexed
// by name. It is immutable once built, so it is safe for concurrent use.
type Symbols struct {
	byAddr  []Symbol
	byName  map[string][]int
	markers map[string]uint64 // section markers of other types
}

// markerNames are non-text symbols kept for their addresses: the bounds of
// the init sections the kernel frees after boot, and of the tables that
// name instructions the kernel rewrites or fixes up, and the heads of the
// module list and of ftrace's record pages (see OwnedSites).
var markerNames = map[string]bool{"__init_begin": true, "__init_end": true, "_stext": true, "_etext": true,
	"__start___ex_table": true, "__stop___ex_table": true, "__start___jump_table": true, "__stop___jump_table": true,
	"__start_static_call_sites": true, "__stop_static_call_sites": true,
	"modules": true, "ftrace_pages_start": true,
	// The per-CPU pointer to the running task (6.1; pcpu_hot from 6.2).
	"current_task": true, "pcpu_hot": true}

// ErrHiddenAddresses is returned when kallsyms shows zero addresses: the
// reader lacks CAP_SYSLOG or kernel.kptr_restrict hides them.
var ErrHiddenAddresses = errors.New("kallsyms addresses are hidden (run as root, or lower kernel.kptr_restrict)")

// ErrUnknownFunction is matched by every UnknownFunctionError.
var ErrUnknownFunction = errors.New("unknown function")

// UnknownFunctionError names a function that kallsyms does not list.
type UnknownFunctionError struct{ Name string }

func (e *UnknownFunctionError) Error() string {
	return fmt.Sprintf("unknown function %q: not in /proc/kallsyms (static functions may have been inlined; check the name)", e.Name)
}

func (e *UnknownFunctionError) Is(target error) bool { return target == ErrUnknownFunction }

// LoadKallsyms reads a kallsyms file such as /proc/kallsyms.
func LoadKallsyms(path string) (*Symbols, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseKallsyms(f)
}

// ParseKallsyms parses the "ADDR TYPE NAME [MODULE]" lines of kallsyms,
// keeping text symbols only.
func ParseKallsyms(r io.Reader) (*Symbols, error) {
	s := &Symbols{byName: make(map[string][]int), markers: make(map[string]uint64)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	nonzero := false
	line := 0
	for sc.Scan() {
		line++
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || len(fields[1]) != 1 {
			return nil, fmt.Errorf("kallsyms line %d: malformed %q", line, sc.Text())
		}
		addr, err := strconv.ParseUint(fields[0], 16, 64)
		if err != nil {
			return nil, fmt.Errorf("kallsyms line %d: bad address: %w", line, err)
		}
		t := fields[1][0]
		if t != 't' && t != 'T' {
			if markerNames[fields[2]] && len(fields) == 3 {
				s.markers[fields[2]] = addr
			}
			continue
		}
		if addr != 0 {
			nonzero = true
		}
		sym := Symbol{Addr: addr, Type: t, Name: fields[2]}
		if len(fields) > 3 {
			sym.Module = strings.Trim(fields[3], "[]")
		}
		s.byAddr = append(s.byAddr, sym)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(s.byAddr) == 0 {
		return nil, errors.New("kallsyms: no text symbols")
	}
	if !nonzero {
		return nil, ErrHiddenAddresses
	}
	s.index()
	return s, nil
}

// index sorts the text symbols by address and indexes them by name.
func (s *Symbols) index() {
	sort.SliceStable(s.byAddr, func(i, j int) bool { return s.byAddr[i].Addr < s.byAddr[j].Addr })
	for i, sym := range s.byAddr {
		s.byName[sym.Name] = append(s.byName[sym.Name], i)
	}
}

// Len is the number of text symbols.
func (s *Symbols) Len() int { return len(s.byAddr) }

// All returns the text symbols sorted by address. The caller must not
// modify the slice.
func (s *Symbols) All() []Symbol { return s.byAddr }

// Lookup returns the symbol called name. Where several share the name
// (static functions), the core kernel's first one wins; ambiguous reports
// how many there were, so callers can say so.
func (s *Symbols) Lookup(name string) (sym Symbol, ambiguous int, err error) {
	idx := s.byName[name]
	if len(idx) == 0 {
		return Symbol{}, 0, &UnknownFunctionError{Name: name}
	}
	best := s.byAddr[idx[0]]
	for _, i := range idx {
		if s.byAddr[i].Module == "" {
			best = s.byAddr[i]
			break
		}
	}
	return best, len(idx), nil
}

// End returns the address where the function starting at sym.Addr ends:
// the next text symbol at a higher address, capped at maxFunctionSize.
func (s *Symbols) End(sym Symbol) uint64 {
	i := sort.Search(len(s.byAddr), func(i int) bool { return s.byAddr[i].Addr > sym.Addr })
	end := sym.Addr + maxFunctionSize
	if i < len(s.byAddr) && s.byAddr[i].Addr < end {
		end = s.byAddr[i].Addr
	}
	return end
}

// maxFunctionSize bounds a function's extent when no later symbol does
// (the last symbol of a module, say).
const maxFunctionSize = 64 << 10

// At returns the symbol containing addr and the offset into it.
func (s *Symbols) At(addr uint64) (Symbol, uint64, bool) {
	i := sort.Search(len(s.byAddr), func(i int) bool { return s.byAddr[i].Addr > addr })
	if i == 0 {
		return Symbol{}, 0, false
	}
	sym := s.byAddr[i-1]
	if addr-sym.Addr >= maxFunctionSize {
		return Symbol{}, 0, false
	}
	return sym, addr - sym.Addr, true
}

// Overlapping returns the functions whose extent [Addr, End) overlaps
// [lo, hi), one symbol per start address, in address order.
func (s *Symbols) Overlapping(lo, hi uint64) []Symbol {
	i := sort.Search(len(s.byAddr), func(i int) bool { return s.byAddr[i].Addr > lo })
	if i > 0 && s.End(s.byAddr[i-1]) > lo {
		i--
	}
	var out []Symbol
	for ; i < len(s.byAddr) && s.byAddr[i].Addr < hi; i++ {
		if len(out) > 0 && out[len(out)-1].Addr == s.byAddr[i].Addr {
			continue
		}
		out = append(out, s.byAddr[i])
	}
	return out
}

// Names returns a function that names the symbol starting exactly at an
// address (what cfg's block analysis takes as its NameAt).
func (s *Symbols) Names() func(addr uint64) (string, bool) {
	return func(a uint64) (string, bool) {
		sym, off, ok := s.At(a)
		return sym.Name, ok && off == 0
	}
}

// Portable names a function start so that it survives a reboot of the same
// build: core kernel addresses relative to _text (KASLR moves them
// together), module functions by module and name.
func (s *Symbols) Portable(addr uint64) (string, bool) {
	sym, off, ok := s.At(addr)
	if !ok || off != 0 {
		return "", false
	}
	if sym.Module != "" {
		return sym.Module + ":" + sym.Name, true
	}
	text, ok := s.marker("_text")
	if !ok || addr < text {
		return "", false
	}
	return fmt.Sprintf("_text+%#x", addr-text), true
}

// FromPortable is the inverse of Portable for this boot.
func (s *Symbols) FromPortable(name string) (uint64, bool) {
	if off, ok := strings.CutPrefix(name, "_text+"); ok {
		text, ok := s.marker("_text")
		v, err := strconv.ParseUint(off, 0, 64)
		return text + v, ok && err == nil
	}
	mod, fn, ok := strings.Cut(name, ":")
	if !ok {
		return 0, false
	}
	for _, i := range s.byName[fn] {
		if s.byAddr[i].Module == mod {
			return s.byAddr[i].Addr, true
		}
	}
	return 0, false
}

// Address returns the address of a text symbol or a kept marker symbol.
func (s *Symbols) Address(name string) (uint64, bool) { return s.marker(name) }

// InRange reports whether addr lies in [start, end) of two marker symbols
// of the core kernel; false when either is missing.
func (s *Symbols) InRange(addr uint64, start, end string) bool {
	lo, ok1 := s.marker(start)
	hi, ok2 := s.marker(end)
	return ok1 && ok2 && addr >= lo && addr < hi
}

func (s *Symbols) marker(name string) (uint64, bool) {
	if a, ok := s.markers[name]; ok {
		return a, true
	}
	sym, _, err := s.Lookup(name)
	return sym.Addr, err == nil && sym.Module == ""
}
