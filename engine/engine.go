// Package engine is kinst's splicing engine: it installs, re-points and
// removes splices in the running kernel through the driver (Device).
//
// Every request at one instruction shares one patch (a point): the
// requests' snippets in order, then the relocated instruction and a jump
// back. Adding or removing a request builds, verifies and writes a new
// patch, then re-points the splice at it, so no call runs neither patch;
// replaced patches and released springboard slots are freed in batches
// after an RCU-tasks grace period. The engine also keeps the overlay (the
// original bytes under its own splices, which the text view that analysis
// reads puts back), finishes covering splices in the background, and hands
// out counter slots. Where and how to splice is the planner's (package
// splice); the engine carries a splice.Site out.
package engine

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// Config configures an Engine.
type Config struct {
	Device Device
	Log    *slog.Logger
	// PatchHeap returns an address in the patch heap, for sizing patches
	// (0: unknown; any address within rel32 reach of text and counters
	// gives the same lengths, and the counter heap is used).
	PatchHeap func() uint64
	// RedZone is the bytes below %rsp the spliced code may use: 128 for a
	// user process (the SysV ABI), 0 for the kernel. Patches that push
	// move %rsp below it first (codegen.PatchSpec.RedZone).
	RedZone int32
}

// Engine installs and removes requests. Its methods may be called from
// any goroutine.
//
// Lock order: a caller's own locks (the daemon's sessions) before mu;
// mu before the overlay's, the springboard heap's and the finisher's.
type Engine struct {
	dev       Device
	log       *slog.Logger
	patchHeap func() uint64
	heapBase  atomic.Uint64 // patchHeap's answer, once it gave one
	redZone   int32

	// noTrap, when set, refuses with this reason a point that would fall
	// back to a trap splice (its springboard slot or covered instructions
	// taken): see SetNoTrap. Protected by mu.
	noTrap string
	// punned: the device writes a punned jmp for a trap splice (a
	// process's, SetPunned) and itself refuses, with noTrap's reason, one
	// it can only make an int3: noTrap refuses no fallback to a trap
	// splice. Protected by mu.
	punned bool

	spring *springboard.Heap // springboard space; has its own lock
	ov     overlay           // original bytes under our splices; has its own lock
	cover  coverFinisher     // writes armed covering splices' jmps; has its own lock

	// mu serialises every change to kernel text, the patch heap and the
	// counter slots. It protects the fields below, and the fields of every
	// point that change (reqs, patch, splice, class, slot, slotSplice).
	mu sync.Mutex

	// points are the instrumented instructions (covered ones too) by
	// address.
	// +checklocks:mu
	points addrMap[*point]
	// retired are patches and slots waiting for reclaim.
	// +checklocks:mu
	retired []retired
	// finals, during RemoveCounted, takes each removed request's count
	// as its slots are retired (retireRequest).
	// +checklocks:mu
	finals map[*Request]uint64
	// reclaimArmed: a reclaim of retired is scheduled.
	// +checklocks:mu
	reclaimArmed bool
	// +checklocks:mu
	slots slotAllocator
	// armTimes is where AddEach's time went, summed over every call.
	// +checklocks:mu
	armTimes ArmTimes
	// counterAddrs is newRequest's buffer of a request's counter
	// addresses, handed to its SnippetFunc.
	// +checklocks:mu
	counterAddrs []uint64
	// staleWrites counts free counter slots found written when handed
	// out again (see takeCounter).
	// +checklocks:mu
	staleWrites int
}

// ArmTimes is where batched arming (AddEach) spent its time, summed over
// every batch: what a bench reports beside the total.
type ArmTimes struct {
	Prepare time.Duration // new points and requests made, slots taken (one CPU)
	Build   time.Duration // patches sized, allocated, generated and verified (every CPU)
	Write   time.Duration // patches written into the heap and read back
	Splice  time.Duration // splicing: the driver's batches and the engine's books
	Driver  time.Duration // of Splice, inside the driver (checks, writes, CPU synchronisations)
}

// ArmTimes is AddEach's time so far, by stage.
func (e *Engine) ArmTimes() ArmTimes {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.armTimes
}

// New returns an engine over c.Device with nothing installed.
func New(c Config) *Engine {
	e := &Engine{dev: c.Device, log: c.Log, patchHeap: c.PatchHeap, redZone: c.RedZone,
		spring: springboard.NewHeap(),
		slots:  newSlotAllocator(c.Device.NumCounters()),
	}
	if e.log == nil {
		e.log = slog.Default()
	}
	return e
}

