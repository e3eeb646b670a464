package kerninstd

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/springboard"
)

// DriverModule is the module name of kerninst.ko in kallsyms.
const DriverModule = "kerninst"

// site is a resolved point: one instruction of a decoded function.
type site struct {
	point cfg.Point
	sym   kernel.Symbol
	fn    *cfg.Function
	index int
	amb   int
	// live: registers and flags that may be live before the instruction.
	// Flags count as live when either the forward scan or the block
	// data-flow says so, so a mistake in one analysis alone cannot
	// corrupt the kernel.
	live cfg.LiveSet
	// class is how the splice reaches the patch.
	class springboard.Class
}

// flagsLive: a patch here must preserve RFLAGS.
func (s *site) flagsLive() bool { return s.live.Flags() != 0 }

func (s *site) insn() *cfg.Instruction { return &s.fn.Insns[s.index] }

func (s *site) where() string {
	return fmt.Sprintf("%s+%#x", s.fn.Name, s.insn().Addr-s.fn.Addr)
}

func (s *site) resolved() api.Resolved {
	in := s.insn()
	return api.Resolved{
		Point:       s.point.Spec,
		Function:    s.fn.Name,
		Module:      s.fn.Module,
		Offset:      in.Addr - s.fn.Addr,
		Address:     api.Addr(in.Addr),
		Length:      in.Len(),
		Bytes:       hex.EncodeToString(in.Bytes),
		Instruction: in.String(),
		SpliceClass: s.class.String(),
		FlagsLive:   s.flagsLive(),
		Classic:     (*api.ClassicName)(s.point.Classic),
		Ambiguous:   s.amb,
	}
}

// ErrNoEntryInstruction is returned when a function's entry block has no
// instruction a direct splice can take.
var ErrNoEntryInstruction = errors.New("no spliceable instruction in the entry block")

// lookup finds a function by name, reloading kallsyms once if it is not
// there: a module may have been loaded since the last snapshot.
func (d *Daemon) lookup(name string) (*kernel.Symbols, kernel.Symbol, int, error) {
	syms := d.symbols()
	sym, amb, err := syms.Lookup(name)
	if errors.Is(err, kernel.ErrUnknownFunction) {
		if syms, err = d.reloadSymbols(); err == nil {
			sym, amb, err = syms.Lookup(name)
		}
	}
	return syms, sym, amb, err
}

// resolve maps a point to one instruction of the live kernel and checks
// that it may be spliced. It changes nothing.
func (d *Daemon) resolve(spec string) (*site, error) {
	p, err := cfg.ParsePoint(spec)
	if err != nil {
		return nil, badRequest(err)
	}
	syms, sym, amb, err := d.lookup(p.Function)
	if err != nil {
		return nil, err
	}
	fn, err := cfg.ReadFunction(d.text(), syms, sym)
	if err != nil {
		return nil, err
	}
	s := &site{point: p, sym: sym, fn: fn, amb: amb}
	if p.HasOffset {
		// The kernel's own tables first: they hold even where decoding
		// does not reach (an instruction x86asm does not know).
		if why := d.ownedSites().Reason(fn.Addr + p.Offset); why != "" {
			return nil, &cfg.NoSpliceError{Where: spec, Reason: why}
		}
		if s.index, err = fn.Index(fn.Addr + p.Offset); err != nil {
			return nil, err
		}
	} else if p.HasBlock {
		if s.index, err = d.blockInstruction(syms, fn, p.Block); err != nil {
			return nil, err
		}
	} else if s.index, err = entryInstruction(fn, d.ownedSites()); err != nil {
		return nil, err
	}
	if err := d.checkSite(syms, s); err != nil {
		return nil, err
	}
	return s, nil
}

// checkSite refuses a no-splice instruction and sets the splice class and
// the live registers and flags of s, whose instruction is chosen.
func (d *Daemon) checkSite(syms *kernel.Symbols, s *site) error {
	fn, in := s.fn, s.insn()
	if why := d.noSpliceReason(syms, fn, in.Addr); why != "" {
		return &cfg.NoSpliceError{Where: s.where(), Reason: why}
	}
	blocks := d.blocks(syms, fn)
	if inPadding(blocks, s.index) {
		return &cfg.NoSpliceError{Where: s.where(), Reason: paddingReason}
	}
	s.class = d.spliceClass(syms, fn, blocks, s.index)
	s.live = d.siteLive(syms, s, blocks)
	return nil
}

