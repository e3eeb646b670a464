package splice

import (
	"fmt"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/cfg"
)

// TimerSite is one site of a timer: where a call is counted, and where a
// thread enters or leaves what is timed.
type TimerSite struct {
	Site               *Site
	Count, Enter, Exit bool
}

// Span is [Lo, Hi), offsets into a function.
type Span struct{ Lo, Hi uint64 }

// RegionSites plans the sites of a timer over the code of f at spans
// (the code of a range of source lines, debuginfo.LineRangeSpans):
// cfg.Region's plan, each site spliced at its instruction or, where that
// cannot be spliced (a kernel function's ftrace nop), at the next
// instruction of its block that can, when nothing between them is a call
// and they are on the same side of the region's edge (the timer then
// gains or loses those instructions' time only).
func (f *Func) RegionSites(spans []Span) ([]TimerSite, error) {
	fn := f.Fn
	for _, sp := range spans {
		if sp.Lo >= sp.Hi || sp.Hi > fn.End-fn.Addr {
			return nil, fmt.Errorf("span %#x-%#x is not inside %s (%d bytes)", sp.Lo, sp.Hi, fn.Name, fn.End-fn.Addr)
		}
	}
	in := func(i int) bool {
		off := fn.Insns[i].Addr - fn.Addr
		for _, sp := range spans {
			if off >= sp.Lo && off < sp.Hi {
				return true
			}
		}
		return false
	}
	plan, err := cfg.Region(fn, f.Blocks, in)
	if err != nil {
		return nil, fmt.Errorf("cannot time it in %s exactly: %w", fn.Name, err)
	}
	out := make([]TimerSite, 0, len(plan))
	for _, rs := range plan {
		s, err := f.regionSite(rs.Index, in)
		if err != nil {
			return nil, err
		}
		out = append(out, TimerSite{Site: s, Count: rs.Count, Enter: rs.Enter, Exit: rs.Exit})
	}
	return out, nil
}

// regionSite is the site of a region's instruction i (RegionSites).
func (f *Func) regionSite(i int, in func(int) bool) (*Site, error) {
	s, err := f.At(i)
	if err == nil {
		return s, nil
	}
	for _, b := range f.Blocks {
		if i < b.First || i >= b.First+b.N {
			continue
		}
		for j := i + 1; j < b.First+b.N; j++ {
			if f.Fn.Insns[j-1].Inst.Op == x86asm.CALL || in(j) != in(i) {
				break
			}
			if s, err := f.At(j); err == nil {
				return s, nil
			}
		}
	}
	return nil, err
}
