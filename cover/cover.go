// Package cover owns coverage probes: a hit flag at every basic block of
// a set of functions that can take one, each removed once its flag is set,
// so the cost of coverage falls as it saturates. The same Set serves the
// kernel (kerninstd's coverage sessions) and a user process (kinst cover
// --user), through whichever engine.Engine splices its text.
//
// A Set is not safe for concurrent use: its owner serialises Arm, Sweep,
// Remove and Report (kerninstd under Daemon.mu; the process command from
// one goroutine).
package cover

import (
	"errors"
	"fmt"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
)

// Engine is what a Set splices through: an engine.Engine (the kernel's),
// or a process.Target (a process's, over an engine per region).
type Engine interface {
	AddEach(sites []*splice.Site, sp engine.Spec) ([]*engine.Request, []error)
	RemoveEach(rs []*engine.Request) []error
	Hit(r *engine.Request) bool
}

// Set is one coverage run: the report (blocks, totals, timeline), kept
// current, and the probes still spliced.
type Set struct {
	report  api.CoverReport
	pending []Probe // planned by Add, spliced by Arm
	live    []Probe
	armed   time.Time
}

// Probe is one block's probe: the request, once armed, and the block it
// is for (Report().Functions[Function].Blocks[Block]).
type Probe struct {
	Request         *engine.Request
	Function, Block int
	site            *splice.Site
	covered         bool // seen hit; its removal failed and is retried
}

// New starts a Set; filter describes whose execution covers ("pid 42"),
// "" for everyone's.
func New(filter string) *Set {
	return &Set{report: api.CoverReport{Filter: filter, Functions: []api.CoverFunction{}, Timeline: []api.CoverSample{}}}
}

// Add plans a probe at every block of f, at the block's cheapest
// spliceable instruction (splice.Func.Block). A block with none is listed
// with the planner's reason; padding is not a block of the function and
// is left out.
func (s *Set) Add(f *splice.Func) {
	fn := f.Fn
	cf := api.CoverFunction{Function: fn.Name, Module: fn.Module, Address: api.Addr(fn.Addr), Blocks: []api.CoverBlock{}}
	at := len(s.report.Functions)
	for b := range f.Blocks {
		blk := &f.Blocks[b]
		if blk.Padding || blk.N == 0 {
			continue
		}
		last := blk.Last(fn)
		cb := api.CoverBlock{Index: b, Start: api.Addr(blk.Start(fn)), End: api.Addr(last.Addr + uint64(last.Len())), Lines: []string{}}
		site, err := f.Resolve(splice.Point{Spec: fmt.Sprintf("%s:%d", fn.Name, b), Function: fn.Name, Block: b, HasBlock: true})
		if err != nil {
			why := Refusal(err)
			cb.Refused = &why
			cf.Refused++
		} else {
			// Detached: the session holds a site for every block, so the
			// function's decoded instructions go once it is planned.
			s.pending = append(s.pending, Probe{Function: at, Block: len(cf.Blocks), site: site.Detached()})
		}
		cf.Blocks = append(cf.Blocks, cb)
	}
	cf.Total = len(cf.Blocks)
	s.report.Functions = append(s.report.Functions, cf)
}

// AddUnreadable lists a function a glob, module or call graph reached
// that could not be read as a function: with the reason and no blocks.
func (s *Set) AddUnreadable(sym kernel.Symbol, err error) {
	s.report.Functions = append(s.report.Functions, api.CoverFunction{Function: sym.Name, Module: sym.Module,
		Address: api.Addr(sym.Addr), Error: Refusal(err), Blocks: []api.CoverBlock{}})
}

// Refusal is why a block takes no probe, without the location the report
// already gives.
func Refusal(err error) string {
	var ns *splice.NoSpliceError
	if errors.As(err, &ns) {
		return ns.Reason
	}
	return err.Error()
}

// Flag is the probe's snippet: one byte set in its slot (codegen.HitFlag),
// under pred when there is one.
func Flag(pred codegen.Predicate) engine.SnippetFunc {
	return func(c []uint64) codegen.Snippet {
		var s codegen.Snippet = codegen.HitFlag{Addr: c[0]}
		if pred != nil {
			s = codegen.Guard{If: pred, Then: []codegen.Snippet{s}}
		}
		return s
	}
}

