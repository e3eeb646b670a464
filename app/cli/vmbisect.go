package cli

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kinst/kinst/app/bisect"
	"github.com/kinst/kinst/output"
)

// BisectOptions are the flags of `kinst vm bisect`.
type BisectOptions struct {
	File   string // points, one a line; '#' starts a comment
	Trial  bisect.VMTrial
	Repeat int
	JSON   bool
}

// ReadPoints reads a points file: one point a line (FUNC, FUNC+0xOFF,
// FUNC:BLOCK), blank lines and '#' comments skipped.
func ReadPoints(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var pts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line != "" {
			pts = append(pts, strings.Fields(line)...)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(pts) == 0 {
		return nil, fmt.Errorf("%s: no points", path)
	}
	return pts, nil
}

// VMBisect reduces the points of o.File that hang, oops or crash the test
// VM to a minimal set that still does, a fresh VM for every try.
func VMBisect(ctx context.Context, o BisectOptions, env Env) error {
	pts, err := ReadPoints(o.File)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Err, "kinst: bisecting %d points, each set tried up to %d times in a fresh VM\n", len(pts), max(o.Repeat, 1))
	rep, err := bisect.Minimize(ctx, pts, o.Trial.Try, bisect.Options{Repeat: o.Repeat, Log: env.Err})
	if err != nil {
		return err
	}
	out := output.BisectReport{Points: len(pts), Minimal: rep.Minimal, Outcome: rep.Failure.Outcome.String(),
		Detail: rep.Failure.Detail, Tries: rep.Tries, ElapsedNS: int64(rep.Elapsed)}
	if o.JSON {
		return writeJSON(env.Out, out)
	}
	fmt.Fprintf(env.Out, "%d points reduced to %d in %d tries (%v); it fails with a %s: %s\n",
		out.Points, len(out.Minimal), out.Tries, rep.Elapsed.Round(time.Second), out.Outcome, out.Detail)
	for _, p := range out.Minimal {
		fmt.Fprintln(env.Out, p)
	}
	return nil
}
