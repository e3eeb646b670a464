package live

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

// A module unloaded under a coverage session, and loaded again: the driver
// puts the module's bytes back as it goes (its module notifier) and
// forgets those splices' ids; the session goes on and ends with its report
// and exit status 0, nothing is left installed, and the kernel stays
// quiet. Before, every probe of the gone module failed its removal
// (ENOENT, one error line each) and kinst cover exited 1 with no report.
func TestCoverModuleUnloaded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log0 := dmesgLines(t, ctx)
	// While the session still holds its (now gone) points, a count at
	// one of them: evdev comes back at the same address, where the
	// engine's old point must give way to a new one.
	out := gsh(t, ctx, "(kinst cover --module evdev --duration 10s --json >/tmp/ev.json 2>/tmp/ev.err; echo \"status $?\" >/tmp/ev.rc) & "+
		"until kinst ls 2>/dev/null | grep -q cover; do sleep 0.2; done; grep ' evdev_open' /proc/kallsyms; "+
		"rmmod evdev && echo unloaded; insmod /lib/modules/evdev.ko && echo loaded; grep ' evdev_open' /proc/kallsyms; "+
		"kinst count evdev_open --duration 1s >/dev/null 2>/tmp/cnt.err; echo \"count status $?\"; cat /tmp/cnt.err; "+
		"wait; cat /tmp/ev.rc; tail -3 /tmp/ev.err; "+
		"lsmod | grep -q '^evdev ' && echo evdev back")
	t.Logf("%s", out)
	if !strings.Contains(out, "unloaded") || !strings.Contains(out, "loaded") || !strings.Contains(out, "evdev back") {
		t.Fatalf("rmmod/insmod of evdev under the session: %q", out)
	}
	if !strings.Contains(out, "\nstatus 0") {
		t.Errorf("kinst cover over the unloaded module: %q; want status 0", out)
	}
	if !strings.Contains(out, "count status 0") {
		t.Errorf("kinst count evdev_open beside the session's gone points: %q; want status 0 (it failed with re-point …: no such file or directory)", out)
	}
	var rep api.CoverReport
	if err := json.Unmarshal([]byte(gsh(t, ctx, "cat /tmp/ev.json")), &rep); err != nil {
		t.Fatalf("no report: %v", err)
	}
	if rep.Armed == 0 || len(rep.Functions) == 0 {
		t.Errorf("report: %d armed over %d functions", rep.Armed, len(rep.Functions))
	}
	t.Logf("evdev: %d functions, %d blocks, %d armed, %d covered (its exit and cleanup code ran as it went)",
		len(rep.Functions), rep.TotalBlocks, rep.Armed, rep.CoveredBlocks)
	if info, err := client.Info(ctx); err != nil || info.Splices != 0 || info.DriverSplices != 0 || info.Sessions != 0 {
		t.Errorf("after the session: %+v, %v", info, err)
	}
	quietSince(t, ctx, log0, "the module unloaded under coverage")
	// The reloaded module takes probes again.
	if _, errs, status := gexec(t, ctx, "kinst", "cover", "--module", "evdev", "--duration", "1s"); status != 0 {
		t.Errorf("kinst cover --module evdev after the reload: status %d\n%s", status, errs)
	}
}
