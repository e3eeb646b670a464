package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

// TestBenchSpliceSpringboard runs `kinst bench splice` at a
// springboard-class instruction of __x64_sys_getppid in the guest while a
// getppid loop runs through it: every Figure 4 step must be timed, the
// slot written every cycle, and afterwards the instruction's bytes (read
// through QEMU, not the driver) must be the original ones, with no splice
// left installed and nothing in dmesg.
func TestBenchSpliceSpringboard(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const fn, cycles = "__x64_sys_getppid", 200
	g, err := client.CFG(ctx, fn)
	if err != nil {
		t.Fatal(err)
	}
	var point string
	var addr api.Addr
	var length int
	for _, b := range g.Blocks {
		for _, in := range b.Instructions {
			if in.SpliceClass == "springboard" && point == "" {
				point, addr, length = fmt.Sprintf("%s+%#x", fn, in.Offset), in.Address, in.Length
			}
		}
	}
	if point == "" {
		t.Skipf("no springboard-class instruction in %s", fn)
	}
	orig := qemuBytes(t, addr, length)
	pid := strings.TrimSpace(gsh(t, ctx, "kinst workload syscalls 30m >/tmp/bench-load.log 2>&1 & echo $!"))
	out, errOut, code := gexec(t, ctx, "kinst", "bench", "splice", point, "--cycles", strconv.Itoa(cycles), "--json")
	gsh(t, ctx, "kill -INT "+pid)
	if code != 0 {
		t.Fatalf("bench splice %s: status %d\n%s", point, code, errOut)
	}
	var res struct {
		api.BenchResult
		Request int64 `json:"request_ns"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench splice --json: %v\n%s", err, out)
	}
	if res.Point.SpliceClass != "springboard" || res.Cycles != cycles || !res.Restored {
		t.Errorf("class %s, %d cycles of %d, restored %v", res.Point.SpliceClass, res.Cycles, cycles, res.Restored)
	}
	for name, d := range map[string]api.Durations{
		"resolve": res.Resolve, "liveness": res.Liveness, "patch_alloc": res.PatchAlloc, "codegen": res.Codegen,
		"relocation": res.Relocation, "patch_write": res.Patch, "slot_find": res.SlotFind,
		"springboard": res.Springboard, "splice": res.Splice, "unsplice": res.Unsplice, "free": res.Free,
	} {
		t.Logf("%-12s n=%-4d median %v", name, d.N, time.Duration(d.Median))
		if d.N == 0 || d.Median <= 0 {
			t.Errorf("%s not timed: %+v", name, d)
		}
	}
	if res.Springboard.N != cycles {
		t.Errorf("slot written %d times, want once per cycle (%d)", res.Springboard.N, cycles)
	}
	if now := qemuBytes(t, addr, length); !bytes.Equal(now, orig) {
		t.Errorf("%s after the bench: %x, want %x", point, now, orig)
	}
	if info, err := client.Info(ctx); err != nil || info.Splices != 0 || info.DriverSplices != 0 {
		t.Errorf("splices left: %+v %v", info, err)
	}
	if oops := gsh(t, ctx, "dmesg | grep -E 'Oops|BUG:|general protection|RIP:' || true"); oops != "" {
		t.Errorf("kernel complained:\n%s", oops)
	}
}
