package debuginfo

import (
	"cmp"
	"debug/dwarf"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kinst/kinst/internal/elfsym"
)

// LineAddr is where the code of a source line starts in one function:
// a link-time address and the function symbol it lies in.
type LineAddr struct {
	Addr uint64
	Func string // the function symbol holding Addr
	Off  uint64 // Addr's offset in it
}

// NoCodeError is a source line that exists in the line tables' file but
// starts no code (a comment, a declaration, a line the compiler merged
// into another): Near are the closest lines before and after it that
// do, 0 when there is none.
type NoCodeError struct {
	File          string
	Line          int
	To            int // a range's last line (LineRangeAddrs); 0 for one line
	Before, After int
}

func (e *NoCodeError) Error() string {
	var near []string
	if e.Before > 0 {
		near = append(near, fmt.Sprint(e.Before))
	}
	if e.After > 0 {
		near = append(near, fmt.Sprint(e.After))
	}
	s := fmt.Sprintf("%s:%d starts no code", e.File, e.Line)
	if e.To > e.Line {
		s = fmt.Sprintf("%s:%d-%d start no code", e.File, e.Line, e.To)
	}
	if len(near) > 0 {
		s += "; the nearest lines that do: " + strings.Join(near, ", ")
	}
	return s
}

func (e *NoCodeError) Is(target error) bool { return target == ErrNoLine }

// LineAddrs are the places the code of line in the source file named by
// suffix (MatchFile) starts: in every function whose code holds some of
// it (a function, and every function a copy of it was inlined into), the
// lowest address where a run of line-table rows of that line begins. One
// address per function: where the compiler spread the line over several
// runs in one function (scheduling, a loop's test), the others are left
// out, so that a counter there counts the line once per pass through its
// first run. A line whose rows in a function all share their address
// with the next line's (its statement merged into the next: `else if (a
// == b) r = 0;` folded into the else's code) starts there with
// PlaceMergedLines, as gdb's breakpoint on it does, and starts no code
// without. In address order. A file no line table names
// gives ErrNoLine; a line of it without code, a *NoCodeError.
func (f *File) LineAddrs(suffix string, line int) ([]LineAddr, error) {
	return f.LineRangeAddrs(suffix, line, line)
}

// LineRangeAddrs is LineAddrs for the lines lo to hi of the file: in
// every function whose code holds some of them, the lowest address where
// a run of one of them begins, in address order (kinst cover --lines).
// A range without code gives a *NoCodeError naming lo.
func (f *File) LineRangeAddrs(suffix string, lo, hi int) ([]LineAddr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// By function symbol: the first run of code, and the first place
	// of a line whose rows there cover no byte (taken where the function
	// has no run).
	first, merged := map[string]LineAddr{}, map[string]LineAddr{}
	noCode, err := f.rangeRows(suffix, lo, hi, func(s *sequence, i int, empty bool) {
		r := s.rows[i]
		l := int(r.line)
		if i > 0 && s.rows[i-1].file == r.file && int(s.rows[i-1].line) == l && s.rows[i-1].addr < r.addr {
			return // the same run goes on
		}
		sym, off, ok := f.syms.Lookup(r.addr)
		if !ok || sym.Kind != elfsym.Func {
			return
		}
		m := first
		if empty {
			m = merged
		}
		if a, ok := m[sym.Name]; !ok || r.addr < a.Addr {
			m[sym.Name] = LineAddr{Addr: r.addr, Func: sym.Name, Off: off}
		}
	})
	if err != nil {
		return nil, err
	}
	for fn, a := range merged { // empty without PlaceMergedLines (rangeRows)
		if _, ok := first[fn]; !ok {
			first[fn] = a
		}
	}
	if len(first) == 0 {
		return nil, noCode
	}
	out := make([]LineAddr, 0, len(first))
	for _, a := range first {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b LineAddr) int { return cmp.Compare(a.Addr, b.Addr) })
	return out, nil
}