// paddingReason refuses an instruction of a padding block: it never runs,
// so a counter there would never count, and its bytes are springboard
// space (a slot there and a splice would overlap).
const paddingReason = "padding between functions: never executed (springboard space)"

// inPadding: instruction i lies in a padding block.
func inPadding(blocks []cfg.Block, i int) bool {
	for k := range blocks {
		if b := &blocks[k]; i >= b.First && i < b.First+b.N {
			return b.Padding
		}
	}
	return false
}

// spliceClass is the kind of splice instruction i of fn would get now: a
// short instruction takes a springboard splice when a slot is free within
// rel8 reach, else a covering splice when its basic block allows one
// (ignoring other points), else a trap splice.
func (d *Daemon) spliceClass(syms *kernel.Symbols, fn *cfg.Function, blocks []cfg.Block, i int) springboard.Class {
	in := &fn.Insns[i]
	c := springboard.Classify(in.Len())
	if c == springboard.Springboard {
		d.addSpringboardSpace(syms, in.Addr)
		if _, ok := d.spring.Find(in.Addr); ok {
			return c
		}
	}
	if c != springboard.Direct {
		if _, ok := d.coverRun(syms, fn, blocks, i); ok {
			return springboard.Cover
		}
		return springboard.Trap
	}
	return c
}

// coverRun is the number of instructions, i first, a covering splice at
// instruction i would overwrite, if it may (cfg.CoverRun): every one may
// be spliced, the last relocated, and all but the last fall through
// without a branch or call.
func (d *Daemon) coverRun(syms *kernel.Symbols, fn *cfg.Function, blocks []cfg.Block, i int) (int, bool) {
	return cfg.CoverRun(fn, blocks, i, springboard.JmpRel32Len, syms, d.ownedSites(), func(j int, last bool) bool {
		in := &fn.Insns[j]
		if d.noSpliceReason(syms, fn, in.Addr) != "" { // an int3 already there included
			return false
		}
		if last {
			return unrelocatable(in) == ""
		}
		return codegen.CanFallThrough(codegen.Site{Addr: in.Addr, Bytes: in.Bytes})
	})
}

// blocks is fn's basic blocks as the daemon analyses them.
func (d *Daemon) blocks(syms *kernel.Symbols, fn *cfg.Function) []cfg.Block {
	return fn.BlocksOpt(cfg.BlockOptions{Names: syms.Names(), NoReturn: d.noReturn(), Tables: d.text()})
}

// siteLive is the registers and flags live before s's instruction (step
// 2 of a request: liveness); blocks are s.fn's (d.blocks).
func (d *Daemon) siteLive(syms *kernel.Symbols, s *site, blocks []cfg.Block) cfg.LiveSet {
	live := d.dataflowLive(syms, s.fn, blocks, s.index)
	if s.fn.FlagsLive(s.index) {
		live |= cfg.FlagBits
	}
	return live
}

// noSpliceReason combines the symbol-based reasons with the kernel's own
// tables.
func (d *Daemon) noSpliceReason(syms *kernel.Symbols, fn *cfg.Function, addr uint64) string {
	return cfg.NoSpliceReason(syms, fn, addr, DriverModule, d.ownedSites())
}

// dataflowLive is what the block data-flow over blocks (fn's) says is
// live before instruction i of fn.
func (d *Daemon) dataflowLive(syms *kernel.Symbols, fn *cfg.Function, blocks []cfg.Block, i int) cfg.LiveSet {
	lv := fn.LiveWith(blocks, syms.Names(), d.prototypes(), d.calleeReads())
	for _, b := range blocks {
		if i >= b.First && i < b.First+b.N {
			return lv.Before(b.Index, i)
		}
	}
	return ^cfg.LiveSet(0)
}

