package cfg

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/kernel"
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
	// instructions of their block (with AnalyzeOptions.FallsThrough).
	Coverable int `json:"coverable"`
	// Springboard is the springboard space and its reach (filled by the
	// caller from Kernel.SpringboardRuns and ShortSites).
	Springboard *SpringboardStats `json:"springboard,omitempty"`
	// NoSpliceSites counts the sites the kernel's own tables name (see
	// kernel.OwnedSites); absent when they were not read.
	NoSpliceSites *kernel.OwnedCounts `json:"no_splice_sites,omitempty"`
	Seconds       float64             `json:"seconds"`

	springRuns []Range  // SpringboardSpace of every function
	shortSites []uint64 // 2-4-byte instructions classed springboard
	coverSites []uint64 // of those, the ones a covering splice can take
}

// SpringboardStats is the census of springboard space.
type SpringboardStats struct {
	Runs     int    `json:"runs"`      // padding runs holding at least one slot
	Bytes    uint64 `json:"bytes"`     // bytes in those runs
	Slots    int    `json:"slots"`     // disjoint 5-byte slots they hold
	Short    int    `json:"short"`     // spliceable 2-4-byte instructions
	InReach  int    `json:"in_reach"`  // of those, with a slot within rel8 reach
	Assigned int    `json:"assigned"`  // given a slot each at once (greedy, address order)
	Trap     int    `json:"trap"`      // Short - InReach: no slot in reach
	Covering int    `json:"covering"`  // of Short, those a covering splice can take
	TrapOnly int    `json:"trap_only"` // of Short, neither a slot in reach nor coverable: trap splices
}

// AnalyzeOptions tune AnalyzeKernel.
type AnalyzeOptions struct {
	DriverModule string
	// Relocatable says whether a patch can reproduce an instruction;
	// those it cannot are counted as refused. Nil: all can. Its answer
	// must depend on the instruction's bytes only (not on where it is),
	// as codegen.CheckRelocatable's does: the census remembers it per
	// encoding.
	Relocatable func(addr uint64, inst x86asm.Inst, b []byte) error
	// Owned are instructions the kernel's own tables name; refused.
	Owned *kernel.OwnedSites
	// Springboards collects springboard space and the short instructions
	// that would use it (Kernel.SpringboardRuns, ShortSites).
	Springboards bool
	// FallsThrough says whether a patch can run an instruction and go on
	// to the next one's copy (no branch, no call), as
	// codegen.CanFallThroughInst does; with it the census counts the short
	// instructions a covering splice can take (Stats.Coverable). Its
	// answer must depend on the bytes only.
	FallsThrough func(addr uint64, inst x86asm.Inst, b []byte) bool
	// kernel.Prototypes make call liveness precise; nil is conservative.
	Prototypes kernel.Prototypes
	// Progress is called now and then with functions done and total.
	Progress func(done, total int)
	Workers  int // default GOMAXPROCS
}

