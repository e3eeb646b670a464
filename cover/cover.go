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
	"slices"
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

	// all: probe every block (AllBlocks); otherwise a block whose
	// coverage follows from its successors' has none (Inferable).
	all bool
	// from maps an inferred block to the blocks it is inferred from, up
	// the other way; reserve keeps an inferred block's site, armed if a
	// block it is inferred from cannot be.
	from    map[blockRef][]blockRef
	up      map[blockRef][]blockRef
	reserve map[blockRef]*splice.Site
	noProbe map[blockRef]string // why an inferred block could take no probe
}

// blockRef is a block of the report: Functions[f].Blocks[b].
type blockRef struct{ f, b int32 }

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

// Planned is the number of probes Add planned that Arm has not armed.
func (s *Set) Planned() int { return len(s.pending) }

// AllBlocks makes Add probe every block, none inferred (kinst cover
// --all-blocks; bench arm).
func (s *Set) AllBlocks() { s.all = true }

// Add plans a probe at every block of f, at the block's cheapest
// spliceable instruction (splice.Func.Block), except the blocks whose
// coverage follows from their successors' (Inferable), unless AllBlocks.
// A block with no spliceable instruction is listed with the planner's
// reason; padding is not a block of the function and is left out.
func (s *Set) Add(f *splice.Func) {
	fn := f.Fn
	cf := api.CoverFunction{Function: fn.Name, Module: fn.Module, Address: api.Addr(fn.Addr), Blocks: []api.CoverBlock{}}
	at := int32(len(s.report.Functions))
	pos := make(map[int]int32, len(f.Blocks)) // cfg block → its place in cf.Blocks
	sites := make(map[int]*splice.Site, len(f.Blocks))
	hdr := fn.Header() // shared by the function's detached sites
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
			d := site.Detached(hdr)
			// The report names the block; its spec string would be a
			// tenth of the site.
			d.Point.Spec = ""
			sites[b] = d
		}
		pos[b] = int32(len(cf.Blocks))
		cf.Blocks = append(cf.Blocks, cb)
	}
	var inf map[int][]int
	if !s.all {
		inf = Inferable(f, func(b int) bool { return sites[b] != nil })
	}
	if len(inf) > 0 && s.from == nil {
		s.from, s.up, s.reserve, s.noProbe = map[blockRef][]blockRef{}, map[blockRef][]blockRef{}, map[blockRef]*splice.Site{}, map[blockRef]string{}
	}
	for b := range f.Blocks {
		p, ok := pos[b]
		if !ok {
			continue
		}
		ref := blockRef{at, p}
		if succs, ok := inf[b]; ok {
			cb := &cf.Blocks[p]
			cb.Inferred = true
			s.report.Inferred++
			if cb.Refused != nil {
				// No probe fits, but none is needed: its coverage is
				// known. The reason comes back if the inference breaks.
				cf.Refused--
				s.noProbe[ref], cb.Refused = *cb.Refused, nil
			}
			for _, sb := range succs {
				sr := blockRef{at, pos[sb]}
				s.from[ref] = append(s.from[ref], sr)
				s.up[sr] = append(s.up[sr], ref)
			}
			if site := sites[b]; site != nil {
				s.reserve[ref] = site
			}
			continue
		}
		if site := sites[b]; site != nil {
			s.pending = append(s.pending, Probe{Function: int(at), Block: int(p), site: site})
		}
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
	pending := s.pending
	// An inferred block relies on its successors' probes: where one could
	// not be armed, the block gets its own probe (and so on up).
	for failed := s.refusedRefs(pending, errs); len(failed) > 0; {
		more := s.uninfer(failed)
		if len(more) == 0 {
			break
		}
		msites := make([]*splice.Site, len(more))
		for i, p := range more {
			msites[i] = p.site
		}
		mreqs, merrs := eng.AddEach(msites, engine.Spec{Owner: owner, Slots: 1, Snippet: snippet})
		pending, reqs, errs = append(pending, more...), append(reqs, mreqs...), append(errs, merrs...)
		failed = s.refusedRefs(more, merrs)
	}
	end := now()
	first := s.armed.IsZero()
	if first {
		s.armed = end
	}
	s.report.ArmNS += int64(end.Sub(start))
	for i, r := range reqs {
		p := pending[i]
		f := &s.report.Functions[p.Function]
		b := &f.Blocks[p.Block]
		if errs[i] != nil {
			why := Refusal(errs[i])
			b.Refused = &why
			f.Refused++
			continue
		}
		at := p.site.Where()
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
		s.markCovered(blockRef{int32(p.Function), int32(p.Block)})
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
		s.markCovered(blockRef{int32(p.Function), int32(p.Block)})
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

// markCovered marks a block covered, and the inferred blocks that its
// coverage implies.
func (s *Set) markCovered(ref blockRef) {
	f := &s.report.Functions[ref.f]
	if b := &f.Blocks[ref.b]; !b.Covered {
		b.Covered = true
		f.Covered++
		s.report.CoveredBlocks++
		if b.Inferred {
			s.report.CoveredInferred++
		}
	}
	for _, p := range s.up[ref] {
		if !s.report.Functions[p.f].Blocks[p.b].Covered {
			s.markCovered(p)
		}
	}
}

// refusedRefs is the blocks of probes whose arming failed.
func (s *Set) refusedRefs(ps []Probe, errs []error) []blockRef {
	var out []blockRef
	for i, err := range errs {
		if err != nil {
			out = append(out, blockRef{int32(ps[i].Function), int32(ps[i].Block)})
		}
	}
	return out
}

// uninfer takes back the inferences that rely on the blocks of failed,
// directly or through other inferred blocks: each such block is probed
// itself (the probes returned, to arm), or, with no site, left uncovered
// and refused, which takes back the inferences relying on it in turn.
func (s *Set) uninfer(failed []blockRef) []Probe {
	var more []Probe
	for len(failed) > 0 {
		ref := failed[0]
		failed = failed[1:]
		for _, p := range s.up[ref] {
			cb := &s.report.Functions[p.f].Blocks[p.b]
			if !cb.Inferred {
				continue
			}
			cb.Inferred = false
			s.report.Inferred--
			for _, sr := range s.from[p] {
				s.up[sr] = slices.DeleteFunc(s.up[sr], func(x blockRef) bool { return x == p })
			}
			delete(s.from, p)
			if site := s.reserve[p]; site != nil {
				more = append(more, Probe{Function: int(p.f), Block: int(p.b), site: site})
			} else {
				why := s.noProbe[p] + " (and a block it was inferred from took no probe)"
				cb.Refused = &why
				s.report.Functions[p.f].Refused++
				failed = append(failed, p)
			}
			delete(s.reserve, p)
		}
		delete(s.up, ref)
	}
	return more
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
	s.AllBlocks()
	s.Add(f)
	out := make([]*splice.Site, len(s.pending))
	for i, p := range s.pending {
		out[i] = p.site
	}
	return out
}
