package live

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

// coverFunctions are functions of the stat(2) path: the workload runs
// them, and few other tasks of the guest do.
var coverFunctions = []string{"vfs_statx", "filename_lookup", "path_lookupat", "vfs_getattr"}

// origBytes maps every instruction of the functions to its bytes, from
// kinst cfg (the text view, before any splice of the test).
func origBytes(t *testing.T, ctx context.Context, fns []string) map[api.Addr][]byte {
	t.Helper()
	out := map[api.Addr][]byte{}
	for _, fn := range fns {
		g, err := client.CFG(ctx, fn)
		if err != nil {
			t.Fatalf("cfg %s: %v", fn, err)
		}
		for _, b := range g.Blocks {
			for _, in := range b.Instructions {
				out[in.Address], _ = hex.DecodeString(in.Bytes)
			}
		}
	}
	return out
}

// probeAddr is the address of a block's probe ("f+0xOFF").
func probeAddr(t *testing.T, f api.CoverFunction, b api.CoverBlock) api.Addr {
	t.Helper()
	var off uint64
	if _, err := fmt.Sscanf(strings.TrimPrefix(*b.Point, f.Function+"+"), "0x%x", &off); err != nil {
		t.Fatalf("point %q: %v", *b.Point, err)
	}
	return f.Address + api.Addr(off)
}

// checkRestored: no splice left in kerninstd or the driver, and QEMU's
// view of every probed instruction holds its original bytes.
func checkRestored(t *testing.T, ctx context.Context, rep *api.CoverReport, orig map[api.Addr][]byte) {
	t.Helper()
	if info, err := client.Info(ctx); err != nil || info.Splices != 0 || info.DriverSplices != 0 || info.Sessions != 0 {
		t.Errorf("after the session: %+v, %v; want no splice and no session", info, err)
	}
	n := 0
	for _, f := range rep.Functions {
		for _, b := range f.Blocks {
			if b.Point == nil {
				continue
			}
			at := probeAddr(t, f, b)
			want, ok := orig[at]
			if !ok {
				t.Errorf("%s: not an instruction kinst cfg listed", *b.Point)
				continue
			}
			if got := qemuBytes(t, at, len(want)); !bytes.Equal(got, want) {
				t.Errorf("%s: %x after the session, want %x", *b.Point, got, want)
			}
			n++
		}
	}
	if n == 0 {
		t.Error("no probe was armed")
	}
}

