// Package census is kinst's whole-kernel analysis: every function of the
// kernel and its modules decoded, split into blocks and its liveness
// computed, the functions that never return found, the call graph, and a
// census of what the splice planner (package splice) would make of every
// instruction, with the springboard space and its reach. kerninstd runs
// it at start-up (and keeps the result per kernel build); `kinst cfg
// --stats` prints it.
package census

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// Stats is the structural census of a running kernel: the paper's
// Figure 2 for this kernel, plus what the analysis could not resolve and
// how every instruction could be spliced.
type Stats struct {
	Modules          int            `json:"modules"` // loaded modules (the core kernel not counted)
	Functions        int            `json:"functions"`
	BasicBlocks      int            `json:"basic_blocks"`
	Instructions     int            `json:"instructions"`
	InstructionBytes int            `json:"instruction_bytes"`
	PaddingBytes     int            `json:"padding_bytes"`      // unreachable nop/int3 runs: springboard space
	UnanalysableJump int            `json:"unanalysable_jumps"` // register/memory jumps left unresolved
	JumpTables       int            `json:"jump_tables"`        // indirect jumps resolved through a jump table
	TailCalls        int            `json:"tail_calls"`
	Returns          int            `json:"returns"`
	Truncated        int            `json:"truncated_functions"` // decoding stopped at an unknown encoding
	FreedInit        int            `json:"freed_init_functions"`
	NoReturn         int            `json:"noreturn_functions"` // found by analysis: no path reaches a return
	Unreadable       int            `json:"unreadable_functions"`
	SpliceClasses    map[string]int `json:"splice_classes"` // by length: direct, springboard, trap; and refused
	// Coverable counts the spliceable 1-4-byte instructions a covering
	// splice can take: a jmp rel32 over them and the next whole
	// instructions of their block (splice.Func.CoverRun).
	Coverable int `json:"coverable"`
	// Springboard is the springboard space and its reach.
	Springboard *springboard.Census `json:"springboard,omitempty"`
	// NoSpliceSites counts the sites the kernel's own tables name (see
	// kernel.OwnedSites); absent when they were not read.
	NoSpliceSites *kernel.OwnedCounts `json:"no_splice_sites,omitempty"`
	Seconds       float64             `json:"seconds"`

	springRuns []springboard.Range // SpringboardSpace of every function
	shortSites []uint64            // 2-4-byte instructions classed springboard
	coverSites []uint64            // of those, the ones a covering splice can take
}

// Options tune Analyze.
type Options struct {
	// Owned are instructions the kernel's own tables name; refused.
	Owned *kernel.OwnedSites
	// Prototypes make call liveness precise; nil is conservative.
	Prototypes kernel.Prototypes
	// Progress is called now and then with functions done and total.
	Progress func(done, total int)
	Workers  int // default GOMAXPROCS
}

// prefetchReader serves reads inside one large buffer (the core kernel's
// text, read in a few big chunks) and passes others through.
type prefetchReader struct {
	cfg.TextReader
	base uint64
	buf  []byte
}

func (p *prefetchReader) Read(addr uint64, b []byte) error {
	if addr >= p.base && addr+uint64(len(b)) <= p.base+uint64(len(p.buf)) {
		copy(b, p.buf[addr-p.base:])
		return nil
	}
	return p.TextReader.Read(addr, b)
}

// prefetchChunk is the size of one read of core kernel text.
const prefetchChunk = 1 << 20

// CallEdge is one direct call or tail call between functions.
type CallEdge struct {
	Caller, Callee uint64 // function start addresses
	Site           uint64 // the call or jmp instruction
	Tail           bool   // a tail call (jmp), not a call
}

// CallGraph is the interprocedural call graph of direct calls and tail
// calls. Indirect calls (retpolines) are not edges.
type CallGraph struct {
	Callees map[uint64][]CallEdge // by caller
	Callers map[uint64][]CallEdge // by callee
}

// Kernel is the result of Analyze.
type Kernel struct {
	Stats    Stats
	NoReturn cfg.NoReturnSet
	Calls    CallGraph
	Reads    cfg.CalleeReads // each function's entry live-in
	// SpringboardRuns is every function's springboard space, sorted.
	SpringboardRuns []springboard.Range
}

