package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/output"
)

// resolvable is the functions of fns this kernel has (a compiler may
// have inlined some); the test fails if fewer than least are left.
func resolvable(t *testing.T, ctx context.Context, least int, fns ...string) []string {
	t.Helper()
	var out []string
	for _, fn := range fns {
		if _, err := client.Resolve(ctx, fn); err == nil {
			out = append(out, fn)
		} else {
			t.Logf("%s: %v (left out)", fn, err)
		}
	}
	if len(out) < least {
		t.Fatalf("only %v of %v found", out, fns)
	}
	return out
}

// blockSet is the blocks a report covered, as "FUNC:INDEX".
func blockSet(r api.CoverReport) map[string]bool {
	out := map[string]bool{}
	for _, f := range r.Functions {
		for _, b := range f.Blocks {
			if b.Covered {
				out[fmt.Sprintf("%s:%d", f.Function, b.Index)] = true
			}
		}
	}
	return out
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// dmesgLines is how many lines the guest's kernel log has now.
func dmesgLines(t *testing.T, ctx context.Context) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(gsh(t, ctx, "dmesg | wc -l")))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// quietSince fails the test if the kernel logged a warning, BUG or oops
// after its first n lines.
func quietSince(t *testing.T, ctx context.Context, n int, after string) {
	t.Helper()
	if bad := gsh(t, ctx, fmt.Sprintf("dmesg | tail -n +%d | grep -E 'WARNING|BUG|Oops|general protection|RIP:|Call Trace' || true", n+1)); bad != "" {
		t.Fatalf("kernel complained after %s:\n%s", after, bad)
	}
}

// errorBlock finds do_sys_openat2's block that calls put_unused_fd: the
// path taken only when do_filp_open fails (the descriptor reserved for
// the file is given back). The call is found in kinst cfg's decoding and
// its rel32 target checked against the guest's /proc/kallsyms.
func errorBlock(t *testing.T, ctx context.Context) int {
	t.Helper()
	g, err := client.CFG(ctx, "do_sys_openat2")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(gsh(t, ctx, "grep ' put_unused_fd$' /proc/kallsyms | head -1"))
	if len(f) < 1 {
		t.Fatal("no put_unused_fd in /proc/kallsyms")
	}
	want, err := strconv.ParseUint(f[0], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	found := -1
	for _, b := range g.Blocks {
		for _, in := range b.Instructions {
			if !strings.HasPrefix(in.Text, "call") || len(in.Bytes) != 10 || in.Bytes[:2] != "e8" {
				continue
			}
			var rel int32
			for i := 4; i >= 1; i-- {
				v, _ := strconv.ParseUint(in.Bytes[2*i:2*i+2], 16, 8)
				rel = rel<<8 | int32(v)
			}
			if uint64(int64(in.Address)+5+int64(rel)) == want {
				if found >= 0 && found != b.Index {
					t.Fatalf("put_unused_fd is called from blocks %d and %d", found, b.Index)
				}
				found = b.Index
			}
		}
	}
	if found < 0 {
		t.Fatalf("no block of do_sys_openat2 calls put_unused_fd (%#x)", want)
	}
	return found
}

// Oracle 2: the block of do_sys_openat2 that runs only when the open
// fails is uncovered while cat opens a file that exists and covered when
// it opens one that does not; its per-block counter agrees. cat is
// busybox's, whose only open is its argument's; --comm cat keeps the
// rest of the guest's opens out of the uncovered direction.
func TestCoverErrorPath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	blk := errorBlock(t, ctx)
	key := fmt.Sprintf("do_sys_openat2:%d", blk)
	log0 := dmesgLines(t, ctx)
	ok := coverRun(t, ctx, "do_sys_openat2 --comm cat", "cat /etc/kinst/modules")
	fail := coverRun(t, ctx, "do_sys_openat2 --comm cat", "cat /nonexistent/kinst-oracle2")
	unfiltered := coverRun(t, ctx, "do_sys_openat2", "cat /nonexistent/kinst-oracle2")
	t.Logf("%s calls put_unused_fd; covered without the error %v, with it %v (unfiltered %v)",
		key, keys(blockSet(ok)), keys(blockSet(fail)), keys(blockSet(unfiltered)))
	if len(blockSet(ok)) == 0 || blockSet(ok)[key] {
		t.Errorf("opening a file that exists: %s covered %v; want the open's blocks without it", key, blockSet(ok)[key])
	}
	if !blockSet(fail)[key] || !blockSet(unfiltered)[key] {
		t.Errorf("opening a missing file: %s covered %v (unfiltered %v); want covered", key, blockSet(fail)[key], blockSet(unfiltered)[key])
	}
	// The block's own counter: it runs once per failed open.
	out := gsh(t, ctx, fmt.Sprintf("kinst count %s --json -- sh -c 'for i in 1 2 3; do cat /nonexistent/kinst-oracle2; done; true' 2>/dev/null", key))
	var cr output.CountReport
	if err := json.Unmarshal([]byte(out), &cr); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(cr.Probes) != 1 || cr.Probes[0].Count < 3 {
		t.Errorf("kinst count %s over three failed opens: %+v", key, cr.Probes)
	}
	quietSince(t, ctx, log0, "the error-path sessions")
}

