package live

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/output"
)

// statCalls is the number of stat(2) calls the workload makes; each enters
// filename_lookup exactly once on 6.1.
const statCalls = 5000

// slack bounds the calls of filename_lookup made during the counting window
// by the rest of the guest (kinst's own start-up, the exec agent, busybox):
// the counter sees every call system-wide, not only the workload's.
const slack = 150

func resolveLookuppn(t *testing.T, ctx context.Context) api.Resolved {
	t.Helper()
	r, err := client.Resolve(ctx, "lookuppn")
	if err != nil {
		t.Fatalf("resolve lookuppn: %v", err)
	}
	if r.Function != "filename_lookup" || r.Classic == nil {
		t.Fatalf("lookuppn resolved to %+v, want filename_lookup via the classic map", r)
	}
	return r
}

// qemuBytes reads guest kernel memory as QEMU sees it: independent of our
// driver.
func qemuBytes(t *testing.T, addr api.Addr, n int) []byte {
	t.Helper()
	return live.QEMUBytes(t, uint64(addr), n)
}

// waitBytes polls QEMU's view of addr until pred holds.
func waitBytes(t *testing.T, addr api.Addr, n int, what string, pred func([]byte) bool) []byte {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b := qemuBytes(t, addr, n)
		if pred(b) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s at %#x (now %x)", what, uint64(addr), b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestSpliceVisibleThenRestored(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := resolveLookuppn(t, ctx)
	orig := qemuBytes(t, r.Address, r.Length)
	info, err := client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}

	cctx, stop := context.WithCancel(ctx)
	done := make(chan string)
	go func() {
		var out, errb bytes.Buffer
		guest.Exec(cctx, []string{"kinst", "count", "lookuppn", "--duration", "2m"}, &out, &errb)
		done <- out.String() + errb.String()
	}()
	spliced := waitBytes(t, r.Address, 5, "the jmp rel32", func(b []byte) bool { return b[0] == 0xe9 })
	target := uint64(r.Address) + 5 + uint64(int64(int32(uint32(spliced[1])|uint32(spliced[2])<<8|uint32(spliced[3])<<16|uint32(spliced[4])<<24)))
	if target < uint64(info.PatchHeap) || target >= uint64(info.PatchHeap)+info.PatchHeapSize {
		t.Errorf("splice jumps to %#x, outside the patch heap [%#x, +%#x)", target, uint64(info.PatchHeap), info.PatchHeapSize)
	}
	if r.Length > 5 && !bytes.Equal(qemuBytes(t, r.Address, r.Length)[5:], orig[5:]) {
		t.Errorf("splice wrote more than one jmp rel32: bytes after it changed")
	}
	// kinst rd shows the same bytes as QEMU.
	m, err := client.Read(ctx, fmt.Sprintf("%#x", uint64(r.Address)), 5)
	if err != nil || m.Bytes != hex.EncodeToString(spliced) {
		t.Errorf("kinst rd = %+v, %v; QEMU sees %x", m, err, spliced)
	}
	// Ctrl-C (the exec agent sends SIGINT) removes the splice.
	stop()
	out := <-done
	waitBytes(t, r.Address, r.Length, "the original bytes", func(b []byte) bool { return bytes.Equal(b, orig) })
	if info, err := client.Info(ctx); err != nil || info.Splices != 0 || info.DriverSplices != 0 {
		t.Errorf("after Ctrl-C: info %+v, %v; want no splices\nkinst output:\n%s", info, err, out)
	}
}

func TestKill9DaemonRestoresText(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := resolveLookuppn(t, ctx)
	orig := qemuBytes(t, r.Address, r.Length)
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		guest.Exec(cctx, []string{"kinst", "count", "lookuppn", "--duration", "2m"}, new(bytes.Buffer), new(bytes.Buffer))
	}()
	// A workload keeps running through the spliced function meanwhile.
	wctx, wstop := context.WithCancel(ctx)
	wdone := make(chan int)
	go func() {
		code, _ := guest.Exec(wctx, []string{"kinst", "workload", "syscalls", "15s"}, new(bytes.Buffer), new(bytes.Buffer))
		wdone <- code
	}()
	defer wstop()
	waitBytes(t, r.Address, 5, "the jmp rel32", func(b []byte) bool { return b[0] == 0xe9 })
	gsh(t, ctx, "kill -9 $(pidof kerninstd)")
	waitBytes(t, r.Address, r.Length, "the driver to restore the original bytes", func(b []byte) bool { return bytes.Equal(b, orig) })
	if code := <-wdone; code != 0 {
		t.Errorf("workload across kill -9 exited %d", code)
	}
	stop()
	<-done
	gsh(t, ctx, "kinst workload stat 100 /")
	// The guest's supervisor restarts kerninstd; later tests need it.
	if err := client.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if info, err := client.Info(ctx); err != nil || info.DriverSplices != 0 {
		t.Errorf("restarted kerninstd: %+v, %v; want no splices left in the driver", info, err)
	}
}

func TestBadRequestsChangeNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	m, err := client.Read(ctx, "filename_lookup", 256)
	if err != nil {
		t.Fatal(err)
	}
	code, _ := hex.DecodeString(m.Bytes)
	fn, err := cfg.Decode("filename_lookup", "", uint64(m.Address), code)
	if err != nil {
		t.Fatal(err)
	}
	var long *cfg.Instruction
	for i := range fn.Insns {
		in := &fn.Insns[i]
		if long == nil && in.Len() >= 2 && in.Addr > fn.Addr {
			long = in
		}
	}
	if long == nil {
		t.Fatalf("filename_lookup has no multi-byte instruction in its first 256 bytes?")
	}
	before := qemuBytes(t, api.Addr(fn.Addr), 256)
	cases := []struct {
		point, code, mention string
	}{
		{"no_such_function_kinst", "unknown_function", "no_such_function_kinst"},
		{fmt.Sprintf("filename_lookup+%#x", long.Addr-fn.Addr+1), "not_boundary", "not an instruction boundary"},
		{"filename_lookup+0x0", "no_splice", "ftrace"},
		{"filename_lookup+zz", "bad_request", "bad offset"},
	}
	if landingPad(before) { // IBT (6.12): the endbr64, then the ftrace site
		cases[2].mention = "endbr64"
		cases = append(cases, struct{ point, code, mention string }{"filename_lookup+0x4", "no_splice", "ftrace"})
	}
	for _, tc := range cases {
		for _, attach := range []bool{false, true} {
			var err error
			if attach {
				_, err = client.CreateSession(ctx, api.SessionRequest{Points: []string{"lookuppn", tc.point}})
			} else {
				_, err = client.Resolve(ctx, tc.point)
			}
			var ae *api.APIError
			if !errors.As(err, &ae) || ae.Code != tc.code || !strings.Contains(ae.Error(), tc.mention) {
				t.Errorf("%s (attach=%v): got %v (%+v), want code %s mentioning %q", tc.point, attach, err, ae, tc.code, tc.mention)
			}
		}
	}
	var ae *api.APIError
	// The CLI says it plainly and exits non-zero.
	_, errs, status := gexec(t, ctx, "kinst", "count", "no_such_function_kinst", "--duration", "1s")
	if status == 0 || !strings.Contains(errs, "unknown function") {
		t.Errorf("kinst count of an unknown function: status %d, stderr %q", status, errs)
	}
	// A read of unmapped kernel memory is an error, not an oops.
	if _, err := client.Read(ctx, "0xffffffffff7ff000", 16); !errors.As(err, &ae) || ae.Code != "fault" {
		t.Errorf("read of unmapped kernel memory: %v, want a fault error", err)
	}
	// The module cannot be unloaded while kerninstd holds the device.
	if _, errs, status := gexec(t, ctx, "rmmod", "kerninst"); status == 0 {
		t.Errorf("rmmod kerninst succeeded while in use (%s)", errs)
	}
	if _, err := client.Info(ctx); err != nil {
		t.Errorf("kerninstd after the bad requests: %v", err)
	}
	if after := qemuBytes(t, api.Addr(fn.Addr), 256); !bytes.Equal(before, after) {
		t.Errorf("refused requests changed filename_lookup's text:\nbefore %x\nafter  %x", before, after)
	}
	if info, err := client.Info(ctx); err != nil || info.Splices != 0 {
		t.Errorf("after refusals: %+v, %v; want no splices", info, err)
	}
}

func TestSpliceStressUnderLoad(t *testing.T) {
	cycles := envCycles(t, "KINST_STRESS_CYCLES", 300)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	r := resolveLookuppn(t, ctx)
	orig := qemuBytes(t, r.Address, r.Length)
	// A syscall-heavy workload on every vCPU, through the spliced function,
	// in the background of the guest for the whole burst.
	before, err := client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(gsh(t, ctx, "kinst workload syscalls 30m >/tmp/stress-load.log 2>&1 & echo $!"))
	time.Sleep(2 * time.Second)
	res, err := client.BenchSplice(ctx, api.BenchRequest{Point: "lookuppn", Cycles: cycles})
	gsh(t, ctx, "kill -INT "+pid)
	var load string
	for i := 0; i < 100 && !strings.Contains(load, "stat calls"); i++ {
		time.Sleep(200 * time.Millisecond)
		load = gsh(t, ctx, "cat /tmp/stress-load.log")
	}
	if err != nil {
		t.Fatalf("bench splice: %v", err)
	}
	t.Logf("%d cycles under load: splice median %v, unsplice median %v (TCG guest time); load: %s", res.Cycles,
		time.Duration(res.Splice.Median), time.Duration(res.Unsplice.Median), strings.TrimSpace(load))
	if after, err := client.Info(ctx); err == nil {
		// CPUs that met the transient int3 of a splice or unsplice and
		// were sent on through the patch: the race the protocol covers.
		t.Logf("int3 notifier redirects during the burst: %d", after.Int3Hits-before.Int3Hits)
	}
	if res.Cycles != cycles || !res.Restored {
		t.Errorf("bench: %d cycles of %d, restored=%v", res.Cycles, cycles, res.Restored)
	}
	if !strings.Contains(load, "stat calls") {
		t.Errorf("workload did not finish cleanly: %q", load)
	}
	if now := qemuBytes(t, r.Address, r.Length); !bytes.Equal(now, orig) {
		t.Errorf("after the burst: %x, want %x", now, orig)
	}
	if oops := gsh(t, ctx, "dmesg | grep -E 'Oops|BUG:|general protection|int3|RIP:' || true"); oops != "" {
		t.Errorf("kernel complained during the burst:\n%s", oops)
	}
	// The kernel still works, and a count still counts exactly.
	out := gsh(t, ctx, "kinst count lookuppn --json -- kinst workload stat 1000 /")
	var rep output.CountReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Probes) != 1 || rep.Probes[0].Count < 1000 || rep.Probes[0].Count > 1000+slack {
		t.Errorf("count after the burst: %v %+v", err, rep)
	}
}

