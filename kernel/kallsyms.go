package kernel

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Symbol is one kallsyms entry of the kernel image or a module.
type Symbol struct {
	Addr uint64
	// Size is the ELF symbol's size (ELFOptions.Sizes); 0 when unknown,
	// as from kallsyms, and the function then runs to the next symbol.
	Size   uint64
	Name   string
	Module string // "" for the core kernel
	Type   byte   // kallsyms type letter: t/T text, d/D data, b/B bss, r/R rodata, a/A absolute, w/W weak…
	// Indirect: from an ELF file's STT_GNU_IFUNC, a resolver (a user
	// library's strlen, memcpy…), not the function its name says.
	Indirect bool
	// (Fields ordered to pack: a coverage session holds one per probe.)
}

// IsText reports whether the symbol is in a text section (weak
// definitions included).
func (s Symbol) IsText() bool {
	return s.Type == 't' || s.Type == 'T' || s.Type == 'w' || s.Type == 'W'
}

// isFunction: the symbols the function view (Lookup, At, End, All)
// holds. Weak definitions stay out, as they always have: their extent
// belongs to the symbol before them.
func (s Symbol) isFunction() bool { return s.Type == 't' || s.Type == 'T' }

// IsPrefix reports a symbol that names the padding before a function,
// not a function: __pfx_NAME (CONFIG_CALL_PADDING, 6.2 on: 16 bytes of
// nops that call-depth tracking or FineIBT fill with code at boot) and
// __cfi_NAME (kCFI's hash, clang builds). The padding stays its own
// symbol, so it never counts as the previous function's springboard space,
// but whole-kernel walks (the census, coverage globs) leave it out.
func (s Symbol) IsPrefix() bool {
	return strings.HasPrefix(s.Name, "__pfx_") || strings.HasPrefix(s.Name, "__cfi_")
}

// Symbols is one symbol table of a kernel, live (/proc/kallsyms, ELF
// symbol tables) or from a dump (the kallsyms tables in its memory, and
// its modules' symbols). It keeps every symbol it was given, sorted by
// address, and a function view of the text symbols (types t and T) that
// the analysis works on. It is immutable once built, so it is safe for
// concurrent use.
type Symbols struct {
	all    []Symbol // sorted by address
	byAddr []Symbol // the functions, sorted by address
	text   []uint64 // where each text symbol starts, weak ones included, sorted

	// Commands that read a dump look up a handful of names: the index is
	// built on first use, not with the table.
	// byName is every index into all, sorted by name and, within a
	// name, by address: a sorted index of 4 bytes a symbol, where a map
	// of names took 10 MB of kerninstd's 45 MB at rest.
	once   sync.Once
	byName []int32
}

// ErrHiddenAddresses is returned when kallsyms shows zero addresses: the
// reader lacks CAP_SYSLOG or kernel.kptr_restrict hides them.
var ErrHiddenAddresses = errors.New("kallsyms addresses are hidden (run as root, or lower kernel.kptr_restrict)")

// ErrNoSymbol is matched by every lookup of a name or address that the
// table does not hold, UnknownFunctionError included.
var ErrNoSymbol = errors.New("no such kernel symbol")

// NoSymbolError names what was not found.
type NoSymbolError struct{ Name string }

func (e *NoSymbolError) Error() string   { return fmt.Sprintf("%q: %v", e.Name, ErrNoSymbol) }
func (e *NoSymbolError) Is(t error) bool { return t == ErrNoSymbol }

// ErrUnknownFunction is matched by every UnknownFunctionError.
var ErrUnknownFunction = errors.New("unknown function")

// UnknownFunctionError names a function that kallsyms does not list, or
// lists only as a weak definition.
type UnknownFunctionError struct {
	Name string
	Weak bool // kallsyms lists it as a weak definition (w or W)
}

func (e *UnknownFunctionError) Error() string {
	if e.Weak {
		return fmt.Sprintf("unknown function %q: kallsyms lists it only as a weak definition (W), which kinst does not take as a function: nothing of it is spliced", e.Name)
	}
	return fmt.Sprintf("unknown function %q: not in /proc/kallsyms (static functions may have been inlined; check the name)", e.Name)
}

func (e *UnknownFunctionError) Is(target error) bool {
	return target == ErrUnknownFunction || target == ErrNoSymbol
}

// KallsymsPath is the running kernel's symbol table.
const KallsymsPath = "/proc/kallsyms"

// LoadKallsyms reads a kallsyms file such as /proc/kallsyms.
func LoadKallsyms(path string) (*Symbols, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseKallsyms(f)
}

