// Package livecore tests `kinst core` against dumps of a real,
// unmodified Debian kernel booted under QEMU, taken through QMP
// dump-guest-memory, with the guest's own view (ps, /proc/PID/stack,
// dmesg, /proc/kallsyms) as the oracle. One VM serves the package; the
// last test panics it.
//
// They run only with KINST_LIVE=1 (make test sets it); KINST_BIN to use
// prebuilt static binaries; KINST_CACHE for the download/build cache (see
// app/livetest).
package livecore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kinst/kinst/app/livetest"
)

var (
	guest *livetest.VM
	bin   string // directory with kinst and kerninstd
	tmp   string // this run's scratch directory (dumps go here)
	cache string // KINST_CACHE: the kernel package and its vmlinux
)

func TestMain(m *testing.M) {
	// The known-leaks module's cache records its objects' owners, as
	// slub_debug=U does for a cache a user suspects.
	o := livetest.Options{Append: "slub_debug=U," + leakCache}
	os.Exit(livetest.MainWith(m, "livecore", o, func(g *livetest.VM) {
		guest, bin, tmp, cache = g, g.Bin, g.Scratch, g.Cache
	}))
}

// gsh runs a shell command in the guest and fails the test on a non-zero
// status.
func gsh(t testing.TB, ctx context.Context, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := guest.Instance.Exec(ctx, []string{"sh", "-c", script}, &out, &errb)
	if err != nil || code != 0 {
		t.Fatalf("guest sh -c %q: status %d, %v\nstdout: %s\nstderr: %s", script, code, err, out.String(), errb.String())
	}
	return out.String()
}

// dumpGuest writes a dump of the guest's memory with QMP
// dump-guest-memory (format "elf" or "kdump-zlib").
func dumpGuest(t testing.TB, name, format string) string {
	t.Helper()
	path := filepath.Join(tmp, name)
	start := time.Now()
	if err := guest.Dump(path, format); err != nil {
		t.Fatalf("dump-guest-memory %s: %v", format, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s dump: %d MiB in %.1fs", format, st.Size()>>20, time.Since(start).Seconds())
	return path
}

// kinst runs the host's kinst and returns its stdout; it fails the test
// on a non-zero status.
func kinst(t testing.TB, args ...string) []byte {
	t.Helper()
	out, _ := kinstErr(t, args...)
	return out
}