// TestExceptionTableSitesRefused splices at an instruction the kernel's
// exception table names (a user-memory access): a copy of it in a patch
// would fault with no fix-up, so it must be refused.
func TestExceptionTableSitesRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := client.Read(ctx, "__start___ex_table", 12*64)
	if err != nil {
		t.Fatal(err)
	}
	tab, _ := hex.DecodeString(m.Bytes)
	tried := 0
	for off := 0; off+12 <= len(tab) && tried < 5; off += 12 {
		rel := int32(uint32(tab[off]) | uint32(tab[off+1])<<8 | uint32(tab[off+2])<<16 | uint32(tab[off+3])<<24)
		insn := uint64(m.Address) + uint64(off) + uint64(int64(rel))
		at, err := client.Read(ctx, fmt.Sprintf("%#x", insn), 1)
		if err != nil || at.Symbol == "" {
			continue
		}
		tried++
		before := qemuBytes(t, api.Addr(insn), 8)
		_, err = client.CreateSession(ctx, api.SessionRequest{Points: []string{at.Symbol}})
		var ae *api.APIError
		if !errors.As(err, &ae) || ae.Code != "no_splice" || !strings.Contains(ae.Error(), "exception-table") {
			t.Errorf("splice at %s (an __ex_table site): %v, want a no_splice refusal naming the exception table", at.Symbol, err)
		}
		if after := qemuBytes(t, api.Addr(insn), 8); !bytes.Equal(before, after) {
			t.Errorf("%s changed: %x → %x", at.Symbol, before, after)
		}
	}
	if tried == 0 {
		t.Fatal("no exception-table site found in the first 64 entries")
	}
}

// Two probes of one straight-line run of do_nanosleep's entry block, a
// covering splice (armed as an int3 alone) and a direct one after it,
// count exactly alike, with the guest's own nanosleep calls (its Go
// runtime's) running throughout, in every one of ten sessions. The final
// counts are read as the splices go (engine.RemoveCounted): read a moment
// before, 11 sessions in 80 ended unequal; and an int3 written alone is
// written again with the CPUs parked, without which the emulator can run
// a translation of the bytes it replaced (ki_poke_many).
func TestCountsOfOneBlockAgree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := client.CFG(ctx, "do_nanosleep")
	if err != nil {
		t.Fatal(err)
	}
	var covering, direct string
	for _, in := range g.Blocks[0].Instructions {
		switch {
		case covering == "" && in.SpliceClass == "covering":
			covering = fmt.Sprintf("do_nanosleep+%#x", in.Offset)
		case covering != "" && in.SpliceClass == "direct":
			direct = fmt.Sprintf("do_nanosleep+%#x", in.Offset)
		case strings.HasPrefix(in.Text, "call"):
			covering = "" // a call between them: not one straight-line run
		}
		if direct != "" {
			break
		}
	}
	if covering == "" || direct == "" {
		t.Fatalf("no covering splice followed by a direct one in do_nanosleep's entry block: %+v", g.Blocks[0].Instructions)
	}
	for i := 0; i < 10; i++ {
		out, errOut, code := gexec(t, ctx, "kinst", "count", covering, direct, "--duration", "1s", "--json")
		if code != 0 {
			t.Fatalf("kinst count %s %s: status %d\n%s", covering, direct, code, errOut)
		}
		var rep output.CountReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Probes) != 2 {
			t.Fatalf("%v: %s", err, out)
		}
		a, b := rep.Probes[0].Count, rep.Probes[1].Count
		if a != b || a == 0 {
			t.Errorf("session %d: %s counted %d, %s counted %d: want equal and not 0", i, covering, a, direct, b)
		}
	}
}
