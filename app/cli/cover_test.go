package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kinst/kinst/cover"
	"github.com/kinst/kinst/kerninstd/kerninstdtest"
)

// covered waits (real time) until the daemon's coverage session has n
// covered blocks: its poller has swept the flags the test set.
func (f *fixture) covered(n int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	last := -1
	for time.Now().Before(deadline) {
		ss, err := f.c.Sessions(context.Background())
		f.must(err)
		if len(ss) == 1 && ss[0].Cover != nil {
			if last = ss[0].Cover.CoveredBlocks; last == n {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.t.Fatalf("coverage never reached %d blocks (%d covered)", n, last)
}

// kinst cover filename_lookup 'path_*' -- CMD: CMD runs three probed blocks in
// two rounds; the poller sees each round's flags one poll later and
// removes those probes; the rest are removed at the end.
func TestGoldenCover(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		t.Run(fmt.Sprint("json=", asJSON), func(t *testing.T) {
			f := newFixture(t, asJSON)
			f.workloads["opens"] = func(stdout io.Writer) int {
				f.streaming(2) // the coverage poller's and the sample stream's tickers
				// Each function's first block is inferred (it has no
				// call and dominates both successors): covered with the
				// second, that is with the first probe hit.
				f.must(f.s.Kernel.Count(kerninstdtest.Addr("filename_lookup", 0x1f), 5))
				f.must(f.s.Kernel.Count(kerninstdtest.Addr("path_openat", 0x18), 1))
				f.s.Clock.Advance(cover.Poll)
				f.covered(4)
				f.must(f.s.Kernel.Count(kerninstdtest.Addr("filename_lookup", 0x17), 1))
				f.s.Clock.Advance(2 * cover.Poll)
				f.covered(5)
				fmt.Fprintln(stdout, "workload: done")
				return 3
			}
			status, err := Cover(context.Background(), f.c, CoverOptions{Targets: []string{"filename_lookup", "path_*"},
				JSON: asJSON, Name: "cov", Command: []string{"opens"}}, f.env)
			if err != nil || status != 3 {
				t.Fatalf("status %d, %v", status, err)
			}
			if in, err := f.c.Info(context.Background()); err != nil || in.Splices != 0 || in.Sessions != 0 {
				t.Errorf("after the run: %+v, %v", in, err)
			}
			f.check(map[bool]string{false: "cover", true: "cover-json"}[asJSON], nil)
		})
	}
}

// TestCell: a table's function name is cut to nameWidth runes, its
// start and end kept; a name that fits is left alone.
func TestCell(t *testing.T) {
	long := "<addr2line::lookup::LoopingLookup<core::result::Result<" + strings.Repeat("gimli::read::Error, ", 50) + ">>::new_lookup"
	tests := []struct{ in, want string }{
		{"main", "main"},
		{strings.Repeat("é", nameWidth), strings.Repeat("é", nameWidth)},
		{long, long[:39] + "…" + long[len(long)-40:]},
		{strings.Repeat("é", nameWidth+1), strings.Repeat("é", 39) + "…" + strings.Repeat("é", 40)},
	}
	for _, tt := range tests {
		got := cell(tt.in)
		if got != tt.want {
			t.Errorf("cell(%.20q…) = %q, want %q", tt.in, got, tt.want)
		}
		if n := utf8.RuneCountInString(got); n > nameWidth {
			t.Errorf("cell(%.20q…) is %d runes", tt.in, n)
		}
	}
}
