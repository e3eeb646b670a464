package output

// DecayReport is `kinst bench cover-decay --json`: a system-call loop's
// throughput, per step after a coverage session over the call's path was
// armed, relative to the same loop uninstrumented. Guest times under
// emulation: read the ratios.
type DecayReport struct {
	Workload string `json:"workload"` // e.g. "stat(2) of /"
	Callees  string `json:"callees"`  // the coverage session's --callees root
	Depth    int    `json:"depth"`
	// Runs is how many sessions were armed in a row; every figure below
	// is the median over them (the functions and blocks are the first
	// run's).
	Runs int `json:"runs"`
	// The session: functions and blocks covered, probes armed and how
	// long arming took.
	Functions int `json:"functions"`
	Blocks    int `json:"blocks"`
	Armed     int `json:"armed"`
	// Inferred blocks have no probe: covered when a successor is.
	Inferred int   `json:"inferred"`
	ArmNS    int64 `json:"arm_ns"`
	StepNS   int64 `json:"step_ns"`
	// Baseline is the uninstrumented loop's median calls per second over
	// steps of StepNS; BaselineMin and BaselineMax are its slowest and
	// fastest step over that median, over every run (the emulator's own
	// noise).
	Baseline    float64 `json:"baseline_calls_per_sec"`
	BaselineMin float64 `json:"baseline_min"`
	BaselineMax float64 `json:"baseline_max"`
	// After is the median step's throughput after the session was
	// removed, over Baseline: drift of the guest's speed during the run.
	After float64     `json:"after"`
	Steps []DecayStep `json:"steps"`
	// RecoveredNS is when, after arming, the steps' ratios reached 0.95
	// for good (the start of the first step from which every step's
	// ratio is at least 0.95); null if the last step is below it.
	RecoveredNS *int64 `json:"recovered_ns"`
}

// DecayStep is one step after the probes were armed.
type DecayStep struct {
	ElapsedNS   int64   `json:"elapsed_ns"` // the step's end, since the session was armed
	CallsPerSec float64 `json:"calls_per_sec"`
	Ratio       float64 `json:"ratio"`       // CallsPerSec / Baseline
	LiveProbes  int     `json:"live_probes"` // at the step's end, from the session's timeline
	Covered     int     `json:"covered"`
}
