package unwind

import (
	"strconv"
	"strings"

	"github.com/ianlancetaylor/demangle"
)

// Demangle returns the readable form of a C++ (Itanium ABI, "_Z…") or
// Rust (legacy "_ZN…17h<hash>E" and v0 "_R…") symbol name, and name
// itself when it is not mangled or does not demangle. The output is
// that of `c++filt -i` (binutils without its verbose flag): C++ names
// with their parameters (level3()), Rust names as rustfilt prints them by
// default, without the legacy "::h<16 hex digits>" hash and without v0
// crate disambiguators. It uses github.com/ianlancetaylor/demangle, the
// demangler of Go's own pprof.
func Demangle(name string) string {
	if len(name) < 3 || name[0] != '_' || (name[1] != 'Z' && name[1] != 'R') {
		return name // the common case, without a call
	}
	// A symbol version left on the name ("…@GLIBCXX_3.4") would stop
	// the demangler: demangle the name and put the version back.
	base, version := name, ""
	if i := strings.IndexByte(name, '@'); i > 0 {
		base, version = name[:i], name[i:]
	}
	out, err := demangle.ToString(rustLegacyUnderscores(base))
	if err != nil {
		return name
	}
	return out + version
}

// rustLegacyUnderscores works around the demangler's reading of a Rust
// legacy name: it takes an underscore after an identifier's length for
// the separator v0 names have, so "28__rust_begin_short_backtrace" (in
// every Rust program's main thread) would lose an underscore. An
// identifier that starts with "_" but not "_$" (which stands for an
// escape, whose "_" is dropped anyway) gets one more, for the demangler
// to drop.
func rustLegacyUnderscores(name string) string {
	if !strings.HasPrefix(name, "_ZN") || !strings.Contains(name, "_") {
		return name
	}
	var b strings.Builder
	b.WriteString("_ZN")
	rest := name[3:]
	changed := false
	for len(rest) > 0 && rest[0] >= '0' && rest[0] <= '9' {
		i, n := 0, 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' && n < 1<<20 {
			n = n*10 + int(rest[i]-'0')
			i++
		}
		if n == 0 || i+n > len(rest) {
			return name
		}
		id := rest[i : i+n]
		rest = rest[i+n:]
		if id[0] == '_' && !strings.HasPrefix(id, "_$") {
			id, changed = "_"+id, true
		}
		b.WriteString(strconv.Itoa(len(id)))
		b.WriteString(id)
	}
	if !changed || !strings.HasPrefix(rest, "E") {
		return name // not one to change, or not a plain nested name
	}
	b.WriteString(rest)
	return b.String()
}