// entryInstruction picks where "function entry" is spliced: the first
// instruction of the entry block that is not the ftrace site and is long
// enough for a direct splice (the cheapest kind); failing that, the first
// one that can be relocated at all (a springboard or trap splice). Every
// instruction of the entry block runs exactly once per call, so a counter
// there counts calls.
func entryInstruction(fn *cfg.Function, owned *kernel.OwnedSites) (int, error) {
	n := fn.EntryBlock()
	if i, ok := pickInstruction(fn, owned, 0, n); ok {
		return i, nil
	}
	var listing bytes.Buffer
	for i := 0; i < n && i < 8; i++ {
		in := &fn.Insns[i]
		fmt.Fprintf(&listing, "\n  +%#x  %d bytes  %s", in.Addr-fn.Addr, in.Len(), in.String())
	}
	return 0, fmt.Errorf("%w of %s: every instruction before its first branch is the ftrace site or cannot be relocated; pick one with %s+0xOFF:%s",
		ErrNoEntryInstruction, fn.Name, fn.Name, listing.String())
}

// ErrNoBlock is matched by errors for a FUNC:BLOCK that names no block
// that can be instrumented.
var ErrNoBlock = errors.New("no such block")

// blockInstruction picks where FUNC:BLOCK is spliced: an instruction of
// the block chosen as for the entry (every instruction of a basic block
// runs once each time the block does, calls returning). Block indices are
// those kinst cfg prints.
func (d *Daemon) blockInstruction(syms *kernel.Symbols, fn *cfg.Function, b int) (int, error) {
	blocks := fn.BlocksOpt(cfg.BlockOptions{Names: syms.Names(), NoReturn: d.noReturn(), Tables: d.text()})
	if b < 0 || b >= len(blocks) {
		return 0, badRequest(fmt.Errorf("%w: %s has blocks 0..%d, not %d (see kinst cfg %s)", ErrNoBlock, fn.Name, len(blocks)-1, b, fn.Name))
	}
	blk := &blocks[b]
	if blk.Padding {
		return 0, &cfg.NoSpliceError{Where: fmt.Sprintf("%s:%d", fn.Name, b), Reason: "padding: never executed"}
	}
	if i, ok := pickInstruction(fn, d.ownedSites(), blk.First, blk.N); ok {
		return i, nil
	}
	return 0, &cfg.NoSpliceError{Where: fmt.Sprintf("%s:%d", fn.Name, b),
		Reason: "no instruction of the block can be relocated (or it is the ftrace site); pick one with FUNC+0xOFF to see why"}
}

// pickInstruction returns the first instruction of fn.Insns[first,
// first+n) that is not the ftrace site and is long enough for a direct
// splice (the cheapest kind), else the first one that can be relocated at
// all (a springboard or trap splice).
func pickInstruction(fn *cfg.Function, owned *kernel.OwnedSites, first, n int) (int, bool) {
	short := -1
	for i := first; i < first+n; i++ {
		in := &fn.Insns[i]
		if cfg.IsFtraceSite(owned, fn, i) || codegen.CheckRelocatable(in.Addr, in.Inst, in.Bytes) != nil {
			continue
		}
		if springboard.Classify(in.Len()) == springboard.Direct {
			return i, true
		}
		if short < 0 {
			short = i
		}
	}
	return short, short >= 0
}

// point is one instrumented instruction. Every request at it shares one
// patch: the requests' snippets in order, then the relocated instruction.
// Adding or removing a request builds a new patch in new memory and
// re-points the splice at it (the driver's RESPLICE: no moment where the
// point runs neither patch); the old patch is freed after the driver's
// RCU-tasks wait. Protected by Daemon.mu.
type point struct {
	site *site
	// cover: for a covering splice, the instructions after site that its
	// jmp overwrites; the patch runs each, with its own requests' snippets
	// before it. d.points maps their addresses to this point too.
	cover  []*site
	reqs   []*request
	patch  uint64 // the installed patch; 0 when not spliced
	splice uint32 // the driver's splice id at the instruction
	class  springboard.Class
	// A springboard splice's slot (a jmp rel32 to the patch, in padding)
	// and the driver's splice id of the slot.
	slot       uint64
	slotSplice uint32
}

