package bisect

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func points(n int) []string {
	p := make([]string, n)
	for i := range p {
		p[i] = fmt.Sprintf("f%d", i)
	}
	return p
}

// failsWith is a try that fails when the set holds every culprit, with
// probability odds (a race), or always when odds is 1.
func failsWith(culprits []string, odds float64, r *rand.Rand) TryFunc {
	return func(_ context.Context, set []string) (Result, error) {
		for _, c := range culprits {
			if !slices.Contains(set, c) {
				return Result{Outcome: Pass}, nil
			}
		}
		if odds < 1 && r.Float64() >= odds {
			return Result{Outcome: Pass}, nil
		}
		return Result{Outcome: Hang, Detail: "stuck"}, nil
	}
}

func TestMinimize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n        int
		culprits []string
		odds     float64
		repeat   int
	}{
		{"one", 1000, []string{"f617"}, 1, 1},
		{"two far apart", 1000, []string{"f3", "f990"}, 1, 1},
		{"three", 200, []string{"f10", "f11", "f150"}, 1, 1},
		// A race that fires half the time: repeats make it found.
		{"race", 500, []string{"f42", "f420"}, 0.5, 12},
		{"all", 2, []string{"f0", "f1"}, 1, 1},
	} {
		r := rand.New(rand.NewPCG(1, 2))
		rep, err := Minimize(context.Background(), points(tc.n), failsWith(tc.culprits, tc.odds, r), Options{Repeat: tc.repeat})
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		got := slices.Clone(rep.Minimal)
		slices.Sort(got)
		want := slices.Clone(tc.culprits)
		slices.Sort(want)
		if !slices.Equal(got, want) || rep.Failure.Outcome != Hang {
			t.Errorf("%s: minimal %v (%v) after %d tries, want %v", tc.name, got, rep.Failure, rep.Tries, want)
		}
		t.Logf("%s: %d points to %v in %d tries", tc.name, tc.n, got, rep.Tries)
	}
}

func TestMinimizeRefusesPassingSet(t *testing.T) {
	_, err := Minimize(context.Background(), points(10), failsWith([]string{"nope"}, 1, nil), Options{Repeat: 2})
	if err == nil || !strings.Contains(err.Error(), "nothing to bisect") {
		t.Errorf("a set that passes: %v", err)
	}
	boom := errors.New("no VM")
	_, err = Minimize(context.Background(), points(10), func(context.Context, []string) (Result, error) { return Result{}, boom }, Options{})
	if !errors.Is(err, boom) {
		t.Errorf("harness failure: %v, want %v", err, boom)
	}
}

func TestOopsLine(t *testing.T) {
	for _, tc := range []struct{ log, want string }{
		{"[ 1.0] ok\n[ 2.0] all fine\n", ""},
		{"[ 1.0] ok\n[ 296.1] BUG: kernel NULL pointer dereference, address: 0000\n[ 296.2] more\n", "[ 296.1] BUG: kernel NULL pointer dereference, address: 0000"},
		{"[ 3.0] traps: PANIC: double fault, error_code: 0x0\n", "[ 3.0] traps: PANIC: double fault, error_code: 0x0"},
	} {
		if got := strings.TrimSpace(oopsLine.FindString(tc.log)); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.log, got, tc.want)
		}
	}
}