// Analyze decodes every function of the kernel and its modules from the
// text r reads, splits it into blocks, computes block liveness, finds the
// functions that never return, asks the splice planner about every
// instruction, and returns the census. Functions are analysed in
// parallel; one function's failure is counted, not fatal.
func Analyze(ctx context.Context, r cfg.TextReader, syms *kernel.Symbols, o Options) (*Kernel, error) {
	start := time.Now()
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if lo, ok1 := syms.Address("_stext"); ok1 {
		if hi, ok2 := syms.Address("_etext"); ok2 && hi > lo {
			buf := make([]byte, hi-lo)
			ok := true
			for off := 0; off < len(buf) && ok; off += prefetchChunk {
				ok = r.Read(lo+uint64(off), buf[off:min(off+prefetchChunk, len(buf))]) == nil
			}
			if ok {
				r = &prefetchReader{TextReader: r, base: lo, buf: buf}
			}
		}
	}
	// One function per start address (aliases share one).
	var fns []kernel.Symbol
	modules := map[string]bool{}
	for i, s := range syms.All() {
		if i > 0 && syms.All()[i-1].Addr == s.Addr || s.IsPrefix() {
			continue
		}
		fns = append(fns, s)
		if s.Module != "" {
			modules[s.Module] = true
		}
	}
	st := Stats{Modules: len(modules), SpliceClasses: map[string]int{}}
	if o.Owned != nil {
		n := o.Owned.Counts()
		st.NoSpliceSites = &n
	}
	// The facts of the census: no no-return set nor callee summaries yet
	// (they are what it computes), the text through the prefetch.
	facts := &splice.Facts{Symbols: syms, Text: r, Owned: o.Owned, Prototypes: o.Prototypes}
	sums := make(map[uint64]*summary, len(fns))
	var mu sync.Mutex
	var done atomic.Int64
	work := make(chan kernel.Symbol, 256)
	var wg sync.WaitGroup
	for w := 0; w < o.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := Stats{SpliceClasses: map[string]int{}}
			localSums := map[uint64]*summary{}
			w := &worker{verdicts: splice.NewVerdicts()}
			for s := range work {
				if sum := analyzeOne(facts, s, &local, w); sum != nil {
					localSums[s.Addr] = sum
				}
				if n := done.Add(1); o.Progress != nil && n%2000 == 0 {
					o.Progress(int(n), len(fns))
				}
			}
			mu.Lock()
			st.add(&local)
			for a, sum := range localSums {
				sums[a] = sum
			}
			mu.Unlock()
		}()
	}
	for _, s := range fns {
		if ctx.Err() != nil {
			break
		}
		work <- s
	}
	close(work)
	wg.Wait()
	if o.Progress != nil {
		o.Progress(int(done.Load()), len(fns))
	}
	noret := noReturnFunctions(sums)
	st.NoReturn = len(noret)
	st.Seconds = time.Since(start).Seconds()
	reads := make(cfg.CalleeReads, len(sums))
	for a, sum := range sums {
		reads[a] = sum.entryLive
	}
	runs, shorts, covers := st.springRuns, st.shortSites, st.coverSites
	st.springRuns, st.shortSites, st.coverSites = nil, nil, nil
	sort.Slice(runs, func(i, j int) bool { return runs[i].Start < runs[j].Start })
	sort.Slice(shorts, func(i, j int) bool { return shorts[i] < shorts[j] })
	sort.Slice(covers, func(i, j int) bool { return covers[i] < covers[j] })
	c := springboard.TakeCensus(runs, shorts, covers)
	st.Springboard = &c
	k := &Kernel{Stats: st, NoReturn: noret, Calls: callGraph(sums), Reads: reads, SpringboardRuns: runs}
	return k, ctx.Err()
}

// callGraph collects the direct call and tail-call edges of the summaries.
func callGraph(sums map[uint64]*summary) CallGraph {
	g := CallGraph{Callees: map[uint64][]CallEdge{}, Callers: map[uint64][]CallEdge{}}
	for caller, sum := range sums {
		for _, b := range sum.blocks {
			for i, c := range b.calls {
				e := CallEdge{Caller: caller, Callee: c, Site: b.callSites[i]}
				g.Callees[caller] = append(g.Callees[caller], e)
				g.Callers[c] = append(g.Callers[c], e)
			}
			if b.exit == cfg.TailCall {
				e := CallEdge{Caller: caller, Callee: b.tail, Site: b.tailSite, Tail: true}
				g.Callees[caller] = append(g.Callees[caller], e)
				g.Callers[b.tail] = append(g.Callers[b.tail], e)
			}
		}
	}
	return g
}

