package debuginfo

import (
	"errors"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kinst/kinst/debuginfo/debuginfotest"
)

// LineAddrs against addr2line over every byte of every function: for
// each source line addr2line reports, the functions LineAddrs names are
// those with a byte of that line, each at its lowest such byte; a line
// of the file with no byte is a NoCodeError naming lines that have some.
func TestLineAddrsMatchAddr2line(t *testing.T) {
	prog := buildProg(t)
	fns := funcs(t, prog)
	var addrs []uint64
	var owner []string
	for _, s := range fns {
		for a := s.Addr; a < s.Addr+s.Size; a++ {
			addrs, owner = append(addrs, a), append(owner, s.Name)
		}
	}
	want := map[string]map[string]uint64{}    // "file:line" → function → lowest address
	emptyOnly := map[string]map[string]bool{} // of want: placed by rows covering no byte only
	for i, l := range debuginfotest.Addr2line(t, prog, addrs) {
		if debuginfotest.Unknown(l) {
			continue
		}
		if want[l] == nil {
			want[l] = map[string]uint64{}
		}
		if a, ok := want[l][owner[i]]; !ok || addrs[i] < a {
			want[l][owner[i]] = addrs[i]
		}
	}
	// A line whose rows in a function all cover no byte (merged into
	// the next line's) is placed at its first such row there, from
	// readelf's decoded table: addr2line never names it.
	ownerOf := func(a uint64) string {
		for _, s := range fns {
			if a >= s.Addr && a < s.Addr+s.Size {
				return s.Name
			}
		}
		return ""
	}
	byBase := map[string]string{} // "base:line" → addr2line's "file:line"
	for l := range want {
		i := strings.LastIndexByte(l, ':')
		byBase[path.Base(l[:i])+l[i:]] = l
	}
	merged := 0
	for key, addrs := range debuginfotest.EmptyRows(t, prog) {
		if strings.HasSuffix(key, ":0") {
			continue
		}
		l, ok := byBase[key]
		if !ok {
			l = key // a line addr2line never names: by its base name
			byBase[key] = l
		}
		for _, a := range addrs {
			fn := ownerOf(a)
			if fn == "" {
				continue
			}
			if want[l] == nil {
				want[l] = map[string]uint64{}
			}
			if old, ok := want[l][fn]; !ok || emptyOnly[l][fn] && a < old {
				want[l][fn] = a
				if emptyOnly[l] == nil {
					emptyOnly[l] = map[string]bool{}
				}
				if !emptyOnly[l][fn] {
					merged++
				}
				emptyOnly[l][fn] = true
			}
		}
	}
	t.Logf("%d lines placed in a function only by rows that cover no byte", merged)
	// By default (the kernel's view) a line placed only so starts no
	// code, as addr2line names it nowhere.
	plain, err := Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	onlyMerged := 0
	for l, byFn := range want {
		all := true
		for fn := range byFn {
			all = all && emptyOnly[l][fn]
		}
		if !all {
			continue
		}
		onlyMerged++
		i := strings.LastIndexByte(l, ':')
		var nc *NoCodeError
		if got, err := plain.LineAddrs(path.Base(l[:i]), atoi(t, l[i+1:])); !errors.As(err, &nc) {
			t.Errorf("%s without PlaceMergedLines: %v, %v; want it to start no code", l, got, err)
		}
	}
	if onlyMerged == 0 {
		t.Error("no line placed only by rows that cover no byte: the program does not test PlaceMergedLines")
	}
	f, err := Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.PlaceMergedLines()
	checked, maxLine := 0, map[string]int{}
	for l, byFn := range want {
		i := strings.LastIndexByte(l, ':')
		file, n := path.Base(l[:i]), atoi(t, l[i+1:])
		maxLine[file] = max(maxLine[file], n)
		got, err := f.LineAddrs(file, n)
		if err != nil {
			t.Errorf("%s:%d: %v; addr2line places it in %v", file, n, err, byFn)
			continue
		}
		gotFn := map[string]uint64{}
		for _, a := range got {
			gotFn[a.Func] = a.Addr
			if s, off, ok := f.Symbols().Lookup(a.Addr); !ok || s.Name != a.Func || off != a.Off {
				t.Errorf("%s:%d: %+v, but the symbol table says %s+%#x", file, n, a, s.Name, off)
			}
		}
		for fn, a := range byFn {
			if gotFn[fn] != a {
				t.Errorf("%s:%d in %s: LineAddrs %#x, addr2line's lowest %#x", file, n, fn, gotFn[fn], a)
			}
		}
		if len(gotFn) != len(byFn) {
			t.Errorf("%s:%d: LineAddrs in %v, addr2line in %v", file, n, gotFn, byFn)
		}
		checked++
	}
	if checked < 20 {
		t.Fatalf("only %d lines checked", checked)
	}
	t.Logf("%d source lines agree with addr2line", checked)
	// Ranges of lines: every function any line of the range is in, at
	// its lowest address among them.
	ranges := 0
	for file, last := range maxLine {
		for lo := 1; lo <= last; lo += 4 {
			hi := lo + 6
			// Rows covering no byte place a function only where
			// none of the range's lines has a byte in it.
			wantFn, mergedFn := map[string]uint64{}, map[string]uint64{}
			for l, byFn := range want {
				i := strings.LastIndexByte(l, ':')
				if n := atoi(t, l[i+1:]); path.Base(l[:i]) != file || n < lo || n > hi {
					continue
				}
				for fn, a := range byFn {
					m := wantFn
					if emptyOnly[l][fn] {
						m = mergedFn
					}
					if b, ok := m[fn]; !ok || a < b {
						m[fn] = a
					}
				}
			}
			for fn, a := range mergedFn {
				if _, ok := wantFn[fn]; !ok {
					wantFn[fn] = a
				}
			}
			got, err := f.LineRangeAddrs(file, lo, hi)
			var nc *NoCodeError
			if len(wantFn) == 0 {
				if !errors.As(err, &nc) || nc.Line != lo || nc.To != hi {
					t.Errorf("%s:%d-%d: %v, %v; addr2line places no byte there", file, lo, hi, got, err)
				}
				continue
			}
			gotFn := map[string]uint64{}
			for _, a := range got {
				gotFn[a.Func] = a.Addr
			}
			if err != nil || !maps.Equal(gotFn, wantFn) {
				t.Errorf("%s:%d-%d: %v, %v; addr2line's lowest %v", file, lo, hi, gotFn, err, wantFn)
			}
			ranges++
		}
	}
	if ranges < 10 {
		t.Errorf("only %d line ranges checked", ranges)
	}
	// FuncLines of each function: the lines addr2line gives its bytes,
	// each at its lowest byte.
	for _, s := range fns {
		lines, at, err := f.FuncLines(s.Addr, s.Addr+s.Size)
		if errors.Is(err, ErrNoLine) {
			lines, at = nil, nil // crt code: no line table (nor lines from addr2line)
		} else if err != nil {
			t.Errorf("%s: %v", s.Name, err)
			continue
		}
		n := 0
		for i, l := range lines {
			byFn, ok := want[l.String()]
			if !ok { // a line addr2line never names
				byFn = want[path.Base(l.File)+":"+strconv.Itoa(l.Line)]
			}
			if byFn[s.Name] != at[i] {
				t.Errorf("%s: %s first at %#x, addr2line's lowest %#x", s.Name, l, at[i], byFn[s.Name])
			}
		}
		for _, byFn := range want {
			if _, ok := byFn[s.Name]; ok {
				n++
			}
		}
		if n != len(lines) {
			t.Errorf("%s: FuncLines %v; addr2line gives its bytes %d lines", s.Name, lines, n)
		}
	}
	// Line 1 of main.c is an #include: no code, and lines with code
	// after it named.
	var nc *NoCodeError
	if _, err := f.LineAddrs("main.c", 1); !errors.As(err, &nc) || !errors.Is(err, ErrNoLine) || nc.After == 0 || nc.After > maxLine["main.c"] {
		t.Errorf("main.c:1: %v, want a NoCodeError naming the next line with code", err)
	}
	if _, err := f.LineAddrs("nosuch.c", 3); !errors.Is(err, ErrNoLine) || errors.As(err, &nc) {
		t.Errorf("nosuch.c:3: %v, want ErrNoLine (no such file)", err)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("line %q: %v", s, err)
	}
	return n
}