// request is one piece of instrumentation at a point, owned by a session:
// a snippet and the counter slots it writes. Protected by Daemon.mu.
type request struct {
	pt      *point
	site    *site  // the instruction instrumented: pt.site, or one pt covers
	owner   string // session ID
	slots   []int  // counter slots, zeroed when the request was made
	snippet codegen.Snippet
}

// counter is the first counter slot: a counting request's count.
func (r *request) counter() int { return r.slots[0] }

// SnippetFunc makes a request's snippet from the kernel addresses of its
// counter slots.
type SnippetFunc func(counters []uint64) codegen.Snippet

// CounterSnippet counts executions in the request's only slot.
func CounterSnippet(c []uint64) codegen.Snippet { return codegen.Counter{Addr: c[0]} }

// instrument adds a request at s for owner: nslots fresh counter slots
// and the snippet mk makes from their addresses, then rebuilds the
// point's patch. On error nothing changed. The caller holds d.mu.
func (d *Daemon) instrument(s *site, owner string, nslots int, mk SnippetFunc) (*request, error) {
	addr := s.insn().Addr
	pt := d.points[addr]
	if pt == nil {
		pt = d.newPoint(s)
	}
	r := &request{pt: pt, site: s, owner: owner}
	for i := 0; i < nslots; i++ {
		slot, err := d.slots.alloc()
		if err == nil {
			err = d.dev.ClearCounters(slot, 1)
		}
		if err != nil {
			for _, sl := range r.slots {
				d.slots.free(sl)
			}
			d.slots.free(slot)
			return nil, err
		}
		r.slots = append(r.slots, slot)
	}
	addrs := make([]uint64, len(r.slots))
	for i, sl := range r.slots {
		addrs[i] = d.dev.CounterAddr(sl)
	}
	r.snippet = mk(addrs)
	reqs := append(append([]*request(nil), pt.reqs...), r)
	if err := d.install(pt, reqs); err != nil {
		for _, sl := range r.slots {
			d.slots.free(sl)
		}
		return nil, err
	}
	for _, ps := range pt.sites() {
		d.points[ps.insn().Addr] = pt
	}
	return r, nil
}

// newPoint is a point at s not yet spliced. A covering splice takes the
// instructions after s only if no other point has one of them; otherwise
// the point gets a trap splice. The caller holds d.mu.
func (d *Daemon) newPoint(s *site) *point {
	pt := &point{site: s, class: s.class}
	if pt.class != springboard.Cover {
		return pt
	}
	pt.class = springboard.Trap
	syms := d.symbols()
	blocks := d.blocks(syms, s.fn)
	n, ok := d.coverRun(syms, s.fn, blocks, s.index)
	if !ok {
		return pt
	}
	var cover []*site
	for j := s.index + 1; j < s.index+n; j++ {
		if _, taken := d.points[s.fn.Insns[j].Addr]; taken {
			return pt
		}
		c := &site{point: s.point, sym: s.sym, fn: s.fn, index: j, amb: s.amb, class: springboard.Cover}
		c.live = d.siteLive(syms, c, blocks)
		cover = append(cover, c)
	}
	pt.cover, pt.class = cover, springboard.Cover
	return pt
}

// sites is every instruction the point's splice overwrites, in order.
func (pt *point) sites() []*site { return append([]*site{pt.site}, pt.cover...) }

// coverBytes is the original bytes of the run a covering splice
// overwrites, as far as the jmp reaches.
func (pt *point) coverBytes() []byte {
	var b []byte
	for _, s := range pt.sites() {
		b = append(b, s.insn().Bytes...)
	}
	return b[:springboard.JmpRel32Len]
}

// uninstrument removes request r: the point gets a patch without it, or
// its original bytes back when r was the last. The caller holds d.mu.
func (d *Daemon) uninstrument(r *request) error {
	pt := r.pt
	var reqs []*request
	for _, o := range pt.reqs {
		if o != r {
			reqs = append(reqs, o)
		}
	}
	if err := d.install(pt, reqs); err != nil {
		return err
	}
	for _, sl := range r.slots {
		d.slots.free(sl)
	}
	if len(pt.reqs) == 0 {
		for _, ps := range pt.sites() {
			delete(d.points, ps.insn().Addr)
		}
	}
	return nil
}