// WalkCallees visits the functions root calls, breadth first, depth
// levels down: visit gets each callee address not met before (root's
// own included as met) and gives the function to descend into, nil to
// go no further along it. Calls through a PLT or a register are not
// followed (Callees has only direct ones).
func WalkCallees(root *splice.Func, depth int, visit func(callee uint64) *splice.Func) {
	seen := map[uint64]bool{root.Sym.Addr: true}
	level := []*splice.Func{root}
	for l := 0; l < depth && len(level) > 0; l++ {
		var next []*splice.Func
		for _, f := range level {
			for _, e := range Callees(f.Fn, f.Blocks) {
				if seen[e.Callee] {
					continue
				}
				seen[e.Callee] = true
				if cf := visit(e.Callee); cf != nil {
					next = append(next, cf)
				}
			}
		}
		level = next
	}
}

// Callees are the call graph's edges from fn (split into blocks as
// splice.Facts.Func splits it): each block's direct calls, then its tail
// call, in block order. Indirect calls are not edges.
func Callees(fn *cfg.Function, blocks []cfg.Block) []CallEdge {
	var out []CallEdge
	for i := range blocks {
		b := &blocks[i]
		blockCalls(fn, b, func(t, site uint64) { out = append(out, CallEdge{Caller: fn.Addr, Callee: t, Site: site}) })
		if t, site, ok := tailCall(fn, b); ok {
			out = append(out, CallEdge{Caller: fn.Addr, Callee: t, Site: site, Tail: true})
		}
	}
	return out
}

// blockCalls calls call with the target and address of each direct call
// of block b, in order.
func blockCalls(fn *cfg.Function, b *cfg.Block, call func(target, site uint64)) {
	for i := b.First; i < b.First+b.N; i++ {
		if in := &fn.Insns[i]; in.Inst.Op == x86asm.CALL {
			if t, ok := cfg.BranchTarget(in); ok {
				call(t, in.Addr)
			}
		}
	}
}

// tailCall is the target and the jmp of block b's tail call, if it ends
// in one.
func tailCall(fn *cfg.Function, b *cfg.Block) (target, site uint64, ok bool) {
	if b.Exit != cfg.TailCall {
		return 0, 0, false
	}
	target, _ = cfg.BranchTarget(b.Last(fn))
	return target, b.Last(fn).Addr, true
}

// summary is what the no-return analysis needs of a function.
type summary struct {
	blocks    []summaryBlock
	entryLive cfg.LiveSet
}

type summaryBlock struct {
	calls     []uint64 // direct call targets, in order
	callSites []uint64 // the call instructions
	succs     []int
	exit      cfg.ExitKind
	tail      uint64 // tail-call target
	tailSite  uint64
}

// noReturnFunctions finds the functions from which no path reaches a
// return: the least fixed point of "returns", starting from none. A path
// is cut by a call to a function not (yet) known to return; a tail call
// returns if its target does; an indirect jump, a call or tail call out of
// the analysed set, or falling off the end counts as returning.
func noReturnFunctions(sums map[uint64]*summary) cfg.NoReturnSet {
	returns := make(map[uint64]bool, len(sums))
	known := func(a uint64) bool { _, ok := sums[a]; return ok }
	cut := func(a uint64) bool { return known(a) && !returns[a] }
	for changed := true; changed; {
		changed = false
		for a, sum := range sums {
			if returns[a] || len(sum.blocks) == 0 {
				continue
			}
			if reachesReturn(sum, cut) {
				returns[a] = true
				changed = true
			}
		}
	}
	nr := cfg.NoReturnSet{}
	for a := range sums {
		if !returns[a] {
			nr[a] = true
		}
	}
	return nr
}

func reachesReturn(sum *summary, cut func(uint64) bool) bool {
	seen := make([]bool, len(sum.blocks))
	work := []int{0}
	seen[0] = true
	for len(work) > 0 {
		b := &sum.blocks[work[len(work)-1]]
		work = work[:len(work)-1]
		stopped := false
		for _, c := range b.calls {
			if cut(c) {
				stopped = true
				break
			}
		}
		if stopped {
			continue
		}
		switch b.exit {
		case cfg.Return, cfg.IndirectJump:
			return true
		case cfg.TailCall:
			if !cut(b.tail) {
				return true
			}
			continue
		case cfg.Trap:
			continue
		}
		if len(b.succs) == 0 {
			return true // fell off what was decoded: assume it returns
		}
		for _, s := range b.succs {
			if !seen[s] {
				seen[s] = true
				work = append(work, s)
			}
		}
	}
	return false
}

