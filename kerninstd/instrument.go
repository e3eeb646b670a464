package kerninstd

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/springboard"
)

// DriverModule is the module name of kerninst.ko in kallsyms.
const DriverModule = "kerninst"

// patchSize is what one counter patch is given: the largest is
// pushfq + lock inc + popfq + a relocated jcc (rel32 + jmp) + jmp back.
const patchSize = 128

// site is a resolved point: one instruction of a decoded function.
type site struct {
	point cfg.Point
	sym   cfg.Symbol
	fn    *cfg.Function
	index int
	amb   int
	// live: registers and flags that may be live before the instruction.
	// Flags count as live when either the forward scan or the block
	// data-flow says so, so a mistake in one analysis alone cannot
	// corrupt the kernel.
	live cfg.LiveSet
}

// flagsLive: a patch here must preserve RFLAGS.
func (s *site) flagsLive() bool { return s.live.Flags() != 0 }

func (s *site) insn() *cfg.Instruction { return &s.fn.Insns[s.index] }

func (s *site) where() string {
	return fmt.Sprintf("%s+%#x", s.fn.Name, s.insn().Addr-s.fn.Addr)
}

func (s *site) resolved() Resolved {
	in := s.insn()
	return Resolved{
		Point:       s.point.Spec,
		Function:    s.fn.Name,
		Module:      s.fn.Module,
		Offset:      in.Addr - s.fn.Addr,
		Address:     Addr(in.Addr),
		Length:      in.Len(),
		Bytes:       hex.EncodeToString(in.Bytes),
		Instruction: in.String(),
		SpliceClass: springboard.Classify(in.Len()).String(),
		FlagsLive:   s.flagsLive(),
		Classic:     s.point.Classic,
		Ambiguous:   s.amb,
	}
}

// ErrNoEntryInstruction is returned when a function's entry block has no
// instruction a direct splice can take.
var ErrNoEntryInstruction = errors.New("no spliceable instruction in the entry block")

// lookup finds a function by name, reloading kallsyms once if it is not
// there: a module may have been loaded since the last snapshot.
func (d *Daemon) lookup(name string) (*cfg.Symbols, cfg.Symbol, int, error) {
	syms := d.symbols()
	sym, amb, err := syms.Lookup(name)
	if errors.Is(err, cfg.ErrUnknownFunction) {
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
	fn, err := cfg.ReadFunction(d.dev, syms, sym)
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
	} else if s.index, err = entryInstruction(fn, d.ownedSites()); err != nil {
		return nil, err
	}
	in := s.insn()
	if why := d.noSpliceReason(syms, fn, in.Addr); why != "" {
		return nil, &cfg.NoSpliceError{Where: s.where(), Reason: why}
	}
	if springboard.Classify(in.Len()) != springboard.Direct {
		return nil, &springboard.TooShortError{Addr: in.Addr, Len: in.Len(), Where: s.where(), Text: in.String()}
	}
	s.live = d.dataflowLive(syms, fn, s.index)
	if fn.FlagsLive(s.index) {
		s.live |= cfg.FlagBits
	}
	return s, nil
}

// noSpliceReason combines the symbol-based reasons with the kernel's own
// tables.
func (d *Daemon) noSpliceReason(syms *cfg.Symbols, fn *cfg.Function, addr uint64) string {
	return syms.NoSpliceReason(fn, addr, DriverModule, d.ownedSites())
}

// dataflowLive is what the block data-flow says is live before
// instruction i of fn.
func (d *Daemon) dataflowLive(syms *cfg.Symbols, fn *cfg.Function, i int) cfg.LiveSet {
	protos := d.prototypes()
	names := syms.Names()
	blocks := fn.BlocksOpt(cfg.BlockOptions{Names: names, NoReturn: d.noReturn(), Tables: d.dev})
	lv := fn.LiveWith(blocks, names, protos, d.calleeReads())
	for _, b := range blocks {
		if i >= b.First && i < b.First+b.N {
			return lv.Before(b.Index, i)
		}
	}
	return ^cfg.LiveSet(0)
}

