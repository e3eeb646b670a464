package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
)

// lineRange is kinst cover --file FILE --lines A-B: the lines A to B of
// one source file.
type lineRange struct {
	module string // a kernel module's source file (--file MODULE:FILE)
	file   string
	lo, hi int
}

// parseLineRange reads --lines (A-B, or A alone) for the one --file
// it needs; nil when --lines is not given.
func parseLineRange(o CoverOptions) (*lineRange, error) {
	if o.Lines == "" {
		return nil, nil
	}
	if len(o.Files) != 1 {
		return nil, fmt.Errorf("--lines %s: name the one source file the lines are of with --file (given %d)", o.Lines, len(o.Files))
	}
	a, b, found := strings.Cut(o.Lines, "-")
	if !found {
		b = a
	}
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil || lo <= 0 || hi < lo {
		return nil, fmt.Errorf("--lines %q: want A-B, two line numbers with A ≤ B (or one line)", o.Lines)
	}
	mod, file := splitModuleFile(o.Files[0])
	return &lineRange{module: mod, file: file, lo: lo, hi: hi}, nil
}

func (r *lineRange) String() string { return fmt.Sprintf("%s:%d-%d", r.file, r.lo, r.hi) }

// funcs are the functions whose code holds some of the range's lines,
// inlined copies included.
func (r *lineRange) funcs(dbg *debuginfo.File) ([]string, error) {
	as, err := dbg.LineRangeAddrs(r.file, r.lo, r.hi)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.Func
	}
	return out, nil
}

// has: one of lines (a block's, file:line) is in the range.
func (r *lineRange) has(lines []string) bool {
	for _, l := range lines {
		i := strings.LastIndexByte(l, ':')
		if i < 0 {
			continue
		}
		n, err := strconv.Atoi(l[i+1:])
		if err == nil && n >= r.lo && n <= r.hi && debuginfo.MatchFile(l[:i], r.file) {
			return true
		}
	}
	return false
}

// keep is rep with only the blocks that hold a line of the range, and the
// functions that have one, their totals counted again; the probes'
// figures (armed, removed, the timeline) stay those of the session.
func (r *lineRange) keep(rep api.CoverReport) api.CoverReport {
	out := rep
	out.Functions = nil
	out.FunctionCount, out.TotalBlocks, out.CoveredBlocks, out.RefusedBlocks, out.Inferred, out.CoveredInferred = 0, 0, 0, 0, 0, 0
	for _, f := range rep.Functions {
		g := f
		g.Blocks, g.Total, g.Covered, g.Refused = nil, 0, 0, 0
		for _, b := range f.Blocks {
			if !r.has(b.Lines) {
				continue
			}
			g.Blocks = append(g.Blocks, b)
			g.Total++
			switch {
			case b.Covered:
				g.Covered++
			case b.Refused != nil && !b.Inferred:
				g.Refused++
			}
			if b.Inferred {
				out.Inferred++
				if b.Covered {
					out.CoveredInferred++
				}
			}
		}
		if g.Total == 0 {
			continue
		}
		out.Functions = append(out.Functions, g)
		out.FunctionCount++
		out.TotalBlocks += g.Total
		out.CoveredBlocks += g.Covered
		out.RefusedBlocks += g.Refused
	}
	return out
}
