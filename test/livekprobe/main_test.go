// Package livekprobe holds the live tests that compare kinst with the
// kernel's own kprobes (tracefs and BPF) in one VM: call counts against a
// kprobe oracle, the per-hit costs of every mechanism, a request's cost
// against a tracefs kprobe's, and lock waiters against a filtered kprobe.
//
// Its VM runs under single-threaded TCG (one host thread runs both vCPUs
// in turn). Enabling a kprobe makes the kernel patch its own text with
// text_poke_bp (the kprobe's int3, and static keys such as the sched_switch
// tracepoint's in __schedule); under multi-threaded TCG a vCPU can keep
// executing a stale translation of the transient int3 after memory holds
// the final bytes, and kprobe_int3_handler backs it up to the same address
// for ever (kinst's own driver avoids this by rewriting each patched
// instruction once more; the kernel does not). The other live packages
// keep multi-threaded TCG, where the vCPUs truly run in parallel.
package livekprobe

import (
	"context"
	"os"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/livetest"
)

var (
	live   *livetest.VM
	client *api.Client
)

func TestMain(m *testing.M) {
	os.Exit(livetest.MainWith(m, "livekprobe", livetest.Options{Accel: "tcg-single"},
		func(g *livetest.VM) { live, client = g, g.Client }))
}

// The workload's stat calls, and the other lookups a count may include
// (the shell and the workload starting).
const (
	statCalls = 5000
	slack     = 150
)

func gsh(t *testing.T, ctx context.Context, script string) string {
	t.Helper()
	return live.Sh(t, ctx, script)
}

func gexec(t *testing.T, ctx context.Context, argv ...string) (string, string, int) {
	t.Helper()
	return live.Exec(t, ctx, argv...)
}