// DeclLine of every function of the fixture defined in main.c or table.c
// is the line of its definition, found in the source text.
func TestDeclLine(t *testing.T) {
	prog := buildProg(t)
	f, err := Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defined := map[string]Line{} // from the source: a line "… NAME(" not ending in ';'
	for _, src := range []string{"main.c", "table.c"} {
		b, err := os.ReadFile(filepath.Join("testdata/src", src))
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			m := regexp.MustCompile(`^[a-z].*\b([a-z_][a-z0-9_]*)\(`).FindStringSubmatch(l)
			if m != nil && !strings.HasSuffix(strings.TrimSpace(l), ";") {
				if _, seen := defined[m[1]]; !seen {
					defined[m[1]] = Line{File: "src/" + src, Line: i + 1}
				}
			}
		}
	}
	n := 0
	for _, s := range funcs(t, prog) {
		want, ok := defined[s.Name]
		if !ok {
			continue
		}
		got, err := f.DeclLine(s.Addr)
		if err != nil || !strings.HasSuffix(got.File, want.File) || got.Line != want.Line {
			t.Errorf("%s: DeclLine %v (%v), defined at %v", s.Name, got, err, want)
		}
		n++
	}
	if n < 3 {
		t.Fatalf("only %d functions checked (%v)", n, defined)
	}
	if _, err := f.DeclLine(1); !errors.Is(err, ErrNoLine) {
		t.Errorf("DeclLine(1): %v, want ErrNoLine", err)
	}
}

