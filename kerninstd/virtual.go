package kerninstd

import (
	"errors"
	"fmt"

	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/splice"
	"golang.org/x/arch/x86/x86asm"
)

// Virtual (on-CPU) timers: a timed function with a task table and an
// off-CPU word, and a request in the context switch (codegen.TaskEnter,
// TaskExit, SwitchOffCPU). Virtual time is wall time minus the time the
// tasks inside spent switched out.

// SwitchFunction is where the switch hook goes: __switch_to(prev, next),
// entered with the outgoing task in %rdi and the incoming one in %rsi on
// the CPU that switches, interrupts off. Its entry instruction is spliced,
// so the hook runs once per context switch.
const SwitchFunction = "__switch_to"

// virtualEntries is the size of a virtual timer's task table: tasks that
// may be inside the function at once (more are counted as dropped).
const virtualEntries = 64

// virtualState is what a virtual timer adds to a timed function.
type virtualState struct {
	sw      *splice.Site
	base    int // first of the block of slots below
	table   codegen.TaskTable
	off     int // counter slot: the off-CPU timer word
	dropped int // counter slot: tasks the full table turned away
}

// Slots of a virtual timer's block, in order.
const (
	vCalls = iota
	vWall
	vOff
	vDropped
	vTable
)

// ErrSwitchHook: the context switch cannot be instrumented here.
var ErrSwitchHook = errors.New("cannot instrument the context switch for virtual timers")

// resolveSwitch finds the switch hook's instruction and checks that
// %rdi and %rsi still hold the tasks there: only pushes come before it.
func (tm *timing) resolveSwitch() (*splice.Site, error) {
	f, p, err := tm.plan.Func(SwitchFunction)
	var s *splice.Site
	if err == nil {
		s, err = f.Resolve(p)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSwitchHook, err)
	}
	owned := f.Facts().Owned
	for i := 0; i < s.Index(); i++ {
		if op := s.Fn.Insns[i].Inst.Op; op != x86asm.PUSH && !splice.IsFtraceSite(owned, s.Fn, i) {
			return nil, fmt.Errorf("%w: %s before %s may change %%rdi or %%rsi", ErrSwitchHook, s.Fn.Insns[i].String(), s.Where())
		}
	}
	return s, nil
}

// attachVirtual installs a virtual timer: the switch hook first, then the
// exits, then the entry, so no task is in the table while the hook is
// missing. The caller holds Daemon.mu.
func (tm *timing) attachVirtual(owner string, t *timedFunc, pred codegen.Predicate) error {
	v := t.virtual
	base, err := tm.eng.ReserveCounters(virtualSlots)
	if err != nil {
		return err
	}
	v.base = base
	t.calls, t.word, v.off, v.dropped = base+vCalls, base+vWall, base+vOff, base+vDropped
	addr := tm.eng.CounterAddr
	v.table = codegen.TaskTable{Addr: addr(base + vTable), Entries: virtualEntries}
	ct := int32(tm.task.CurrentTask)
	fixed := func(sn codegen.Snippet) engine.SnippetFunc { return func([]uint64) codegen.Snippet { return sn } }
	add := func(s *splice.Site, sn codegen.Snippet) error {
		r, err := tm.eng.Add(s, engine.Spec{Owner: owner, Snippet: fixed(sn)})
		if err != nil {
			tm.detachTimed(t)
			return err
		}
		t.reqs = append(t.reqs, r)
		return nil
	}
	if err := add(v.sw, codegen.SwitchOffCPU{Regions: []codegen.OffCPU{{Table: v.table, Word: addr(v.off)}}}); err != nil {
		return err
	}
	exit := codegen.TaskExit{Table: v.table, CurrentTask: ct, Then: []codegen.Snippet{codegen.TimerExit{Word: addr(t.word)}}}
	var enter codegen.Snippet = codegen.Seq{codegen.Counter{Addr: addr(t.calls)},
		codegen.TaskEnter{Table: v.table, CurrentTask: ct, Dropped: addr(v.dropped), Then: []codegen.Snippet{codegen.TimerEnter{Word: addr(t.word)}}}}
	if pred != nil {
		enter = codegen.Guard{If: pred, Then: []codegen.Snippet{enter}}
	}
	entryIsExit := false
	for _, s := range t.exits {
		if s == t.entry {
			entryIsExit = true
			continue
		}
		if err := add(s, exit); err != nil {
			return err
		}
	}
	if entryIsExit {
		enter = codegen.Seq{enter, exit}
	}
	return add(t.entry, enter)
}

// virtualSlots is the size of a virtual timer's block of slots.
var virtualSlots = vTable + codegen.TaskTableSlots(virtualEntries)

// freeVirtualSlots returns a virtual timer's block of slots.
func (tm *timing) freeVirtualSlots(t *timedFunc) {
	tm.eng.RetireCounters(t.virtual.base, virtualSlots)
}