// Oracle 1: under one run of a deterministic workload, the blocks a
// coverage session covers are exactly those whose per-block counter
// (kinst count FUNC:BLOCK, made inside the coverage session's window, at
// the same instructions: one patch serves both) is non-zero. Afterwards
// every byte is back and no splice is left.
func TestCoverMatchesBlockCounts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fns := resolvable(t, ctx, 2, coverFunctions...)
	orig := origBytes(t, ctx, fns)

	cov, err := client.CreateSession(ctx, api.SessionRequest{Cover: fns, Name: "oracle1-cover", TTLNS: int64(5 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	// The session's description has the totals; its report, the blocks.
	rep, err := client.CoverReport(ctx, cov.ID)
	if err != nil {
		client.RemoveSession(ctx, cov.ID)
		t.Fatal(err)
	}
	if sum := cov.Cover; sum.TotalBlocks != rep.TotalBlocks || sum.Armed != rep.Armed || sum.FunctionCount != len(rep.Functions) {
		t.Errorf("summary: %d blocks, %d armed, %d functions; report: %d, %d, %d", sum.TotalBlocks, sum.Armed, sum.FunctionCount,
			rep.TotalBlocks, rep.Armed, len(rep.Functions))
	}
	t.Logf("%d blocks, %d probes armed in %v", rep.TotalBlocks, rep.Armed, time.Duration(rep.ArmNS))
	var points []string
	for _, f := range rep.Functions {
		for _, b := range f.Blocks {
			if b.Refused != nil {
				t.Logf("%s:%d refused: %s", f.Function, b.Index, *b.Refused)
				continue
			}
			points = append(points, fmt.Sprintf("%s:%d", f.Function, b.Index))
		}
	}
	cnt, err := client.CreateSession(ctx, api.SessionRequest{Points: points, Name: "oracle1-count", TTLNS: int64(5 * time.Minute)})
	if err != nil {
		client.RemoveSession(ctx, cov.ID)
		t.Fatal(err)
	}
	gsh(t, ctx, "kinst workload stat 2000 / && kinst workload stat 500 /nonexistent/x 2>/dev/null || true")
	counts, err := client.RemoveSession(ctx, cnt.ID)
	if err != nil {
		t.Error(err)
	}
	final, err := client.RemoveSession(ctx, cov.ID)
	if err != nil {
		t.Fatal(err)
	}
	fr := final.Cover

	counted := map[string]uint64{}
	for i, p := range counts.Probes {
		counted[points[i]] = p.Count
	}
	var coveredSet, countedSet, diff []string
	for _, f := range fr.Functions {
		for _, b := range f.Blocks {
			k := fmt.Sprintf("%s:%d", f.Function, b.Index)
			if b.Covered {
				coveredSet = append(coveredSet, k)
			}
			if counted[k] > 0 {
				countedSet = append(countedSet, k)
			}
			if b.Covered != (counted[k] > 0) {
				diff = append(diff, fmt.Sprintf("%s covered %v, count %d", k, b.Covered, counted[k]))
			}
		}
	}
	sort.Strings(diff)
	t.Logf("covered %d of %d blocks; %d blocks counted non-zero; %d probes removed after their hit; timeline %+v",
		fr.CoveredBlocks, fr.TotalBlocks, len(countedSet), fr.Removed, fr.Timeline)
	if len(diff) > 0 {
		t.Errorf("coverage and block counts disagree:\n%s", strings.Join(diff, "\n"))
	}
	if len(coveredSet) < len(fns) {
		t.Errorf("only %d blocks covered under the workload", len(coveredSet))
	}
	if fr.Removed+fr.CoveredInferred != fr.CoveredBlocks {
		t.Errorf("%d probes removed for %d covered blocks", fr.Removed, fr.CoveredBlocks)
	}
	checkRestored(t, ctx, fr, orig)
}

// kinst cover over globs, for CMD's lifetime, through the command line:
// the JSON report, probes removed as they hit, and every byte back.
func TestCoverCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := gsh(t, ctx, "kinst cover 'vfs_*stat*' 'filename_*' --name globcov --json -- kinst workload stat 500 / 2>/dev/null")
	var rep api.CoverReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%.2000s", err, out)
	}
	var fns []string
	for _, f := range rep.Functions {
		fns = append(fns, f.Function)
		if f.Total != len(f.Blocks) || f.Refused > f.Total || f.Covered > f.Total-f.Refused {
			t.Errorf("%s: %d blocks, %d listed, %d covered, %d refused", f.Function, f.Total, len(f.Blocks), f.Covered, f.Refused)
		}
		for _, b := range f.Blocks {
			// Each block has a probe, a refusal, or its coverage inferred
			// from its successors', and only one.
			kinds := 0
			for _, k := range []bool{b.Point != nil, b.Refused != nil, b.Inferred} {
				if k {
					kinds++
				}
			}
			if kinds != 1 || b.Covered && b.Point == nil && !b.Inferred || b.Lines == nil {
				t.Errorf("%s:%d: %+v", f.Function, b.Index, b)
			}
		}
	}
	if rep.Session != "globcov" || len(rep.Functions) < 3 || rep.CoveredBlocks == 0 || rep.ExitStatus == nil || *rep.ExitStatus != 0 {
		t.Fatalf("report: session %q, %d functions, %d covered, exit %v", rep.Session, len(rep.Functions), rep.CoveredBlocks, rep.ExitStatus)
	}
	t.Logf("kinst cover 'vfs_*stat*' 'filename_*': %d functions, %d blocks, %d armed in %v, %d covered, %d removed, %d refused; timeline %+v",
		len(rep.Functions), rep.TotalBlocks, rep.Armed, time.Duration(rep.ArmNS), rep.CoveredBlocks, rep.Removed,
		rep.TotalBlocks-rep.Armed, rep.Timeline)
	if last := rep.Timeline[len(rep.Timeline)-1]; rep.Removed+rep.CoveredInferred != rep.CoveredBlocks || last.Covered != rep.CoveredBlocks ||
		last.LiveProbes != rep.Armed-rep.Removed {
		t.Errorf("removed %d, covered %d, last timeline row %+v", rep.Removed, rep.CoveredBlocks, last)
	}
	// Original bytes after the fact: the text view reads the same as the
	// guest's memory through QEMU once nothing is spliced.
	orig := origBytes(t, ctx, fns[:min(len(fns), 40)])
	short := rep
	short.Functions = rep.Functions[:min(len(fns), 40)]
	checkRestored(t, ctx, &short, orig)
	noOops(t, ctx, "kinst cover")
}

// coverRun runs kinst cover ARGS --json -- CMD in the guest (CMD's failure
// is the test's to judge) and returns the report.
func coverRun(t *testing.T, ctx context.Context, args, cmd string) api.CoverReport {
	t.Helper()
	out, errOut, _ := gexec(t, ctx, "sh", "-c", "kinst cover "+args+" --json -- "+cmd)
	var rep api.CoverReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("kinst cover %s: %v:\n%.2000s\nstderr:\n%.2000s", args, err, out, errOut)
	}
	if info, err := client.Info(ctx); err != nil || info.Splices != 0 || info.DriverSplices != 0 {
		t.Errorf("after kinst cover %s: %+v, %v", args, info, err)
	}
	return rep
}

