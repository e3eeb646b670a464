package process

import (
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/unwind"
)

// A user point names functions as a C++ or Rust programmer writes them
// too (ns::Parser::parse, or with its parameters), which have colons,
// spaces, parentheses and plus signs of their own; so its parts are
// found from the ends: LIB: only before a single colon with nothing of a
// qualified name before it, :BLOCK and +OFF only as a suffix.
var (
	blockSuffix  = regexp.MustCompile(`^(.*[^:]):([0-9]+)$`)
	offsetSuffix = regexp.MustCompile(`^(.+)\+(0[xX][0-9a-fA-F]+|[0-9]+)$`)
)

// SplitLib splits LIB:REST: the colon must be a single one (not half of
// "::"), what is before it a file name (no "(", "<" or space), and what
// follows not a block number (FUNC:BLOCK).
func SplitLib(spec string) (lib, rest string) {
	for i := 0; i < len(spec); i++ {
		if spec[i] != ':' {
			continue
		}
		if i+1 < len(spec) && spec[i+1] == ':' {
			return "", spec // a qualified name comes first
		}
		if i == 0 || strings.ContainsAny(spec[:i], "(< ") {
			return "", spec
		}
		if _, err := strconv.Atoi(spec[i+1:]); err == nil {
			return "", spec
		}
		return spec[:i], spec[i+1:]
	}
	return "", spec
}

// parsePoint reads a user point: [LIB:]FUNC[+0xOFF | :BLOCK].
func parsePoint(spec string) (lib string, p splice.Point, err error) {
	lib, rest := SplitLib(spec)
	p = splice.Point{Spec: spec, Function: rest}
	if m := blockSuffix.FindStringSubmatch(rest); m != nil {
		b, err := strconv.ParseUint(m[2], 10, 31)
		if err != nil {
			return "", p, fmt.Errorf("point %q: bad block %q", spec, m[2])
		}
		p.Function, p.Block, p.HasBlock = m[1], int(b), true
	} else if m := offsetSuffix.FindStringSubmatch(rest); m != nil {
		off, err := strconv.ParseUint(m[2], 0, 64)
		if err != nil {
			return "", p, fmt.Errorf("point %q: bad offset %q (want FUNC+0xOFF)", spec, m[2])
		}
		p.Function, p.Offset, p.HasOffset = m[1], off, true
	}
	if p.Function == "" {
		return "", p, fmt.Errorf("point %q: want [LIB:]FUNC, FUNC+0xOFF or FUNC:BLOCK", spec)
	}
	return lib, p, nil
}

// readable is a mangled symbol's demangled name and that name without
// its parameter list (and a trailing " const"): what a C++ or Rust
// programmer calls the function.
type readable struct{ full, short string }

// demangled lists the readable names of the mangled symbols, once.
func (t *Target) demangled() map[uint64]readable {
	if t.readable != nil {
		return t.readable
	}
	t.readable = map[uint64]readable{}
	for _, s := range t.Syms.All() {
		if !strings.HasPrefix(s.Name, "_Z") && !strings.HasPrefix(s.Name, "_R") {
			continue
		}
		full := unwind.Demangle(s.Name)
		if full == s.Name {
			continue
		}
		t.readable[s.Addr] = readable{full, withoutParams(full)}
	}
	return t.readable
}

// withoutParams cuts a demangled name's last top-level parameter list
// ("ns::f(int, char*) const" → "ns::f").
func withoutParams(name string) string {
	s := strings.TrimSuffix(name, " const")
	if !strings.HasSuffix(s, ")") {
		return name
	}
	depth := 0
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case ')':
			depth++
		case '(':
			depth--
			if depth == 0 {
				return s[:i]
			}
		}
	}
	return name
}

// lookup is the symbols named name in lib ("" the executable): by their
// own name, else by their demangled name with or without parameters.
func (t *Target) lookup(name, lib string) []kernel.Symbol {
	var out []kernel.Symbol
	for _, s := range t.Syms.Named(name) {
		if inModule(s, lib) {
			out = append(out, s)
		}
	}
	if len(out) > 0 {
		return out
	}
	rd := t.demangled()
	for _, s := range t.Syms.All() {
		if r, ok := rd[s.Addr]; ok && inModule(s, lib) && (r.full == name || r.short == name) && strings.HasPrefix(s.Name, "_") {
			out = append(out, s)
		}
	}
	return out
}

// matches: sym's name, or its demangled name with or without parameters,
// matches the glob.
func (t *Target) matches(pattern string, sym kernel.Symbol) bool {
	if ok, _ := path.Match(pattern, sym.Name); ok {
		return true
	}
	if r, ok := t.demangled()[sym.Addr]; ok && strings.HasPrefix(sym.Name, "_") {
		a, _ := path.Match(pattern, r.full)
		b, _ := path.Match(pattern, r.short)
		return a || b
	}
	return false
}