// install makes reqs the point's requests: with none, the original bytes
// go back; otherwise a new patch is generated, verified, written and read
// back, then spliced in (first request) or swapped for the old one. The
// old patch is freed last; the driver waits until no task can still run
// in it. On error the point is as it was.
func (d *Daemon) install(pt *point, reqs []*request) error {
	s := pt.site
	old := pt.patch
	if len(reqs) == 0 {
		if pt.splice != 0 {
			if err := d.ov.restored(s.insn().Addr, func() error { return d.dev.Unsplice(pt.splice) }); err != nil {
				return fmt.Errorf("unsplice %s: %w", s.where(), err)
			}
			pt.splice = 0
		}
		if pt.slotSplice != 0 {
			if err := d.ov.restored(pt.slot, func() error { return d.dev.Unsplice(pt.slotSplice) }); err != nil {
				return fmt.Errorf("unsplice springboard %#x of %s: %w", pt.slot, s.where(), err)
			}
			pt.slotSplice = 0
		}
		pt.reqs, pt.patch = nil, 0
		d.retire(old, pt.slot)
		pt.slot = 0
		return nil
	}
	specs := pt.patchSpecs(reqs)
	n := 0
	for _, spec := range specs {
		k, err := codegen.PatchLen(d.patchHeapBase(), spec)
		if err != nil {
			return fmt.Errorf("%s: %w", s.where(), err)
		}
		n += k
	}
	patch, err := d.allocPatch(n)
	if err != nil {
		return fmt.Errorf("allocate patch: %w", err)
	}
	fail := func(err error) error {
		if ferr := d.dev.PatchFree(patch); ferr != nil {
			d.log.Error("free patch after failed attach", "patch", fmt.Sprintf("%#x", patch), "err", ferr)
		}
		return err
	}
	code, err := pt.buildPatch(patch, specs)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", s.where(), err))
	}
	if err := d.dev.PatchWrite(patch, code); err != nil {
		return fail(fmt.Errorf("write patch: %w", err))
	}
	// Read the patch back: what runs must be what was verified.
	back := make([]byte, len(code))
	if err := d.dev.Read(patch, back); err != nil || !bytes.Equal(back, code) {
		return fail(fmt.Errorf("patch at %#x does not read back as written (%v)", patch, err))
	}
	switch {
	case pt.slotSplice != 0: // a springboard splice: re-point its slot
		if err := d.dev.Resplice(pt.slotSplice, patch); err != nil {
			return fail(fmt.Errorf("re-point the springboard of %s: %w", s.where(), err))
		}
	case pt.splice != 0:
		if err := d.dev.Resplice(pt.splice, patch); err != nil {
			return fail(fmt.Errorf("re-point %s: %w", s.where(), err))
		}
	case pt.class == springboard.Springboard:
		if err := d.springboardSplice(pt, patch); err != nil {
			if !errors.Is(err, springboard.ErrNoSlot) {
				return fail(fmt.Errorf("springboard splice %s: %w", s.where(), err))
			}
			// The slot went to another point meanwhile: trap instead.
			d.log.Info("no springboard slot left; trap splice", "at", s.where())
			pt.class = springboard.Trap
		}
	}
	if pt.splice == 0 {
		splice := func() (uint32, error) { return d.splice(s, pt.class, patch) }
		if pt.class == springboard.Cover {
			splice = func() (uint32, error) { return d.spliceCovering(pt, patch) }
		}
		id, err := splice()
		if err != nil {
			return fail(fmt.Errorf("splice %s: %w", s.where(), err))
		}
		pt.splice = id
	}
	pt.reqs, pt.patch = reqs, patch
	d.retire(old, 0)
	return nil
}

// reclaimDelay is how long retired patches wait to be freed in one batch:
// each free waits for an RCU-tasks grace period (tens of milliseconds),
// but one wait covers every patch and slot retired before it.
const reclaimDelay = 50 * time.Millisecond

