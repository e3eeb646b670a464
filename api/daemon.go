package api

import (
	"fmt"
	"strconv"
	"time"
)

// The daemon's JSON API. Paths are under /v1. Errors are returned with a
// 4xx/5xx status and an ErrorResponse body.
//
//	GET    /v1/info                          Info
//	POST   /v1/resolve        ResolveRequest → Resolved
//	GET    /v1/sessions                      → []Session with current totals
//	POST   /v1/sessions       SessionRequest → Session
//	GET    /v1/sessions/{id}/samples?interval=D  → stream of Sample (NDJSON)
//	DELETE /v1/sessions/{id|name}            → Session with final counts
//	GET    /metrics                          Prometheus exposition of every session
//	GET    /v1/read?at=ADDR|SYM[+OFF]&len=N  → Memory
//	GET    /v1/functions?q=TEXT&limit=N      → Functions
//	GET    /v1/sessions/{id}/cover           → CoverReport
//	POST   /v1/bench/splice   BenchRequest   → BenchResult
//	POST   /v1/bench/arm      ArmRequest     → ArmResult
//	POST   /v1/bench/churn    ChurnRequest   → ChurnResult
//	GET    /v1/cfg?func=NAME                 → CFG
//	GET    /v1/cfg/stats                     → stream of StatsEvent (NDJSON)
//	GET    /v1/cfg/calls?func=NAME           → Calls

// Info describes the daemon and the kernel it instruments.
type Info struct {
	Version string `json:"version,omitempty"` // kerninstd's build
	// Mechanism is "splice" with the driver, "bpf" without it (count and
	// time only, by fentry, kprobe.multi or kprobe).
	Mechanism string `json:"mechanism"`
	// NoSplice, with mechanism "bpf", is why kerninstd does not splice:
	// the driver is not loaded, or the CPU has a quirk that splicing would
	// turn into an oops (QEMU TCG before 8.0 with cmpxchg16b).
	NoSplice      string `json:"no_splice,omitempty"`
	KernelRelease string `json:"kernel_release"`
	// Target, for sessions kinst hosts itself over a user process
	// (mechanism "process"), names it: "process PID (COMM)".
	Target        string `json:"target,omitempty"`
	ABIVersion    uint32 `json:"abi_version"` // the loaded driver's
	PatchHeap     Addr   `json:"patch_heap"`
	PatchHeapSize uint64 `json:"patch_heap_size"`
	CounterHeap   Addr   `json:"counter_heap"`
	Counters      int    `json:"counters"`
	Splices       int    `json:"splices"`        // installed by this daemon
	DriverSplices int    `json:"driver_splices"` // installed, as the driver counts them
	// CoveringArmed counts covering splices still working as trap splices
	// (int3 only) until the driver's next grace period lets their jmp in.
	CoveringArmed int    `json:"covering_armed"`
	CoveringJumps uint64 `json:"covering_jumps"` // covering splices' jmps written so far
	Int3Hits      uint32 `json:"int3_hits"`      // CPUs the driver's int3 notifier sent to a patch
	// DriverSyncs counts the driver's rounds of "every CPU runs a
	// serialising instruction" (one IPI to each CPU) so far: what a
	// splice costs the whole machine.
	DriverSyncs   uint64 `json:"driver_syncs"`
	PatchHeapUsed uint64 `json:"patch_heap_used"` // bytes of the patch heap allocated
	// MaxSplices is the most splices the driver holds at once (its splice
	// table); 0 where there is no such bound (BPF, tests).
	MaxSplices int `json:"max_splices,omitempty"`
	// PeakRSS is kerninstd's peak resident memory (VmHWM), in bytes.
	PeakRSS  uint64 `json:"peak_rss_bytes,omitempty"`
	Sessions int    `json:"sessions"`
	Symbols  int    `json:"symbols"`
	// DirtyFreeCounters counts free counter slots that are not zero, and
	// StaleCounterWrites slots found written while free when handed out
	// again. A slot goes back to the allocator zeroed, after the grace
	// period that frees the last patch writing it, so both are 0 unless
	// some patch outlived its request (a bug; the live tests check it).
	DirtyFreeCounters  int `json:"dirty_free_counters"`
	StaleCounterWrites int `json:"stale_counter_writes"`
}

// Addr is a kernel address, written in JSON as a "0x…" string.
type Addr uint64

func (a Addr) MarshalText() ([]byte, error) { return a.appendText(nil), nil }