// noOops fails the test if the guest kernel has logged an oops so far.
func noOops(t *testing.T, ctx context.Context, after string) {
	t.Helper()
	if oops := gsh(t, ctx, "dmesg | grep -E 'Oops|BUG:|general protection|RIP:' || true"); oops != "" {
		t.Fatalf("kernel complained after %s:\n%s", after, oops)
	}
}

// The per-task filter, over the path walk (whose indirect calls through
// a register a guarded probe must not disturb): unfiltered, then --comm
// kinst (the workload's command name) covers blocks, and a comm no task
// has covers nothing while the same workload runs; the kernel stays
// healthy throughout.
func TestCoverFilter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fns := resolvable(t, ctx, 3, "vfs_statx", "filename_lookup", "path_lookupat", "link_path_walk", "walk_component", "step_into", "lookup_fast")
	targets := strings.Join(fns, " ")
	noOops(t, ctx, "boot")
	all := coverRun(t, ctx, targets, "kinst workload stat 200 /")
	noOops(t, ctx, "kinst cover "+targets)
	mine := coverRun(t, ctx, targets+" --comm kinst", "kinst workload stat 200 /")
	noOops(t, ctx, "kinst cover --comm kinst")
	none := coverRun(t, ctx, targets+" --comm no-such-comm", "kinst workload stat 200 /")
	noOops(t, ctx, "kinst cover --comm no-such-comm")
	t.Logf("%s: %d blocks; covered %d unfiltered, %d with --comm kinst, %d with --comm no-such-comm",
		targets, all.TotalBlocks, all.CoveredBlocks, mine.CoveredBlocks, none.CoveredBlocks)
	if all.CoveredBlocks == 0 || mine.CoveredBlocks == 0 || mine.Filter != "comm kinst" {
		t.Errorf("unfiltered %d, --comm kinst %d (filter %q): want blocks covered", all.CoveredBlocks, mine.CoveredBlocks, mine.Filter)
	}
	if none.CoveredBlocks != 0 || none.Removed != 0 || none.Filter != "comm no-such-comm" {
		t.Errorf("--comm no-such-comm: %d blocks covered, %d removed, filter %q; want none", none.CoveredBlocks, none.Removed, none.Filter)
	}
}

// Figures: arm time and the decay of live probes for a few thousand
// blocks under a syscall-heavy load; every byte back afterwards.
func TestCoverArmFigures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rep := coverRun(t, ctx, "'vfs_*' 'path_*' '*lookup*' --duration 3s", "kinst workload syscalls 3s")
	refused := map[string]int{}
	for _, f := range rep.Functions {
		for _, b := range f.Blocks {
			if b.Refused != nil {
				why := *b.Refused
				if k := strings.Index(why, "kerninst splice: "); k >= 0 {
					why = why[k:]
					if e := strings.Index(why, " at 0x"); e >= 0 {
						why = why[:e]
					}
				}
				refused[why[:min(len(why), 90)]]++
			}
		}
	}
	t.Logf("%d functions, %d blocks, %d probes armed in %v (%.0f µs a probe), %d covered, %d removed; refusals %v",
		len(rep.Functions), rep.TotalBlocks, rep.Armed, time.Duration(rep.ArmNS), float64(rep.ArmNS)/1e3/float64(max(rep.Armed, 1)),
		rep.CoveredBlocks, rep.Removed, refused)
	for _, s := range rep.Timeline {
		t.Logf("  %8.3f s  %5d live  %5d covered", time.Duration(s.ElapsedNS).Seconds(), s.LiveProbes, s.Covered)
	}
	if rep.Armed < 1000 || rep.CoveredBlocks == 0 || rep.Removed+rep.CoveredInferred != rep.CoveredBlocks {
		t.Errorf("armed %d, covered %d, removed %d", rep.Armed, rep.CoveredBlocks, rep.Removed)
	}
	var fns []string
	for _, f := range rep.Functions[:min(len(rep.Functions), 60)] {
		if f.Error == "" {
			fns = append(fns, f.Function)
		}
	}
	short := rep
	short.Functions = nil
	for _, f := range rep.Functions[:min(len(rep.Functions), 60)] {
		if f.Error == "" {
			short.Functions = append(short.Functions, f)
		}
	}
	checkRestored(t, ctx, &short, origBytes(t, ctx, fns))
	noOops(t, ctx, "kinst cover")
}