// LineRangeSpans against addr2line over every byte of every function: a
// byte is in a function's spans exactly when addr2line -i puts it, or a
// call it was inlined at, on a line of the range, for ranges of every
// width over each file.
func TestLineRangeSpansMatchAddr2line(t *testing.T) {
	prog := buildProg(t)
	fns := funcs(t, prog)
	var addrs []uint64
	for _, s := range fns {
		for a := s.Addr; a < s.Addr+s.Size; a++ {
			addrs = append(addrs, a)
		}
	}
	chains := debuginfotest.Addr2lineChains(t, prog, addrs)
	f, err := Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checked, viaCall := 0, 0
	for _, file := range []string{"main.c", "table.c", "util.h"} {
		for lo := 1; lo <= 60; lo += 3 {
			for _, width := range []int{0, 2, 9} {
				hi := lo + width
				got, err := f.LineRangeSpans(file, lo, hi)
				in := map[uint64]bool{}
				for _, fs := range got {
					for _, sp := range fs.Spans {
						for a := sp.Lo; a < sp.Hi; a++ {
							in[a] = true
						}
					}
				}
				want := 0
				for i, chain := range chains {
					if len(chain) == 0 || debuginfotest.Unknown(chain[0]) {
						continue
					}
					inRange := false
					for k, l := range chain {
						j := strings.LastIndexByte(l, ':')
						if n := atoi(t, l[j+1:]); path.Base(l[:j]) == file && n >= lo && n <= hi {
							inRange = true
							if k > 0 {
								viaCall++
							}
							break
						}
					}
					if inRange {
						want++
					}
					if inRange != in[addrs[i]] {
						t.Fatalf("%s:%d-%d: %#x (addr2line -i %q) in the spans: %v", file, lo, hi, addrs[i], chain, in[addrs[i]])
					}
				}
				if want == 0 && err == nil {
					t.Errorf("%s:%d-%d: spans %v where addr2line has no byte", file, lo, hi, got)
				}
				if want > 0 {
					checked++
				}
			}
		}
	}
	if checked < 20 || viaCall == 0 {
		t.Fatalf("%d ranges with code checked, %d bytes in by an inlined call: want both", checked, viaCall)
	}
	t.Logf("%d line ranges agree with addr2line -i byte by byte (%d bytes in by the call they were inlined at)", checked, viaCall)
}
