// Package livecompat is the compatibility pass: the same short checks on
// every supported kernel, one VM per kernel in turn: boot with the driver, count against
// a known workload with the text restored after, time against sleeps of
// known length, the whole-kernel census against tracefs and /proc,
// a splice/unsplice burst under load, and ps and bt on a dump of the
// guest against its own ps and /proc/PID/stack. Figures (boot to first
// count, census sizes and time) are logged for docs/setup.md's table.
//
// The default kernel is left to its full suites; KINST_COMPAT_KERNELS
// (space-separated releases, "default" for the default) replaces the
// list.
package livecompat

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/livetest"
	"github.com/kinst/kinst/output"
)

// Kernels are the supported kernels: the default (what
// linux-image-amd64 depends on: 6.1) and Debian 12's 6.12 backports,
// stock, cloud and PREEMPT_RT. One list, here.
var Kernels = []string{
	"",
	"6.12.117+deb12-amd64",
	"6.12.117+deb12-cloud-amd64",
	"6.12.117+deb12-rt-amd64",
}

// compatKernels are the kernels the pass boots: every supported kernel
// but the default, whose full suites (test/live, test/livecore) make
// each of these checks and more on it (the whole-kernel soak counts
// every block of SLUB's entry points under load, as slub-counters does
// some), so that its boot here was a fifth of make test's VM time for
// nothing new. KINST_COMPAT_KERNELS (space-separated releases,
// "default" for the default) replaces the list.
func compatKernels() []string {
	if v := os.Getenv("KINST_COMPAT_KERNELS"); v != "" {
		var ks []string
		for _, k := range strings.Fields(v) {
			if k == "default" {
				k = ""
			}
			ks = append(ks, k)
		}
		return ks
	}
	return Kernels[1:]
}

const (
	statCalls = 2000
	slack     = 150 // other lookups in the window: the shell, kinst starting
	sleeps    = 10  // of 50 ms each, timed
)

func TestMain(m *testing.M) {
	if !livetest.Enabled() {
		fmt.Println("livecompat: skipping the live-VM tests (they boot a VM per kernel; set KINST_LIVE=1 to run them, as make test does)")
		return
	}
	os.Exit(m.Run())
}

func TestCompat(t *testing.T) {
	for _, k := range compatKernels() {
		name := k
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) { compat(t, k) })
	}
}

