package report

import (
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cover"
)

// CoverSummary is a coverage run's totals and timeline as of now, named
// session, without the functions: what a session's description carries.
func CoverSummary(s *cover.Set, session string, now time.Time) *api.CoverReport {
	sum := s.Summary(now)
	rep := &api.CoverReport{Session: session, Filter: sum.Filter, FunctionCount: sum.Functions, TotalBlocks: sum.TotalBlocks,
		RefusedBlocks: sum.RefusedBlocks, CoveredBlocks: sum.CoveredBlocks, Armed: sum.Armed, Inferred: sum.Inferred,
		CoveredInferred: sum.CoveredInferred, Removed: sum.Removed, ArmNS: int64(sum.Arm), PlanNS: int64(sum.Plan), DurationNS: int64(sum.Duration),
		Timeline: make([]api.CoverSample, len(sum.Timeline))}
	for i, t := range sum.Timeline {
		rep.Timeline[i] = api.CoverSample{ElapsedNS: int64(t.Elapsed), LiveProbes: t.LiveProbes, Covered: t.Covered}
	}
	return rep
}

// Cover is the coverage as of now, named session: the summary and every
// function's blocks, built afresh (the caller owns it).
func Cover(s *cover.Set, session string, now time.Time) *api.CoverReport {
	rep := CoverSummary(s, session, now)
	rep.Functions = make([]api.CoverFunction, 0, rep.FunctionCount)
	for f := range s.Functions() {
		rep.Functions = append(rep.Functions, coverFunction(f))
	}
	return rep
}

func coverFunction(f cover.Function) api.CoverFunction {
	out := api.CoverFunction{Function: f.Name, Module: f.Module, Address: api.Addr(f.Addr), Total: len(f.Blocks),
		Covered: f.Covered, Refused: f.Refused, Error: f.Error, Blocks: make([]api.CoverBlock, len(f.Blocks))}
	for i, b := range f.Blocks {
		cb := api.CoverBlock{Index: b.Index, Inferred: b.Inferred, Start: api.Addr(b.Start), End: api.Addr(b.End),
			Covered: b.Covered, Lines: []string{}}
		if b.Point != "" {
			cb.Point = &b.Point
		}
		if b.Refused != "" {
			cb.Refused = &b.Refused
		}
		out.Blocks[i] = cb
	}
	return out
}
