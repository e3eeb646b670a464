package livecompat

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/app/livetest"
	"github.com/kinst/kinst/output"
)

// slubFunctions are SLUB's allocation entry points, whose lockless fast
// path ends in this_cpu_cmpxchg16b: 6.12 names first, then 6.1's.
var slubFunctions = []string{"__kmalloc_node_noprof", "kmem_cache_alloc_noprof", "__kmalloc_node", "kmem_cache_alloc"}

// checkSLUBCounters counts every block of SLUB's allocation entry points
// that takes a splice while the guest allocates, and fails on any kernel
// complaint. It is the reproducer of the 6.12 oops at 182,243 blocks: a
// flags-saving patch (popfq) before the fast path's cmpxchg16b and a
// probe after it put a kernel pointer into RFLAGS under QEMU TCG before
// 8.0 (internal/cpuquirk). Two counters, __kmalloc_node_noprof:12 and :35,
// oopsed 6.12 in 2 of 2 runs on a guest CPU with cx16; the test VM's CPU
// has none (vm.DefaultCPU), and kerninstd does not splice on an affected
// CPU (TestCPUQuirk).
func checkSLUBCounters(t *testing.T, ctx context.Context, g *livetest.VM) {
	var points []string
	for _, fn := range slubFunctions {
		cfg, err := g.Client.CFG(ctx, fn)
		if err != nil {
			continue // not in this kernel
		}
		for _, b := range cfg.Blocks {
			if b.Padding {
				continue
			}
			for _, in := range b.Instructions {
				if in.SpliceClass != "refused" {
					points = append(points, fmt.Sprintf("%s:%d", fn, b.Index))
					break
				}
			}
		}
	}
	if len(points) < 20 {
		t.Fatalf("only %d blocks of %v take a splice", len(points), slubFunctions)
	}
	out := g.Sh(t, ctx, fmt.Sprintf("kinst count %s --json -- kinst workload stat %d /", strings.Join(points, " "), 5*statCalls))
	var rep output.CountReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("count report: %v\n%s", err, out)
	}
	var total uint64
	for _, p := range rep.Probes {
		total += p.Count
	}
	if len(rep.Probes) != len(points) || total == 0 {
		t.Fatalf("%d probes of %d, %d hits in all", len(rep.Probes), len(points), total)
	}
	if oops := g.Sh(t, ctx, "dmesg | grep -E 'Oops|BUG:|WARNING:|general protection|RIP:' || true"); oops != "" {
		t.Fatalf("the kernel complained with %d counters in SLUB's allocation paths:\n%s", len(points), oops)
	}
	t.Logf("%d counters in %v: %d hits, no complaint", len(points), slubFunctions, total)
}

// TestCPUQuirk boots a guest whose CPU has cmpxchg16b under QEMU TCG (the
// Debian 12 host's QEMU 7.2 computes its flags from stale state) and
// checks that kerninstd finds the quirk and does not splice: count falls
// back to BPF, and coverage, which needs splices, is refused with the
// reason. Where kerninstd finds no quirk (KVM, QEMU 8.0 or later), SLUB's
// cmpxchg16b path is counted instead and must leave the kernel quiet. With
// the quirk and kerninstd --allow-cpu-quirk, checkSLUBCounters oopses this
// guest (seen by hand: two counters, __kmalloc_node_noprof:12 and :35).
func TestCPUQuirk(t *testing.T) {
	g, down, err := livetest.Boot("livecompat-cpuquirk", livetest.Options{Kernel: "6.12.117+deb12-amd64", CPU: "qemu64"})
	if err != nil {
		t.Fatal(err)
	}
	defer down()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if n := strings.TrimSpace(g.Sh(t, ctx, "grep -cw cx16 /proc/cpuinfo || true")); n == "0" {
		t.Fatalf("the guest CPU has no cx16: the test needs one that does")
	}
	in, err := g.Client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Mechanism == "splice" {
		// KVM, or a QEMU that computes cmpxchg16b's flags right (8.0 and
		// later): no quirk, and SLUB's cmpxchg16b path takes counters.
		t.Logf("accelerator %s: no quirk found; SLUB's cmpxchg16b path under counters", g.Instance.Accel())
		checkSLUBCounters(t, ctx, g)
		return
	}
	if in.Mechanism != "bpf" || !strings.Contains(in.NoSplice, "cmpxchg16b") {
		t.Fatalf("kerninstd on an affected CPU: mechanism %q, no_splice %q; want bpf and the cmpxchg16b quirk", in.Mechanism, in.NoSplice)
	}
	_, errs, code := g.Exec(t, ctx, "kinst", "cover", "vfs_read", "-d", "1s")
	if code == 0 || !strings.Contains(errs, "cmpxchg16b") {
		t.Fatalf("kinst cover on an affected CPU: status %d, stderr %q; want a refusal that names the quirk", code, errs)
	}
	out := g.Sh(t, ctx, "kinst count vfs_read --json -- kinst workload stat 100 /")
	var rep output.CountReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Probes) != 1 || rep.Probes[0].Count == 0 {
		t.Fatalf("count through BPF: %v\n%s", err, out)
	}
}