// Arm splices every probe planned since the last Arm in one engine batch,
// owned by owner, timing it with now. A probe the engine cannot install
// leaves its block refused with the error; the others stay. Arm again
// after Add when more functions come (a library a process loads later):
// the timeline keeps counting from the first Arm, ArmNS adds up.
func (s *Set) Arm(eng Engine, owner string, snippet engine.SnippetFunc, now func() time.Time) {
	sites := make([]*splice.Site, len(s.pending))
	for i, p := range s.pending {
		sites[i] = p.site
	}
	start := now()
	reqs, errs := eng.AddEach(sites, engine.Spec{Owner: owner, Slots: 1, Snippet: snippet})
	end := now()
	first := s.armed.IsZero()
	if first {
		s.armed = end
	}
	s.report.ArmNS += int64(end.Sub(start))
	for i, r := range reqs {
		p := s.pending[i]
		f := &s.report.Functions[p.Function]
		b := &f.Blocks[p.Block]
		if errs[i] != nil {
			why := Refusal(errs[i])
			b.Refused = &why
			f.Refused++
			continue
		}
		at := fmt.Sprintf("%s+%#x", r.Site().Fn.Name, r.Site().Addr()-r.Site().Fn.Addr)
		b.Point = &at
		p.Request, p.site = r, nil
		s.live = append(s.live, p)
	}
	s.pending = nil
	s.report.TotalBlocks = 0
	for _, f := range s.report.Functions {
		s.report.TotalBlocks += f.Total
	}
	s.report.Armed = len(s.live) + s.report.Removed
	sample := api.CoverSample{LiveProbes: len(s.live), Covered: s.report.CoveredBlocks}
	if !first {
		sample.ElapsedNS = int64(end.Sub(s.armed))
	}
	s.report.Timeline = append(s.report.Timeline, sample)
}

// Sweep marks the blocks whose probe has run as covered and removes those
// probes in one batch (one wait frees all their patches). A probe that
// cannot be removed stays live, to be tried again; its error is returned
// with the probe.
func (s *Set) Sweep(eng Engine, now time.Time) map[*engine.Request]error {
	var hit, live []Probe
	for _, p := range s.live {
		if eng.Hit(p.Request) {
			hit = append(hit, p)
		} else {
			live = append(live, p)
		}
	}
	if len(hit) == 0 {
		return nil
	}
	rs := make([]*engine.Request, len(hit))
	for i, p := range hit {
		rs[i] = p.Request
		if p.covered {
			continue
		}
		hit[i].covered = true
		f := &s.report.Functions[p.Function]
		f.Blocks[p.Block].Covered = true
		f.Covered++
		s.report.CoveredBlocks++
	}
	var failed map[*engine.Request]error
	for i, err := range eng.RemoveEach(rs) {
		if err != nil {
			if failed == nil {
				failed = map[*engine.Request]error{}
			}
			failed[rs[i]] = err
			live = append(live, hit[i])
			continue
		}
		s.report.Removed++
	}
	s.live = live
	s.report.Timeline = append(s.report.Timeline, api.CoverSample{ElapsedNS: int64(now.Sub(s.armed)),
		LiveProbes: len(live), Covered: s.report.CoveredBlocks})
	return failed
}

// Mark marks the blocks whose probe has run as covered without removing
// anything: for text that has gone (an exited process), whose flags are
// still readable.
func (s *Set) Mark(eng Engine, now time.Time) {
	for i := range s.live {
		p := &s.live[i]
		if p.covered || !eng.Hit(p.Request) {
			continue
		}
		p.covered = true
		f := &s.report.Functions[p.Function]
		f.Blocks[p.Block].Covered = true
		f.Covered++
		s.report.CoveredBlocks++
	}
	s.report.Timeline = append(s.report.Timeline, api.CoverSample{ElapsedNS: int64(now.Sub(s.armed)),
		LiveProbes: len(s.live), Covered: s.report.CoveredBlocks})
}

// Remove removes every probe still live; it reports whether none is
// left. Sweep first: the last hits count.
func (s *Set) Remove(eng Engine) (bool, error) {
	rs := make([]*engine.Request, len(s.live))
	for i, p := range s.live {
		rs[i] = p.Request
	}
	var kept []Probe
	var errs []error
	for i, err := range eng.RemoveEach(rs) {
		if err != nil {
			errs = append(errs, err)
			kept = append(kept, s.live[i])
		}
	}
	s.live = kept
	return len(kept) == 0, errors.Join(errs...)
}

// Live is the probes still spliced.
func (s *Set) Live() []Probe { return s.live }

// Report is a copy of the coverage as of now, named session.
func (s *Set) Report(session string, now time.Time) *api.CoverReport {
	rep := s.report
	rep.Session = session
	rep.DurationNS = int64(now.Sub(s.armed))
	rep.Functions = make([]api.CoverFunction, len(s.report.Functions))
	for i, f := range s.report.Functions {
		f.Blocks = append([]api.CoverBlock(nil), f.Blocks...)
		rep.Functions[i] = f
	}
	rep.Timeline = append([]api.CoverSample(nil), s.report.Timeline...)
	return &rep
}

// Sites is the probe sites Add would plan for f's blocks, in block order
// (the refused left out).
func Sites(f *splice.Func) []*splice.Site {
	s := New("")
	s.Add(f)
	out := make([]*splice.Site, len(s.pending))
	for i, p := range s.pending {
		out[i] = p.site
	}
	return out
}