// worker is one census goroutine's reusable state.
type worker struct {
	buf      cfg.DecodeBuf
	verdicts *splice.Verdicts
}

func analyzeOne(k *splice.Facts, s kernel.Symbol, st *Stats, w *worker) *summary {
	fn, err := cfg.ReadFunctionInto(k.Text, k.Symbols, s, &w.buf)
	switch {
	case err == nil:
	case errors.Is(err, cfg.ErrFreedInit):
		st.FreedInit++
		return nil
	default:
		st.Unreadable++
		return nil
	}
	st.Functions++
	if fn.Truncated {
		st.Truncated++
	}
	f := k.Func(fn, w.verdicts)
	blocks := f.Blocks
	fnWhy := f.FunctionNoSplice()
	// Liveness is part of the analysis (its block live-in sets are what
	// splicing consults), so the census pays for it too.
	f.Liveness()
	if fnWhy == "" {
		owned := func(a uint64) bool { return k.Owned.Reason(a) != "" }
		st.springRuns = append(st.springRuns, splice.SpringboardSpace(fn, blocks, owned)...)
	}
	sum := &summary{blocks: make([]summaryBlock, len(blocks)), entryLive: f.EntryReads()}
	// The blocks' slices share backing arrays, one allocation each per
	// function rather than per block.
	var succs []int
	var calls, sites []uint64
	for bi, b := range blocks {
		sb := &sum.blocks[bi]
		sb.exit = b.Exit
		n := len(succs)
		for _, e := range b.Succs {
			succs = append(succs, e.To)
		}
		sb.succs = succs[n:len(succs):len(succs)]
		n = len(calls)
		blockCalls(fn, &b, func(t, site uint64) {
			calls = append(calls, t)
			sites = append(sites, site)
		})
		sb.calls, sb.callSites = calls[n:len(calls):len(calls)], sites[n:len(sites):len(sites)]
		sb.tail, sb.tailSite, _ = tailCall(fn, &b)
	}
	for bi := range blocks {
		b := &blocks[bi]
		n := 0
		for i := b.First; i < b.First+b.N; i++ {
			n += fn.Insns[i].Len()
		}
		if b.Padding {
			st.PaddingBytes += n
			continue
		}
		st.BasicBlocks++
		st.Instructions += b.N
		st.InstructionBytes += n
		if b.JumpTable != nil {
			st.JumpTables++
		}
		switch b.Exit {
		case cfg.IndirectJump:
			st.UnanalysableJump++
		case cfg.TailCall:
			st.TailCalls++
		case cfg.Return:
			st.Returns++
		}
		for i := b.First; i < b.First+b.N; i++ {
			class := springboard.Classify(fn.Insns[i].Len())
			if !f.Spliceable(i) {
				st.SpliceClasses["refused"]++
				continue
			}
			st.SpliceClasses[class.String()]++
			if class == springboard.Direct {
				continue
			}
			if class == springboard.Springboard {
				st.shortSites = append(st.shortSites, fn.Insns[i].Addr)
			}
			if _, ok := f.CoverRun(i); ok {
				st.Coverable++
				if class == springboard.Springboard {
					st.coverSites = append(st.coverSites, fn.Insns[i].Addr)
				}
			}
		}
	}
	return sum
}

func (st *Stats) add(o *Stats) {
	st.Functions += o.Functions
	st.BasicBlocks += o.BasicBlocks
	st.Instructions += o.Instructions
	st.InstructionBytes += o.InstructionBytes
	st.PaddingBytes += o.PaddingBytes
	st.UnanalysableJump += o.UnanalysableJump
	st.JumpTables += o.JumpTables
	st.TailCalls += o.TailCalls
	st.Returns += o.Returns
	st.Truncated += o.Truncated
	st.FreedInit += o.FreedInit
	st.Unreadable += o.Unreadable
	for k, v := range o.SpliceClasses {
		st.SpliceClasses[k] += v
	}
	st.springRuns = append(st.springRuns, o.springRuns...)
	st.shortSites = append(st.shortSites, o.shortSites...)
	st.coverSites = append(st.coverSites, o.coverSites...)
	st.Coverable += o.Coverable
}