// appendText appends a as MarshalText writes it.
func (a Addr) appendText(b []byte) []byte {
	return strconv.AppendUint(append(b, "0x"...), uint64(a), 16)
}

func (a *Addr) UnmarshalText(b []byte) error {
	var v uint64
	if _, err := fmt.Sscanf(string(b), "0x%x", &v); err != nil {
		return fmt.Errorf("address %q: want 0x…", b)
	}
	*a = Addr(v)
	return nil
}

// ResolveRequest names one instrumentation point.
type ResolveRequest struct {
	Point string `json:"point"`
}

// Resolved is a point mapped to one instruction of the live kernel.
type Resolved struct {
	Point       string       `json:"point"`
	Function    string       `json:"function"`
	Module      string       `json:"module,omitempty"`
	Offset      uint64       `json:"offset"`
	Address     Addr         `json:"address"`
	Length      int          `json:"length"`
	Bytes       string       `json:"bytes"` // hex
	Instruction string       `json:"instruction"`
	SpliceClass string       `json:"splice_class"`
	FlagsLive   bool         `json:"flags_live"`
	Classic     *ClassicName `json:"classic,omitempty"`
	Ambiguous   int          `json:"ambiguous,omitempty"` // >1: that many functions share the name
}

// ClassicName maps a function name of the KernInst paper (Solaris) to its
// Linux counterpart.
type ClassicName struct {
	Solaris string `json:"solaris"`
	Linux   string `json:"linux"`
	Why     string `json:"why"`
}

// SessionRequest asks for a counter at each point and a timer on each
// function. All or none are installed.
type SessionRequest struct {
	Points []string `json:"points"`
	// Tied sessions are removed when their sample stream ends.
	Tied bool `json:"tied"`
	// Name identifies the session for kinst ls and kinst detach; unique
	// among live sessions. Default: its ID.
	Name string `json:"name,omitempty"`
	// TTLNS removes the session by itself this many nanoseconds after it
	// was created (0: never), so forgotten instrumentation goes away.
	TTLNS int64 `json:"ttl_ns,omitempty"`
	// Timers are functions to time (see TimerInfo).
	Timers []string `json:"timers,omitempty"`
	// Regions are parts of functions to time as functions are (kinst
	// time FILE:A-B): a thread is inside from when control passes into
	// the region's code until it passes out. Wall time only.
	Regions []Region `json:"regions,omitempty"`
	// Cover makes a coverage session: a probe at every basic block of
	// each function named (or matched by a glob: vfs_*), removed when it
	// first runs. Not with Points, Timers or Lock. Each function is
	// covered once, whichever targets name it.
	Cover []string `json:"cover,omitempty"`
	// CoverModules adds every function of each loaded module's text
	// (ext4) to a coverage session.
	CoverModules []string `json:"cover_modules,omitempty"`
	// CoverCallees adds each function named and the functions it calls
	// directly or by tail call, CoverDepth levels down (0: 1), to a
	// coverage session. Indirect calls are not followed.
	CoverCallees []string `json:"cover_callees,omitempty"`
	CoverDepth   int      `json:"cover_depth,omitempty"`
	// CoverAllBlocks probes every block; by default a block whose
	// coverage follows from its successors' has no probe (inferred).
	CoverAllBlocks bool `json:"cover_all_blocks,omitempty"`
	// Filter restricts the timers (or coverage probes) to some tasks.
	Filter *Filter `json:"filter,omitempty"`
	// Virtual also measures the timers' on-CPU time, with a hook in the
	// context switch.
	Virtual bool `json:"virtual,omitempty"`
	// Lock times the waits for one kernel mutex (a data symbol or
	// 0xADDR) in mutex_lock's slow path, instead of Timers.
	Lock string `json:"lock,omitempty"`
}

// Region is a part of one function's code to time: the instructions
// that start in one of Spans.
type Region struct {
	Name     string       `json:"name"`     // how reports name it (its timer's Function)
	Function string       `json:"function"` // the function symbol holding it
	Spans    []OffsetSpan `json:"spans"`
}

// OffsetSpan is [Lo, Hi) of offsets into a function.
type OffsetSpan struct {
	Lo uint64 `json:"lo"`
	Hi uint64 `json:"hi"`
}

