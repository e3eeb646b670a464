// Package bisect reduces a set of probe points that hangs, oopses or
// crashes the test VM to a minimal set that still does: delta debugging
// (Zeller's ddmin) over the points, each try in a freshly booted guest,
// each subset tried several times, since the failures it hunts are races
// whose odds grow with the number of probes.
package bisect

import (
	"context"
	"fmt"
	"io"
	"time"
)

// Outcome is how one try ended.
type Outcome int

const (
	Pass  Outcome = iota // the probes came and went; the guest is healthy
	Oops                 // the kernel logged an oops, BUG or warning trace
	Hang                 // the guest stopped answering
	Crash                // QEMU exited: the kernel panicked (-no-reboot)
)

func (o Outcome) String() string {
	return [...]string{"pass", "oops", "hang", "crash"}[o]
}

// Failed reports whether o is a failure the bisection keeps.
func (o Outcome) Failed() bool { return o != Pass }

// Result is one try's outcome, with what was seen (the log lines of an
// oops, the vCPUs' pcs of a hang).
type Result struct {
	Outcome Outcome
	Detail  string
}

// TryFunc runs the points once, in a fresh guest. An error is the
// harness's own failure (the VM would not boot), not the kernel's: the
// bisection stops on it.
type TryFunc func(ctx context.Context, points []string) (Result, error)

// Options tune a bisection.
type Options struct {
	// Repeat is how many times a subset is tried before it is called
	// passing (default 3); the first failure ends its tries.
	Repeat int
	// Log gets a line for every try; nil for none.
	Log io.Writer
}

// Report is a bisection's result.
type Report struct {
	Minimal []string // the smallest failing set found
	Failure Result   // how the last failing try of Minimal failed
	Tries   int
	Elapsed time.Duration
}

// Minimize reduces points, which must fail (it is tried first), to a
// 1-minimal failing subset: removing any one chunk the algorithm tried
// makes it pass in every repeat.
func Minimize(ctx context.Context, points []string, try TryFunc, o Options) (Report, error) {
	if o.Repeat <= 0 {
		o.Repeat = 3
	}
	start := time.Now()
	rep := Report{}
	test := func(set []string) (bool, error) {
		for k := 0; k < o.Repeat; k++ {
			rep.Tries++
			t0 := time.Now()
			res, err := try(ctx, set)
			if err != nil {
				return false, fmt.Errorf("try %d (%d points): %w", rep.Tries, len(set), err)
			}
			if o.Log != nil {
				fmt.Fprintf(o.Log, "bisect: try %d: %d points, repeat %d/%d: %s (%.1fs)\n", rep.Tries, len(set), k+1, o.Repeat, res.Outcome, time.Since(t0).Seconds())
			}
			if res.Outcome.Failed() {
				rep.Failure = res
				return true, nil
			}
		}
		return false, nil
	}
	failed, err := test(points)
	if err != nil {
		return rep, err
	}
	if !failed {
		rep.Elapsed = time.Since(start)
		return rep, fmt.Errorf("the %d points passed %d tries: nothing to bisect", len(points), o.Repeat)
	}
	set := points
	n := 2
	for len(set) >= 2 {
		chunks := split(set, n)
		reduced := false
		for _, c := range chunks { // a chunk alone fails
			if failed, err = test(c); err != nil {
				return rep, err
			}
			if failed {
				set, n, reduced = c, 2, true
				break
			}
		}
		if !reduced && n > 2 { // the set without a chunk fails
			for i := range chunks {
				c := complement(chunks, i)
				if failed, err = test(c); err != nil {
					return rep, err
				}
				if failed {
					set, n, reduced = c, max(n-1, 2), true
					break
				}
			}
		}
		if !reduced {
			if n >= len(set) {
				break
			}
			n = min(2*n, len(set))
		}
	}
	rep.Minimal, rep.Elapsed = set, time.Since(start)
	return rep, nil
}

// split cuts s into n chunks of nearly equal size, in order.
func split(s []string, n int) [][]string {
	var out [][]string
	for i := 0; i < n; i++ {
		lo, hi := i*len(s)/n, (i+1)*len(s)/n
		if lo < hi {
			out = append(out, s[lo:hi])
		}
	}
	return out
}

// complement is every chunk but chunks[skip], in order.
func complement(chunks [][]string, skip int) []string {
	var out []string
	for i, c := range chunks {
		if i != skip {
			out = append(out, c...)
		}
	}
	return out
}
