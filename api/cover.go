package api

// CoverReport is `kinst cover --json`, and a coverage session's state in
// Session.Cover (there with ExitStatus unset and DurationNS the time
// since the probes were armed). A stable interface.
type CoverReport struct {
	Session string `json:"session"`
	Filter  string `json:"filter,omitempty"` // e.g. "pid 42"
	// Functions are every function's blocks; null in a session's
	// description (kerninstd's list and create answers), which carries
	// the totals only: GET /v1/sessions/{id}/cover has them.
	Functions []CoverFunction `json:"functions"`
	// FunctionCount is the number of functions, RefusedBlocks the blocks
	// that took no probe: the totals a summary without Functions needs.
	FunctionCount int `json:"function_count"`
	RefusedBlocks int `json:"refused_blocks"`
	TotalBlocks   int `json:"total_blocks"`
	CoveredBlocks int `json:"covered_blocks"`
	Armed         int `json:"armed"` // probes spliced
	// Inferred blocks have no probe: their coverage follows from their
	// successors' (cover.Inferable); CoveredInferred of them are covered.
	// Zero with --all-blocks.
	Inferred        int   `json:"inferred"`
	CoveredInferred int   `json:"covered_inferred"`
	Removed         int   `json:"removed"` // probes removed after their first hit
	ArmNS           int64 `json:"arm_ns"`  // from the first probe's splice to the last's
	// PlanNS is the time before the first splice: finding the functions,
	// reading and decoding their code, and planning every block's probe.
	PlanNS     int64 `json:"plan_ns"`
	DurationNS int64 `json:"duration_ns"`
	// Timeline has a row when the probes were armed and one each time
	// the daemon found blocks newly covered (and removed their probes).
	Timeline   []CoverSample `json:"timeline"`
	ExitStatus *int          `json:"exit_status"` // of -- CMD; null without one
	// Ended, for a process (-p): how its splices went: "removed",
	// "exited" (they went with the process) or "exec" (with the program
	// it replaced by exec).
	Ended string `json:"ended,omitempty"`
}

// CoverFunction is one function's blocks. Padding between functions is
// not a block of the function and is not listed; indices are those of
// `kinst cfg FUNC --json`.
type CoverFunction struct {
	Function string       `json:"function"`
	Module   string       `json:"module,omitempty"`
	Address  Addr         `json:"address"`
	Total    int          `json:"total"`
	Covered  int          `json:"covered"`
	Refused  int          `json:"refused"`
	Blocks   []CoverBlock `json:"blocks"`
	// Error says why a function a glob matched could not be read (and
	// has no blocks).
	Error string `json:"error,omitempty"`
}

// CoverBlock is one basic block: covered once its probe ran; a block
// that could take no probe says why.
type CoverBlock struct {
	Index int `json:"index"`
	// Inferred: no probe; covered when a successor is (cover.Inferable).
	Inferred bool    `json:"inferred,omitempty"`
	Start    Addr    `json:"start"`
	End      Addr    `json:"end"` // the end of the block's bytes (exclusive)
	Covered  bool    `json:"covered"`
	Point    *string `json:"point"`   // FUNC+0xOFF of the instruction probed; null when refused
	Refused  *string `json:"refused"` // why no probe; null when probed
	// Lines are the block's source lines (file:line), filled by the
	// client from a debug vmlinux: first the line of the block's first
	// instruction (as addr2line prints it), then every line of the
	// block's bytes, sorted by file and line, each once. Empty without
	// debug information, and for functions of modules.
	Lines []string `json:"lines"`
}

// CoverSample is the coverage at one time.
type CoverSample struct {
	ElapsedNS  int64 `json:"elapsed_ns"`  // since the probes were armed
	LiveProbes int   `json:"live_probes"` // probes still spliced
	Covered    int   `json:"covered"`     // blocks covered so far
}