// Filter selects the current task a timer counts; at most one field set.
type Filter struct {
	PID  int    `json:"pid,omitempty"`  // process (task->tgid)
	TID  int    `json:"tid,omitempty"`  // thread (task->pid)
	Comm string `json:"comm,omitempty"` // command name (task->comm, up to 15 bytes)
}

// Probe is one installed counter.
type Probe struct {
	Resolved
	Count       uint64 `json:"count"`
	Patch       Addr   `json:"patch"`
	Springboard Addr   `json:"springboard,omitempty"` // the slot a springboard splice jumps to
	// Mechanism is how the probe counts: "splice" (the driver), or
	// without the driver "fentry", "kprobe.multi" or "kprobe" (BPF).
	Mechanism string `json:"mechanism"`
}

// Session is a set of probes installed together.
type Session struct {
	ID      string      `json:"id"`
	Name    string      `json:"name"`
	Created time.Time   `json:"created"`
	Expires *time.Time  `json:"expires,omitempty"` // removed by itself then
	Tied    bool        `json:"tied,omitempty"`
	Probes  []Probe     `json:"probes"`
	Timers  []TimerInfo `json:"timers,omitempty"`
	// Cover is a coverage session's state (SessionRequest.Cover).
	Cover *CoverReport `json:"cover,omitempty"`
}

// TimerInfo is one timed function: its entry and exit splices and its
// totals since it was attached.
type TimerInfo struct {
	Function string     `json:"function"`
	Filter   string     `json:"filter,omitempty"`  // e.g. "pid 42"
	Virtual  bool       `json:"virtual,omitempty"` // VirtualNS is measured
	Entry    Resolved   `json:"entry"`
	Exits    []Resolved `json:"exits"`
	// Mechanism is "splice", or without the driver "fentry" (fentry and
	// fexit) or "kprobe" (kprobe and kretprobe).
	Mechanism string `json:"mechanism"`
	Totals
}

// Totals are a timed function's totals at one time, since its timer was
// attached.
type Totals struct {
	Time      time.Time `json:"time"`
	Calls     uint64    `json:"calls"`
	WallNS    float64   `json:"wall_ns"`    // thread-time inside (Σ wall time of every call)
	VirtualNS float64   `json:"virtual_ns"` // the part of it on a CPU; 0 when not measured
	Inside    int       `json:"inside"`     // threads inside at Time
}

// Sample is one line of a sample stream: counts per probe, in the order of
// Session.Probes.
type Sample struct {
	Time   time.Time `json:"time"`
	Totals []uint64  `json:"totals"`
	Deltas []uint64  `json:"deltas"`
	// Timers are the totals of each timed function, in the order of
	// Session.Timers.
	Timers []Totals `json:"timers,omitempty"`
}

// Memory is a range of live kernel memory.
type Memory struct {
	Address Addr   `json:"address"`
	Symbol  string `json:"symbol,omitempty"` // FUNC+0xOFF of Address, if known
	Bytes   string `json:"bytes"`            // hex
}

// BenchRequest asks for cycles of splice and unsplice at one point.
type BenchRequest struct {
	Point  string `json:"point"`
	Cycles int    `json:"cycles"`
}

// ArmRequest asks kerninstd to arm a coverage probe at Blocks basic
// blocks and take them out again (kinst bench arm).
type ArmRequest struct {
	Blocks int `json:"blocks"`
	// Targets are functions or globs (default: every function, in
	// address order); blocks are taken from them in order.
	Targets []string `json:"targets,omitempty"`
	Single  bool     `json:"single,omitempty"` // one splice at a time, not batched
	// All: every block of the targets that takes a probe (a whole-kernel
	// session with the default targets); Blocks is then ignored.
	All bool `json:"all,omitempty"`
	// Skip passes over the targets' first Skip blocks that take a probe
	// before taking any, so that a bisection can drop blocks from the
	// front while the last block armed stays the same.
	Skip int `json:"skip,omitempty"`
}

