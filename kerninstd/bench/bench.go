// Package bench measures splicing on the running kernel, through the
// engine and planner kerninstd runs on, as a session would use them: one
// point's request cycle step by step (Splice, KernInst's Figure 4),
// coverage probes armed and removed at scale (Arm), and splice, re-splice
// and unsplice churned over a pool of points (Churn). Each owns its
// requests under an owner ID no session has and removes them on every
// exit. kerninstd serves them under /v1/bench/.
package bench

import (
	"errors"
	"log/slog"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/splice"
)

// Kernel is what the benches drive: kerninstd's engine and planner over
// the driver.
type Kernel struct {
	Engine  *engine.Engine
	Planner *splice.Planner
	// Read reads kernel memory as it is: the driver's read, not the
	// engine's text view (which shows spliced bytes as the originals).
	Read func(addr uint64, b []byte) error
	// Info is the daemon's description of itself: the driver's CPU
	// synchronisation rounds, patch heap use, kerninstd's peak resident
	// set.
	Info func() api.Info
	// Targets lists the functions of coverage targets (globs, as a
	// coverage session's), in order; fn reads and plans the i-th of n.
	// It may be called from several goroutines at once.
	Targets func(globs []string) (n int, fn func(i int) (*splice.Func, error), err error)
	Log     *slog.Logger
	// Now is the daemon's clock, which Arm times its phases with (nil:
	// time.Now).
	Now func() time.Time
}

func (k Kernel) now() time.Time {
	if k.Now == nil {
		return time.Now()
	}
	return k.Now()
}

// ErrBadRequest is matched by errors for a request the bench refuses
// before it changes anything: out-of-range counts, no points.
var ErrBadRequest = errors.New("bad bench request")

// requestError is a request refused before anything changed
// (ErrBadRequest), with the reason as its message.
type requestError struct{ error }

func (e requestError) Unwrap() error        { return e.error }
func (e requestError) Is(target error) bool { return target == ErrBadRequest }

func badRequest(err error) error { return requestError{err} }
