package livemetrics

// This file's name sorts last on purpose: TestDriverCommands replaces the
// guest init's kerninstd restart loop with a kerninstd that `kinst driver
// load` starts, so it runs after every other test of the package.

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/output"
)

// guestDriverStatus runs `kinst driver status --json` in the guest.
func guestDriverStatus(t *testing.T, ctx context.Context) output.DriverStatus {
	t.Helper()
	out := guest.Sh(t, ctx, "kinst driver status --json")
	var st output.DriverStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("driver status --json: %v\n%s", err, out)
	}
	return st
}

// TestDriverCommands drives `kinst driver status|unload|load` in the
// guest, checking each against the guest's own /proc/modules, /dev and
// process list, and that a refused unload changes nothing.
func TestDriverCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	modules := func() bool {
		return strings.Contains(guest.Sh(t, ctx, "cut -d' ' -f1 /proc/modules"), "kerninst\n")
	}

	st := guestDriverStatus(t, ctx)
	if !st.ModuleLoaded || !st.Device || !st.Kerninstd || st.KerninstdPID != 0 || !modules() {
		t.Fatalf("status with init's kerninstd = %+v", st)
	}
	if st.KernelRelease != strings.TrimSpace(guest.Sh(t, ctx, "uname -r")) || st.BuildID == "" {
		t.Errorf("status kernel = %q build id %q", st.KernelRelease, st.BuildID)
	}

	// init's kerninstd holds the device: unload must refuse and leave
	// the module and the daemon as they were.
	_, errs, code := guest.Exec(t, ctx, "kinst", "driver", "unload")
	if code == 0 || !strings.Contains(errs, "kerninstd this command did not start") {
		t.Fatalf("unload under a foreign kerninstd: status %d, stderr %q", code, errs)
	}
	if st := guestDriverStatus(t, ctx); !st.ModuleLoaded || !st.Kerninstd {
		t.Fatalf("a refused unload changed things: %+v", st)
	}

	// Stop init's restart loop and its kerninstd, then unload for real.
	guest.Sh(t, ctx, `for p in $(pidof kerninstd); do pp=$(awk '{print $4}' /proc/$p/stat); kill $pp; kill $p; done; sleep 1; ! pidof kerninstd`)
	guest.Sh(t, ctx, "kinst driver unload")
	if modules() {
		t.Fatal("kerninst still in /proc/modules after unload")
	}
	if out := guest.Sh(t, ctx, "ls /dev/kerninst 2>/dev/null || true"); out != "" {
		t.Fatalf("/dev/kerninst still there: %q", out)
	}
	st = guestDriverStatus(t, ctx)
	if st.ModuleLoaded || st.Device || st.Kerninstd {
		t.Fatalf("status after unload = %+v", st)
	}
	// Unloading again is not an error.
	guest.Sh(t, ctx, "kinst driver unload")

	// A missing module file: a clear error, nothing loaded.
	_, errs, code = guest.Exec(t, ctx, "kinst", "driver", "load", "--ko", "/nonexistent.ko")
	if code == 0 || !strings.Contains(errs, "/nonexistent.ko") || modules() {
		t.Fatalf("load of a missing file: status %d, stderr %q", code, errs)
	}

	// Load the module the VM booted with, and a kerninstd as init ran it,
	// so the host's client reaches it again.
	guest.Sh(t, ctx, "kinst driver load --ko /lib/modules/kerninst.ko -- --listen 0.0.0.0:7070 --token-file /run/kinst.token --analyze=false")
	st = guestDriverStatus(t, ctx)
	pid := strings.TrimSpace(guest.Sh(t, ctx, "pidof kerninstd"))
	if !st.ModuleLoaded || !st.Device || !st.Kerninstd || !modules() || pid == "" || st.KerninstdPID == 0 ||
		pid != strings.TrimSpace(strings.Fields(pid)[0]) {
		t.Fatalf("status after load = %+v (pidof kerninstd %q)", st, pid)
	}
	if err := guest.Client.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	out := guest.Sh(t, ctx, "kinst count --json -d 1s vfs_read -- cat /proc/version")
	if !strings.Contains(out, "vfs_read") {
		t.Fatalf("count after load: %s", out)
	}

	// Unload stops the kerninstd load started, then removes the module.
	guest.Sh(t, ctx, "kinst driver unload")
	if modules() || strings.TrimSpace(guest.Sh(t, ctx, "pidof kerninstd || true")) != "" {
		t.Fatal("unload left the module or kerninstd behind")
	}
	// Leave the guest as the VM booted it, for anyone who looks after.
	guest.Sh(t, ctx, "kinst driver load --ko /lib/modules/kerninst.ko -- --listen 0.0.0.0:7070 --token-file /run/kinst.token --analyze=false")
}