// ArmResult is one arm-and-remove run of kinst bench arm.
type ArmResult struct {
	Mode      string         `json:"mode"` // "batched" or "single"
	Blocks    int            `json:"blocks"`
	Functions int            `json:"functions"` // functions the blocks were taken from
	Armed     int            `json:"armed"`
	Refused   int            `json:"refused"` // blocks planned that the engine or driver refused
	Refusals  map[string]int `json:"refusals,omitempty"`
	// RefusedAt is, for each kind of refusal, the first block refused so
	// (FUNC+0xOFF): where to start looking.
	RefusedAt map[string]string `json:"refused_at,omitempty"`
	PlanNS    int64             `json:"plan_ns"`
	ArmNS     int64             `json:"arm_ns"`
	ArmSyncs  uint64            `json:"arm_syncs"` // driver CPU sync rounds while arming
	// ArmStages is where a batched arm's time went; nil for single.
	ArmStages   *ArmStages `json:"arm_stages,omitempty"`
	RemoveNS    int64      `json:"remove_ns"`
	RemoveSyncs uint64     `json:"remove_syncs"`
	PatchBytes  uint64     `json:"patch_bytes"` // patch heap in use with every probe armed
	// First and Last are the first and last blocks taken (FUNC+0xOFF),
	// the ends of the range a bisection narrows.
	First string `json:"first,omitempty"`
	Last  string `json:"last,omitempty"`
	// PeakRSS is kerninstd's peak resident memory after the run
	// (api.Info.PeakRSS); 0 where the daemon does not say.
	PeakRSS uint64 `json:"peak_rss_bytes,omitempty"`
}

// ArmStages splits a batched arm's time by stage (engine.ArmTimes).
type ArmStages struct {
	PrepareNS int64 `json:"prepare_ns"` // points, requests and slots: one CPU
	BuildNS   int64 `json:"build_ns"`   // patches sized, allocated, generated and verified: every CPU
	WriteNS   int64 `json:"write_ns"`   // patches written and read back
	SpliceNS  int64 `json:"splice_ns"`  // splicing, the engine's books included
	DriverNS  int64 `json:"driver_ns"`  // of SpliceNS, inside the driver: checks, writes, CPU syncs
}

// Durations summarises a set of measured durations, in nanoseconds.
type Durations struct {
	N      int   `json:"n"`
	Median int64 `json:"median_ns"`
	P90    int64 `json:"p90_ns"`
	Min    int64 `json:"min_ns"`
	Max    int64 `json:"max_ns"`
}

// BenchResult is the latency of each step of an instrumentation request
// (KernInst's Figure 4 steps, on x86-64).
type BenchResult struct {
	Point  Resolved `json:"point"`
	Cycles int      `json:"cycles"`
	// Every cycle, a counting request made and removed through the
	// engine: patch allocation, codegen (build + verify, with
	// relocation), patch write, the driver's splice (int3, sync, tail,
	// sync, head, sync) and its restore; for a springboard-class point,
	// slot find and writing the slot (same protocol) before the jmp rel8,
	// and unsplice removes both; and the batched free of the patch (the
	// first free of a batch waits for an RCU-tasks grace period, the
	// others do not: read its max).
	Splice      Durations `json:"splice"`
	Unsplice    Durations `json:"unsplice"`
	Springboard Durations `json:"springboard"` // slot write (springboard points only)
	// Up to 100 of these: resolve (lookup, read, decode, classify,
	// liveness), liveness alone, relocation alone.
	Resolve    Durations `json:"resolve"`
	Liveness   Durations `json:"liveness"`
	PatchAlloc Durations `json:"patch_alloc"`
	Codegen    Durations `json:"codegen"`
	Relocation Durations `json:"relocation"`
	Patch      Durations `json:"patch_write"`
	SlotFind   Durations `json:"slot_find"`
	Free       Durations `json:"free"`
	Restored   bool      `json:"restored"` // text equals the original bytes afterwards
}

// ChurnRequest asks for cycles of splice, re-splice and unsplice over a
// pool of points: the listed points and every instruction of the listed
// functions that may be spliced.
type ChurnRequest struct {
	Points    []string `json:"points,omitempty"`
	Functions []string `json:"functions,omitempty"`
	Cycles    int      `json:"cycles"`
	Seed      int64    `json:"seed"` // the pseudo-random choice of points
}

// ChurnResult is what a churn run did. Each cycle makes six request
// changes that add and six that remove: a change at a point with no
// other request is a splice (add) or an unsplice (remove); any other is
// a re-splice to a rebuilt patch.
type ChurnResult struct {
	Pool     int       `json:"pool"` // points drawn from
	Cycles   int       `json:"cycles"`
	Seconds  float64   `json:"seconds"`
	Splice   Durations `json:"splice"`
	Resplice Durations `json:"resplice"`
	Unsplice Durations `json:"unsplice"`
	// Every pool point no session instruments reads back (through the
	// driver) as the kernel's bytes; NotRestored lists the others.
	Restored    bool     `json:"restored"`
	NotRestored []string `json:"not_restored,omitempty"`
}

