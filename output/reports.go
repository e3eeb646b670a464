package output

import "github.com/kinst/kinst/api"

// The reports of the commands that instrument the live kernel, as their
// --json prints them. Durations and times are in nanoseconds.

// CountReport is `kinst count --json`.
type CountReport struct {
	Probes     []CountProbe  `json:"probes"`
	DurationNS int64         `json:"duration_ns"`
	IntervalNS int64         `json:"interval_ns"`
	Intervals  []CountSample `json:"intervals"`
	ExitStatus *int          `json:"exit_status,omitempty"` // of -- CMD
	// Ended, for a process (-p): how its splices went: "removed",
	// "exited" (they went with the process) or "exec" (with the program
	// it replaced by exec).
	Ended string `json:"ended,omitempty"`
}

// CountProbe is one point's total.
type CountProbe struct {
	Point    string   `json:"point"`
	Function string   `json:"function"`
	Offset   uint64   `json:"offset"`
	Address  api.Addr `json:"address"`
	Count    uint64   `json:"count"`
	Classic  string   `json:"classic,omitempty"` // the Solaris name asked for
	// Mechanism: "splice", or without the driver the BPF mechanism
	// ("fentry", "kprobe.multi", "kprobe").
	Mechanism string `json:"mechanism"`
}

// CountSample is one interval's deltas, in probe order.
type CountSample struct {
	ElapsedNS int64    `json:"elapsed_ns"`
	Deltas    []uint64 `json:"deltas"`
}

// TimeReport is `kinst time --json` and `kinst waiters --json`.
type TimeReport struct {
	Session    string          `json:"session"`
	Filter     string          `json:"filter,omitempty"`
	Functions  []TimedFunction `json:"functions"`
	DurationNS int64           `json:"duration_ns"`
	IntervalNS int64           `json:"interval_ns"`
	// FirstDataNS is from the request to the first sample received.
	FirstDataNS int64 `json:"first_data_ns"`
	// DetachNS is how long removing the instrumentation took.
	DetachNS   int64          `json:"detach_ns"`
	Intervals  []TimeInterval `json:"intervals"`
	ExitStatus *int           `json:"exit_status,omitempty"`
	// Ended, for a process (-p): how its splices went: "removed",
	// "exited" (they went with the process) or "exec" (with the program
	// it replaced by exec).
	Ended string `json:"ended,omitempty"`
}

// TimedFunction is one function's totals over the run.
type TimedFunction struct {
	Function    string   `json:"function"`
	Entry       string   `json:"entry"` // FUNC+0xOFF spliced for the entry
	Exits       []string `json:"exits"` // FUNC+0xOFF of every exit spliced
	Calls       uint64   `json:"calls"`
	CallsPerSec float64  `json:"calls_per_sec"`
	WallNS      float64  `json:"wall_ns"`     // Σ wall time of the calls (thread-time inside)
	AvgWallNS   float64  `json:"avg_wall_ns"` // per call
	VirtualNS   *float64 `json:"virtual_ns"`  // Σ on-CPU time; null unless --virtual
	AvgVirtual  *float64 `json:"avg_virtual_ns,omitempty"`
	Concurrency float64  `json:"concurrency"` // average threads inside
	// Mechanism: "splice", or without the driver "fentry" (fentry and
	// fexit) or "kprobe" (kprobe and kretprobe).
	Mechanism string `json:"mechanism"`
}

// TimeInterval is one sampling interval, per function in order.
type TimeInterval struct {
	ElapsedNS int64   `json:"elapsed_ns"`
	Functions []Rates `json:"functions"`
}

// Rates are the derived metrics of one interval of one timed function.
type Rates struct {
	Seconds      float64 `json:"seconds"`
	CallsPerSec  float64 `json:"calls_per_sec"`
	AvgWallNS    float64 `json:"avg_wall_ns"`    // per call made in the interval
	AvgVirtualNS float64 `json:"avg_virtual_ns"` // per call made in the interval
	// Concurrency is the average number of threads inside (KernInst's
	// AOT); for a lock's slow path, the average number of waiters.
	Concurrency float64 `json:"concurrency"`
}

// DrillReport is `kinst drilldown --json`.
type DrillReport struct {
	Levels   []DrillLevel `json:"levels"`
	Dominant string       `json:"dominant"` // where the time goes, as deep as it was followed
}