// ParseKallsyms parses the "ADDR TYPE NAME [MODULE]" lines of kallsyms.
func ParseKallsyms(r io.Reader) (*Symbols, error) {
	var syms []Symbol
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
		sym := Symbol{Addr: addr, Type: fields[1][0], Name: fields[2]}
		if len(fields) > 3 {
			sym.Module = strings.Trim(fields[3], "[]")
		}
		if sym.isFunction() && addr != 0 {
			nonzero = true
		}
		syms = append(syms, sym)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	s := NewSymbols(syms)
	if len(s.byAddr) == 0 {
		return nil, errors.New("kallsyms: no text symbols")
	}
	if !nonzero {
		return nil, ErrHiddenAddresses
	}
	return s, nil
}

// NewSymbols makes a table of syms, which it takes over and sorts by
// address (stably: equal addresses keep their order).
func NewSymbols(syms []Symbol) *Symbols {
	if !sort.SliceIsSorted(syms, func(i, j int) bool { return syms[i].Addr < syms[j].Addr }) {
		sort.SliceStable(syms, func(i, j int) bool { return syms[i].Addr < syms[j].Addr })
	}
	s := &Symbols{all: syms}
	for _, sym := range syms {
		if sym.isFunction() {
			s.byAddr = append(s.byAddr, sym)
		}
		if sym.IsText() {
			s.text = append(s.text, sym.Addr)
		}
	}
	return s
}

// MergeSymbols combines symbol sources into one Symbols: a vmlinux's ELF
// symbols with its modules' .ko symbols, or a dump's kallsyms with its
// modules' symbols. Where several name a core-kernel symbol, the earlier
// part's comes first.
func MergeSymbols(parts ...*Symbols) *Symbols {
	var all []Symbol
	for _, p := range parts {
		all = append(all, p.all...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Addr < all[j].Addr })
	return NewSymbols(all)
}

// named returns the indexes into all of the symbols called name, in
// address order.
func (s *Symbols) named(name string) []int32 {
	s.once.Do(func() {
		s.byName = make([]int32, len(s.all))
		for i := range s.byName {
			s.byName[i] = int32(i)
		}
		slices.SortStableFunc(s.byName, func(a, b int32) int { return strings.Compare(s.all[a].Name, s.all[b].Name) })
	})
	lo, _ := slices.BinarySearchFunc(s.byName, name, func(i int32, name string) int { return strings.Compare(s.all[i].Name, name) })
	hi := lo
	for hi < len(s.byName) && s.all[s.byName[hi]].Name == name {
		hi++
	}
	return s.byName[lo:hi:hi]
}

// Len is the number of functions (text symbols of types t and T).
func (s *Symbols) Len() int { return len(s.byAddr) }

// All returns the functions sorted by address. The caller must not
// modify the slice.
func (s *Symbols) All() []Symbol { return s.byAddr }

// Every returns every symbol, of every type, sorted by address. The
// caller must not modify the slice.
func (s *Symbols) Every() []Symbol { return s.all }

// Named returns every symbol called name, of any type and module, in
// address order.
func (s *Symbols) Named(name string) []Symbol {
	idx := s.named(name)
	out := make([]Symbol, len(idx))
	for i, j := range idx {
		out[i] = s.all[j]
	}
	return out
}

// Lookup returns the function called name. Where several share the name
// (static functions), the core kernel's first one wins; ambiguous reports
// how many there were, so callers can say so.
func (s *Symbols) Lookup(name string) (sym Symbol, ambiguous int, err error) {
	found, weak := false, false
	for _, i := range s.named(name) {
		c := s.all[i]
		if !c.isFunction() {
			weak = weak || c.IsText()
			continue
		}
		ambiguous++
		if !found || (sym.Module != "" && c.Module == "") {
			sym, found = c, true
		}
	}
	if !found {
		return Symbol{}, 0, &UnknownFunctionError{Name: name, Weak: weak}
	}
	return sym, ambiguous, nil
}

// LookupModule finds the function name of module (a kernel module's
// name, as kallsyms gives it), however many others share the name.
func (s *Symbols) LookupModule(name, module string) (Symbol, error) {
	weak := false
	for _, i := range s.named(name) {
		c := s.all[i]
		if c.Module != module {
			continue
		}
		if c.isFunction() {
			return c, nil
		}
		weak = weak || c.IsText()
	}
	if !weak && !s.hasModule(module) {
		return Symbol{}, fmt.Errorf("%w: %s:%s: no module %q is loaded (kallsyms lists none of its symbols; see lsmod)", ErrUnknownFunction, module, name, module)
	}
	return Symbol{}, &UnknownFunctionError{Name: module + ":" + name, Weak: weak}
}

// hasModule reports whether any symbol is module's.
func (s *Symbols) hasModule(module string) bool {
	for i := range s.all {
		if s.all[i].Module == module {
			return true
		}
	}
	return false
}

