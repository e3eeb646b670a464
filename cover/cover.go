// Package cover owns coverage probes: a hit flag at every basic block of
// a set of functions that can take one, each removed once its flag is set,
// so the cost of coverage falls as it saturates. The same Set serves the
// kernel (kerninstd's coverage sessions) and a user process (kinst cover
// --user), through whichever engine.Engine splices its text.
//
// A Set is not safe for concurrent use: its owner serialises Arm, Sweep,
// Remove, Summary and Functions (kerninstd under Daemon.mu; the process
// command from one goroutine).
package cover

import (
	"errors"
	"fmt"
	"iter"
	"slices"
	"time"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// Engine is what a Set splices through: an engine.Engine (the kernel's),
// or a process.Target (a process's, over an engine per region).
type Engine interface {
	AddEach(sites []*splice.Site, sp engine.Spec) ([]*engine.Request, []error)
	RemoveEach(rs []*engine.Request) []error
	Hit(r *engine.Request) bool
}

// Poll is how often the owner of a Set looks for probes that have run
// (Sweep): kerninstd's sessions and kinst cover --user alike. Sooner
// costs a scan of every live flag more often; later leaves probes that
// ran spliced, and costing, for longer.
const Poll = 50 * time.Millisecond

// Set is one coverage run: every block's state (kept compact: a
// whole-kernel session has over half a million), the totals and the
// timeline, and the probes still spliced. What it reports is built on
// demand (Summary, Functions).
type Set struct {
	filter   string
	fns      []function
	reasons  []string         // refusal reasons, each once; block.why is an index + 1
	reasonAt map[string]int32 // reasons' indices

	covered, inferred, coveredInferred, removed, armedN int
	armNS, planNS                                       int64
	timeline                                            []Sample
	planStart                                           time.Time // Planning's; zero when not said

	pending []Probe // planned by Add, spliced by Arm
	live    []Probe
	armed   time.Time

	// all: probe every block (AllBlocks); otherwise a block whose
	// coverage follows from its successors' has none (Inferable).
	all bool
	// up is every inference of the blocks planned since the last Arm
	// (block to is inferred from block from; sorted by from once Arm
	// needs it, nil after it); reserve keeps an inferred block's site,
	// armed if a block it is inferred from cannot be. They and noProbe
	// are of the blocks planned since the last Arm; upArmed is up's edges
	// of the blocks armed, sorted by from. (Edges in one slice, not maps
	// of slices: a whole kernel's took 25 MB of small objects that way.)
	up       []inference
	upSorted bool
	upArmed  []inference
	reserve  map[blockRef]*splice.Site
	noProbe  map[blockRef]int32 // why an inferred block could take no probe (a reason index + 1)
	// runs are the blocks planned since the last Arm whose own probe
	// needs a trap, each with the covering run from the block before it
	// that reaches it instead (splice.Func.RunIntoBlock): armed when the
	// probe is refused (no punned jmp fits).
	runs map[blockRef]runInto
}

// runInto is a block's probe by a covering run from the block before it:
// the run's site (a probe of pred) and the block's first instruction in
// it (the block's probe).
type runInto struct {
	pred      int32 // the block before, in the same function
	run, into *splice.Site
}

// function is one function of the run (Function without the per-block
// strings).
type function struct {
	name, module     string
	addr             uint64
	err              string // why it could not be read (no blocks)
	covered, refused int32
	blocks           []block
}

// block is one block's state: 32 bytes, where its Block (or
// api.CoverBlock) with its point's string takes about 130.
type block struct {
	start uint32 // offset in the function (24 bytes a block: a whole kernel has half a million)
	size  uint32
	index int32  // in the function's CFG (kinst cfg)
	probe uint32 // offset in the function of the instruction probed, + 1; 0: none
	why   int32  // the refusal, an index in Set.reasons + 1; 0: not refused
	flags blockFlags
}

type blockFlags uint8

const (
	blockInferred blockFlags = 1 << iota
	blockCovered
)

// blockRef is a block of the run: fns[f].blocks[b].
type blockRef struct{ f, b int32 }

// Probe is one block's probe: the request, once armed, and the block it
// is for (the Function-th of Functions, its Block-th block).
type Probe struct {
	Request         *engine.Request
	Function, Block int32
	site            *splice.Site
}

// New starts a Set; filter describes whose execution covers ("pid 42"),
// "" for everyone's.
func New(filter string) *Set {
	return &Set{filter: filter, reasonAt: map[string]int32{}}
}

// Planning says that finding, reading and planning the run's functions
// began at start: the first Arm reports the time from there to its own
// start as the plan time (Summary.Plan).
func (s *Set) Planning(start time.Time) { s.planStart = start }

// Planned is the number of probes Add planned that Arm has not armed.
func (s *Set) Planned() int { return len(s.pending) }

// AllBlocks makes Add probe every block, none inferred (kinst cover
// --all-blocks; bench arm).
func (s *Set) AllBlocks() { s.all = true }

// reason is why's index + 1 in s.reasons.
func (s *Set) reason(why string) int32 {
	i, ok := s.reasonAt[why]
	if !ok {
		i = int32(len(s.reasons))
		s.reasons = append(s.reasons, why)
		s.reasonAt[why] = i
	}
	return i + 1
}

// refuse marks a block refused for why.
func (s *Set) refuse(ref blockRef, why string) {
	s.fns[ref.f].blocks[ref.b].why = s.reason(why)
	s.fns[ref.f].refused++
}

// Add plans a probe at every block of f, at the block's cheapest
// spliceable instruction (splice.Func.Block), except the blocks whose
// coverage follows from their successors' (Inferable), unless AllBlocks.
// A block with no spliceable instruction is listed with the planner's
// reason; padding is not a block of the function and is left out.
// Add is AddPlan(s.Plan(f)).
func (s *Set) Add(f *splice.Func) { s.AddPlan(s.Plan(f)) }

// FuncPlan is one function's blocks and probes, planned (Set.Plan) but
// not yet part of a Set (Set.AddPlan).
type FuncPlan struct {
	fn    function
	whys  []string       // per kept block: the refusal, "" if none
	sites []*splice.Site // per kept block: its detached site, nil if refused
	// inf: Inferable's answer, by kept block (not cfg block).
	inf map[int32][]int32
	// runs: by kept block, the run from the block before (Set.runs).
	runs map[int32]runInto
}

// Plan is the costly half of Add: every block of f resolved to a probe
// site (detached, so the function's decoded instructions go once the
// plan is made) and the inferable blocks found. It reads only the Set's
// AllBlocks choice, so Plans of functions that share no splice.Verdicts
// (the kernel planner's share none; a process target's get one each from
// process.Target.EachFunc) may run at once beside each other, not beside
// AddPlan or AllBlocks; AddPlan takes them in order.
func (s *Set) Plan(f *splice.Func) *FuncPlan {
	fn := f.Fn
	n := 0
	for b := range f.Blocks {
		if blk := &f.Blocks[b]; !blk.Padding && blk.N > 0 {
			n++
		}
	}
	// Exactly as many blocks as are kept: a whole kernel's are half a
	// million, held for the session's life.
	p := &FuncPlan{
		fn:    function{name: fn.Name, module: fn.Module, addr: fn.Addr, blocks: make([]block, 0, n)},
		whys:  make([]string, n),
		sites: make([]*splice.Site, n),
	}
	pos := make(map[int]int32, n) // cfg block → its place in fn.blocks
	hdr := fn.Header()            // shared by the function's detached sites
	for b := range f.Blocks {
		blk := &f.Blocks[b]
		if blk.Padding || blk.N == 0 {
			continue
		}
		last := blk.Last(fn)
		start := blk.Start(fn)
		k := int32(len(p.fn.blocks))
		site, err := f.Resolve(splice.Point{Function: fn.Name, Block: b, HasBlock: true})
		if err != nil {
			p.whys[k] = Refusal(err)
		} else {
			// Detached: the session holds a site for every block, so the
			// function's decoded instructions go once it is planned.
			p.sites[k] = site.Detached(hdr)
		}
		pos[b] = k
		p.fn.blocks = append(p.fn.blocks, block{start: uint32(start - p.fn.addr), size: uint32(last.Addr + uint64(last.Len()) - start), index: int32(b)})
		if site != nil && (site.Class == springboard.Trap || site.Class == springboard.Springboard) && f.Facts().NoTrap != "" {
			p.planRun(f, b, k, pos, hdr)
		}
	}
	if !s.all {
		inf := Inferable(f, func(b int) bool {
			k, ok := pos[b]
			return ok && p.sites[k] != nil
		})
		if len(inf) > 0 {
			p.inf = make(map[int32][]int32, len(inf))
			for b, succs := range inf {
				if _, ok := pos[b]; !ok {
					continue
				}
				ks := make([]int32, len(succs))
				for i, sb := range succs {
					ks[i] = pos[sb]
				}
				p.inf[pos[b]] = ks
			}
		}
	}
	return p
}

// planRun plans the covering run from the block before cfg block b (kept
// block k) that reaches b without the trap its own probe needs, where
// traps are refused and the punned jmp the engine tries instead may not
// fit (Set.runs).
func (p *FuncPlan) planRun(f *splice.Func, b int, k int32, pos map[int]int32, hdr *cfg.Function) {
	pred, ok := pos[b-1]
	if !ok {
		return
	}
	run, into, ok := f.RunIntoBlock(b)
	if !ok {
		return
	}
	at := slices.Index(run.Covered(), into)
	d := run.Detached(hdr)
	if p.runs == nil {
		p.runs = map[int32]runInto{}
	}
	p.runs[k] = runInto{pred: pred, run: d, into: d.Covered()[at]}
}

// AddPlan makes p's function the Set's next, its probes planned for the
// next Arm.
func (s *Set) AddPlan(p *FuncPlan) {
	cf := p.fn
	at := int32(len(s.fns))
	if len(p.inf) > 0 && s.reserve == nil { // none since the last Arm
		s.reserve, s.noProbe = map[blockRef]*splice.Site{}, map[blockRef]int32{}
	}
	for k, r := range p.runs {
		if s.runs == nil {
			s.runs = map[blockRef]runInto{}
		}
		s.runs[blockRef{at, k}] = r
	}
	for k := range cf.blocks {
		ref := blockRef{at, int32(k)}
		cb := &cf.blocks[k]
		if why := p.whys[k]; why != "" {
			cb.why = s.reason(why)
			cf.refused++
		}
		site := p.sites[k]
		if succs, ok := p.inf[int32(k)]; ok {
			cb.flags |= blockInferred
			s.inferred++
			if cb.why != 0 {
				// No probe fits, but none is needed: its coverage is
				// known. The reason comes back if the inference breaks.
				cf.refused--
				s.noProbe[ref], cb.why = cb.why, 0
			}
			for _, sk := range succs {
				s.up = append(s.up, inference{from: blockRef{at, sk}, to: ref})
			}
			s.upSorted = false
			if site != nil {
				s.reserve[ref] = site
			}
			continue
		}
		if site != nil {
			s.pending = append(s.pending, Probe{Function: at, Block: int32(k), site: site})
		}
	}
	s.fns = append(s.fns, cf)
}

// AddUnreadable lists a function a glob, module or call graph reached
// that could not be read as a function: with the reason and no blocks.
func (s *Set) AddUnreadable(sym kernel.Symbol, err error) {
	s.fns = append(s.fns, function{name: sym.Name, module: sym.Module, addr: sym.Addr, err: Refusal(err)})
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
	spec := engine.Spec{Owner: owner, Slots: 1, Snippet: snippet}
	start := now()
	if s.armed.IsZero() && !s.planStart.IsZero() {
		s.planNS = int64(start.Sub(s.planStart))
	}
	// The probes go in chunks, each chunk's armed probes written back
	// over the planned ones they came from: a whole kernel's half a
	// million would otherwise be held twice (planned and live) beside
	// the engine's per-site answers, at the moment memory peaks.
	// Copied out of the array append grew by doubling (a whole kernel's
	// spare capacity is 10 MB) now, while the engine holds little, not at
	// the end beside all it holds.
	pending := slices.Clone(s.pending)
	s.pending = nil
	var armed []Probe
	if len(s.live) == 0 {
		armed = pending[:0] // written at or before the index being read
	}
	var failed []blockRef
	for lo := 0; lo < len(pending); lo += ArmChunk {
		chunk := pending[lo:min(lo+ArmChunk, len(pending))]
		reqs, errs := s.armEach(eng, spec, chunk)
		failed = append(failed, s.refusedRefs(chunk, errs)...)
		armed = s.keepArmed(armed, chunk, reqs, errs)
	}
	// A block whose probe was refused may be reached by a run from the
	// block before it (after every chunk: that block's own probe is in).
	failed, armed = s.armRuns(eng, spec, failed, armed)
	// An inferred block relies on its successors' probes: where one could
	// not be armed, the block gets its own probe (and so on up).
	for len(failed) > 0 {
		more := s.uninfer(failed)
		if len(more) == 0 {
			break
		}
		reqs, errs := s.armEach(eng, spec, more)
		failed = s.refusedRefs(more, errs)
		armed = s.keepArmed(armed, more, reqs, errs)
		failed, armed = s.armRuns(eng, spec, failed, armed)
	}
	// Every block planned so far is armed or refused, so no inference is
	// taken back any more: what is left of up goes into upArmed (to mark
	// inferred blocks covered), the rest goes. A whole kernel's reserve
	// alone is 100,000 sites.
	s.settleInferences()
	end := now()
	first := s.armed.IsZero()
	if first {
		s.armed = end
	}
	s.armNS += int64(end.Sub(start))
	if len(s.live) == 0 {
		s.live = armed // pending's array, exactly sized
	} else {
		s.live = append(s.live, armed...)
	}
	s.armedN = len(s.live) + s.removed
	sample := Sample{LiveProbes: len(s.live), Covered: s.covered}
	if !first {
		sample.Elapsed = end.Sub(s.armed)
	}
	s.timeline = append(s.timeline, sample)
}

// ArmChunk is how many probes Arm hands the engine at once, so that the
// engine's answers for a whole kernel are never held together;
// kerninstd's arm bench arms in the same chunks. A variable for the
// tests.
var ArmChunk = 16384

// armEach hands ps's sites to the engine.
func (s *Set) armEach(eng Engine, spec engine.Spec, ps []Probe) ([]*engine.Request, []error) {
	sites := make([]*splice.Site, len(ps))
	for i, p := range ps {
		sites[i] = p.site
	}
	return eng.AddEach(sites, spec)
}

// keepArmed appends to armed the probes of ps the engine armed (reqs[i]),
// and marks the others' blocks refused with their error. armed may share
// ps's array, at or before ps.
func (s *Set) keepArmed(armed, ps []Probe, reqs []*engine.Request, errs []error) []Probe {
	for i, r := range reqs {
		p := ps[i]
		if errs[i] != nil {
			s.refuse(blockRef{p.Function, p.Block}, Refusal(errs[i]))
			continue
		}
		f := &s.fns[p.Function]
		f.blocks[p.Block].probe = uint32(p.site.Addr()-f.addr) + 1
		p.Request, p.site = r, nil
		armed = append(armed, p)
	}
	return armed
}

// Sweep marks the blocks whose probe has run as covered and removes those
// probes in one batch (one wait frees all their patches). A probe that
// cannot be removed stays live, to be tried again; its error is returned
// with the probe.
func (s *Set) Sweep(eng Engine, now time.Time) map[*engine.Request]error {
	// The probes not hit stay, in place: a copy of half a million
	// probes every 50 ms would be garbage at that rate.
	var hit []Probe
	n, kept := len(s.live), s.live[:0]
	for _, p := range s.live {
		if eng.Hit(p.Request) {
			hit = append(hit, p)
		} else {
			kept = append(kept, p)
		}
	}
	clear(s.live[len(kept):n])
	s.live = kept
	if len(hit) == 0 {
		return nil
	}
	rs := make([]*engine.Request, len(hit))
	for i, p := range hit {
		rs[i] = p.Request
		s.markCovered(blockRef{p.Function, p.Block}) // once: it checks
	}
	var failed map[*engine.Request]error
	for i, err := range eng.RemoveEach(rs) {
		if err != nil {
			if failed == nil {
				failed = map[*engine.Request]error{}
			}
			failed[rs[i]] = err
			s.live = append(s.live, hit[i])
			continue
		}
		s.removed++
	}
	s.timeline = append(s.timeline, Sample{Elapsed: now.Sub(s.armed),
		LiveProbes: len(s.live), Covered: s.covered})
	return failed
}

// Mark marks the blocks whose probe has run as covered without removing
// anything: for text that has gone (an exited process), whose flags are
// still readable.
func (s *Set) Mark(eng Engine, now time.Time) {
	for i := range s.live {
		p := &s.live[i]
		if s.fns[p.Function].blocks[p.Block].flags&blockCovered != 0 || !eng.Hit(p.Request) {
			continue
		}
		s.markCovered(blockRef{p.Function, p.Block})
	}
	s.timeline = append(s.timeline, Sample{Elapsed: now.Sub(s.armed),
		LiveProbes: len(s.live), Covered: s.covered})
}

// Remove removes every probe still live; it reports whether none is
// left. Sweep first: the last hits count.
//
// The probes go in chunks of ArmChunk, as Arm splices them: one batch of
// a whole kernel's probes held the engine's per-batch bookkeeping for all
// of them at once, on top of the session, and was kerninstd's peak.
func (s *Set) Remove(eng Engine) (bool, error) {
	var kept []Probe
	var errs []error
	rs := make([]*engine.Request, 0, min(len(s.live), ArmChunk))
	for lo := 0; lo < len(s.live); lo += ArmChunk {
		chunk := s.live[lo:min(lo+ArmChunk, len(s.live))]
		rs = rs[:0]
		for _, p := range chunk {
			rs = append(rs, p.Request)
		}
		for i, err := range eng.RemoveEach(rs) {
			if err != nil {
				errs = append(errs, err)
				kept = append(kept, chunk[i])
			}
		}
	}
	s.live = kept
	return len(kept) == 0, errors.Join(errs...)
}

// markCovered marks a block covered, and the inferred blocks that its
// coverage implies.
func (s *Set) markCovered(ref blockRef) {
	f := &s.fns[ref.f]
	if b := &f.blocks[ref.b]; b.flags&blockCovered == 0 {
		b.flags |= blockCovered
		f.covered++
		s.covered++
		if b.flags&blockInferred != 0 {
			s.coveredInferred++
		}
	}
	i, _ := slices.BinarySearchFunc(s.upArmed, ref, func(e inference, r blockRef) int { return e.from.cmp(r) })
	for ; i < len(s.upArmed) && s.upArmed[i].from == ref; i++ {
		if p := s.upArmed[i].to; s.fns[p.f].blocks[p.b].flags&blockCovered == 0 {
			s.markCovered(p)
		}
	}
}

// inference is one edge of upArmed: block to is inferred from block from.
type inference struct{ from, to blockRef }

func (r blockRef) cmp(o blockRef) int {
	if r.f != o.f {
		return int(r.f - o.f)
	}
	return int(r.b - o.b)
}

// settleInferences ends the inferences' planning at Arm: up's edges to
// blocks still inferred join upArmed, sorted, and the rest goes (16 bytes
// an edge).
func (s *Set) settleInferences() {
	for _, e := range s.up {
		if s.fns[e.to.f].blocks[e.to.b].flags&blockInferred != 0 {
			s.upArmed = append(s.upArmed, e)
		}
	}
	slices.SortFunc(s.upArmed, inference.cmp)
	s.upArmed = slices.Clip(s.upArmed)
	s.up, s.upSorted, s.reserve, s.noProbe, s.runs = nil, false, nil, nil, nil
}

func (a inference) cmp(b inference) int {
	if c := a.from.cmp(b.from); c != 0 {
		return c
	}
	return a.to.cmp(b.to)
}

// inferredFrom is the edges of up from block from (up sorted first).
func (s *Set) inferredFrom(from blockRef) []inference {
	if !s.upSorted {
		slices.SortFunc(s.up, inference.cmp)
		s.upSorted = true
	}
	i, _ := slices.BinarySearchFunc(s.up, from, func(e inference, r blockRef) int { return e.from.cmp(r) })
	j := i
	for j < len(s.up) && s.up[j].from == from {
		j++
	}
	return s.up[i:j]
}

// armRuns arms, for each block of failed that has one (Set.runs), the
// covering run from the block before it: a probe of that block at the
// run's start and the block's own at its first instruction in the run,
// in one batch. It returns the blocks still failed and armed with the
// probes armed. Both blocks count as probed (the one before taken out of
// any inference). The block before's own probe goes first where its
// splice holds bytes the run's jmp overwrites (its cheapest instruction
// is often the jcc itself), unless it has run already; it comes back if
// the run cannot be armed. Where the run arms but the block's probe in it
// does not (another point took the instruction), the run stays as a
// probe of the block before.
func (s *Set) armRuns(eng Engine, spec engine.Spec, failed []blockRef, armed []Probe) ([]blockRef, []Probe) {
	var ps []Probe
	still := failed[:0:0]
	preds := map[blockRef]*splice.Site{} // the run's site, by the block before
	for _, ref := range failed {
		r, ok := s.runs[ref]
		if !ok {
			still = append(still, ref)
			continue
		}
		delete(s.runs, ref)
		ps = append(ps, Probe{Function: ref.f, Block: r.pred, site: r.run}, Probe{Function: ref.f, Block: ref.b, site: r.into})
		preds[blockRef{ref.f, r.pred}] = r.run
	}
	if len(ps) == 0 {
		return failed, armed
	}
	// The block before's probes in the way, taken out (and their sites
	// kept, to put back where the run fails).
	moved := map[blockRef]*splice.Site{}
	kept := armed[:0]
	for _, p := range armed {
		ref := blockRef{p.Function, p.Block}
		if run, ok := preds[ref]; ok && moved[ref] == nil && overlaps(p.Request.Site(), run) && !eng.Hit(p.Request) {
			if errs := eng.RemoveEach([]*engine.Request{p.Request}); errs[0] == nil {
				moved[ref] = p.Request.Site()
				continue
			}
		}
		kept = append(kept, p)
	}
	clear(armed[len(kept):])
	armed = kept
	reqs, errs := s.armEach(eng, spec, ps)
	var back []Probe
	for k := 0; k < len(ps); k += 2 {
		pred, blk := blockRef{ps[k].Function, ps[k].Block}, blockRef{ps[k+1].Function, ps[k+1].Block}
		if errs[k] != nil {
			still = append(still, blk) // refused as before, with its own probe's reason
			if site := moved[pred]; site != nil {
				back = append(back, Probe{Function: pred.f, Block: pred.b, site: site})
			}
			continue
		}
		s.probedNow(pred)
		if errs[k+1] != nil {
			still = append(still, blk)
			armed = s.keepArmed(armed, ps[k:k+1], reqs[k:k+1], errs[k:k+1])
			continue
		}
		s.probedNow(blk)
		armed = s.keepArmed(armed, ps[k:k+2], reqs[k:k+2], errs[k:k+2])
	}
	if len(back) > 0 {
		reqs, errs := s.armEach(eng, spec, back)
		armed = s.keepArmed(armed, back, reqs, errs)
	}
	return still, armed
}

// overlaps: site's splice may hold bytes of the jmp a splice at run
// writes (each writes at most a jmp rel32's 5 bytes from its start).
func overlaps(site, run *splice.Site) bool {
	a, b := site.Addr(), run.Addr()
	return a < b+springboard.JmpRel32Len && b < a+springboard.JmpRel32Len
}

// probedNow makes ref a probed block: no longer refused or inferred.
func (s *Set) probedNow(ref blockRef) {
	f := &s.fns[ref.f]
	cb := &f.blocks[ref.b]
	if cb.why != 0 {
		cb.why = 0
		f.refused--
	}
	if cb.flags&blockInferred != 0 {
		cb.flags &^= blockInferred
		s.inferred--
		delete(s.reserve, ref)
	}
}

// refusedRefs is the blocks of probes whose arming failed.
func (s *Set) refusedRefs(ps []Probe, errs []error) []blockRef {
	var out []blockRef
	for i, err := range errs {
		if err != nil {
			out = append(out, blockRef{ps[i].Function, ps[i].Block})
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
		for _, e := range s.inferredFrom(ref) {
			p := e.to
			cb := &s.fns[p.f].blocks[p.b]
			if cb.flags&blockInferred == 0 {
				continue // taken back already, its edges with it
			}
			cb.flags &^= blockInferred
			s.inferred--
			if site := s.reserve[p]; site != nil {
				more = append(more, Probe{Function: p.f, Block: p.b, site: site})
			} else {
				s.refuse(p, s.reasons[s.noProbe[p]-1]+" (and a block it was inferred from took no probe)")
				failed = append(failed, p)
			}
			delete(s.reserve, p)
		}
	}
	return more
}

// Armed is the number of probes armed (live or removed after a hit).
func (s *Set) Armed() int { return s.armedN }

// Live is the probes still spliced.
func (s *Set) Live() []Probe { return s.live }

// Sample is the coverage at one moment of the run.
type Sample struct {
	Elapsed    time.Duration // since the probes were armed
	LiveProbes int           // probes still spliced
	Covered    int           // blocks covered so far
}

// Summary is the run's totals and timeline as of a moment: what a
// session's description carries (package report makes the api's
// CoverReport of it).
type Summary struct {
	Filter                                  string // whose execution covers ("pid 42"); "" everyone's
	Functions, TotalBlocks, RefusedBlocks   int
	CoveredBlocks, Armed, Inferred, Removed int
	CoveredInferred                         int
	Arm                                     time.Duration // from the first probe's splice to the last's
	Plan                                    time.Duration // from Planning to the first Arm; 0 when not said
	Duration                                time.Duration // since arming
	Timeline                                []Sample
}

// Function is one function's blocks as of now (Functions).
type Function struct {
	Name, Module     string
	Addr             uint64
	Covered, Refused int
	Error            string // why it could not be read (no blocks)
	Blocks           []Block
}

// Block is one block's state: its index in the function's CFG (kinst
// cfg), its range, the instruction probed (FUNC+0xOFF; "" none) or why
// none could be.
type Block struct {
	Index             int
	Start, End        uint64
	Inferred, Covered bool
	Point, Refused    string
}

// Summary is the coverage's totals and timeline as of now, without the
// functions (Functions gives them).
func (s *Set) Summary(now time.Time) Summary {
	sum := Summary{Filter: s.filter, CoveredBlocks: s.covered, Armed: s.armedN, Inferred: s.inferred,
		CoveredInferred: s.coveredInferred, Removed: s.removed, Arm: time.Duration(s.armNS),
		Plan:     time.Duration(s.planNS),
		Duration: now.Sub(s.armed), Functions: len(s.fns), Timeline: slices.Clone(s.timeline)}
	if sum.Timeline == nil {
		sum.Timeline = []Sample{}
	}
	for i := range s.fns {
		sum.TotalBlocks += len(s.fns[i].blocks)
		sum.RefusedBlocks += int(s.fns[i].refused)
	}
	return sum
}

// Functions yields every function of the run with its blocks, built
// afresh one at a time (a whole kernel's at once would double a big
// session's memory while its report is written).
func (s *Set) Functions() iter.Seq[Function] {
	return func(yield func(Function) bool) {
		for i := range s.fns {
			if !yield(s.fns[i].state(s.reasons)) {
				return
			}
		}
	}
}

// state is f as Functions gives it; reasons are the Set's.
func (f *function) state(reasons []string) Function {
	out := Function{Name: f.name, Module: f.module, Addr: f.addr, Covered: int(f.covered), Refused: int(f.refused),
		Error: f.err, Blocks: make([]Block, len(f.blocks))}
	for i, b := range f.blocks {
		cb := Block{Index: int(b.index), Inferred: b.flags&blockInferred != 0, Start: f.addr + uint64(b.start),
			End: f.addr + uint64(b.start) + uint64(b.size), Covered: b.flags&blockCovered != 0}
		if b.probe != 0 {
			cb.Point = fmt.Sprintf("%s+%#x", f.name, b.probe-1)
		}
		if b.why != 0 {
			cb.Refused = reasons[b.why-1]
		}
		out.Blocks[i] = cb
	}
	return out
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
