package process

import "errors"

// Errors the package wraps, for errors.Is.
var (
	// ErrNoProcess: the process does not exist (or exited).
	ErrNoProcess = errors.New("no such process")
	// ErrNotTraceable: ptrace refused (another tracer, Yama's
	// ptrace_scope, no CAP_SYS_PTRACE).
	ErrNotTraceable = errors.New("process cannot be traced")
	// ErrBusy: a thread kept running inside the bytes a change needed,
	// however many times it was let go and stopped again.
	ErrBusy = errors.New("a thread stays inside the instruction")
	// ErrUnsupported: a change the process engine does not make (a trap
	// splice in a process that handles SIGTRAP itself, or beyond the
	// trap table).
	ErrUnsupported = errors.New("not supported in a process")
	// ErrExec: the process ran exec; the program kinst attached to, and
	// its splices with it, are gone (Target.Exec).
	ErrExec = errors.New("the process has run exec")
)