// DrillLevel is one function and its callees, timed over one run of the
// workload.
type DrillLevel struct {
	Function string     `json:"function"`
	Rows     []DrillRow `json:"rows"` // the function first, then callees by total wall time
	Skipped  []string   `json:"skipped,omitempty"`
}

// DrillRow is one timed function of a level.
type DrillRow struct {
	Function  string  `json:"function"`
	Calls     uint64  `json:"calls"`
	WallNS    float64 `json:"wall_ns"`
	AvgWallNS float64 `json:"avg_wall_ns"`
	Share     float64 `json:"share"` // of the level's function's wall time
}

// WatchRow is one metric of `kinst watch --json` (an array of them,
// printed after the last refresh).
type WatchRow struct {
	Session     string    `json:"session"`
	Metric      string    `json:"metric"` // "time FUNC" or "count POINT"
	Total       uint64    `json:"total"`  // calls or executions so far
	PerSec      float64   `json:"per_sec"`
	AvgWallNS   float64   `json:"avg_wall_ns,omitempty"`
	Concurrency float64   `json:"concurrency,omitempty"`
	Inside      int       `json:"inside,omitempty"`
	History     []float64 `json:"history"` // per-second rates, oldest first
}

// BenchSpliceReport is `kinst bench splice --json`: the daemon's step
// timings, the whole request, and the same request as a tracefs kprobe.
type BenchSpliceReport struct {
	api.BenchResult
	// Request is resolve + patch alloc + codegen + patch write + slot
	// find + slot write + splice, medians.
	Request int64         `json:"request_ns"`
	Kprobe  KprobeRequest `json:"kprobe"`
}

// KprobeRequest is the cost of the same request made as a kprobe through
// tracefs.
type KprobeRequest struct {
	Point   string        `json:"point"`
	Attach  api.Durations `json:"attach"` // write the kprobe_events line, enable
	Detach  api.Durations `json:"detach"` // disable, delete
	Ratio   float64       `json:"ratio"`  // attach median / kinst's request median
	Skipped string        `json:"skipped,omitempty"`
}

// HitReport is `kinst bench hit --json`.
type HitReport struct {
	Function string   `json:"function"`
	Calls    int      `json:"calls"`
	Runs     int      `json:"runs"`
	Expected uint64   `json:"expected_hits"` // calls × runs: what every row's hits should be
	Rows     []HitRow `json:"rows"`
	// User: measured in a user process on this machine (bench hit
	// --user), not in the guest kernel.
	User bool `json:"user,omitempty"`
}

// HitRow is one mechanism's cost per call of the loop.
type HitRow struct {
	Mechanism string  `json:"mechanism"`
	Point     string  `json:"point,omitempty"`
	NsPerCall float64 `json:"ns_per_call"` // guest (emulated) time: compare as ratios
	Ratio     float64 `json:"ratio"`       // to the uninstrumented loop
	Overhead  float64 `json:"overhead"`    // (ns_per_call - base) / base
	Hits      uint64  `json:"hits"`        // counted by the mechanism during its runs
	// Calls is what Hits should be when the row timed fewer calls than
	// the report's (the uprobe rows of bench hit --user: each hit is a
	// trap); 0: the report's expected_hits.
	Calls   uint64 `json:"calls,omitempty"`
	Skipped string `json:"skipped,omitempty"`
	// AttachNS and DetachNS are the medians over runs of putting the
	// mechanism in and taking it out (bench hit --user: a splice's
	// request and removal with the process's threads stopped; a tracefs
	// uprobe's definition and enabling, then disabling and deletion; a
	// BPF uprobe's load and attach, then close). Host time.
	AttachNS float64 `json:"attach_ns,omitempty"`
	DetachNS float64 `json:"detach_ns,omitempty"`
}

// `kinst bench churn --json` prints a ChurnResult, `kinst cfg FUNC
// --json` a CFG, `kinst cfg --calls FUNC --json` a Calls, `kinst cfg
// --stats --json` a CFGStats, `kinst rd --json` a Memory, `kinst ls
// --json` a []Session and `kinst detach --json` a Session.

