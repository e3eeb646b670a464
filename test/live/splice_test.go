package live

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

// spliceable lists the instructions of fn that kerninstd says can be
// spliced (not refused, not in padding), with their blocks.
type insnRef struct {
	point string
	off   uint64
	block int
	class string
}

func spliceable(t *testing.T, ctx context.Context, fn string) (api.CFG, []insnRef) {
	t.Helper()
	g, err := client.CFG(ctx, fn)
	if err != nil {
		t.Fatalf("cfg %s: %v", fn, err)
	}
	var out []insnRef
	for _, b := range g.Blocks {
		if b.Padding {
			continue
		}
		for _, in := range b.Instructions {
			if in.SpliceClass == "refused" {
				continue
			}
			out = append(out, insnRef{point: fmt.Sprintf("%s+%#x", fn, in.Offset), off: in.Offset, block: b.Index, class: in.SpliceClass})
		}
	}
	return g, out
}

// busyVCPUs keeps both vCPUs busy with read/write system calls that never
// enter the path-lookup code under test; the returned func stops them.
func busyVCPUs(t *testing.T, ctx context.Context) func() {
	pids := strings.Fields(gsh(t, ctx, "for i in 1 2; do cat /dev/zero >/dev/null 2>&1 </dev/null & echo $!; done"))
	return func() { gsh(t, ctx, "kill "+strings.Join(pids, " ")+" 2>/dev/null; true") }
}

// TestCountsAtEveryInstruction splices a counter at every spliceable
// instruction of the stat path's lookup functions at once (direct,
// springboard and trap splices, cmp/jcc pairs, short first instructions)
// while both vCPUs are busy, runs a known number of stat calls and a
// directory walk, and checks the counts against the paths the CFG allows:
// every instruction of a block counts the same; the entry block counts
// the stat calls; returns balance entries; a block whose successors have
// no other predecessor counts their sum. The walk's output must not change.
func TestCountsAtEveryInstruction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const n = 3000
	const tol = 3 // threads still inside a block when the counts are read
	funcs := []string{"filename_lookup", "vfs_statx"}
	type fnInfo struct {
		g     api.CFG
		refs  []insnRef
		bytes []byte
	}
	infos := map[string]*fnInfo{}
	var points []string
	for _, fn := range funcs {
		g, refs := spliceable(t, ctx, fn)
		infos[fn] = &fnInfo{g: g, refs: refs, bytes: qemuBytes(t, g.Address-reachPad, int(g.Size)+2*reachPad)}
		for _, r := range refs {
			points = append(points, r.point)
		}
	}
	walk := `find / -xdev -maxdepth 3 2>/dev/null | sort | md5sum`
	ref := gsh(t, ctx, walk)
	stop := busyVCPUs(t, ctx)
	defer stop()

	s, err := client.CreateSession(ctx, api.SessionRequest{Points: points})
	if err != nil {
		t.Fatalf("splice %d points: %v", len(points), err)
	}
	classes := map[string]int{}
	for _, p := range s.Probes {
		classes[p.SpliceClass]++
	}
	t.Logf("%d counters over %s: %v", len(points), strings.Join(funcs, ", "), classes)
	// Covering splices count as trap splices until the driver's grace
	// period lets their jmps in: let it, so the workload runs the jmps.
	if classes["covering"] > 0 {
		waitCovering(t, ctx)
		jmps := 0
		for _, p := range s.Probes {
			if b := qemuBytes(t, p.Address, 1); p.SpliceClass == "covering" && b[0] == 0xe9 {
				jmps++
			}
		}
		if jmps == 0 {
			t.Errorf("no covering splice's jmp in memory (QEMU's view)")
		}
		t.Logf("%d covering runs hold their jmp", jmps)
	}
	out := gsh(t, ctx, fmt.Sprintf("kinst workload stat %d / && %s", n, walk))
	final, err := client.RemoveSession(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if strings.TrimSpace(out) != strings.TrimSpace(ref) {
		t.Errorf("the directory walk changed under instrumentation: %q, before %q", out, ref)
	}
	count := map[string]uint64{}
	for _, p := range final.Probes {
		count[p.Point] = p.Count
	}
	for _, fn := range funcs {
		fi := infos[fn]
		blockCount := map[int]uint64{}
		for _, r := range fi.refs {
			c := count[r.point]
			if bc, ok := blockCount[r.block]; ok {
				if diff(bc, c) > tol {
					t.Errorf("%s (block %d, %s): count %d, another instruction of the block %d", r.point, r.block, r.class, c, bc)
				}
				continue
			}
			blockCount[r.block] = c
		}
		entry, ok := blockCount[0]
		if !ok {
			t.Fatalf("%s: no counter in the entry block", fn)
		}
		// The walk adds its own lookups on top of the n stat calls.
		if entry < n {
			t.Errorf("%s entry counted %d, want at least the %d stat calls", fn, entry, n)
		}
		var exits uint64
		checked := 0
		for _, b := range fi.g.Blocks {
			bc, ok := blockCount[b.Index]
			if !ok || b.Padding {
				continue
			}
			if b.Exit == "return" || b.Exit == "tail-call" {
				exits += bc
			}
			// Successors that only this block leads to split its count.
			var sum uint64
			all := len(b.Succs) > 0
			for _, e := range b.Succs {
				sb := fi.g.Blocks[e.To]
				sc, ok := blockCount[e.To]
				if !ok || len(sb.Preds) != 1 || e.To == 0 {
					all = false
					break
				}
				sum += sc
			}
			if all {
				checked++
				if diff(sum, bc) > tol*uint64(len(b.Succs)) {
					t.Errorf("%s block %d counted %d, its successors %v together %d", fn, b.Index, bc, b.Succs, sum)
				}
			}
		}
		if diff(exits, entry) > tol {
			t.Errorf("%s: %d entries, %d exits through returns and tail calls", fn, entry, exits)
		}
		t.Logf("%s: entry %d (stat calls %d, plus the walk), %d blocks counted, %d branch splits checked, exits %d",
			fn, entry, n, len(blockCount), checked, exits)
		if now := qemuBytes(t, fi.g.Address-reachPad, len(fi.bytes)); !bytes.Equal(now, fi.bytes) {
			t.Errorf("%s (with the padding around it) not restored byte for byte", fn)
		}
	}
	if oops := gsh(t, ctx, "dmesg | grep -E 'Oops|BUG:|general protection|RIP:' || true"); oops != "" {
		t.Errorf("kernel complained:\n%s", oops)
	}
}