// retired is a patch (and a springboard slot) no splice leads to any more
// but that a preempted task may still be running in.
type retired struct{ patch, slot uint64 }

// retire queues a replaced or removed patch and slot for reclaim. The
// caller holds d.mu.
func (d *Daemon) retire(patch, slot uint64) {
	if patch == 0 && slot == 0 {
		return
	}
	d.retired = append(d.retired, retired{patch, slot})
	if !d.reclaimArmed {
		d.reclaimArmed = true
		time.AfterFunc(reclaimDelay, func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.reclaimLocked()
		})
	}
}

// reclaimLocked frees every retired patch and returns the slots. The
// driver's first free waits for RCU-tasks (a splice was removed or
// re-pointed since the last wait), which covers every retirement before
// it: only then do the slots go back to the heap. The caller holds d.mu.
func (d *Daemon) reclaimLocked() {
	d.reclaimArmed = false
	var kept []retired
	for _, r := range d.retired {
		if r.patch != 0 {
			if err := d.dev.PatchFree(r.patch); err != nil {
				d.log.Error("free retired patch", "patch", fmt.Sprintf("%#x", r.patch), "err", err)
				kept = append(kept, r)
				continue
			}
		}
		if r.slot != 0 {
			d.spring.Release(r.slot)
		}
	}
	d.retired = kept
}

// allocPatch allocates n bytes of patch heap, reclaiming retired patches
// first if the heap is full.
func (d *Daemon) allocPatch(n int) (uint64, error) {
	p, err := d.dev.PatchAlloc(n)
	if err != nil && len(d.retired) > 0 {
		d.reclaimLocked()
		p, err = d.dev.PatchAlloc(n)
	}
	return p, err
}

// splice writes the instruction's splice to patch: a jmp rel32 for a
// direct splice, an int3 for a trap splice.
func (d *Daemon) splice(s *site, class springboard.Class, patch uint64) (uint32, error) {
	in := s.insn()
	var repl []byte
	switch class {
	case springboard.Direct:
		var err error
		if repl, err = codegen.JmpRel32(in.Addr, patch); err != nil {
			return 0, err
		}
	case springboard.Cover:
		return 0, fmt.Errorf("covering splices go through spliceCovering")
	case springboard.Trap:
		repl = []byte{0xcc}
	default:
		return 0, fmt.Errorf("%v splices go through springboardSplice (a slot first)", class)
	}
	var id uint32
	err := d.ov.spliced(in.Addr, in.Bytes, func() (err error) {
		id, err = d.dev.Splice(in.Addr, patch, in.Bytes[:len(repl)], repl)
		return err
	})
	return id, err
}

// spliceCovering arms a covering splice: a jmp rel32 to patch over the
// point's run of instructions. The driver writes the int3 now (the splice
// works as a trap splice at once) and the jmp when d.cover's background
// FinishCovering has seen a grace period.
func (d *Daemon) spliceCovering(pt *point, patch uint64) (uint32, error) {
	at := pt.site.insn().Addr
	jmp, err := codegen.JmpRel32(at, patch)
	if err != nil {
		return 0, err
	}
	orig := pt.coverBytes()
	var id uint32
	err = d.ov.spliced(at, orig, func() (err error) {
		id, err = d.dev.SpliceCovering(at, patch, orig, jmp)
		return err
	})
	if err == nil {
		d.cover.kick(d)
	}
	return id, err
}

// coverFinisher runs the driver's FinishCovering in the background after
// covering splices are armed: one grace period serves every splice armed
// before it, and neither d.mu nor the driver's lock is held across it, so
// requests go on meanwhile. Until then an armed splice works as a trap
// splice.
type coverFinisher struct {
	mu       sync.Mutex
	running  bool   // a goroutine is finishing; protected by mu
	arms     uint64 // covering splices armed; protected by mu
	finished uint64 // arms covered by a completed FinishCovering; protected by mu
	jmps     uint64 // jmps the driver wrote; protected by mu
}