// rangeRows calls visit with every row of the file's line tables
// (eachRow) that names one of the lines lo to hi, and gives the error for
// a range that turns out to have no code: a *NoCodeError naming the
// nearest lines that have some. A file no table names is ErrNoLine, at
// once. The caller holds f.mu.
func (f *File) rangeRows(suffix string, lo, hi int, visit func(s *sequence, i int, empty bool)) (noCode, err error) {
	if f.closed {
		return nil, errors.New("debuginfo: file closed")
	}
	if f.syms == nil {
		return nil, fmt.Errorf("%s has no symbol table to name functions", f.Path)
	}
	before, after := 0, 0
	named, err := f.eachRow(suffix, func(s *sequence, i int, empty bool) {
		if empty && !f.merged {
			return // addr2line's view: such a row places no line
		}
		switch l := int(s.rows[i].line); {
		case l < lo:
			before = max(before, l)
		case l > hi:
			if after == 0 || l < after {
				after = l
			}
		default:
			visit(s, i, empty)
		}
	})
	if err != nil {
		return nil, err
	}
	if named == "" {
		return nil, fmt.Errorf("no line table names %s: %w", suffix, ErrNoLine)
	}
	e := &NoCodeError{File: named, Line: lo, Before: before, After: after}
	if hi > lo {
		e.To = hi
	}
	return e, nil
}

// eachRow calls visit with every row of the line tables that names a
// line of the source file called suffix (MatchFile), empty when it
// covers no byte (the next row is at the same address), and gives the
// file's name as the first table to name it has it ("" when none does).
// The caller holds f.mu.
func (f *File) eachRow(suffix string, visit func(s *sequence, i int, empty bool)) (string, error) {
	named := ""
	err := f.eachUnit(func(d *dwarf.Data, cu *dwarf.Entry, hdr dwarf.Offset) (bool, error) {
		if cu.Tag != dwarf.TagCompileUnit {
			return true, nil
		}
		t, err := f.table(hdr)
		if err != nil {
			return true, nil // a unit without a readable table holds nothing of it
		}
		match, name := matchFiles(t.files, suffix)
		if name == "" {
			return true, nil
		}
		if named == "" {
			named = name
		}
		for si := range t.seqs {
			s := &t.seqs[si]
			for i := 0; i < len(s.rows)-1; i++ {
				if r := s.rows[i]; match[r.file] && r.line != 0 {
					visit(s, i, s.rows[i+1].addr == r.addr)
				}
			}
		}
		return true, nil
	})
	return named, err
}

// Span is a run of code [Lo, Hi) at link-time addresses.
type Span struct{ Lo, Hi uint64 }

// FuncSpans is the code of some source lines in one function: where
// the function starts and the spans of its code the lines' rows cover.
type FuncSpans struct {
	Func  string // the function symbol
	Addr  uint64 // its link-time address
	Spans []Span // by address, adjacent ones merged
}

// LineRangeSpans is the code of the lines lo to hi of the source file
// called suffix, per function holding any of it (inlined copies
// included), in address order: every byte whose line-table row (the one
// addr2line reports) names one of those lines, and the code of every
// function inlined at a call on one of them (whose rows name the inlined
// function's lines). kinst time times it as a region. No code gives the
// errors LineRangeAddrs gives.
func (f *File) LineRangeSpans(suffix string, lo, hi int) ([]FuncSpans, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	by := map[string]*FuncSpans{}
	add := func(sp Span) { // to the function holding it
		sym, _, ok := f.syms.Lookup(sp.Lo)
		if !ok || sym.Kind != elfsym.Func {
			return
		}
		fs := by[sym.Name]
		if fs == nil {
			fs = &FuncSpans{Func: sym.Name, Addr: sym.Addr}
			by[sym.Name] = fs
		}
		fs.Spans = append(fs.Spans, sp)
	}
	noCode, err := f.rangeRows(suffix, lo, hi, func(s *sequence, i int, empty bool) {
		if !empty {
			add(Span{s.rows[i].addr, s.rows[i+1].addr})
		}
	})
	if err != nil {
		return nil, err
	}
	if err := f.inlinedCalls(suffix, lo, hi, add); err != nil {
		return nil, err
	}
	if len(by) == 0 { // not even a call inlined on one of the lines
		return nil, noCode
	}
	out := make([]FuncSpans, 0, len(by))
	for _, fs := range by {
		slices.SortFunc(fs.Spans, func(a, b Span) int { return cmp.Compare(a.Lo, b.Lo) })
		merged := fs.Spans[:1]
		for _, sp := range fs.Spans[1:] {
			if last := &merged[len(merged)-1]; sp.Lo <= last.Hi {
				last.Hi = max(last.Hi, sp.Hi)
			} else {
				merged = append(merged, sp)
			}
		}
		fs.Spans = merged
		out = append(out, *fs)
	}
	slices.SortFunc(out, func(a, b FuncSpans) int { return cmp.Compare(a.Addr, b.Addr) })
	return out, nil
}