// SetNoTrap makes a point the planner gave another class fail with
// reason why, rather than fall back to a trap splice when its
// springboard slot or its covered instructions are taken at install: a
// user process's trap splice may kill it (process.TrapHazard). A site
// planned as a trap splice is still spliced as one. "" allows them again.
func (e *Engine) SetNoTrap(why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.noTrap = why
}

// SetPunned says the device makes a trap splice a punned jmp where one
// fits (a process: process.Device), refusing itself an int3 that
// SetNoTrap's reason forbids: a point whose springboard slot is gone may
// fall back to a trap splice (after a covering one).
func (e *Engine) SetPunned(ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.punned = ok
}

// trapRefused is the error for a point at s that would fall back to a
// trap splice while SetNoTrap refuses them, or nil. The caller holds mu.
func (e *Engine) trapRefused(s *splice.Site) error {
	if e.noTrap == "" || e.punned || s.Class == springboard.Trap {
		return nil
	}
	return &splice.NoSpliceError{Where: s.Where(), Reason: e.noTrap}
}

// Text reads kernel text for analysis: live bytes, with the original
// bytes wherever the engine has spliced.
func (e *Engine) Text() cfg.TextReader { return textView{dev: e.dev, ov: &e.ov} }

// Springboards is the springboard heap: the planner adds space to it and
// asks it whether a slot is free; the engine takes and releases slots.
func (e *Engine) Springboards() *springboard.Heap { return e.spring }

// Counter reads a counter slot.
func (e *Engine) Counter(slot int) uint64 { return e.dev.Counter(slot) }

// CounterAddr is a counter slot's kernel address.
func (e *Engine) CounterAddr(slot int) uint64 { return e.dev.CounterAddr(slot) }

// State is what the engine has installed.
type State struct {
	Splices       int    // instructions spliced (not those a covering splice runs over)
	Points        int    // instructions with requests (covered ones included)
	Counters      int    // counter slots in use (removed requests' until reclaim)
	Springboards  int    // springboard slots taken (released ones included until reclaimed)
	Retired       int    // patches and slots waiting for reclaim
	Overlay       int    // spliced ranges whose original bytes the text view puts back
	CoveringArmed int    // covering splices that may still be int3 only
	CoveringJumps uint64 // jmps the driver wrote for covering splices
}

// State reports what is installed now.
func (e *Engine) State() State {
	e.mu.Lock()
	var st State
	for addr, pt := range e.points.all() {
		if pt.site.Addr() == addr {
			st.Splices++
		}
	}
	st.Points, st.Counters = e.points.len(), e.slots.used
	for _, r := range e.retired {
		if r.counters == nil {
			st.Retired++
		}
	}
	e.mu.Unlock()
	st.Springboards = e.spring.InUse()
	st.Overlay = e.ov.len()
	st.CoveringArmed, st.CoveringJumps = e.cover.state()
	return st
}

// Owner returns the owner of the first request at the instruction at
// addr, if it is instrumented.
func (e *Engine) Owner(addr uint64) (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	pt, ok := e.points.get(addr)
	if !ok || len(pt.reqs) == 0 {
		return "", false
	}
	return pt.reqs[0].Owner(), true
}

// Installed describes how a request's point is spliced now.
type Installed struct {
	// Site is the instruction the point's splice is at: the request's
	// own, or the first of a covering splice's run that covers it.
	Site        *splice.Site
	Class       springboard.Class // as installed (the planned one, or trap when it fell back)
	Patch       uint64            // the point's patch; 0 when not spliced
	Springboard uint64            // a springboard splice's slot
	Requests    int               // requests sharing the patch
}

// Installed describes r's point.
func (e *Engine) Installed(r *Request) Installed {
	e.mu.Lock()
	defer e.mu.Unlock()
	pt := r.pt
	return Installed{Site: pt.site, Class: pt.class, Patch: pt.patch, Springboard: pt.slot, Requests: len(pt.reqs)}
}

// patchHeapBase is an address in the patch heap, for sizing patches. The
// heap does not move, so Config.PatchHeap is asked until it answers, and
// not for every patch: kerninstd's asks the driver (an ioctl), which cost
// as much as building the patch.
func (e *Engine) patchHeapBase() uint64 {
	if a := e.heapBase.Load(); a != 0 {
		return a
	}
	if e.patchHeap != nil {
		if a := e.patchHeap(); a != 0 {
			e.heapBase.Store(a)
			return a
		}
	}
	// Anything within rel32 reach of text and counters gives the same
	// length: the counter heap is.
	return e.dev.CounterAddr(0)
}

func hex(a uint64) string { return fmt.Sprintf("%#x", a) }
