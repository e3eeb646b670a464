package splice

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/springboard"
)

// DriverModule is the module name of kerninst.ko in kallsyms: its text is
// never spliced.
const DriverModule = "kerninst"

// Facts are what a plan rests on: one snapshot of the kernel's symbols
// and tables, of the whole-kernel analysis, and the text to read.
// Symbols and Text are required; the others may be nil.
type Facts struct {
	Symbols *kernel.Symbols
	// Text reads kernel text as the kernel's own code: under kinst's own
	// splices, the original bytes (engine.Engine.Text).
	Text cfg.TextReader
	// Owned are the instructions the kernel's own tables name; nil if
	// they could not be read (then only an ftrace site's shape is known).
	Owned *kernel.OwnedSites
	// NoReturn and Reads come from the whole-kernel analysis (the
	// functions that never return, and what each reads before writing);
	// nil before it ran, which keeps block splitting and liveness safe.
	NoReturn cfg.NoReturnSet
	Reads    cfg.CalleeReads
	// Prototypes from BTF make calls read only their arguments; nil:
	// every call reads all six argument registers.
	Prototypes kernel.Prototypes
	// Unprobeable is the kernel's kprobe blacklist; nil when it was not
	// read (a dump, or no debugfs): then only kinst's own lists of the
	// int3 and stop_machine paths protect them.
	Unprobeable kernel.KprobeBlacklist
	// DieNotifiers are the functions on the kernel's die chain; nil when
	// it was not read.
	DieNotifiers DieNotifiers
	// Process says the text is a user process's: the kernel's rules (its
	// no-instrumentation lists, ftrace's entry site, kinst's own driver)
	// do not apply there (ProcessNoSplice).
	Process bool
	// NoTrap, when set, refuses trap splices with this reason: an
	// instruction that takes no other class is not spliceable.
	NoTrap string
	// Pun says trap splices are punned jumps the device places (a
	// process's): NoTrap does not refuse them; the device refuses the
	// one it can make only an int3.
	Pun bool
	// GoModules are a process's modules built by Go ("" the executable):
	// their loads and stores through a pointer are its nil checks, which
	// fault on purpose and are found again by the faulting pc
	// (ProcessNoSplice). Read only; nil: none.
	GoModules map[string]bool
	// recent: functions decoded lately, shared by the planner's facts
	// (Planner.FuncOf); nil: none kept.
	recent *recentFunctions
	// Decoded, if set, holds functions decoded already, read before the
	// text is decoded again.
	Decoded *Decoded
}

// readFunction is sym's function: the one Decoded holds, else decoded
// from the text (through the planner's recent ones).
func (k *Facts) readFunction(sym kernel.Symbol) (*cfg.Function, error) {
	if fn := k.Decoded.get(sym); fn != nil {
		return fn, nil
	}
	return k.recent.read(k.Text, k.Symbols, sym)
}

// BlockOptions is how every analysis of kinst splits a function into
// basic blocks: call and jump targets named by the symbols (return
// thunks, retpolines), calls to functions that never return ending their
// block, jump tables read from the text.
func (k *Facts) BlockOptions() cfg.BlockOptions {
	return cfg.BlockOptions{Names: AnalysisNames(k.Symbols), NoReturn: k.NoReturn.Func(), Tables: k.Text, User: k.Process}
}

// AnalysisNames names call and jump targets for the analysis. Where
// several symbols start at one address, a thunk's name wins: kallsyms
// lists __indirect_thunk_start and __static_call_text_end at the
// address of __x86_indirect_thunk_array and __x86_indirect_thunk_rax,
// and a call named by a marker would be an ordinary call, not one through
// %rax, so liveness would find %rax dead before it. A retpoline thunk
// named by its register beats the array's name, which says none.
// Otherwise the name is Symbols.At's.
func AnalysisNames(syms *kernel.Symbols) cfg.NameAt {
	names := syms.Names()
	return func(a uint64) (string, bool) {
		best, rank := "", 0
		for _, s := range syms.FunctionsAt(a) {
			if r := thunkRank(s.Name); r > rank {
				best, rank = s.Name, r
			}
		}
		if rank > 0 {
			return best, true
		}
		return names(a)
	}
}

