package process

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kinst/kinst/patchheap"
)

// textStart is the start of the first executable mapping of pid.
func textStart(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && strings.Contains(f[1], "x") {
			lo, _, _ := strings.Cut(f[0], "-")
			a, err := strconv.ParseUint(lo, 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return a
		}
	}
	t.Fatal("no executable mapping")
	return 0
}

// TestPatchQuarantine: a freed patch keeps its bytes and its space until
// the heap is full; then every quarantined patch is given back at once
// and the allocation that found the heap full succeeds. A second free of
// the same patch is an error.
func TestPatchQuarantine(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t))
	want := w.round(t)
	pid := w.cmd.Process.Pid
	d, err := Open(pid, textStart(t, pid))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const size = 4096
	var patches []uint64
	for {
		a, err := d.PatchAlloc(size)
		if errors.Is(err, patchheap.ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		patches = append(patches, a)
	}
	if len(patches) < HeapSize/size/2 {
		t.Fatalf("%d patches of %d bytes in a %d-byte heap", len(patches), size, HeapSize)
	}
	code := bytes.Repeat([]byte{0x90}, 64)
	if err := d.PatchWrite(patches[0], code); err != nil {
		t.Fatal(err)
	}
	for _, a := range patches {
		if err := d.PatchFree(a); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.PatchFree(patches[0]); err == nil {
		t.Error("a second free of a quarantined patch: no error")
	}
	got := make([]byte, len(code))
	if err := d.Read(patches[0], got); err != nil || !bytes.Equal(got, code) {
		t.Errorf("a quarantined patch's bytes: %x, %v; want %x", got, err, code)
	}
	// The heap is full of quarantined patches: this allocation gives them
	// all back.
	a, err := d.PatchAlloc(size)
	if err != nil {
		t.Fatalf("allocation with the heap full of freed patches: %v", err)
	}
	d.mu.Lock()
	left := len(d.quarantine)
	d.mu.Unlock()
	if left != 0 {
		t.Errorf("%d patches still quarantined after the release", left)
	}
	if err := d.PatchFree(a); err != nil {
		t.Error(err)
	}
	if got := w.round(t); got != want {
		t.Errorf("program after the allocations: %q, want %q", got, want)
	}
}

// The engine's reclaim runs on a timer and may give counters back after
// the target is detached: the counters then read 0 and clear to nothing,
// where they once touched kinst's unmapped view of the region (a fault
// that killed the test binary).
func TestCountersAfterClose(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t))
	w.round(t)
	pid := w.cmd.Process.Pid
	d, err := Open(pid, textStart(t, pid))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.ClearCounters(0, 4); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.ClearCounters(0, 4); err != nil {
		t.Errorf("clear after close: %v", err)
	}
	if v := d.Counter(1); v != 0 {
		t.Errorf("counter after close reads %d", v)
	}
}
