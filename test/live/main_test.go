// Package live tests kinst end to end against a real, unmodified Debian
// kernel booted under QEMU, with the real kerninst.ko loaded and kerninstd
// running in the guest. One VM serves every test of the package.
//
// They run only with KINST_LIVE=1 (make test sets it); KINST_BIN to use
// prebuilt static binaries; KINST_CACHE for the download/build cache;
// KINST_STRESS_CYCLES for the length of the splice/unsplice burst.
package live

import (
	"context"
	"os"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/livetest"
	"github.com/kinst/kinst/app/vm"
)

var (
	live   *livetest.VM
	guest  *vm.Instance
	client *api.Client
)

func TestMain(m *testing.M) {
	os.Exit(livetest.Main(m, "live", func(g *livetest.VM) { live, guest, client = g, g.Instance, g.Client }))
}

func repoRoot() string { return livetest.RepoRoot() }

// gexec runs a command in the guest and returns stdout, stderr and status.
func gexec(t *testing.T, ctx context.Context, argv ...string) (string, string, int) {
	t.Helper()
	return live.Exec(t, ctx, argv...)
}

// gsh runs a shell command in the guest and fails the test on a non-zero
// status.
func gsh(t *testing.T, ctx context.Context, script string) string {
	t.Helper()
	return live.Sh(t, ctx, script)
}
