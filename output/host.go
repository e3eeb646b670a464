package output

// The reports of the commands that run on the host without kerninstd.

// OffCPUReport is `kinst offcpu --json`. Every key is always present; a
// key that does not apply to the mode is null: attach and lost when
// sampling, period_ns, passes, thread_visits and unreadable when tracing.
type OffCPUReport struct {
	Mode       string  `json:"mode"`   // "sample" or "trace"
	Attach     *string `json:"attach"` // tracing: tp_btf or raw_tracepoint
	DurationNS int64   `json:"duration_ns"`
	PeriodNS   *int64  `json:"period_ns"`
	Passes     *int    `json:"passes"`
	Visits     *int    `json:"thread_visits"`
	// Unreadable counts thread visits whose /proc files could not be
	// opened (sampling).
	Unreadable *int `json:"unreadable"`
	// Lost counts blocks whose kernel stack could not be recorded
	// (tracing).
	Lost    *int64        `json:"lost"`
	Stacks  int           `json:"distinct_stacks"`
	TotalNS int64         `json:"total_off_cpu_ns"`
	Top     []OffCPUStack `json:"top"`
	// DebugNotes say, per file whose frames needed a separate debug
	// file, why none was found.
	DebugNotes map[string]string `json:"debug_notes,omitempty"`
	// Tracing only (null when sampling): blocks whose user stack frame
	// pointers cut short, left cut (no sampled stack of the thread
	// completed it) and completed from the sampler's CFI-unwound stacks.
	UserCut       *int64 `json:"user_cut_blocks"`
	UserCompleted *int64 `json:"user_completed_blocks"`
	// Sampling only (null when tracing): where threads were read,
	// "bpf_iter" (a BPF task iterator) or "proc" (the /proc files).
	Source *string `json:"source"`
}

// OffCPUStack is one distinct stack of an off-CPU profile.
type OffCPUStack struct {
	// Group is the first frame of the folded stack: the thread name, or
	// what --group asks for.
	Group string `json:"group"`
	// PID is the process of the stack when grouping by process or
	// thread id (--group pid|tid), TID its thread when grouping by thread
	// id; null otherwise (the stack may sum several).
	PID *int `json:"pid"`
	TID *int `json:"tid"`
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
	// OffCPUNS is measured when tracing, duration_ns × samples / passes
	// when sampling (a thread off CPU in every pass gets the whole run).
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
	// DebugNotes say, per file of the process, why its debug
	// information (separate debug file, DWARF lines) is missing.
	DebugNotes map[string]string `json:"debug_notes,omitempty"`
}

// UnwindThread is one thread's user stack.
type UnwindThread struct {
	TID     int           `json:"tid"`
	Comm    string        `json:"comm"`
	Syscall *int          `json:"syscall,omitempty"` // number of the system call it is blocked in
	Error   string        `json:"error,omitempty"`   // why it has no stack (e.g. "thread is running")
	Note    string        `json:"note,omitempty"`    // how it was unwound when not as asked (--ptrace refused: from /proc)
	Frames  []UnwindFrame `json:"frames"`
	// KernelThread: a kernel thread (PF_KTHREAD), which has no user
	// stack; KernelStack is its kernel stack from
	// /proc/PID/task/TID/stack, innermost first ("kthreadd+0x2f0/0x310"),
	// absent where that file is not readable (it needs root; Error says
	// why).
	KernelThread bool     `json:"kernel_thread,omitempty"`
	KernelStack  []string `json:"kernel_stack,omitempty"`
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
	// Source is the frame's "file:line", from the DWARF of the binary
	// or of its separate debug file.
	Source string `json:"source,omitempty"`
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

// DriverStatus is `kinst driver status --json`: what a real host has of
// kinst's kernel half and of what it needs.
type DriverStatus struct {
	KernelRelease string `json:"kernel_release"`
	BuildID       string `json:"build_id"` // the running kernel's GNU build id, "" if unreadable
	// ModuleLoaded: kerninst is in /proc/modules; Device: /dev/kerninst
	// exists.
	ModuleLoaded bool   `json:"module_loaded"`
	Device       bool   `json:"device"`
	Kerninstd    bool   `json:"kerninstd"`     // a kerninstd answers on Socket
	KerninstdPID int    `json:"kerninstd_pid"` // from the pid file, 0 if none runs
	Socket       string `json:"socket"`
	// Lockdown is the kernel's lockdown mode ("none", "integrity",
	// "confidentiality"), "" where the kernel has no lockdown LSM.
	Lockdown string `json:"lockdown"`
	// SecureBoot is the firmware's Secure Boot state: true, false, or
	// null where the machine does not say (BIOS boot, no efivarfs).
	SecureBoot *bool `json:"secure_boot"`
	// Config is where the kernel configuration was read from, "" if
	// from nowhere; Missing lists what kinst needs that it lacks, and
	// Recommended what some commands need.
	Config      string         `json:"config"`
	Missing     []KernelOption `json:"missing"`
	Recommended []KernelOption `json:"recommended_missing"`
	Problems    []string       `json:"problems"` // what stops `kinst driver load` here, plainly
}

// KernelOption is a kernel configuration option and why kinst needs it.
type KernelOption struct {
	Name string `json:"name"` // CONFIG_…
	Why  string `json:"why"`
}
