package api

import (
	"encoding/json"
	"strconv"
)

// A coverage report is mostly its blocks: libc's 71,000 are 26 MB of
// indented JSON, and encoding/json took a tenth of a second of two CPUs
// for them (reflection, then a second pass to indent). appendFunction
// writes a CoverFunction's bytes directly, the same bytes:
// TestCoverFunctionJSON checks it against encoding/json on every shape
// of function and on hostile strings.

// jsonIndent is how a function is indented in an indented report: as
// json.MarshalIndent(f, prefix, "  ") writes it, prefix the depth of the
// report's functions.
type jsonIndent struct {
	on     bool
	prefix string
}

// newline starts a line at depth levels under the prefix (nothing
// compact).
func (in jsonIndent) newline(b []byte, depth int) []byte {
	if !in.on {
		return b
	}
	b = append(b, '\n')
	b = append(b, in.prefix...)
	for range depth {
		b = append(b, "  "...)
	}
	return b
}

// key writes a member's name (after a comma unless first) on its own
// line when indented.
func (in jsonIndent) key(b []byte, depth int, name string, first bool) []byte {
	if !first {
		b = append(b, ',')
	}
	b = in.newline(b, depth)
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	if in.on {
		b = append(b, ' ')
	}
	return b
}

// appendFunction appends f as json.Marshal (indent off) or
// json.MarshalIndent(f, in.prefix, "  ") writes it.
func appendFunction(b []byte, f *CoverFunction, in jsonIndent) []byte {
	b = append(b, '{')
	b = appendJSONString(in.key(b, 1, "function", true), f.Function)
	if f.Module != "" {
		b = appendJSONString(in.key(b, 1, "module", false), f.Module)
	}
	b = appendAddr(in.key(b, 1, "address", false), f.Address)
	b = strconv.AppendInt(in.key(b, 1, "total", false), int64(f.Total), 10)
	b = strconv.AppendInt(in.key(b, 1, "covered", false), int64(f.Covered), 10)
	b = strconv.AppendInt(in.key(b, 1, "refused", false), int64(f.Refused), 10)
	b = appendArray(in.key(b, 1, "blocks", false), f.Blocks, in, 1, func(b []byte, k *CoverBlock) []byte { return appendBlock(b, k, in) })
	if f.Error != "" {
		b = appendJSONString(in.key(b, 1, "error", false), f.Error)
	}
	return append(in.newline(b, 0), '}')
}

// appendBlock appends a block of a function's blocks (depth 2).
func appendBlock(b []byte, k *CoverBlock, in jsonIndent) []byte {
	b = append(b, '{')
	b = strconv.AppendInt(in.key(b, 3, "index", true), int64(k.Index), 10)
	if k.Inferred {
		b = append(in.key(b, 3, "inferred", false), "true"...)
	}
	b = appendAddr(in.key(b, 3, "start", false), k.Start)
	b = appendAddr(in.key(b, 3, "end", false), k.End)
	b = strconv.AppendBool(in.key(b, 3, "covered", false), k.Covered)
	b = appendStringPtr(in.key(b, 3, "point", false), k.Point)
	b = appendStringPtr(in.key(b, 3, "refused", false), k.Refused)
	b = appendArray(in.key(b, 3, "lines", false), k.Lines, in, 3, func(b []byte, l *string) []byte { return appendJSONString(b, *l) })
	return append(in.newline(b, 2), '}')
}

// appendArray appends items as a JSON array whose members are at depth+1
// (null when nil), each by item.
func appendArray[T any](b []byte, items []T, in jsonIndent, depth int, item func([]byte, *T) []byte) []byte {
	switch {
	case items == nil:
		return append(b, "null"...)
	case len(items) == 0:
		return append(b, "[]"...)
	}
	b = append(b, '[')
	for i := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = item(in.newline(b, depth+1), &items[i])
	}
	return append(in.newline(b, depth), ']')
}

func appendStringPtr(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendJSONString(b, *s)
}

// appendAddr appends a as its MarshalText, quoted.
func appendAddr(b []byte, a Addr) []byte {
	return append(a.appendText(append(b, '"')), '"')
}

// appendJSONString appends s quoted as encoding/json quotes it: printable
// ASCII but for the characters it escapes is copied; anything else
// (control characters, <, >, &, non-ASCII, invalid UTF-8) is left to
// encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
