package api

// The reports of the commands that run on the host without kerninstd.

// OffCPUReport is `kinst offcpu --json`.
type OffCPUReport struct {
	Mode       string        `json:"mode"`             // "sample" or "trace"
	Attach     string        `json:"attach,omitempty"` // tracing: tp_btf or raw_tracepoint
	DurationNS int64         `json:"duration_ns"`
	PeriodNS   int64         `json:"period_ns,omitempty"`
	Passes     int           `json:"passes,omitempty"`
	Visits     int           `json:"thread_visits,omitempty"`
	Unreadable int           `json:"unreadable,omitempty"`
	Lost       int64         `json:"lost,omitempty"`
	Stacks     int           `json:"distinct_stacks"`
	TotalNS    int64         `json:"total_off_cpu_ns"`
	Top        []OffCPUStack `json:"top"`

	// Tracing only: blocks whose user stack frame pointers cut short,
	// left cut (no sampled stack of the thread completed it) and
	// completed from the sampler's CFI-unwound stacks.
	UserCut       *int64 `json:"user_cut_blocks,omitempty"`
	UserCompleted *int64 `json:"user_completed_blocks,omitempty"`
	// Sampling only: where threads were read, "bpf_iter" (a BPF task
	// iterator) or "proc" (the /proc files).
	Source string `json:"source,omitempty"`
}

// OffCPUStack is one distinct stack of an off-CPU profile.
type OffCPUStack struct {
	// Group is the first frame of the folded stack: the thread name, or
	// what --group asks for.
	Group string `json:"group"`
	PID   int    `json:"pid,omitempty"` // set when grouping by process or thread id
	TID   int    `json:"tid,omitempty"` // set when grouping by thread id
	// State is the scheduler state letter (S, D, T, I, …; R: preempted,
	// tracing only).
	State string `json:"state,omitempty"`
	// Wchan is the innermost kernel function outside the scheduler.
	Wchan string `json:"wchan,omitempty"`
	// Kernel and User are function names, innermost first.
	Kernel    []string `json:"kernel,omitempty"`
	User      []string `json:"user,omitempty"`
	UserError string   `json:"user_error,omitempty"` // why the user stack is missing or truncated
	// Samples counts samples (sampling) or blocks (tracing).
	Samples int64 `json:"samples"`
	// OffCPUNS is measured when tracing, samples × the mean interval
	// between passes when sampling.
	OffCPUNS int64 `json:"off_cpu_ns"`
}

// UnwindTable is `kinst unwind table --json`: DWARF CFI compiled into
// rows, in readelf's frames-interp notation.
type UnwindTable struct {
	File        string      `json:"file"`
	BuildID     string      `json:"build_id,omitempty"`
	Sections    []string    `json:"sections"`
	FDEs        int         `json:"fdes"`
	SkippedFDEs int         `json:"skipped_fdes"`
	BytesPerRow int         `json:"bytes_per_row"`
	TableBytes  int         `json:"table_bytes"` // rows and FDE starts (4 bytes each)
	CompileNs   int64       `json:"compile_ns"`
	Rows        []UnwindRow `json:"rows"`
}

// UnwindRow is one row: the rules in effect from PC on, in readelf's
// frames-interp notation. CFA "u" starts a range no FDE covers.
type UnwindRow struct {
	PC  string `json:"pc"`
	CFA string `json:"cfa"`
	RBP string `json:"rbp"`
	RA  string `json:"ra"`
	// CFAExpr says what an "exp" CFA is: "plt" (the standard .plt
	// expression) or "deref" ([reg+offset], a signal frame's saved rsp),
	// which the unwinder evaluates, or "unsupported".
	CFAExpr string `json:"cfa_expr,omitempty"`
	// Symbol names the function at pc, when the file has symbols.
	Symbol string `json:"symbol,omitempty"`
}

// UnwindStacks is `kinst unwind stack PID --json`.
type UnwindStacks struct {
	PID     int            `json:"pid"`
	Threads []UnwindThread `json:"threads"`
}

// UnwindThread is one thread's user stack.
type UnwindThread struct {
	TID     int           `json:"tid"`
	Comm    string        `json:"comm"`
	Syscall *int          `json:"syscall,omitempty"` // number of the system call it is blocked in
	Error   string        `json:"error,omitempty"`   // why it has no stack (e.g. "thread is running")
	Frames  []UnwindFrame `json:"frames"`
}

// UnwindFrame is one frame, innermost first.
type UnwindFrame struct {
	PC     string `json:"pc"`
	File   string `json:"file,omitempty"`
	Symbol string `json:"symbol,omitempty"`
	Offset string `json:"offset,omitempty"`
	// Method is how this frame was found from the one below: "cfi",
	// "fp" (frame pointer) or "scan" (CFI after a stack scan for rbp);
	// "" for the innermost frame.
	Method string `json:"method,omitempty"`
}

// VMStatus is `kinst vm status --json`.
type VMStatus struct {
	Accel         string `json:"accel"`
	Agent         string `json:"agent"`
	KernelRelease string `json:"kernel_release"`
	Kerninstd     string `json:"kerninstd"`
	QMP           string `json:"qmp"`
	SerialLog     string `json:"serial_log"`
}