// The per-task filter: cova stats / while covb stats a path with a ".."
// in it, both through the same functions. Blocks only one of
// them runs (covered by it alone in two unfiltered runs, and by the
// other in neither) are the oracle: a session filtered on one comm while
// both run covers its own exclusive blocks and none of the other's.
func TestCoverPerTaskFilter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	fns := resolvable(t, ctx, 4, "vfs_statx", "filename_lookup", "path_lookupat", "link_path_walk", "walk_component", "step_into",
		"lookup_fast", "path_init", "handle_dots", "follow_dotdot_rcu", "follow_dotdot")
	targets := strings.Join(fns, " ")
	gsh(t, ctx, "ln -sf /bin/kinst /tmp/cova && ln -sf /bin/kinst /tmp/covb && mkdir -p /tmp/covdir/a/b && touch /tmp/covdir/a/b/c")
	// Beside the exec and the Go runtime's start, which both tasks share,
	// only cova's path ends at the root and only covb's climbs a "..".
	const deep = "/tmp/covdir/a/../a/b/c"
	aCmd, bCmd := "/tmp/cova workload stat 300 /", "/tmp/covb workload stat 300 "+deep
	log0 := dmesgLines(t, ctx)
	alone := func(cmd string) (both, any map[string]bool) {
		r1, r2 := blockSet(coverRun(t, ctx, targets, cmd)), blockSet(coverRun(t, ctx, targets, cmd))
		both, any = map[string]bool{}, map[string]bool{}
		for k := range r1 {
			any[k] = true
			if r2[k] {
				both[k] = true
			}
		}
		for k := range r2 {
			any[k] = true
		}
		return both, any
	}
	aBoth, aAny := alone(aCmd)
	bBoth, bAny := alone(bCmd)
	only := func(both, other map[string]bool) map[string]bool {
		out := map[string]bool{}
		for k := range both {
			if !other[k] {
				out[k] = true
			}
		}
		return out
	}
	aOnly, bOnly := only(aBoth, bAny), only(bBoth, aAny)
	t.Logf("blocks only cova's stat of / runs: %v", keys(aOnly))
	t.Logf("blocks only covb's stat of %s runs: %v", deep, keys(bOnly))
	if len(aOnly) == 0 || len(bOnly) == 0 {
		t.Fatalf("no exclusive blocks to tell the tasks apart (cova %d, covb %d)", len(aOnly), len(bOnly))
	}
	// Each comm filtered while the other runs a long loop beside it.
	for _, tc := range []struct {
		comm, cmd, other  string
		mine, theirs      map[string]bool
		myName, theirName string
	}{
		{"cova", aCmd, "/tmp/covb workload stat 10000000 " + deep, aOnly, bOnly, "cova", "covb"},
		{"covb", bCmd, "/tmp/cova workload stat 10000000 /", bOnly, aOnly, "covb", "cova"},
	} {
		out := gsh(t, ctx, fmt.Sprintf("%s & bg=$!; sleep 1; kinst cover %s --comm %s --json -- %s 2>/dev/null; kill $bg; wait $bg 2>/dev/null; true",
			tc.other, targets, tc.comm, tc.cmd))
		var rep api.CoverReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("--comm %s: %v:\n%.2000s", tc.comm, err, out)
		}
		got := blockSet(rep)
		var missing, leaked []string
		for k := range tc.mine {
			if !got[k] {
				missing = append(missing, k)
			}
		}
		for k := range tc.theirs {
			if got[k] {
				leaked = append(leaked, k)
			}
		}
		sort.Strings(missing)
		sort.Strings(leaked)
		t.Logf("--comm %s beside %s: %d blocks covered", tc.comm, tc.theirName, len(got))
		if len(missing) > 0 || len(leaked) > 0 || rep.Filter != "comm "+tc.comm {
			t.Errorf("--comm %s (filter %q) beside %s: %s's blocks not covered %v; %s's covered %v",
				tc.comm, rep.Filter, tc.theirName, tc.myName, missing, tc.theirName, leaked)
		}
	}
	quietSince(t, ctx, log0, "the filtered sessions")
}