// thunkRank orders the names one address may have: a retpoline thunk
// naming its register, then any retpoline thunk, then a return thunk,
// then the rest (0).
func thunkRank(name string) int {
	switch {
	case cfg.IsIndirectThunk(name) && !strings.HasSuffix(name, "_array"):
		return 3
	case cfg.IsIndirectThunk(name):
		return 2
	case cfg.IsReturnThunk(name):
		return 1
	}
	return 0
}

// Func plans fn against k: it splits fn into blocks once. v caches
// codegen's verdicts across functions (a whole-kernel pass); nil asks
// codegen every time.
func (k *Facts) Func(fn *cfg.Function, v *Verdicts) *Func {
	o := k.BlockOptions()
	f := &Func{Fn: fn, Blocks: fn.BlocksOpt(o), facts: k, names: o.Names, v: v}
	if !k.Process {
		f.why = k.functionNoSplice(fn)
	}
	f.jumpy = cfg.HasUnresolvedJump(f.Blocks)
	f.usable = f.coverUsable
	return f
}

// Exits plans the function's exits for a timer entered at entry: the
// last instruction of every block that leaves it (ret, a jmp to a
// return thunk, a tail call, an indirect jump); entry itself where it is
// one.
func (f *Func) Exits(entry *Site) ([]*Site, error) {
	var out []*Site
	for _, b := range f.Blocks {
		if b.Padding {
			continue
		}
		switch b.Exit {
		case cfg.Return, cfg.TailCall, cfg.IndirectJump:
		default:
			continue
		}
		i := b.First + b.N - 1
		if i == entry.Index() {
			out = append(out, entry)
			continue
		}
		s, err := f.At(i)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Func is one function planned against one Facts: decoded, split into
// blocks once, its liveness computed on first use. One goroutine uses a
// Func at a time.
type Func struct {
	Fn     *cfg.Function
	Blocks []cfg.Block
	// Sym is the symbol the function was looked up by, and Ambiguous the
	// number of other symbols of that name (Planner.Func).
	Sym       kernel.Symbol
	Ambiguous int

	facts *Facts
	names cfg.NameAt
	v     *Verdicts
	why   string // FunctionNoSplice: no instruction may be spliced
	jumpy bool   // an indirect jump not resolved to a table: no covering splices
	live  *cfg.Liveness
	last  *cfg.Block // the block block found last

	// slotFree reports whether a springboard slot is free within rel8
	// reach of an address (Planner.slotFree); nil: never.
	slotFree func(addr uint64) bool
	// padFree reports whether padding bytes hold no springboard slot in
	// use, and with take keeps slots out of them from then on
	// (UseSpringboards); nil: runs into padding are not planned.
	padFree func(r springboard.Range, take bool) bool

	// usable is coverUsable, one closure per function; from is the
	// instruction the run it checks starts at.
	usable func(j int, last bool) bool
	from   int
}

// FunctionNoSplice says why no instruction of the function may be
// spliced (FunctionNoSplice), or "".
func (f *Func) FunctionNoSplice() string { return f.why }

// Facts returns what the function was planned with.
func (f *Func) Facts() *Facts { return f.facts }

// block returns the block of instruction i, or nil: passes that walk the
// instructions in order find it at once.
func (f *Func) block(i int) *cfg.Block {
	if b := f.last; b != nil && i >= b.First && i < b.First+b.N {
		return b
	}
	f.last = cfg.BlockOf(f.Blocks, i)
	return f.last
}

// Liveness is the function's block liveness: calls read their arguments
// as the prototypes and callee summaries say, under the ABI its callers
// may have been compiled to (ABI).
func (f *Func) Liveness() *cfg.Liveness {
	if f.live == nil {
		f.live = f.Fn.LiveABI(f.Blocks, f.names, f.facts.Prototypes, f.facts.Reads, f.ABI())
	}
	return f.live
}

// EntryReads is what the function reads before writing it: its entry
// live-in under the ABI's rules, the summary its callers' liveness takes
// (cfg.CalleeReads). Under CallersKnow a return reads every register,
// which is what the callers may keep across the call, not what the
// function reads: taken for reads, it made every caller of a kernel
// function without ftrace's call (memset, an asm helper) keep R10 and
// R11 live before the call, and up to its own entry.
func (f *Func) EntryReads() cfg.LiveSet {
	if f.ABI() == cfg.SysV {
		return f.Liveness().LiveIn[0]
	}
	return f.Fn.LiveABI(f.Blocks, f.names, f.facts.Prototypes, f.facts.Reads, cfg.SysV).LiveIn[0]
}

// ABI is what the function's callers may assume it leaves alone. A
// process's code may come from GCC at -O2, whose callers keep values in
// the registers a callee they can see does not write (cfg.CallersKnow).
// So may a kernel function without ftrace's __fentry__ call at its entry
// (or after its endbr64): its file may have been built without -pg,
// which is what turns that allocation off; the others' files were built
// with it (a notrace function among them is treated as the former, which
// costs a timer a spill at most).
func (f *Func) ABI() cfg.ABI {
	if f.facts.Process {
		return cfg.CallersKnow
	}
	for i := range min(2, len(f.Fn.Insns)) {
		if IsFtraceSite(f.facts.Owned, f.Fn, i) {
			return cfg.SysV
		}
	}
	return cfg.CallersKnow
}

// Live is what may be live before instruction i: the block data-flow's
// answer, and all the flags when the forward scan finds one read first,
// so that a mistake in one analysis alone cannot corrupt the kernel.
func (f *Func) Live(i int) cfg.LiveSet {
	live := ^cfg.LiveSet(0)
	if b := f.block(i); b != nil {
		live = f.Liveness().Before(b.Index, i)
	}
	if f.Fn.FlagsLive(i) {
		live |= cfg.FlagBits
	}
	return live
}

// PaddingReason refuses an instruction of a padding block: it never runs,
// so a counter there would never count, and its bytes are springboard
// space (a slot there and a splice would overlap).
const PaddingReason = "padding between functions: never executed (springboard space)"

// NoSplice says why instruction i must never be spliced, or "": its
// function (kinst's driver, the int3 path, entry and noinstr text), a site
// the kernel's own tables name, the function's ftrace site, an int3
// already there, or a padding block.
func (f *Func) NoSplice(i int) string {
	if f.why != "" {
		return f.why
	}
	if why := f.facts.instructionNoSplice(f.Fn, i); why != "" {
		return why
	}
	if b := f.block(i); b != nil && b.Padding {
		return PaddingReason
	}
	return ""
}

// Spliceable reports whether instruction i may be spliced and a patch can
// reproduce it (Refusal is "").
func (f *Func) Spliceable(i int) bool {
	return f.NoSplice(i) == "" && f.relocatable(i) && !f.trapRefused(i)
}

// trapRefused: only a trap splice fits instruction i, and Facts.NoTrap
// refuses those.
func (f *Func) trapRefused(i int) bool {
	return f.facts.NoTrap != "" && !f.facts.Pun && f.Class(i) == springboard.Trap
}

// Refusal says why instruction i cannot be spliced: NoSplice's reasons,
// or codegen's when a patch could not reproduce it; "" if it can.
func (f *Func) Refusal(i int) string {
	if why := f.NoSplice(i); why != "" {
		return why
	}
	if !f.relocatable(i) {
		in := &f.Fn.Insns[i]
		if err := codegen.CheckRelocatable(in.Addr, in.Inst, in.Bytes); err != nil {
			return err.Error()
		}
	}
	if f.trapRefused(i) {
		return f.facts.NoTrap
	}
	return ""
}

// UseVerdicts makes f ask v (nil: codegen every time) from now on: a
// caller planning functions on several goroutines gives each goroutine a
// Verdicts of its own.
func (f *Func) UseVerdicts(v *Verdicts) { f.v = v }

// Verdicts is the cache f asks (UseVerdicts).
func (f *Func) Verdicts() *Verdicts { return f.v }

func (f *Func) relocatable(i int) bool {
	in := &f.Fn.Insns[i]
	if f.v != nil {
		return f.v.relocatable(in)
	}
	return codegen.CheckRelocatable(in.Addr, in.Inst, in.Bytes) == nil
}

func (f *Func) fallsThrough(i int) bool {
	in := &f.Fn.Insns[i]
	if f.v != nil {
		return f.v.fallsThrough(in)
	}
	return codegen.CanFallThroughInst(in.Addr, in.Inst, in.Bytes)
}

// CoverRun is the number of instructions, i first, a covering splice at
// instruction i (Spliceable) would overwrite, if one may: they lie in i's
// basic block (cfg.CoverRun) of a function whose indirect jumps all
// resolved to tables; no symbol starts and no table of the kernel's
// (exception fixups, static keys' targets) lands after i; every one may
// be spliced and relocated; and all but the last fall through without a
// branch or call. In a process, a block ending in a ret or jmp may also
// be covered into the nop padding after it, where no springboard slot is
// in use (cfg.CoverRunIntoPadding; see padFree).
func (f *Func) CoverRun(i int) (int, bool) {
	n, _, ok := f.coverRun(i, true)
	return n, ok
}

// coverRun is CoverRun; intoPadding allows a run into padding, and pad is
// the padding bytes such a run's jmp overwrites (empty for a run within
// the block).
func (f *Func) coverRun(i int, intoPadding bool) (n int, pad springboard.Range, ok bool) {
	if f.why != "" || f.jumpy {
		return 0, pad, false
	}
	b := f.block(i)
	if b == nil {
		return 0, pad, false
	}
	f.from = i
	if n, ok := cfg.CoverRun(f.Fn, b, i, springboard.JmpRel32Len, f.usable); ok || !intoPadding || !f.facts.Process || f.padFree == nil {
		return n, pad, ok
	}
	n, k, ok := cfg.CoverRunIntoPadding(f.Fn, f.Blocks, b, i, springboard.JmpRel32Len, f.usable)
	if !ok {
		return 0, pad, false
	}
	start := b.Last(f.Fn).End()
	pad = springboard.Range{Start: start, End: start + uint64(k)}
	if !f.padFree(pad, false) {
		return 0, springboard.Range{}, false
	}
	return n, pad, true
}

// RunIntoBlock plans a covering splice that reaches block b from the
// block before it, for a block no splice of its own reaches without a
// trap (a 2-byte jmp after a jcc, no springboard slot in reach, no punned
// jmp that lands on free memory): where b is entered only by falling
// through from that block's jcc (cfg.CoverRunIntoNext), the run starts at
// the latest instruction there it can and takes b's first instruction
// too. The site returned is the run's start, a request there is for the
// block before b; b's own requests go at its first instruction, the
// covered site into (Covered), which the patch runs only when the jcc is
// not taken. Only in a process: the kernel's short blocks have
// springboards.
func (f *Func) RunIntoBlock(b int) (run, into *Site, ok bool) {
	if !f.facts.Process || f.why != "" || f.jumpy || b < 1 || b >= len(f.Blocks) {
		return nil, nil, false
	}
	blk, pred := &f.Blocks[b], &f.Blocks[b-1]
	for i := pred.First + pred.N - 1; i >= pred.First; i-- {
		if f.NoSplice(i) != "" {
			continue
		}
		f.from = i
		n, ok := cfg.CoverRunIntoNext(f.Fn, f.Blocks, b, i, springboard.JmpRel32Len, f.usable)
		if !ok {
			continue
		}
		fn := f.Fn
		point := func(blk int) *Point {
			return &Point{Spec: fmt.Sprintf("%s:%d", fn.Name, blk), Function: fn.Name, Block: blk, HasBlock: true}
		}
		pp, bp := point(b-1), point(b)
		run = &Site{Fn: fn, Class: springboard.Cover, Live: f.Live(i),
			x: &siteExtra{point: pp, index: int32(i), ambiguous: int32(f.Ambiguous)}}
		for j := i + 1; j < i+n; j++ {
			jp := pp
			if j >= blk.First {
				jp = bp
			}
			c := &Site{Fn: fn, Class: springboard.Cover, Live: f.Live(j),
				x: &siteExtra{point: jp, index: int32(j), ambiguous: int32(f.Ambiguous)}}
			run.x.cover = append(run.x.cover, c)
			if j == blk.First {
				into = c
			}
		}
		return run, into, true
	}
	return nil, nil, false
}

// trapPadding gives trap site s at instruction i, a ret or jmp that ends
// its block, the nop padding after it that a punned jmp over it may own
// (Site.TrapPadding): up to the pun's 4 bytes, taken out of the
// springboard heap. Only in a process, and only where no slot in use
// lies there.
func (f *Func) trapPadding(s *Site, i int) {
	if !f.facts.Process || f.padFree == nil || f.why != "" || f.jumpy {
		return
	}
	in := &f.Fn.Insns[i]
	k := min(cfg.PaddingAfter(f.Fn, f.Blocks, i), springboard.JmpRel32Len-1-in.Len())
	if k <= 0 {
		return
	}
	pad := springboard.Range{Start: in.End(), End: in.End() + uint64(k)}
	if f.padFree(pad, true) {
		s.x.pad = f.bytesAt(pad)
	}
}

// bytesAt is the function's bytes in r (padding: instructions of
// fn.Insns, in order).
func (f *Func) bytesAt(r springboard.Range) []byte {
	var b []byte
	k, err := f.Fn.Index(r.Start)
	if err != nil {
		return nil
	}
	for ; k < len(f.Fn.Insns) && f.Fn.Insns[k].Addr < r.End; k++ {
		in := &f.Fn.Insns[k]
		lo, hi := max(in.Addr, r.Start), min(in.End(), r.End)
		b = append(b, in.Bytes[lo-in.Addr:hi-in.Addr]...)
	}
	return b
}

// coverUsable is CoverRun's rule for instruction j of the run from f.from.
func (f *Func) coverUsable(j int, last bool) bool {
	if j > f.from {
		in := &f.Fn.Insns[j]
		if f.facts.Owned.Landing(in.Addr) || symbolAt(f.facts.Symbols, in.Addr) {
			return false // a way in that is not a decoded branch
		}
		if f.facts.instructionNoSplice(f.Fn, j) != "" || !f.relocatable(j) { // an int3 included
			return false
		}
	}
	return last || f.fallsThrough(j)
}

// symbolAt: a symbol starts at addr (code may be entered there).
func symbolAt(syms *kernel.Symbols, addr uint64) bool {
	_, off, ok := syms.At(addr)
	return ok && off == 0
}

// Class is how a splice at instruction i (Spliceable) would reach its
// patch now: direct for 5 bytes or more; a short instruction takes a
// springboard when a slot is free within rel8 reach, else a covering
// splice when its block allows one (other points aside: the engine falls
// back to a trap splice when one holds an instruction of the run), else a
// trap splice.
func (f *Func) Class(i int) springboard.Class {
	in := &f.Fn.Insns[i]
	c := springboard.Classify(in.Len())
	switch {
	case c == springboard.Direct:
		return c
	case c == springboard.Springboard && f.slotFree != nil && f.slotFree(in.Addr):
		return c
	}
	if _, ok := f.CoverRun(i); ok {
		return springboard.Cover
	}
	return springboard.Trap
}

// cost orders the classes by what a hit costs: a direct splice's jmp
// rel32, a springboard's two jumps, a covering splice's jmp and the
// instructions it runs in the patch (an int3 until the driver writes the
// jmp), a trap splice's int3 on every hit.
func cost(c springboard.Class) int {
	switch c {
	case springboard.Direct:
		return 0
	case springboard.Springboard:
		return 1
	case springboard.Cover:
		return 2
	}
	return 3
}

// Pick chooses the instruction of fn.Insns[first, first+n) to splice for
// all of them (a basic block, or the entry block: each of its
// instructions runs once each time the first does): of those that are
// Spliceable, the cheapest class, the first one on ties. False when none
// is.
func (f *Func) Pick(first, n int) (int, bool) {
	for i := first; i < first+n; i++ {
		if springboard.Classify(f.Fn.Insns[i].Len()) == springboard.Direct && f.Spliceable(i) {
			return i, true // the cheapest class: nothing after it is cheaper
		}
	}
	best, bestCost := -1, 0
	for i := first; i < first+n; i++ {
		if !f.Spliceable(i) {
			continue
		}
		if c := cost(f.Class(i)); best < 0 || c < bestCost {
			best, bestCost = i, c
		}
	}
	return best, best >= 0
}

// ErrNoEntryInstruction is returned when a function's entry block has no
// instruction that may be spliced.
var ErrNoEntryInstruction = errors.New("no spliceable instruction in the entry block")

// Entry picks where the function's entry is spliced: Pick over the entry
// block (up to the first branch; cfg.Function.EntryBlock). Every
// instruction there runs exactly once per call, so a counter there counts
// calls.
func (f *Func) Entry() (int, error) {
	fn := f.Fn
	if f.why != "" {
		return 0, &NoSpliceError{Where: fn.Name, Reason: f.why}
	}
	lo, n := 0, fn.EntryBlock()
	if f.facts.Process {
		if f.goStackChecked(n) {
			// Go's stack check: growing the stack calls morestack and
			// jumps back to the entry, which so runs twice for one call;
			// the code after the check runs once per call.
			lo = n
			for n < len(fn.Insns) && !cfg.IsControlTransfer(&fn.Insns[n]) {
				n++
			}
		}
	}
	if i, ok := f.Pick(lo, n); ok {
		return i, nil
	}
	var listing bytes.Buffer
	for i := 0; i < n && i < 8; i++ {
		in := &fn.Insns[i]
		fmt.Fprintf(&listing, "\n  +%#x  %d bytes  %s", in.Addr-fn.Addr, in.Len(), in.String())
	}
	what := "is the ftrace site or cannot be spliced"
	if f.facts.Process {
		what = "cannot be spliced"
	}
	return 0, fmt.Errorf("%w of %s: every instruction before its first branch %s; pick one with %s+0xOFF:%s",
		ErrNoEntryInstruction, fn.Name, what, fn.Name, listing.String())
}

// goStackChecked reports whether the entry block's last instruction (n
// instructions long, its branch included) is the stack check of a Go
// function's prologue: a conditional jump to code that calls
// runtime.morestack (or a variant) and jumps back to the function's
// start.
func (f *Func) goStackChecked(n int) bool {
	fn := f.Fn
	if n < 1 || n >= len(fn.Insns) || f.names == nil {
		return false
	}
	br := &fn.Insns[n-1]
	if br.Inst.Op == x86asm.JMP || br.Inst.Op == x86asm.CALL || br.Inst.Op == x86asm.RET {
		return false
	}
	t, ok := cfg.BranchTarget(br)
	if !ok {
		return false
	}
	j, err := fn.Index(t)
	if err != nil {
		return false
	}
	called := false
	for end := min(j+8, len(fn.Insns)); j < end; j++ {
		in := &fn.Insns[j]
		to, ok := cfg.BranchTarget(in)
		switch {
		case in.Inst.Op == x86asm.CALL && ok:
			name, _ := f.names(to)
			called = strings.HasPrefix(name, "runtime.morestack")
		case in.Inst.Op == x86asm.JMP:
			return called && ok && to == fn.Addr
		}
	}
	return false
}

// ErrNoBlock is matched by errors for a FUNC:BLOCK that names no block.
var ErrNoBlock = errors.New("no such block")

// Block picks where FUNC:BLOCK is spliced: Pick over block b (numbered as
// kinst cfg prints them; every instruction of a basic block runs once
// each time the block does, calls returning).
func (f *Func) Block(b int) (int, error) {
	fn := f.Fn
	if b < 0 || b >= len(f.Blocks) {
		return 0, &BadPointError{fmt.Errorf("%w: %s has blocks 0..%d, not %d (see kinst cfg %s)", ErrNoBlock, fn.Name, len(f.Blocks)-1, b, fn.Name)}
	}
	blk := &f.Blocks[b]
	where := fmt.Sprintf("%s:%d", fn.Name, b)
	if f.why != "" {
		return 0, &NoSpliceError{Where: where, Reason: f.why}
	}
	if blk.Padding {
		return 0, &NoSpliceError{Where: where, Reason: "padding: never executed"}
	}
	if i, ok := f.Pick(blk.First, blk.N); ok {
		return i, nil
	}
	return 0, &NoSpliceError{Where: where, Reason: "no instruction of the block may be spliced: " + f.blockRefusals(blk)}
}

// blockRefusals says why each instruction of blk was refused, the same
// reason once ("+0x10 endbr64: …; +0x14 …").
func (f *Func) blockRefusals(blk *cfg.Block) string {
	var parts []string
	seen := map[string]bool{}
	for i := blk.First; i < blk.First+blk.N; i++ {
		why := f.Refusal(i)
		if why == "" || seen[why] {
			continue
		}
		seen[why] = true
		in := &f.Fn.Insns[i]
		parts = append(parts, fmt.Sprintf("+%#x %s: %s", in.Addr-f.Fn.Addr, in.String(), why))
	}
	if len(parts) == 0 {
		return "none takes a splice of any class"
	}
	return strings.Join(parts, "; ")
}

// Resolve plans the splice of point p, whose function f is: FUNC+0xOFF
// that instruction, FUNC:BLOCK the block's pick (Block), FUNC the entry's
// (Entry).
func (f *Func) Resolve(p Point) (*Site, error) {
	fn := f.Fn
	var i int
	var err error
	switch {
	case p.HasOffset:
		// The kernel's own tables first: they hold even where decoding
		// does not reach (an instruction x86asm does not know).
		if why := f.facts.Owned.Reason(fn.Addr + p.Offset); why != "" {
			return nil, &NoSpliceError{Where: p.Spec, Reason: why}
		}
		i, err = fn.Index(fn.Addr + p.Offset)
	case p.HasBlock:
		i, err = f.Block(p.Block)
	default:
		i, err = f.Entry()
	}
	if err != nil {
		return nil, err
	}
	return f.Site(p, i)
}

// At plans a splice at instruction i as the point FUNC+0xOFF.
func (f *Func) At(i int) (*Site, error) {
	fn := f.Fn
	off := fn.Insns[i].Addr - fn.Addr
	return f.Site(Point{Spec: fmt.Sprintf("%s+%#x", fn.Name, off), Function: fn.Name, Offset: off, HasOffset: true}, i)
}

// Site plans the splice of instruction i for point p: refused (a
// *NoSpliceError) when NoSplice says so; otherwise its class, what is
// live, and for a covering splice the instructions its jmp runs over.
// Whether a patch can reproduce the instruction is codegen's to say when
// the patch is built.
func (f *Func) Site(p Point, i int) (*Site, error) {
	pp := &p // shared by the covered instructions' sites
	s := &Site{Fn: f.Fn, x: &siteExtra{point: pp, index: int32(i), ambiguous: int32(f.Ambiguous)}}
	if why := f.NoSplice(i); why != "" {
		return nil, &NoSpliceError{Where: s.Where(), Reason: why}
	}
	s.Class = f.Class(i)
	if s.Class == springboard.Trap && f.facts.NoTrap != "" && !f.facts.Pun {
		return nil, &NoSpliceError{Where: s.Where(), Reason: f.facts.NoTrap}
	}
	s.Live = f.Live(i)
	// A covering splice's run; where traps are refused, a springboard
	// site's too, for the engine to fall back on if its slot is gone at
	// install (engine.Engine.SetNoTrap).
	if s.Class == springboard.Cover || s.Class == springboard.Springboard && f.facts.NoTrap != "" {
		// A springboard's fallback stays within the block: padding after
		// it may hold the very slot it was planned with.
		n, pad, ok := f.coverRun(i, s.Class == springboard.Cover)
		if ok && pad.Len() > 0 && !f.padFree(pad, true) {
			ok = false // taken since Class looked
		}
		if !ok {
			n = 0
		}
		if s.Class == springboard.Cover && n == 0 {
			s.Class = springboard.Trap
			if f.facts.NoTrap != "" && !f.facts.Pun {
				return nil, &NoSpliceError{Where: s.Where(), Reason: f.facts.NoTrap}
			}
		}
		cs := make([]*Site, 0, max(n-1, 0))
		for j := i + 1; j < i+n; j++ {
			cs = append(cs, &Site{Fn: f.Fn, x: &siteExtra{point: pp, index: int32(j), ambiguous: int32(f.Ambiguous)},
				Class: springboard.Cover, Live: f.Live(j)})
		}
		if len(cs) > 0 {
			s.x.cover = cs
		}
		if pad.Len() > 0 && n > 0 {
			s.x.pad = f.bytesAt(pad)
		}
	}
	if s.Class == springboard.Trap {
		f.trapPadding(s, i)
	}
	return s, nil
}
