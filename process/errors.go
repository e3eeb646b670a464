package process

import (
	"errors"

	"github.com/kinst/kinst/driver"
)

// gone is ErrNoProcess. It also matches driver.ErrClosed: to the engine
// a process that has exited is a device closed under it (nothing left to
// restore, nothing worth a log line per splice).
type gone struct{}

func (gone) Error() string        { return "no such process" }
func (gone) Is(target error) bool { return target == driver.ErrClosed }

// Errors the package wraps, for errors.Is.
var (
	// ErrNoProcess: the process does not exist (or exited). It matches
	// driver.ErrClosed too.
	ErrNoProcess error = gone{}
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