// prefetchReader serves reads inside one large buffer (the core kernel's
// text, read in a few big chunks) and passes others through.
type prefetchReader struct {
	TextReader
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

// Kernel is the result of AnalyzeKernel.
type Kernel struct {
	Stats    Stats
	NoReturn NoReturnSet
	Calls    CallGraph
	Reads    CalleeReads // each function's entry live-in
	// With AnalyzeOptions.Springboards: every function's springboard
	// space (sorted) and the spliceable 2-4-byte instructions (sorted).
	SpringboardRuns []Range
	ShortSites      []uint64
	CoverSites      []uint64 // of ShortSites, those a covering splice can take (sorted)
}

// NoReturnSet holds the start addresses of functions that never return.
type NoReturnSet map[uint64]bool

// Func adapts the set for BlocksWith.
func (s NoReturnSet) Func() NoReturn { return func(a uint64) bool { return s[a] } }

// AnalyzeKernel decodes every function of the kernel and its modules from
// the live text, splits it into blocks, computes block liveness, finds the
// functions that never return, and returns the census. Functions are
// analysed in parallel; one function's failure is counted, not fatal.
func AnalyzeKernel(ctx context.Context, r TextReader, syms *kernel.Symbols, o AnalyzeOptions) (*Kernel, error) {
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
		if i > 0 && syms.All()[i-1].Addr == s.Addr {
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
			w := new(worker)
			for s := range work {
				if sum := analyzeOne(r, syms, s, o, &local, w); sum != nil {
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
	reads := make(CalleeReads, len(sums))
	for a, sum := range sums {
		reads[a] = sum.entryLive
	}
	k := &Kernel{Stats: st, NoReturn: noret, Calls: callGraph(sums), Reads: reads,
		SpringboardRuns: st.springRuns, ShortSites: st.shortSites, CoverSites: st.coverSites}
	k.Stats.springRuns, k.Stats.shortSites, k.Stats.coverSites = nil, nil, nil
	sort.Slice(k.CoverSites, func(i, j int) bool { return k.CoverSites[i] < k.CoverSites[j] })
	sort.Slice(k.SpringboardRuns, func(i, j int) bool { return k.SpringboardRuns[i].Start < k.SpringboardRuns[j].Start })
	sort.Slice(k.ShortSites, func(i, j int) bool { return k.ShortSites[i] < k.ShortSites[j] })
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
			if b.exit == TailCall {
				e := CallEdge{Caller: caller, Callee: b.tail, Site: b.tailSite, Tail: true}
				g.Callees[caller] = append(g.Callees[caller], e)
				g.Callers[b.tail] = append(g.Callers[b.tail], e)
			}
		}
	}
	return g
}

// summary is what the no-return analysis needs of a function.
type summary struct {
	blocks    []summaryBlock
	entryLive LiveSet
}

type summaryBlock struct {
	calls     []uint64 // direct call targets, in order
	callSites []uint64 // the call instructions
	succs     []int
	exit      ExitKind
	tail      uint64 // tail-call target
	tailSite  uint64
}

// noReturnFunctions finds the functions from which no path reaches a
// return: the least fixed point of "returns", starting from none. A path
// is cut by a call to a function not (yet) known to return; a tail call
// returns if its target does; an indirect jump, a call or tail call out of
// the analysed set, or falling off the end counts as returning.
func noReturnFunctions(sums map[uint64]*summary) NoReturnSet {
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
	nr := NoReturnSet{}
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
		case Return, IndirectJump:
			return true
		case TailCall:
			if !cut(b.tail) {
				return true
			}
			continue
		case Trap:
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
	buf   decodeBuf
	reloc relocCache
	plain relocCache // FallsThrough's verdicts
}

// relocCache remembers Relocatable's verdict for recently seen encodings:
// the kernel repeats most of its instructions byte for byte (push %rbp,
// mov %rdi,%rbx, ret...), and the check costs an allocation. Direct
// mapped and small, so it stays in cache: a large map was slower than the
// check itself.
type relocCache [relocSlots]relocEntry

type relocEntry struct {
	key [15]byte
	n   uint8 // encoding length; 0: empty
	ok  bool
}

const relocSlots = 1 << 14

// relocatable is o.Relocatable(in) == nil, remembered per encoding.
func (w *worker) relocatable(o *AnalyzeOptions, in *Instruction) bool {
	if o.Relocatable == nil {
		return true
	}
	e, ok, hit := w.reloc.lookup(in.Bytes)
	if !hit {
		ok = o.Relocatable(in.Addr, in.Inst, in.Bytes) == nil
		e.store(in.Bytes, ok)
	}
	return ok
}

// fallsThrough is o.FallsThrough(in), remembered per encoding.
func (w *worker) fallsThrough(o *AnalyzeOptions, in *Instruction) bool {
	e, ok, hit := w.plain.lookup(in.Bytes)
	if !hit {
		ok = o.FallsThrough(in.Addr, in.Inst, in.Bytes)
		e.store(in.Bytes, ok)
	}
	return ok
}

// lookup finds b's slot and, if it holds b, the verdict remembered. (No
// callback: a closure per instruction would cost the allocation the cache
// saves.) Encodings over 15 bytes have no slot.
func (c *relocCache) lookup(b []byte) (e *relocEntry, ok, hit bool) {
	if len(b) > 15 {
		return nil, false, false
	}
	h := uint32(2166136261) // FNV-1a
	for _, x := range b {
		h = (h ^ uint32(x)) * 16777619
	}
	e = &c[h%relocSlots]
	if int(e.n) == len(b) && string(e.key[:e.n]) == string(b) {
		return e, e.ok, true
	}
	return e, false, false
}

// store remembers ok for b in slot e (nil: nothing).
func (e *relocEntry) store(b []byte, ok bool) {
	if e != nil {
		e.n, e.ok = uint8(copy(e.key[:], b)), ok
	}
}

func analyzeOne(r TextReader, syms *kernel.Symbols, s kernel.Symbol, o AnalyzeOptions, st *Stats, w *worker) *summary {
	fn, err := readFunction(r, syms, s, &w.buf)
	switch {
	case err == nil:
	case errors.Is(err, ErrFreedInit):
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
	names := syms.Names()
	fnWhy := FunctionNoSplice(syms, fn, o.DriverModule)
	blocks := fn.BlocksOpt(BlockOptions{Names: names, Tables: r})
	// Liveness is part of the analysis (its block live-in sets are what
	// splicing consults), so the census pays for it too.
	lv := fn.Live(blocks, names, o.Prototypes)
	if o.Springboards && fnWhy == "" {
		st.springRuns = append(st.springRuns, SpringboardSpace(fn, blocks, func(a uint64) bool { return o.Owned.Reason(a) != "" })...)
	}
	sum := &summary{blocks: make([]summaryBlock, len(blocks)), entryLive: lv.LiveIn[0]}
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
		for i := b.First; i < b.First+b.N; i++ {
			if in := &fn.Insns[i]; in.Inst.Op == x86asm.CALL {
				if t, ok := BranchTarget(in); ok {
					calls = append(calls, t)
					sites = append(sites, in.Addr)
				}
			}
		}
		sb.calls, sb.callSites = calls[n:len(calls):len(calls)], sites[n:len(sites):len(sites)]
		if b.Exit == TailCall {
			sb.tail, _ = BranchTarget(b.Last(fn))
			sb.tailSite = b.Last(fn).Addr
		}
	}
	// A covering splice needs every jump's target known.
	coverOK := o.FallsThrough != nil && fnWhy == "" && !hasUnresolvedJump(blocks)
	// One closure per function (not per instruction): coverFrom is the
	// run's first instruction.
	var coverFrom int
	coverUsable := func(j int, last bool) bool {
		in := &fn.Insns[j]
		if j > coverFrom && (InstructionNoSplice(o.Owned, fn, j) != "" || !w.relocatable(&o, in)) { // int3 included
			return false
		}
		return last || w.fallsThrough(&o, in)
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
		case IndirectJump:
			st.UnanalysableJump++
		case TailCall:
			st.TailCalls++
		case Return:
			st.Returns++
		}
		for i := b.First; i < b.First+b.N; i++ {
			in := &fn.Insns[i]
			class := classOf(in.Len())
			if fnWhy != "" || InstructionNoSplice(o.Owned, fn, i) != "" || !w.relocatable(&o, in) {
				class = "refused"
			}
			st.SpliceClasses[class]++
			if class == "springboard" && o.Springboards {
				st.shortSites = append(st.shortSites, in.Addr)
			}
			if (class == "springboard" || class == "trap") && coverOK {
				coverFrom = i
				if _, ok := coverInBlock(fn, b, i, 5, syms, o.Owned, coverUsable); ok {
					st.Coverable++
					if class == "springboard" && o.Springboards {
						st.coverSites = append(st.coverSites, in.Addr)
					}
				}
			}
		}
	}
	return sum
}

// classOf mirrors springboard.Classify, which cfg cannot import.
func classOf(n int) string {
	switch {
	case n >= 5:
		return "direct"
	case n >= 2:
		return "springboard"
	}
	return "trap"
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