// reachPad covers the springboard slots a function's instructions can
// reach (rel8: within 130 bytes) in the functions around it.
const reachPad = 136

func diff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// cycleLimit bounds one TestResplicingStress cycle, well above the slowest
// cycle seen in the emulated guest (20 s).
const cycleLimit = 3 * time.Minute

// lockupReport is the serial log's soft-lockup and RIP lines (the guest
// cannot be asked once its vCPUs stopped scheduling), or "".
func lockupReport(serial string) string {
	b, err := os.ReadFile(serial)
	if err != nil {
		return ""
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "soft lockup") || strings.Contains(l, "RIP: 0010:") {
			lines = append(lines, l)
		}
	}
	if len(lines) > 6 {
		lines = lines[len(lines)-6:]
	}
	if len(lines) == 0 {
		return ""
	}
	return "\nguest serial log:\n" + strings.Join(lines, "\n")
}

// TestResplicingStress runs thousands of splice, re-splice and unsplice
// cycles over many functions while a syscall-heavy load runs on every
// vCPU. Counters that stay installed all along at filename_lookup's entry
// block -- one direct, one springboard, one trap splice, re-pointed again
// and again by the churn -- must count every stat call of the load: no
// call may run neither the old nor the new patch. The churn goes first
// through sessions over the API (KINST_RESPLICE_CYCLES cycles, default 5:
// in the emulated guest under this load one takes about half a second),
// then through kerninstd's churn bench, which makes the same request
// changes without a round trip each (KINST_CHURN_CYCLES cycles of twelve
// changes, default 1000, over every spliceable instruction of the
// functions, then a quarter as many over the entry block, so the steady
// points are re-pointed often). Afterwards every byte is back (QEMU's
// view) and the kernel logged nothing.
func TestResplicingStress(t *testing.T) {
	cycles, churn := envCycles(t, "KINST_RESPLICE_CYCLES", 5), envCycles(t, "KINST_CHURN_CYCLES", 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	funcs := []string{"filename_lookup", "vfs_statx", "getname_flags", "vfs_fstatat", "path_init",
		"link_path_walk", "complete_walk", "terminate_walk", "putname", "__x64_sys_getppid",
		"__task_pid_nr_ns", "cp_new_stat", "vfs_getattr", "generic_fillattr", "security_inode_getattr"}
	var pool []insnRef
	var churnFuncs []string
	snap := map[string][]byte{}
	addrs := map[string]api.CFG{}
	var entryRefs []insnRef
	for _, fn := range funcs {
		if _, err := client.Resolve(ctx, fn); err != nil {
			t.Logf("skipping %s: %v", fn, err)
			continue
		}
		g, refs := spliceable(t, ctx, fn)
		snap[fn] = qemuBytes(t, g.Address-reachPad, int(g.Size)+2*reachPad)
		addrs[fn] = g
		pool = append(pool, refs...)
		churnFuncs = append(churnFuncs, fn)
		if fn == "filename_lookup" {
			for _, r := range refs {
				if r.block == 0 {
					entryRefs = append(entryRefs, r)
				}
			}
		}
	}
	before, err := client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Deterministic points: one splice of each class in filename_lookup's
	// entry block, each its own session. Springboard points go first: a
	// covering splice would take the short instructions after it, and a
	// point whose run is taken gets a trap splice instead.
	rank := map[string]int{"springboard": 0, "trap": 1, "direct": 2, "covering": 3}
	sort.SliceStable(entryRefs, func(i, j int) bool { return rank[entryRefs[i].class] < rank[entryRefs[j].class] })
	var steadyIDs, steady []string
	installed := map[string]bool{}
	for _, r := range entryRefs {
		if len(installed) == len(rank) {
			break
		}
		ss, err := client.CreateSession(ctx, api.SessionRequest{Points: []string{r.point}})
		if err != nil {
			t.Fatal(err)
		}
		if class := ss.Probes[0].SpliceClass; installed[class] {
			if _, err := client.RemoveSession(ctx, ss.ID); err != nil {
				t.Fatal(err)
			}
			continue
		} else {
			installed[class] = true
		}
		t.Logf("steady counter at %s: %s splice", r.point, ss.Probes[0].SpliceClass)
		steadyIDs, steady = append(steadyIDs, ss.ID), append(steady, r.point)
	}
	if len(installed) < 3 {
		t.Logf("filename_lookup's entry block gave splice classes %v only", installed)
	}
	pid := strings.TrimSpace(gsh(t, ctx, "kinst workload syscalls 30m >/tmp/resplice-load.log 2>&1 & echo $!"))
	time.Sleep(time.Second)

	rng := rand.New(rand.NewSource(1))
	pick := func(k int) []string {
		var ps []string
		for i := 0; i < k; i++ {
			if rng.Intn(4) == 0 {
				ps = append(ps, steady[rng.Intn(len(steady))]) // re-point a steady point
			} else {
				ps = append(ps, pool[rng.Intn(len(pool))].point)
			}
		}
		return ps
	}
	start := time.Now()
	var ops int
	var slowest time.Duration
	var opT [4]time.Duration
	for c := 0; c < cycles; c++ {
		t0 := time.Now()
		// A cycle takes seconds; one that takes minutes is a guest
		// that stopped scheduling (a livelocked vCPU holds kerninstd
		// off the CPU): fail now, with the kernel's lockup report.
		cctx, ccancel := context.WithTimeout(ctx, cycleLimit)
		stuck := func(what string, err error) {
			ccancel()
			t.Fatalf("cycle %d: %s: %v%s", c, what, err, lockupReport(guest.SerialLog()))
		}
		tt := time.Now()
		a, err := client.CreateSession(cctx, api.SessionRequest{Points: pick(3)})
		if err != nil {
			stuck("splice", err)
		}
		opT[0] += time.Since(tt)
		tt = time.Now()
		b, err := client.CreateSession(cctx, api.SessionRequest{Points: append(pick(1), a.Probes[0].Point, a.Probes[1].Point)})
		if err != nil {
			stuck("re-splice", err)
		}
		opT[1] += time.Since(tt)
		tt = time.Now()
		if _, err := client.RemoveSession(cctx, a.ID); err != nil {
			stuck("remove", err)
		}
		opT[2] += time.Since(tt)
		tt = time.Now()
		if _, err := client.RemoveSession(cctx, b.ID); err != nil {
			stuck("remove", err)
		}
		opT[3] += time.Since(tt)
		ccancel()
		ops += 4
		if d := time.Since(t0); d > slowest {
			slowest = d
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d session cycles (%d session changes) in %v (slowest cycle %v); per change: create %v, re-splice %v, remove %v, remove %v",
		cycles, ops, elapsed.Round(time.Millisecond), slowest.Round(time.Millisecond),
		opT[0]/time.Duration(cycles), opT[1]/time.Duration(cycles), opT[2]/time.Duration(cycles), opT[3]/time.Duration(cycles))
	var entryPoints []string
	for _, r := range entryRefs {
		entryPoints = append(entryPoints, r.point)
	}
	for _, run := range []api.ChurnRequest{
		{Functions: churnFuncs, Cycles: churn, Seed: 1},
		{Points: entryPoints, Cycles: max(churn/4, 1), Seed: 2},
	} {
		cctx, ccancel := context.WithTimeout(ctx, time.Duration(run.Cycles)*time.Second+cycleLimit)
		res, err := client.BenchChurn(cctx, run)
		ccancel()
		if err != nil {
			t.Fatalf("churn over %d functions and %d points: %v%s", len(run.Functions), len(run.Points), err, lockupReport(guest.SerialLog()))
		}
		t.Logf("churn: %d cycles over %d points in %.1fs: %d splices (median %v), %d re-splices (%v), %d unsplices (%v)",
			res.Cycles, res.Pool, res.Seconds, res.Splice.N, time.Duration(res.Splice.Median),
			res.Resplice.N, time.Duration(res.Resplice.Median), res.Unsplice.N, time.Duration(res.Unsplice.Median))
		if res.Cycles != run.Cycles || !res.Restored {
			t.Errorf("churn: %d cycles of %d, restored %v %v", res.Cycles, run.Cycles, res.Restored, res.NotRestored)
		}
		if res.Splice.N+res.Resplice.N+res.Unsplice.N != 12*run.Cycles {
			t.Errorf("churn: %d+%d+%d changes, want %d", res.Splice.N, res.Resplice.N, res.Unsplice.N, 12*run.Cycles)
		}
	}
	gsh(t, ctx, "kill -INT "+pid)
	var load string
	for i := 0; i < 100 && !strings.Contains(load, "stat calls"); i++ {
		time.Sleep(200 * time.Millisecond)
		load = gsh(t, ctx, "cat /tmp/resplice-load.log")
	}
	var final []api.Probe
	for _, id := range steadyIDs {
		ss, err := client.RemoveSession(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		final = append(final, ss.Probes...)
	}
	var stats uint64
	if i := strings.Index(load, "stat calls"); i < 0 {
		t.Fatalf("load did not report its stat calls: %q", load)
	} else {
		f := strings.Fields(load[:i])
		stats, _ = strconv.ParseUint(f[len(f)-1], 10, 64)
	}
	t.Logf("load made %d stat calls", stats)
	for _, p := range final {
		t.Logf("  steady %s (%s): %d", p.Point, p.SpliceClass, p.Count)
		if p.Count < stats || p.Count > stats+2*slack {
			t.Errorf("steady counter %s (%s) counted %d, the load made %d stat calls (want %d..%d)",
				p.Point, p.SpliceClass, p.Count, stats, stats, stats+2*slack)
		}
	}
	after, err := client.Info(ctx)
	if err == nil {
		t.Logf("int3 notifier redirects during the run: %d; covering jmps written: %d", after.Int3Hits-before.Int3Hits, after.CoveringJumps-before.CoveringJumps)
		if after.CoveringJumps == before.CoveringJumps {
			t.Errorf("the churn wrote no covering splice's jmp")
		}
		if after.Splices != 0 {
			t.Errorf("%d splices left in kerninstd", after.Splices)
		}
	}
	for fn, b := range snap {
		if now := qemuBytes(t, addrs[fn].Address-reachPad, len(b)); !bytes.Equal(now, b) {
			t.Errorf("%s (with the padding around it) not restored byte for byte", fn)
		}
	}
	if in, err := client.Info(ctx); err == nil && in.DriverSplices != 0 {
		t.Errorf("driver still has %d splices", in.DriverSplices)
	}
	if oops := gsh(t, ctx, "dmesg | grep -E 'Oops|BUG:|general protection|RIP:' || true"); oops != "" {
		t.Errorf("kernel complained:\n%s", oops)
	}
}

// envCycles is the positive integer in the environment variable name, or
// def.
func envCycles(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// waitCovering waits until the daemon has no covering splice armed (int3
// only): their jmps are in.
func waitCovering(t *testing.T, ctx context.Context) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		in, err := client.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if in.CoveringArmed == 0 {
			return
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("%d covering splices still armed after 2 minutes", in.CoveringArmed)
		}
	}
}