// inlinedCalls calls add with the code of every function inlined at a
// call on one of the lines lo to hi of the file called suffix
// (DW_TAG_inlined_subroutine's call_file and call_line): that code is
// the line's as a call's callee is, though its rows name the inlined
// function's own lines. The caller holds f.mu.
func (f *File) inlinedCalls(suffix string, lo, hi int, add func(Span)) error {
	return f.eachUnit(func(d *dwarf.Data, cu *dwarf.Entry, hdr dwarf.Offset) (bool, error) {
		if cu.Tag != dwarf.TagCompileUnit {
			return true, nil
		}
		t, err := f.table(hdr)
		if err != nil {
			return true, nil
		}
		if _, name := matchFiles(t.files, suffix); name == "" {
			return true, nil // no line of the file in this unit, so no call
		}
		lr, err := d.LineReader(cu)
		if err != nil || lr == nil {
			return true, nil
		}
		compDir, _ := cu.Val(dwarf.AttrCompDir).(string)
		files := lr.Files()
		err = everyEntry(d, func(e *dwarf.Entry) bool {
			if e.Tag != dwarf.TagInlinedSubroutine {
				return false
			}
			fi, _ := e.Val(dwarf.AttrCallFile).(int64)
			line, _ := e.Val(dwarf.AttrCallLine).(int64)
			if fi < 0 || int(fi) >= len(files) || files[fi] == nil || int(line) < lo || int(line) > hi ||
				!MatchFile(fileName(files[fi].Name, compDir), suffix) {
				return false
			}
			rs, _ := d.Ranges(e)
			for _, r := range rs {
				if r[1] > r[0] {
					add(Span{r[0], r[1]})
				}
			}
			return true // its children are inside the call's code already
		})
		return err == nil, err
	})
}

// FuncLines are the lines of the function at link-time address lo, up
// to hi, and where each starts first in it, by line: what kinst lines
// lists. Rows of line 0 are left out; lines of inlined code from other
// files are kept with their file.
func (f *File) FuncLines(lo, hi uint64) ([]Line, []uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Where each line's code starts first, and where a line whose rows
	// cover no byte starts (LineAddrs): listed where it has no code.
	firstAt, mergedAt := map[Line]uint64{}, map[Line]uint64{}
	for at := lo; at < hi; {
		t, s, err := f.seqAt(at)
		if err != nil {
			if at == lo {
				return nil, nil, err
			}
			break
		}
		i := sort.Search(len(s.rows), func(i int) bool { return s.rows[i].addr > at }) - 1
		for i > 0 && s.rows[i-1].addr == s.rows[i].addr && s.rows[i].addr >= lo {
			i-- // rows that cover no byte before the last one there
		}
		for ; i < len(s.rows)-1 && s.rows[i].addr < hi; i++ {
			r := s.rows[i]
			if r.line == 0 {
				continue
			}
			m := firstAt
			if s.rows[i+1].addr == r.addr {
				if !f.merged {
					continue // addr2line's view: such a row places no line
				}
				m = mergedAt
			}
			l := Line{File: t.files[r.file], Line: int(r.line)}
			if a, ok := m[l]; !ok || max(r.addr, lo) < a {
				m[l] = max(r.addr, lo)
			}
		}
		at = s.hi()
	}
	for l, a := range mergedAt {
		if _, ok := firstAt[l]; !ok {
			firstAt[l] = a
		}
	}
	lines := make([]Line, 0, len(firstAt))
	for l := range firstAt {
		lines = append(lines, l)
	}
	SortLines(lines)
	addrs := make([]uint64, len(lines))
	for i, l := range lines {
		addrs[i] = firstAt[l]
	}
	return lines, addrs, nil
}