// End returns the address where the function starting at sym.Addr ends:
// the next text symbol at a higher address, capped at maxFunctionSize. A
// weak definition (kallsyms' W, such as 6.1's kprobe_exceptions_notify)
// ends the function before it, though it is no function of the view
// itself: its body is live code, and taken for the one before it, past a
// return, it was "never executed" padding, springboard space that a
// splice would overwrite.
func (s *Symbols) End(sym Symbol) uint64 {
	i := sort.Search(len(s.text), func(i int) bool { return s.text[i] > sym.Addr })
	end := sym.Addr + maxFunctionSize
	if i < len(s.text) && s.text[i] < end {
		end = s.text[i]
	}
	return end
}

// maxFunctionSize bounds a function's extent when no later symbol does
// (the last symbol of a module, say).
const maxFunctionSize = 64 << 10

// At returns the function containing addr and the offset into it.
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

// FunctionsAt returns every function symbol that starts at addr, in the
// table's order (kallsyms': the kernel's preferred name first, linker
// script markers such as __indirect_thunk_start last). The caller must
// not modify it.
func (s *Symbols) FunctionsAt(addr uint64) []Symbol {
	hi := sort.Search(len(s.byAddr), func(i int) bool { return s.byAddr[i].Addr > addr })
	lo := hi
	for lo > 0 && s.byAddr[lo-1].Addr == addr {
		lo--
	}
	return s.byAddr[lo:hi]
}

// EachOverlapping yields the functions whose extent [Addr, End) overlaps
// [lo, hi), one symbol per start address, in address order (the planner
// asks for every instruction's reach: no slice is made of them).
func (s *Symbols) EachOverlapping(lo, hi uint64) iter.Seq[Symbol] {
	return func(yield func(Symbol) bool) {
		i := sort.Search(len(s.byAddr), func(i int) bool { return s.byAddr[i].Addr > lo })
		if i > 0 && s.End(s.byAddr[i-1]) > lo {
			i--
		}
		for first := i; i < len(s.byAddr) && s.byAddr[i].Addr < hi; i++ {
			if i > first && s.byAddr[i-1].Addr == s.byAddr[i].Addr {
				continue
			}
			if !yield(s.byAddr[i]) {
				return
			}
		}
	}
}

// Before returns the last symbol of module ("" for the core kernel), of
// any type, at or below addr and at most limit bytes below it.
func (s *Symbols) Before(addr uint64, module string, limit uint64) (Symbol, bool) {
	i := sort.Search(len(s.all), func(i int) bool { return s.all[i].Addr > addr })
	for i--; i >= 0 && addr-s.all[i].Addr <= limit; i-- {
		if s.all[i].Module == module {
			return s.all[i], true
		}
	}
	return Symbol{}, false
}

// After returns the first symbol of sym's module, of any type, at a
// higher address than sym.
func (s *Symbols) After(sym Symbol) (Symbol, bool) {
	for i := sort.Search(len(s.all), func(i int) bool { return s.all[i].Addr > sym.Addr }); i < len(s.all); i++ {
		if s.all[i].Module == sym.Module {
			return s.all[i], true
		}
	}
	return Symbol{}, false
}

// Names returns a function that names the function starting exactly at
// an address (what cfg's block analysis takes as its NameAt).
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
	text, ok := s.Address("_text")
	if !ok || addr < text {
		return "", false
	}
	return fmt.Sprintf("_text+%#x", addr-text), true
}

// FromPortable is the inverse of Portable for this boot.
func (s *Symbols) FromPortable(name string) (uint64, bool) {
	if off, ok := strings.CutPrefix(name, "_text+"); ok {
		text, ok := s.Address("_text")
		v, err := strconv.ParseUint(off, 0, 64)
		return text + v, ok && err == nil
	}
	mod, fn, ok := strings.Cut(name, ":")
	if !ok {
		return 0, false
	}
	for _, i := range s.named(fn) {
		if sym := s.all[i]; sym.Module == mod && sym.isFunction() {
			return sym.Addr, true
		}
	}
	return 0, false
}

// Address returns the address of the core kernel's symbol called name,
// of any type: a function, a section marker, a variable (per-CPU ones
// are offsets from the per-CPU base). Where several share the name, the
// lowest address wins.
func (s *Symbols) Address(name string) (uint64, bool) {
	for _, i := range s.named(name) {
		if s.all[i].Module == "" {
			return s.all[i].Addr, true
		}
	}
	return 0, false
}

// InRange reports whether addr lies in [start, end) of two marker symbols
// of the core kernel; false when either is missing.
func (s *Symbols) InRange(addr uint64, start, end string) bool {
	lo, ok1 := s.Address(start)
	hi, ok2 := s.Address(end)
	return ok1 && ok2 && addr >= lo && addr < hi
}