// kick notes one more armed splice and starts a finisher if none runs.
func (c *coverFinisher) kick(d *Daemon) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.arms++
	if c.running {
		return
	}
	c.running = true
	go func() {
		for {
			c.mu.Lock()
			upto := c.arms
			c.mu.Unlock()
			n, err := d.dev.FinishCovering()
			c.mu.Lock()
			if err != nil {
				d.log.Error("finish covering splices", "err", err)
			} else {
				c.finished = upto
				c.jmps += uint64(n)
			}
			if err != nil || c.arms == upto {
				c.running = false
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
		}
	}()
}

// state is how many covering splices may still be int3 only, and how
// many jmps the driver has written.
func (c *coverFinisher) state() (armed int, jmps uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.arms - c.finished), c.jmps
}

// springboardSplice takes a slot within rel8 reach of the point, writes
// the slot (jmp rel32 to patch) into the padding, then the jmp rel8 to the
// slot over the instruction. On error nothing is left installed; the slot
// goes back to the heap only after the caller's patch free (which waits
// for RCU-tasks), as a CPU may have passed through it.
func (d *Daemon) springboardSplice(pt *point, patch uint64) error {
	in := pt.site.insn()
	slot, err := d.spring.Alloc(in.Addr)
	if err != nil {
		return err
	}
	orig := make([]byte, springboard.SlotLen)
	jmp, err := codegen.JmpRel32(slot, patch)
	if err == nil {
		err = d.text().Read(slot, orig)
	}
	if err != nil {
		d.spring.Release(slot)
		return err
	}
	var slotID uint32
	err = d.ov.spliced(slot, orig, func() (err error) {
		slotID, err = d.dev.SpliceSlot(slot, patch, orig, jmp)
		return err
	})
	if err != nil {
		d.spring.Release(slot) // never written: nothing reached it
		return fmt.Errorf("write slot %#x: %w", slot, err)
	}
	rel8, err := springboard.JmpRel8(in.Addr, slot)
	var id uint32
	if err == nil {
		err = d.ov.spliced(in.Addr, in.Bytes, func() (err error) {
			id, err = d.dev.Splice(in.Addr, slot, in.Bytes[:len(rel8)], rel8)
			return err
		})
	}
	if err != nil {
		if uerr := d.ov.restored(slot, func() error { return d.dev.Unsplice(slotID) }); uerr != nil {
			d.log.Error("remove slot after failed springboard splice", "slot", fmt.Sprintf("%#x", slot), "err", uerr)
		}
		// The caller's failure path frees the patch, which waits for
		// RCU-tasks, before d.mu lets any other point take this slot.
		d.spring.Release(slot)
		return err
	}
	pt.slot, pt.slotSplice, pt.splice = slot, slotID, id
	return nil
}

// addSpringboardSpace makes sure the springboard space of every function
// within rel8 reach of addr is in the heap: each function's padding is
// found (cfg.SpringboardSpace) the first time an instruction near it asks.
func (d *Daemon) addSpringboardSpace(syms *kernel.Symbols, addr uint64) {
	lo, hi := springboard.Reach(addr)
	hi += springboard.SlotLen
	names := syms.Names()
	owned := d.ownedSites()
	for _, sym := range syms.Overlapping(lo, hi) {
		if d.spring.Seen(sym.Addr) {
			continue
		}
		if fn, err := cfg.ReadFunction(d.text(), syms, sym); err == nil && cfg.FunctionNoSplice(syms, fn, DriverModule) == "" {
			blocks := fn.BlocksOpt(cfg.BlockOptions{Names: names, NoReturn: d.noReturn(), Tables: d.text()})
			runs := cfg.SpringboardSpace(fn, blocks, func(a uint64) bool { return owned.Reason(a) != "" })
			d.spring.Add(toRanges(runs)...)
		}
	}
}

func toRanges(rs []cfg.Range) []springboard.Range {
	out := make([]springboard.Range, len(rs))
	for i, r := range rs {
		out[i] = springboard.Range{Start: r.Start, End: r.End}
	}
	return out
}