// DeclLine is the line a function is declared at (DW_AT_decl_file and
// DW_AT_decl_line of the subprogram whose code starts at the link-time
// address addr, through its abstract origin or specification where the
// concrete copy holds only its code): what FUNC:+N counts from, as perf
// probe's relative lines do.
func (f *File) DeclLine(addr uint64) (Line, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return Line{}, errors.New("debuginfo: file closed")
	}
	off, err := f.unitAt(addr)
	if err != nil {
		return Line{}, err
	}
	d, cu, _, err := f.unit(off)
	if err != nil {
		return Line{}, err
	}
	lr, err := d.LineReader(cu)
	if err != nil || lr == nil {
		return Line{}, fmt.Errorf("%#x: its unit has no line table: %w", addr, ErrNoLine)
	}
	files := lr.Files()
	compDir, _ := cu.Val(dwarf.AttrCompDir).(string)
	rd := d.Reader()
	rd.Next()
	for {
		e, err := rd.Next()
		if err != nil {
			return Line{}, err
		}
		if e == nil || e.Tag == 0 {
			break
		}
		if e.Tag == dwarf.TagSubprogram && startsAt(d, e, addr) {
			return declOf(d, e, files, compDir)
		}
		if e.Children {
			rd.SkipChildren()
		}
	}
	return Line{}, fmt.Errorf("%#x: no subprogram of its unit starts there: %w", addr, ErrNoLine)
}

// startsAt reports whether the subprogram e's code starts at addr: its
// low_pc, or, for a function split into a hot and a cold part
// (DW_AT_ranges instead, as gcc gives foo and foo.cold), the start of one
// of its ranges.
func startsAt(d *dwarf.Data, e *dwarf.Entry, addr uint64) bool {
	if lo, ok := e.Val(dwarf.AttrLowpc).(uint64); ok {
		return lo == addr
	}
	if e.Val(dwarf.AttrRanges) == nil {
		return false
	}
	rs, _ := d.Ranges(e)
	for _, r := range rs {
		if r[0] == addr {
			return true
		}
	}
	return false
}

// declOf reads e's declaration, following its abstract origin or
// specification (at most a few hops).
func declOf(d *dwarf.Data, e *dwarf.Entry, files []*dwarf.LineFile, compDir string) (Line, error) {
	for hop := 0; hop < 4; hop++ {
		line, lok := e.Val(dwarf.AttrDeclLine).(int64)
		file, fok := e.Val(dwarf.AttrDeclFile).(int64)
		if lok && fok && file >= 0 && int(file) < len(files) && files[file] != nil {
			return Line{File: fileName(files[file].Name, compDir), Line: int(line)}, nil
		}
		next, ok := e.Val(dwarf.AttrAbstractOrigin).(dwarf.Offset)
		if !ok {
			if next, ok = e.Val(dwarf.AttrSpecification).(dwarf.Offset); !ok {
				break
			}
		}
		rd := d.Reader()
		rd.Seek(next)
		var err error
		if e, err = rd.Next(); err != nil || e == nil {
			break
		}
	}
	return Line{}, fmt.Errorf("the subprogram has no declaration line: %w", ErrNoLine)
}

// matchFiles marks the files of a line table that suffix names, and
// gives the first of them ("" when none).
func matchFiles(files []string, suffix string) (match []bool, first string) {
	match = make([]bool, len(files))
	for i, name := range files {
		if MatchFile(name, suffix) {
			match[i] = true
			if first == "" {
				first = name
			}
		}
	}
	return match, first
}
