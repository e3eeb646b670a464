// Package livebpf tests kerninstd without the driver: the test VM boots
// with kinst.nodriver (kinst vm up --no-driver), so kerninstd serves
// count and time with BPF (package bpfprobe). Counts are checked against
// a known workload and a tracefs kprobe, times against sleeps of known
// length; what only splices can serve must be refused with nothing left
// attached (the kernel's own lists: kprobes/list, enabled_functions).
//
// Like test/livekprobe, the VM runs under single-threaded TCG: attaching
// fentry or a kprobe makes the kernel patch its own text with
// text_poke_bp, which multi-threaded TCG can livelock.
package livebpf

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/livetest"
)

var (
	live   *livetest.VM
	client *api.Client
)

func TestMain(m *testing.M) {
	os.Exit(livetest.MainWith(m, "livebpf", livetest.Options{Accel: "tcg-single", NoDriver: true},
		func(g *livetest.VM) { live, client = g, g.Client }))
}

const (
	statCalls = 5000
	slack     = 150 // other lookups in the window: the shell, kinst starting
)

func gsh(t *testing.T, ctx context.Context, script string) string {
	t.Helper()
	return live.Sh(t, ctx, script)
}

// nothingAttached checks the kernel's own lists: no kprobe, and no
// function with an ftrace callback or trampoline (fentry, kprobe.multi).
func nothingAttached(t *testing.T, ctx context.Context) {
	t.Helper()
	out := gsh(t, ctx, "cat /sys/kernel/debug/kprobes/list; cat /sys/kernel/tracing/enabled_functions")
	if strings.TrimSpace(out) != "" {
		t.Errorf("probes left attached:\n%s", out)
	}
}