// Version is `kinst version --json` (and what kinst --version prints).
type Version struct {
	// Module is kinst's module version ("(devel)" for a build from a
	// work tree); Revision and Time the VCS revision it was built from
	// and its commit time, Modified whether the tree had changes.
	Module    string `json:"module"`
	Revision  string `json:"revision,omitempty"`
	Time      string `json:"time,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
	// DriverABI is the driver ABI version this kinst speaks.
	DriverABI uint32 `json:"driver_abi"`
	// DaemonAddr is where kerninstd was asked; Daemon its answer, absent
	// when it did not answer, and DaemonError why.
	DaemonAddr  string         `json:"daemon_addr"`
	Daemon      *DaemonVersion `json:"daemon,omitempty"`
	DaemonError string         `json:"daemon_error,omitempty"`
}

// DaemonVersion is what kerninstd reports of itself and its kernel.
type DaemonVersion struct {
	Version       string `json:"version,omitempty"` // kerninstd's build
	DriverABI     uint32 `json:"driver_abi"`        // the loaded driver's ABI version
	KernelRelease string `json:"kernel_release"`
	// CounterFaults is the daemon's free counter slots found written
	// (api.Info's dirty_free_counters plus stale_counter_writes): 0
	// unless a patch outlived its request, a bug to report.
	CounterFaults int `json:"counter_faults"`
}

// ArmReport is `kinst bench arm --json`: one run per block count and
// mode.
type ArmReport struct {
	Runs []api.ArmResult `json:"runs"`
}

// BisectReport is `kinst vm bisect --json`: the minimal failing set of
// points and how it failed.
type BisectReport struct {
	Points    int      `json:"points"`  // in the file
	Minimal   []string `json:"minimal"` // the smallest set that still fails
	Outcome   string   `json:"outcome"` // oops, hang or crash
	Detail    string   `json:"detail"`
	Tries     int      `json:"tries"` // VM boots
	ElapsedNS int64    `json:"elapsed_ns"`
}

// LinesReport is `kinst lines FUNC --json`: the source lines of a kernel
// function (or, with -p, a process's) and whether the instruction where
// each starts takes a probe.
type LinesReport struct {
	Function string   `json:"function"`
	Address  api.Addr `json:"address"`
	Vmlinux  string   `json:"vmlinux"` // the debug file the lines come from
	// Declared is FILE:LINE of the function's declaration, which FUNC:+N
	// counts from; "" when the debug file does not say.
	Declared string       `json:"declared,omitempty"`
	Lines    []SourceLine `json:"lines"`
}

// SourceLine is one line of a LinesReport.
type SourceLine struct {
	File   string `json:"file"`
	Line   int    `json:"line"`
	Offset uint64 `json:"offset"` // where the line's code starts first, in the function
	Point  string `json:"point"`  // FUNC+0xOFF
	// SpliceClass of the instruction there (direct, springboard,
	// covering, trap), or "refused" with Refused saying why.
	SpliceClass string `json:"splice_class"`
	Refused     string `json:"refused,omitempty"`
}

// AnnotateReport is `kinst annotate FUNC --json`: a kernel (or, with -p,
// a process's) function's blocks and instructions with the source line of
// each and, per block, its count over a live run or its coverage from a
// saved report.
type AnnotateReport struct {
	Function string   `json:"function"`
	Address  api.Addr `json:"address"`
	// From is "live" (counted over DurationNS) or the coverage report
	// read.
	From       string          `json:"from"`
	DurationNS int64           `json:"duration_ns,omitempty"`
	Vmlinux    string          `json:"vmlinux,omitempty"` // where the lines come from; "" without
	Blocks     []AnnotateBlock `json:"blocks"`
}

// AnnotateBlock is one basic block of an AnnotateReport.
type AnnotateBlock struct {
	Index int      `json:"index"`
	Start api.Addr `json:"start"`
	// Count is the block's executions (a live run); Covered its coverage
	// (a report); nil when not known (no probe: Refused says why).
	Count        *uint64        `json:"count,omitempty"`
	Covered      *bool          `json:"covered,omitempty"`
	Refused      string         `json:"refused,omitempty"`
	Instructions []AnnotateInsn `json:"instructions"`
}

// AnnotateInsn is one instruction and its source line.
type AnnotateInsn struct {
	Offset uint64 `json:"offset"`
	Text   string `json:"text"`
	Line   string `json:"line,omitempty"` // file:line; "" without debug information
}