func compat(t *testing.T, kernel string) {
	start := time.Now()
	// kinst_leak's cache records its objects' owners: findleaks must
	// group its known leaks by allocating stack on every kernel.
	g, down, err := livetest.Boot("livecompat", livetest.Options{Kernel: kernel, Append: "slub_debug=U,kinst_leak"})
	if err != nil {
		t.Fatalf("%s: %v", kernel, err) // a kernel that cannot be fetched or booted fails
	}
	defer down()
	defer func() {
		if t.Failed() {
			if b, err := os.ReadFile(g.SerialLog()); err == nil {
				t.Logf("serial log tail:\n%s", livetest.Tail(string(b), 30))
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if rel := g.KernelRelease(); kernel != "" && rel != kernel {
		t.Fatalf("booted %s, want %s", rel, kernel)
	}
	t.Run("count", func(t *testing.T) {
		checkCount(t, ctx, g)
		t.Logf("boot to first count: %.1f s", time.Since(start).Seconds())
	})
	t.Run("time", func(t *testing.T) { checkTime(t, ctx, g) })
	t.Run("cfg-stats", func(t *testing.T) { checkStats(t, ctx, g) })
	t.Run("stress", func(t *testing.T) { checkStress(t, ctx, g) })
	t.Run("core", func(t *testing.T) { checkCore(t, ctx, g) })
	t.Run("slub-counters", func(t *testing.T) { checkSLUBCounters(t, ctx, g) })
	t.Run("typegraph", func(t *testing.T) { checkTypegraph(t, ctx, g) })
	if oops := g.Sh(t, ctx, "dmesg | grep -E 'Oops|BUG:|WARNING:|general protection|RIP:' || true"); oops != "" {
		t.Errorf("kernel complained:\n%s", oops)
	}
}

func checkCount(t *testing.T, ctx context.Context, g *livetest.VM) {
	r, err := g.Client.Resolve(ctx, "lookuppn")
	if err != nil || r.Function != "filename_lookup" {
		t.Fatalf("resolve lookuppn: %+v, %v", r, err)
	}
	orig, err := g.ReadVirt(uint64(r.Address), r.Length)
	if err != nil {
		t.Fatal(err)
	}
	out := g.Sh(t, ctx, fmt.Sprintf("kinst count lookuppn --json -- kinst workload stat %d /", statCalls))
	var rep output.CountReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Probes) != 1 {
		t.Fatalf("count --json: %v\n%s", err, out)
	}
	p := rep.Probes[0]
	t.Logf("filename_lookup+%#x (%s): %d for %d stat calls", p.Offset, p.Mechanism, p.Count, statCalls)
	if p.Count < statCalls || p.Count > statCalls+slack || p.Mechanism != "splice" {
		t.Errorf("counted %d by %q, want %d..%d by splice", p.Count, p.Mechanism, statCalls, statCalls+slack)
	}
	if now, err := g.ReadVirt(uint64(r.Address), r.Length); err != nil || !bytes.Equal(now, orig) {
		t.Errorf("after count: %x (%v), want the original %x", now, err, orig)
	}
}

func checkTime(t *testing.T, ctx context.Context, g *livetest.VM) {
	out := g.Sh(t, ctx, fmt.Sprintf(`kinst time --json __x64_sys_clock_nanosleep -- sh -c 'i=0; while [ $i -lt %d ]; do usleep 50000; i=$((i+1)); done'`, sleeps))
	var rep output.TimeReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Functions) != 1 {
		t.Fatalf("time --json: %v\n%s", err, out)
	}
	f := rep.Functions[0]
	t.Logf("clock_nanosleep: %d calls, %.3f s inside, %d exits timed", f.Calls, f.WallNS/1e9, len(f.Exits))
	want := float64(sleeps) * 50e6
	if f.Calls < sleeps || f.Calls > sleeps+3 || f.WallNS < want*0.98 || f.WallNS > want*3 {
		t.Errorf("%d calls, %.3f s: want %d calls and about %.3f s", f.Calls, f.WallNS/1e9, sleeps, want/1e9)
	}
}

func checkStats(t *testing.T, ctx context.Context, g *livetest.VM) {
	start := time.Now()
	out, errs, code := g.Exec(t, ctx, "kinst", "cfg", "--stats", "--json")
	if code != 0 {
		t.Fatalf("kinst cfg --stats: status %d: %s", code, errs)
	}
	took := time.Since(start)
	var st struct {
		Modules       int            `json:"modules"`
		Functions     int            `json:"functions"`
		BasicBlocks   int            `json:"basic_blocks"`
		Instructions  int            `json:"instructions"`
		SpliceClasses map[string]int `json:"splice_classes"`
		NoSpliceSites *struct {
			ExTable     int `json:"ex_table"`
			JumpLabels  int `json:"jump_labels"`
			StaticCalls int `json:"static_calls"`
			Ftrace      int `json:"ftrace"`
			Modules     int `json:"modules"`
		} `json:"no_splice_sites"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("--stats --json: %v\n%s", err, out)
	}
	t.Logf("census in %.1f s (guest): %d functions, %d blocks, %d instructions, %d modules, classes %v, owned sites %+v",
		took.Seconds(), st.Functions, st.BasicBlocks, st.Instructions, st.Modules, st.SpliceClasses, st.NoSpliceSites)
	n := st.NoSpliceSites
	if n == nil {
		t.Fatal("no no_splice_sites in the census")
	}
	listed := strings.Count(g.Sh(t, ctx, "cat /sys/kernel/tracing/available_filter_functions"), "\n")
	modules := strings.Count(g.Sh(t, ctx, "cat /proc/modules"), "\n")
	if n.Ftrace != listed || n.Modules != modules || n.ExTable == 0 || n.JumpLabels == 0 || n.StaticCalls == 0 {
		t.Errorf("owned sites %+v: want %d ftrace records (available_filter_functions) and %d modules (/proc/modules)", *n, listed, modules)
	}
	sum := 0
	for _, c := range st.SpliceClasses {
		sum += c
	}
	if st.Functions < 30000 || sum != st.Instructions || st.SpliceClasses["direct"] == 0 || st.SpliceClasses["refused"] == 0 {
		t.Errorf("implausible census: %+v", st)
	}
}

func checkStress(t *testing.T, ctx context.Context, g *livetest.VM) {
	const cycles = 200
	r, err := g.Client.Resolve(ctx, "lookuppn")
	if err != nil {
		t.Fatal(err)
	}
	orig, _ := g.ReadVirt(uint64(r.Address), r.Length)
	pid := strings.TrimSpace(g.Sh(t, ctx, "kinst workload syscalls 30m >/tmp/stress-load.log 2>&1 & echo $!"))
	time.Sleep(time.Second)
	res, err := g.Client.BenchSplice(ctx, api.BenchRequest{Point: "lookuppn", Cycles: cycles})
	g.Sh(t, ctx, "kill -INT "+pid)
	if err != nil {
		t.Fatalf("bench splice: %v", err)
	}
	t.Logf("%d cycles under load: splice median %v, unsplice median %v", res.Cycles, time.Duration(res.Splice.Median), time.Duration(res.Unsplice.Median))
	if res.Cycles != cycles || !res.Restored {
		t.Errorf("%d cycles of %d, restored=%v", res.Cycles, cycles, res.Restored)
	}
	if now, err := g.ReadVirt(uint64(r.Address), r.Length); err != nil || !bytes.Equal(now, orig) {
		t.Errorf("after the burst: %x (%v), want %x", now, err, orig)
	}
}

// checkCore dumps the guest with a sleeping process and a shell waiting
// on it, and reads the dump with the host's kinst: ps lists them and
// the guest's kernel threads with their names; bt of the sleeper shows
// the functions of its /proc/PID/stack, in order.
func checkCore(t *testing.T, ctx context.Context, g *livetest.VM) {
	pid := strings.TrimSpace(g.Sh(t, ctx, "sleep 600 >/dev/null 2>&1 & echo $!"))
	time.Sleep(500 * time.Millisecond)
	stack := g.Sh(t, ctx, "cat /proc/"+pid+"/stack")
	var want []string // function names, innermost first
	for _, l := range strings.Split(strings.TrimSpace(stack), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(f[1], "+")
		want = append(want, name)
	}
	mounts := g.Sh(t, ctx, "cat /proc/mounts")
	maps := g.Sh(t, ctx, "cat /proc/"+pid+"/maps")
	g.Sh(t, ctx, `insmod /lib/modules/kinst_leak.ko && for i in $(seq 100); do dmesg | grep -q 'kinst_leak: ready' && break; sleep 0.2; done`)
	path := filepath.Join(g.Scratch, "compat.elf")
	if err := g.Dump(path, "elf"); err != nil {
		t.Fatalf("dump: %v", err)
	}
	defer os.Remove(path)
	// A check that fails only now and then keeps the dump and the kernel
	// log, after the checks that read it.
	var keep []string
	defer func() {
		if len(keep) > 0 {
			keepEvidence(t, ctx, g, path, strings.Join(keep, "+"))
		}
	}()
	g.Sh(t, ctx, "kill "+pid)
	kinst := filepath.Join(g.Bin, "kinst")
	out, err := exec.CommandContext(ctx, kinst, "core", path, "ps", "--json").Output()
	if err != nil {
		t.Fatalf("core ps: %v", err)
	}
	var ps struct {
		Tasks []struct {
			PID  int    `json:"pid"`
			Comm string `json:"comm"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal(out, &ps); err != nil {
		t.Fatal(err)
	}
	comms := map[int]string{}
	for _, task := range ps.Tasks {
		comms[task.PID] = task.Comm
	}
	p, _ := strconv.Atoi(pid)
	if comms[p] != "sleep" || comms[1] != "init" || comms[2] != "kthreadd" {
		t.Errorf("core ps: pid %d is %q, 1 is %q, 2 is %q; want sleep, init, kthreadd (%d tasks)", p, comms[p], comms[1], comms[2], len(ps.Tasks))
	}
	// The mount table: mnt_namespace.list before 6.8, an rb-tree after.
	out, err = exec.CommandContext(ctx, kinst, "core", path, "mount", "--json").Output()
	if err != nil {
		t.Fatalf("core mount: %v", err)
	}
	var ms []struct{ Type, Device, Dir string }
	if err := json.Unmarshal(out, &ms); err != nil {
		t.Fatal(err)
	}
	var gotMounts, wantMounts []string
	for _, m := range ms {
		gotMounts = append(gotMounts, m.Device+" "+m.Dir+" "+m.Type)
	}
	for _, l := range strings.Split(strings.TrimSpace(mounts), "\n") {
		if f := strings.Fields(l); len(f) >= 3 {
			wantMounts = append(wantMounts, f[0]+" "+f[1]+" "+f[2])
		}
	}
	if strings.Join(gotMounts, "\n") != strings.Join(wantMounts, "\n") {
		t.Errorf("core mount:\n%s\n/proc/mounts:\n%s", strings.Join(gotMounts, "\n"), strings.Join(wantMounts, "\n"))
	}
	// The sleeper's VMAs: the maple tree (6.1 on), as /proc/PID/maps.
	out, err = exec.CommandContext(ctx, kinst, "core", path, "vm", pid, "--json").Output()
	if err != nil {
		t.Fatalf("core vm: %v", err)
	}
	var vm struct {
		VMAs []struct {
			Start, End uint64
			Perms      string
		}
		Dropped int
	}
	if err := json.Unmarshal(out, &vm); err != nil {
		t.Fatal(err)
	}
	var gotVMAs, wantVMAs []string
	for _, v := range vm.VMAs {
		gotVMAs = append(gotVMAs, fmt.Sprintf("%x-%x %s", v.Start, v.End, v.Perms))
	}
	for _, l := range strings.Split(strings.TrimSpace(maps), "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			lo, hi, _ := strings.Cut(f[0], "-")
			a, _ := strconv.ParseUint(lo, 16, 64)
			b, _ := strconv.ParseUint(hi, 16, 64)
			wantVMAs = append(wantVMAs, fmt.Sprintf("%x-%x %s", a, b, f[1]))
		}
	}
	if vm.Dropped != 0 || strings.Join(gotVMAs, "\n") != strings.Join(wantVMAs, "\n") {
		t.Errorf("core vm %s (%d dropped):\n%s\n/proc/%s/maps:\n%s", pid, vm.Dropped, strings.Join(gotVMAs, "\n"), pid, strings.Join(wantVMAs, "\n"))
	}
	// findleaks on each kernel's heap (6.9 moved the vmalloc areas into
	// per-node trees): a healthy guest's objects nearly all reached.
	out, err = exec.CommandContext(ctx, kinst, "core", path, "findleaks", "--json").Output()
	if err != nil {
		t.Fatalf("core findleaks: %v", err)
	}
	var leaks struct {
		Objects, Reached, Leaked int
		RootRanges               map[string]int `json:"root_ranges"`
		Groups                   []struct {
			Cache         string   `json:"cache"`
			Count         int      `json:"count"`
			AllocFunction string   `json:"alloc_function"`
			AllocFrames   []string `json:"alloc_frames"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(out, &leaks); err != nil {
		t.Fatal(err)
	}
	// The module's ten leaks, in one group with leak_some's stack (the
	// cache's flags word and the stack depot are laid out differently
	// from kernel to kernel).
	known := false
	for _, gr := range leaks.Groups {
		if gr.Cache == "kinst_leak" && gr.Count == 10 && slices.ContainsFunc(gr.AllocFrames, func(f string) bool { return strings.HasPrefix(f, "leak_some+") }) {
			known = true
		}
	}
	if !known {
		t.Errorf("findleaks: no group of kinst_leak's ten leaks with leak_some's stack: %+v", leaks.Groups)
		keep = append(keep, "findleaks")
	}
	// Of the vmalloc'd areas, the module's dropped one is the leak, and
	// no other: the allocator's records of an area, busy or free, and the
	// CPUs' cached task stacks do not make one reached or leaked.
	vleaks := 0
	for _, gr := range leaks.Groups {
		if gr.Cache != "vmalloc" {
			continue
		}
		if strings.HasPrefix(gr.AllocFunction, "vleak_some+") && gr.Count == 1 {
			vleaks++
		} else {
			t.Errorf("findleaks: %d vmalloc'd areas allocated by %s unreached", gr.Count, gr.AllocFunction)
		}
	}
	if vleaks != 1 {
		t.Errorf("findleaks: vleak_some's dropped area not reported")
		keep = append(keep, "vmalloc")
	}
	t.Logf("findleaks: %d objects, %d unreached; roots %v", leaks.Objects, leaks.Leaked, leaks.RootRanges)
	if leaks.Objects < 1000 || leaks.Leaked*200 > leaks.Objects || leaks.RootRanges["vmalloc area"] < 10 {
		t.Errorf("findleaks: %d objects, %d unreached (want under 0.5%%), roots %v", leaks.Objects, leaks.Leaked, leaks.RootRanges)
	}
	out, err = exec.CommandContext(ctx, kinst, "core", path, "bt", pid, "--json").Output()
	if err != nil {
		t.Fatalf("core bt: %v", err)
	}
	var bt struct {
		Frames []struct {
			Function string `json:"function"`
		} `json:"frames"`
	}
	if err := json.Unmarshal(out, &bt); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range bt.Frames {
		got = append(got, f.Function)
	}
	// /proc/PID/stack's functions appear in the dump's backtrace, in
	// order (the dump's may have more: the context switch itself).
	i := 0
	for _, fn := range got {
		if i < len(want) && fn == want[i] {
			i++
		}
	}
	if len(want) == 0 || i != len(want) {
		t.Errorf("core bt %s: %v; want /proc/%s/stack's %v in order", pid, got, pid, want)
	}
}

// checkTypegraph types the heap of the guest filled as livecore's
// TestTypegraph fills it: on every kernel at least the share that test
// asks of the default one (95 %), and the trace events' fields (a cache
// 6.12 merges with others) nearly all.
func checkTypegraph(t *testing.T, ctx context.Context, g *livetest.VM) {
	g.FillHeap(t, ctx)
	defer g.EmptyHeap(t, ctx)
	path := filepath.Join(g.Scratch, "typegraph.elf")
	if err := g.Dump(path, "elf"); err != nil {
		t.Fatalf("dump: %v", err)
	}
	defer os.Remove(path)
	out, err := exec.CommandContext(ctx, filepath.Join(g.Bin, "kinst"), "core", path, "typegraph", "--json").Output()
	if err != nil {
		t.Fatalf("core typegraph: %v", err)
	}
	var r struct {
		Objects int `json:"objects"`
		Typed   int `json:"typed"`
		Caches  []struct {
			Name    string         `json:"name"`
			Objects int            `json:"objects"`
			Types   map[string]int `json:"types"`
		} `json:"caches"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	share := float64(r.Typed) / float64(max(r.Objects, 1))
	t.Logf("typegraph: %d objects, %d typed (%.1f %%)", r.Objects, r.Typed, 100*share)
	if r.Objects < 100000 || share < 0.95 {
		t.Errorf("typegraph: %d of %d objects typed (%.1f %%), want at least 95 %%", r.Typed, r.Objects, 100*share)
	}
	for _, c := range r.Caches {
		if c.Name == "ftrace_event_field" && c.Types["ftrace_event_field"] < c.Objects*95/100 {
			t.Errorf("%d of %d objects of %s typed as ftrace_event_field", c.Types["ftrace_event_field"], c.Objects, c.Name)
		}
	}
}

// keepEvidence keeps the dump and the guest's kernel log of a failed
// check under the artifact directory, for a failure seen once in many
// runs to be looked at again.
func keepEvidence(t *testing.T, ctx context.Context, g *livetest.VM, dump, what string) {
	dir := filepath.Join(livetest.ArtifactDir("livecompat"), g.KernelRelease()+"-"+what)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keep evidence: %v", err)
		return
	}
	if err := os.Rename(dump, filepath.Join(dir, "dump.elf")); err != nil {
		// Another file system: copied.
		if b, rerr := os.ReadFile(dump); rerr != nil || os.WriteFile(filepath.Join(dir, "dump.elf"), b, 0o644) != nil {
			t.Logf("keep dump: %v", err)
		}
	}
	os.WriteFile(filepath.Join(dir, "dmesg"), []byte(g.Sh(t, ctx, "dmesg")), 0o644)
	t.Logf("dump and kernel log kept in %s", dir)
}