// kill -9 of kerninstd in the middle of a coverage session: before,
// QEMU's view of every probe site holds the kernel's bytes; while the
// session runs, every probe still live holds a splice (jmp rel32, jmp
// rel8 to a springboard, or int3); after the kill, with a workload
// running through the functions, the driver puts every byte back, the
// restarted kerninstd finds no splice in the driver, and the kernel
// logged nothing.
func TestCoverKill9(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fns := resolvable(t, ctx, 4, "vfs_statx", "filename_lookup", "path_lookupat", "link_path_walk", "walk_component", "do_sys_openat2", "do_filp_open")
	orig := origBytes(t, ctx, fns)
	log0 := dmesgLines(t, ctx)
	s, err := client.CreateSession(ctx, api.SessionRequest{Cover: fns, Name: "kill9-cover", TTLNS: int64(5 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	type site struct {
		point string
		at    api.Addr
	}
	var sites []site
	armed, err := client.CoverReport(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range armed.Functions {
		for _, b := range f.Blocks {
			if b.Point != nil {
				sites = append(sites, site{*b.Point, probeAddr(t, f, b)})
			}
		}
	}
	if len(sites) < 20 {
		t.Fatalf("only %d probes armed", len(sites))
	}
	// During: read every site, then the session: a block not covered in
	// the later state had its probe spliced when it was read.
	during := map[api.Addr][]byte{}
	for _, st := range sites {
		during[st.at] = qemuBytes(t, st.at, len(orig[st.at]))
	}
	list, err := client.Sessions(ctx)
	if err != nil || len(list) != 1 || list[0].Cover == nil {
		t.Fatalf("sessions %+v, %v", list, err)
	}
	now, err := client.CoverReport(ctx, list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, f := range now.Functions {
		for _, b := range f.Blocks {
			if b.Point == nil || b.Covered {
				continue
			}
			at := probeAddr(t, f, b)
			got := during[at]
			if bytes.Equal(got, orig[at]) || (got[0] != 0xe9 && got[0] != 0xeb && got[0] != 0xcc) {
				t.Errorf("%s live but reads %x (kernel's %x)", *b.Point, got, orig[at])
			}
			live++
		}
	}
	t.Logf("%d probes armed, %d live when read", len(sites), live)
	if live == 0 {
		t.Fatal("no probe live to check")
	}
	wctx, wstop := context.WithCancel(ctx)
	defer wstop()
	wdone := make(chan int)
	go func() {
		code, _ := guest.Exec(wctx, []string{"kinst", "workload", "syscalls", "10s"}, new(bytes.Buffer), new(bytes.Buffer))
		wdone <- code
	}()
	time.Sleep(time.Second)
	gsh(t, ctx, "kill -9 $(pidof kerninstd)")
	for _, st := range sites {
		waitBytes(t, st.at, len(orig[st.at]), st.point+"'s original bytes", func(b []byte) bool { return bytes.Equal(b, orig[st.at]) })
	}
	if code := <-wdone; code != 0 {
		t.Errorf("workload across kill -9 exited %d", code)
	}
	if err := client.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if info, err := client.Info(ctx); err != nil || info.DriverSplices != 0 || info.Splices != 0 || info.Sessions != 0 {
		t.Errorf("restarted kerninstd: %+v, %v; want no splice and no session", info, err)
	}
	quietSince(t, ctx, log0, "kill -9 of kerninstd mid-session")
}

// After a normal session: no session or splice left in kerninstd (kinst
// ls is empty) or in the driver, every probed byte back through QEMU,
// and no warning in the kernel log. Also --module (every text function
// of evdev, as /proc/kallsyms lists them; an unloaded module refused)
// and --callees (do_sys_openat2 and the targets of its direct calls and
// tail calls in kinst cfg's decoding).
func TestCoverModuleCalleesClean(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	log0 := dmesgLines(t, ctx)
	mod := coverRun(t, ctx, "--module evdev", "kinst workload stat 10 /")
	// /proc/kallsyms's text symbols of evdev, by address (one function
	// may have two names).
	want := map[api.Addr]string{}
	for _, l := range strings.Split(gsh(t, ctx, "grep -E ' [tT] .*\\[evdev\\]$' /proc/kallsyms"), "\n") {
		if f := strings.Fields(l); len(f) >= 3 {
			a, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			want[api.Addr(a)] = f[2]
		}
	}
	got := map[api.Addr]string{}
	for _, f := range mod.Functions {
		got[f.Address] = f.Function
		if f.Module != "evdev" || want[f.Address] == "" {
			t.Errorf("--module evdev: %s at %#x in module %q, not an evdev function of kallsyms", f.Function, uint64(f.Address), f.Module)
		}
	}
	for a, name := range want {
		if got[a] == "" {
			t.Errorf("--module evdev: %s (%#x) missing", name, uint64(a))
		}
	}
	if len(want) < 5 || len(mod.Functions) != len(got) {
		t.Errorf("--module evdev: %d functions at %d addresses; kallsyms lists %d", len(mod.Functions), len(got), len(want))
	}
	t.Logf("--module evdev: %d functions, %d blocks, %d armed in %v, %d covered", len(mod.Functions), mod.TotalBlocks, mod.Armed,
		time.Duration(mod.ArmNS), mod.CoveredBlocks)
	if _, errOut, code := gexec(t, ctx, "kinst", "cover", "--module", "ext4", "--duration", "1s"); code == 0 || !strings.Contains(errOut, `module "ext4" is not loaded`) {
		t.Errorf("--module ext4: exit %d, %q", code, errOut)
	}

	calls := coverRun(t, ctx, "--callees do_sys_openat2", "cat /etc/kinst/modules")
	g, err := client.CFG(ctx, "do_sys_openat2")
	if err != nil {
		t.Fatal(err)
	}
	wantC := map[string]bool{"do_sys_openat2": true}
	for _, b := range g.Blocks {
		for i, in := range b.Instructions {
			call := strings.HasPrefix(in.Text, "call")
			tail := b.Exit == "tail-call" && i == len(b.Instructions)-1
			if (call || tail) && strings.HasSuffix(in.Target, "+0x0") {
				wantC[strings.TrimSuffix(in.Target, "+0x0")] = true
			}
		}
	}
	gotC := map[string]bool{}
	for _, f := range calls.Functions {
		gotC[f.Function] = true
	}
	t.Logf("--callees do_sys_openat2: %v; %d blocks, %d covered", keys(gotC), calls.TotalBlocks, calls.CoveredBlocks)
	if fmt.Sprint(keys(gotC)) != fmt.Sprint(keys(wantC)) || len(calls.Functions) != len(gotC) {
		t.Errorf("--callees do_sys_openat2 covered %v, want %v", keys(gotC), keys(wantC))
	}
	// Every probed byte back, through QEMU: the original bytes from kinst
	// cfg of each function (by name: kept only where the name is the
	// function the report lists).
	for _, r := range []api.CoverReport{mod, calls} {
		short := r
		short.Functions = nil
		orig := map[api.Addr][]byte{}
		for _, f := range r.Functions {
			if f.Error != "" {
				continue
			}
			if g, err := client.CFG(ctx, f.Function); err != nil || g.Address != f.Address {
				continue
			}
			short.Functions = append(short.Functions, f)
			for k, v := range origBytes(t, ctx, []string{f.Function}) {
				orig[k] = v
			}
		}
		checkRestored(t, ctx, &short, orig)
	}
	if list, err := client.Sessions(ctx); err != nil || len(list) != 0 {
		t.Errorf("sessions left: %+v, %v", list, err)
	}
	quietSince(t, ctx, log0, "--module and --callees sessions")
}
