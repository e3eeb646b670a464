package live

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/livetest"
)

// Source lines of a Debian module from Debian's own debug file
// (linux-image-RELEASE-dbg's lib/modules/…/evdev.ko, found by name under
// --module-debug and checked against the loaded module's build id):
// kinst cover --module evdev on the host, against the guest's kerninstd,
// gives every block the line addr2line -j gives at its offset into its
// function's section of that file.
func TestDebianModuleLines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if !strings.Contains(gsh(t, ctx, "cat /proc/modules"), "evdev ") {
		t.Skip("the guest has no evdev loaded")
	}
	mods := live.DebugModules(t)
	out, stderr := hostUnder(t, ctx, "evdevlines", "true", "cover", "--module", "evdev", "--module-debug", mods,
		"--name", "evdevlines", "--duration", "2s", "--json", "--addr", guest.KerninstdAddr(), "--token-file", guest.TokenFile())
	if strings.Contains(stderr, "no source lines for") {
		t.Errorf("kinst cover said:\n%s", stderr)
	}
	var rep api.CoverReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%.2000s", err, out)
	}
	n, sections := livetest.CheckModuleLines(t, rep, "evdev", filepath.Join(mods, "evdev.ko"))
	if n < 50 {
		t.Errorf("%d blocks of evdev with a line to compare, want its code's", n)
	}
	t.Logf("%d blocks of evdev in %d sections agree with addr2line -j on Debian's debug file", n, sections)
	noOops(t, ctx, "kinst cover --module evdev with lines")
}