// ErrorResponse is the body of every error reply.
type ErrorResponse struct {
	Error string `json:"error"`
	Code  string `json:"code"` // one of the Code… constants
	Point string `json:"point,omitempty"`
}

// The codes of ErrorResponse.
const (
	CodeUnknownFunction = "unknown_function"
	CodeNotBoundary     = "not_boundary"
	CodeTooShort        = "too_short"
	CodeNoSplice        = "no_splice"
	CodeNoSession       = "no_session"
	CodeBadRequest      = "bad_request"
	CodeFault           = "fault"
	CodeInternal        = "internal"
)

// CFG is GET /v1/cfg?func=NAME: a function's basic blocks, with every
// instruction's live-in set and splice class. A stable interface.
type CFG struct {
	Function string `json:"function"`
	Module   string `json:"module,omitempty"`
	// ModuleBuildID is the loaded module's GNU build id (hex), from
	// /sys/module/NAME/notes: which debug file is the module's.
	ModuleBuildID string     `json:"module_build_id,omitempty"`
	Address       Addr       `json:"address"`
	Size          uint64     `json:"size"`
	Truncated     bool       `json:"truncated,omitempty"` // decoding stopped early
	Blocks        []CFGBlock `json:"blocks"`
}

// CFGBlock is one basic block.
type CFGBlock struct {
	Index        int              `json:"index"`
	Start        Addr             `json:"start"`
	Exit         string           `json:"exit,omitempty"` // return, tail-call, indirect-jump, trap
	Padding      bool             `json:"padding,omitempty"`
	Succs        []CFGEdge        `json:"succs"`
	Preds        []int            `json:"preds"`
	Instructions []CFGInstruction `json:"instructions"`
}

// CFGEdge is a control transfer to block To.
type CFGEdge struct {
	Kind string `json:"kind"` // fallthrough, jump, taken
	To   int    `json:"to"`
}

// CFGInstruction is one instruction.
type CFGInstruction struct {
	Address Addr   `json:"address"`
	Offset  uint64 `json:"offset"`
	Length  int    `json:"length"`
	Bytes   string `json:"bytes"`
	Text    string `json:"text"`
	// LiveIn lists what may be live just before the instruction: general
	// registers (RAX…R15) and arithmetic flags (CF PF AF ZF SF OF), from
	// a backward data-flow over the function's blocks. Calls are assumed
	// to read all six argument registers (no prototypes yet).
	LiveIn      []string `json:"live_in"`
	SpliceClass string   `json:"splice_class"`      // direct, springboard, trap, refused
	Refused     string   `json:"refused,omitempty"` // why, when refused
	Target      string   `json:"target,omitempty"`  // symbol a call or jump goes to
	// Line is the instruction's source line (file:line), filled by the
	// client from a debug vmlinux (kinst web); empty otherwise.
	Line string `json:"line,omitempty"`
}

// Calls is GET /v1/cfg/calls?func=NAME: a function's place in the call
// graph (direct calls and tail calls; retpolined indirect calls are not
// edges).
type Calls struct {
	Function string    `json:"function"`
	Address  Addr      `json:"address"`
	Callees  []CallRef `json:"callees"`
	Callers  []CallRef `json:"callers"`
}

// CallRef is the other end of one call edge.
type CallRef struct {
	Function string `json:"function"` // "?" for an address no symbol starts at
	Module   string `json:"module,omitempty"`
	Site     Addr   `json:"site"`    // the call or jmp instruction
	At       string `json:"site_at"` // sym+0xoff of the site
	Kind     string `json:"kind"`    // call or tail-call
}

// FunctionRef is one function of GET /v1/functions: a kernel function
// whose name matched the query, or a classic name (Classic set) that
// stands for one.
type FunctionRef struct {
	Name    string       `json:"name"`
	Module  string       `json:"module,omitempty"`
	Address Addr         `json:"address"`
	Classic *ClassicName `json:"classic,omitempty"`
}

// Functions is GET /v1/functions?q=TEXT&limit=N: the functions whose
// names contain TEXT (case-insensitive), names starting with it first,
// then shorter names; Total counts every match, of which Functions has
// the first N.
type Functions struct {
	Query     string        `json:"query"`
	Total     int           `json:"total"`
	Functions []FunctionRef `json:"functions"`
}