// entryInstruction picks where "function entry" is spliced: the first
// instruction of the entry block that is not the ftrace site and is long
// enough for a direct splice. Every instruction of the entry block runs
// exactly once per call, so a counter there counts calls.
func entryInstruction(fn *cfg.Function, owned *cfg.OwnedSites) (int, error) {
	n := fn.EntryBlock()
	for i := 0; i < n; i++ {
		if owned.IsFtraceSite(fn, i) {
			continue
		}
		if springboard.Classify(fn.Insns[i].Len()) == springboard.Direct {
			return i, nil
		}
	}
	var listing bytes.Buffer
	for i := 0; i < n && i < 8; i++ {
		in := &fn.Insns[i]
		fmt.Fprintf(&listing, "\n  +%#x  %d bytes  %s", in.Addr-fn.Addr, in.Len(), in.String())
	}
	return 0, fmt.Errorf("%w of %s: every instruction before its first branch is the ftrace site or shorter than 5 bytes (springboard and trap splices come later); pick one with %s+0xOFF:%s",
		ErrNoEntryInstruction, fn.Name, fn.Name, listing.String())
}

// probe is an installed counter.
type probe struct {
	site     *site
	slot     int
	patch    uint64
	spliceID uint32
}

// attachCounter installs a counter at s: allocate a slot and a patch,
// generate and verify the patch, write it, then splice. On error nothing
// stays installed. The caller holds d.mu.
func (d *Daemon) attachCounter(s *site) (*probe, error) {
	in := s.insn()
	if other, ok := d.spliced[in.Addr]; ok {
		return nil, fmt.Errorf("%s is already instrumented (session %s); several requests at one point are not shared yet", s.where(), other)
	}
	slot, err := d.slots.alloc()
	if err != nil {
		return nil, err
	}
	if err := d.dev.ClearCounters(slot, 1); err != nil {
		d.slots.free(slot)
		return nil, err
	}
	patch, err := d.dev.PatchAlloc(patchSize)
	if err != nil {
		d.slots.free(slot)
		return nil, fmt.Errorf("allocate patch: %w", err)
	}
	fail := func(err error) (*probe, error) {
		if ferr := d.dev.PatchFree(patch); ferr != nil {
			d.log.Error("free patch after failed attach", "patch", fmt.Sprintf("%#x", patch), "err", ferr)
		}
		d.slots.free(slot)
		return nil, err
	}
	code, err := buildCounterPatch(patch, s, d.dev.CounterAddr(slot))
	if err != nil {
		return fail(fmt.Errorf("%s: %w", s.where(), err))
	}
	if len(code) > patchSize {
		return fail(fmt.Errorf("%s: patch of %d bytes exceeds %d", s.where(), len(code), patchSize))
	}
	if err := d.dev.PatchWrite(patch, code); err != nil {
		return fail(fmt.Errorf("write patch: %w", err))
	}
	// Read the patch back: what runs must be what was verified.
	back := make([]byte, len(code))
	if err := d.dev.Read(patch, back); err != nil || !bytes.Equal(back, code) {
		return fail(fmt.Errorf("patch at %#x does not read back as written (%v)", patch, err))
	}
	jmp, err := codegen.JmpRel32(in.Addr, patch)
	if err != nil {
		return fail(err)
	}
	orig := append([]byte(nil), in.Bytes[:len(jmp)]...)
	id, err := d.dev.Splice(in.Addr, patch, orig, jmp)
	if err != nil {
		return fail(fmt.Errorf("splice %s: %w", s.where(), err))
	}
	return &probe{site: s, slot: slot, patch: patch, spliceID: id}, nil
}

// buildCounterPatch generates and verifies the counter patch for s.
func buildCounterPatch(patch uint64, s *site, counter uint64) ([]byte, error) {
	in := s.insn()
	cs := codegen.Site{Addr: in.Addr, Bytes: in.Bytes}
	saveFlags := s.flagsLive()
	code, err := codegen.CounterPatch(patch, cs, counter, saveFlags)
	if err != nil {
		return nil, err
	}
	if err := codegen.Verify(code, patch, cs, counter, saveFlags); err != nil {
		return nil, err
	}
	if err := checkClobbers(code[:codegen.CounterPrefixLen(saveFlags)], patch, s.live); err != nil {
		return nil, err
	}
	return code, nil
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

// detach removes a probe: restore the text, then free the patch (the
// driver waits for tasks that may still run in it) and the counter slot.
// The caller holds d.mu.
func (d *Daemon) detach(p *probe) error {
	if err := d.dev.Unsplice(p.spliceID); err != nil {
		return fmt.Errorf("unsplice %s: %w", p.site.where(), err)
	}
	var errs []error
	if err := d.dev.PatchFree(p.patch); err != nil {
		errs = append(errs, fmt.Errorf("free patch %#x: %w", p.patch, err))
	}
	d.slots.free(p.slot)
	return errors.Join(errs...)
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