// patchHeapBase is an address in the patch heap, for sizing patches.
func (d *Daemon) patchHeapBase() uint64 {
	if d.info != nil {
		if in := d.info(); in.PatchHeap != 0 {
			return uint64(in.PatchHeap)
		}
	}
	// Anything within rel32 reach of text and counters gives the same
	// length: the counter heap is.
	return d.dev.CounterAddr(0)
}

// patchSpecs is the point's patch for reqs: one part per instruction the
// splice overwrites, each with the snippets of the requests at it, all but
// the last falling through to the next part.
func (pt *point) patchSpecs(reqs []*request) []codegen.PatchSpec {
	sites := pt.sites()
	specs := make([]codegen.PatchSpec, len(sites))
	for k, ps := range sites {
		var at []*request
		for _, r := range reqs {
			if r.site == nil || r.site.insn().Addr == ps.insn().Addr {
				at = append(at, r)
			}
		}
		specs[k] = ps.patchSpec(at)
		specs[k].FallThrough = k < len(sites)-1
	}
	return specs
}

// buildPatch generates and verifies the point's patch at addr: the parts
// of specs end to end, each checked against the registers live at its own
// instruction.
func (pt *point) buildPatch(addr uint64, specs []codegen.PatchSpec) ([]byte, error) {
	var code []byte
	for k, ps := range pt.sites() {
		part, err := buildPatch(addr+uint64(len(code)), ps, specs[k])
		if err != nil {
			return nil, err
		}
		code = append(code, part...)
	}
	return code, nil
}

// patchSpec is the patch for reqs at s.
func (s *site) patchSpec(reqs []*request) codegen.PatchSpec {
	in := s.insn()
	spec := codegen.PatchSpec{
		Site: codegen.Site{Addr: in.Addr, Bytes: in.Bytes},
		Live: codegen.Live{Regs: uint16(s.live), Flags: s.flagsLive()},
	}
	for _, r := range reqs {
		spec.Snippets = append(spec.Snippets, r.snippet)
	}
	return spec
}

// buildPatch generates the patch at addr and checks it three ways: decoded
// back (codegen.VerifyPatch), and the instrumentation decoded by the
// liveness code, which must find nothing live overwritten.
func buildPatch(addr uint64, s *site, spec codegen.PatchSpec) ([]byte, error) {
	p, err := codegen.BuildPatch(addr, spec)
	if err != nil {
		return nil, err
	}
	if err := codegen.VerifyPatch(p, spec); err != nil {
		return nil, err
	}
	if p.Instr > 0 { // a covering patch's part may have no snippets
		if err := checkClobbers(p.Code[:p.Instr], addr, s.live); err != nil {
			return nil, err
		}
	}
	return p.Code, nil
}

// buildCounterPatch generates and verifies a one-counter patch for s.
func buildCounterPatch(patch uint64, s *site, counter uint64) ([]byte, error) {
	spec := s.patchSpec([]*request{{snippet: codegen.Counter{Addr: counter}}})
	return buildPatch(patch, s, spec)
}

// ErrClobber is matched by errors from checkClobbers.
var ErrClobber = errors.New("patch would clobber live state")

// checkClobbers decodes a patch's instrumentation back and refuses it if
// it overwrites, without restoring, a register or flag live at the site:
// the last line of defence against a code generator bug.
func checkClobbers(prefix []byte, addr uint64, live cfg.LiveSet) error {
	c, err := cfg.Clobbers(prefix, addr)
	if err != nil {
		return err
	}
	if bad := c & live; bad != 0 {
		return fmt.Errorf("%w: %v (a code generator bug; nothing was spliced)", ErrClobber, bad)
	}
	return nil
}

// slotAllocator hands out counter slots. Protected by Daemon.mu.
type slotAllocator struct {
	n    int
	used map[int]bool
	next int
}

func (a *slotAllocator) alloc() (int, error) {
	for i := 0; i < a.n; i++ {
		s := (a.next + i) % a.n
		if !a.used[s] {
			a.used[s] = true
			a.next = s + 1
			return s, nil
		}
	}
	return 0, fmt.Errorf("all %d counter slots in use", a.n)
}

func (a *slotAllocator) free(s int) { delete(a.used, s) }
