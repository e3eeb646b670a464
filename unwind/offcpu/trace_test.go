package offcpu

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// startTracer attaches a tracer for the test, or skips the test when the
// kernel or the privileges do not allow BPF tracing.
func startTracer(t *testing.T, o TraceOptions) *Tracer {
	t.Helper()
	tr, err := NewTracer(o)
	if errors.Is(err, ErrBPFUnavailable) {
		t.Skipf("BPF unavailable here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func TestTraceWorkload(t *testing.T) {
	requireRoot(t)
	for _, raw := range []bool{false, true} {
		name := "tp_btf"
		if raw {
			name = "raw_tracepoint"
		}
		t.Run(name, func(t *testing.T) {
			w := startWorkload(t)
			pid := w.pid
			tr := startTracer(t, TraceOptions{Options: Options{PID: pid, Group: ByTID}, ForceRawTracepoint: raw})
			if tr.Attach != name {
				t.Fatalf("attached as %s, want %s", tr.Attach, name)
			}
			before := w.halfsleep(t)
			time.Sleep(2 * time.Second)
			account := w.halfsleep(t).sub(before)
			p, err := tr.Profile()
			if err != nil {
				t.Fatal(err)
			}
			byThread := map[string]time.Duration{}
			blocks := map[string]int64{}
			for _, s := range p.Stacks {
				if s.PID != pid {
					t.Errorf("stack of pid %d traced with -p %d: %+v", s.PID, pid, s)
				}
				thread := s.Group[:strings.LastIndexByte(s.Group, '-')]
				if len(s.Kernel) > 0 && (strings.HasPrefix(s.Kernel[0], "bpf_") || s.Kernel[0] == "__schedule") {
					t.Errorf("%s: tracer frames left on top: %v", s.Group, s.Kernel)
				}
				if s.State == "S" {
					byThread[thread] += s.OffCPU
				}
				for name, want := range kernelPaths {
					if thread == name && strings.Contains(strings.Join(s.Kernel, ";"), want) {
						blocks[name] += s.Samples
					}
				}
			}
			for _, s := range p.Top(8) {
				t.Logf("%-14s %s %12v %3d blocks  wchan %s  %v", s.Group, s.State, s.OffCPU, s.Samples, s.Wchan, s.Kernel)
			}
			// The waker ends piper's and futexer's blocks every 250 ms.
			for _, name := range []string{"piper", "futexer"} {
				if blocks[name] < 3 {
					t.Errorf("%s: %d blocks in %s, want several", name, blocks[name], kernelPaths[name])
				}
			}
			if blocks["sleeper"] < 1 {
				t.Errorf("sleeper: no block in %s", kernelPaths["sleeper"])
			}
			// halfsleep's time off CPU in nanosleep (switch-out to
			// switch-in) against its own account of the time in the call.
			// The tracer saw its blocks from its first switch-out on, the
			// account covers the same two seconds give or take a block.
			truth := account.inCall
			got := byThread["halfsleep"].Seconds()
			t.Logf("halfsleep in nanosleep: traced %.3f s, its own account %.3f s of %.3f s", got, truth, account.elapsed)
			if tol := max(0.1, 0.15*truth); got < truth-tol || got > truth+tol {
				t.Errorf("halfsleep: traced %.3f s asleep, the thread measured %.3f s", got, truth)
			}
		})
	}
}

// TestTraceUserFramePointers checks BPF user stacks of the workload built
// with frame pointers, linked by ld and by LLD (whose executable segment
// shares a file page with the read-only one): they name its functions.
// (Its caller read_pipe is skipped by any frame-pointer unwinder: the
// libc wrapper keeps no frame.)
func TestTraceUserFramePointers(t *testing.T) {
	requireRoot(t)
	for _, build := range []string{framePointers, framePointersLLD} {
		t.Run(build, func(t *testing.T) { traceUserFramePointers(t, build) })
	}
}

func traceUserFramePointers(t *testing.T, build string) {
	w := startBuild(t, build)
	tr := startTracer(t, TraceOptions{Options: Options{PID: w.pid}})
	time.Sleep(time.Second)
	p, err := tr.Profile()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"piper": "piper_main", "futexer": "futexer_main", "waker": "waker_main"} {
		found := false
		for _, s := range p.Stacks {
			if s.Group == name && slices.Contains(s.User, want) {
				found = true
			}
		}
		if !found {
			for _, s := range p.Stacks {
				if s.Group == name {
					t.Logf("%s: user %v", name, s.User)
				}
			}
			t.Errorf("%s: no traced user stack names %s", name, want)
		}
	}
}

func TestTraceOptionsRejected(t *testing.T) {
	for _, o := range []TraceOptions{
		{Options: Options{KernelOnly: true, UserOnly: true}},
		{MinBlock: time.Second, MaxBlock: time.Millisecond},
		{Options: Options{PID: -1}},
		{MinBlock: -time.Second},
		{Options: Options{PID: 1 << 30}},
		{Options: Options{TID: 1 << 30}},
		{Options: Options{PID: 1, TID: os.Getpid()}},
	} {
		if _, err := NewTracer(o); err == nil || errors.Is(err, ErrBPFUnavailable) {
			t.Errorf("%+v: err %v, want a validation error", o, err)
		}
	}
}

func TestStateLetter(t *testing.T) {
	for _, tc := range []struct {
		w    uint32
		want string
	}{
		{0, "R"}, {preemptBit | 1, "R"}, {1, "S"}, {2, "D"}, {0x402, "I"}, {4, "T"}, {8, "t"}, {0x40, "P"}, {0x80, "X"}, {0x102, "D"},
	} {
		if got := stateLetter(tc.w); got != tc.want {
			t.Errorf("stateLetter(%#x) = %s, want %s", tc.w, got, tc.want)
		}
	}
}

// TestTraceFilters checks the filters against an unfiltered tracer
// running alongside: --min-block drops halfsleep's short sleeps (20 ms,
// more under load) and keeps only blocks of 100 ms or more; --max-block
// drops piper's sleeps in pipe_read (250 ms or more); --state keeps one state; -t keeps
// one thread.
func TestTraceFilters(t *testing.T) {
	requireRoot(t)
	w := startWorkload(t)
	tids := workloadTIDs(t, w.pid)
	const limit = 100 * time.Millisecond
	var tracers []*Tracer
	for _, o := range []TraceOptions{
		{Options: Options{PID: w.pid}},
		{Options: Options{PID: w.pid, States: "S"}, MinBlock: limit},
		{Options: Options{PID: w.pid}, MaxBlock: limit},
		{Options: Options{TID: tids["futexer"]}},
	} {
		tracers = append(tracers, startTracer(t, o))
	}
	time.Sleep(1500 * time.Millisecond)
	var ps []*Profile
	for _, tr := range tracers {
		p, err := tr.Profile()
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	all, minb, maxb, one := ps[0], ps[1], ps[2], ps[3]
	blocks := func(p *Profile, thread, state string) (n int64) {
		for _, s := range p.Stacks {
			if s.Group == thread && (state == "" || s.State == state) {
				n += s.Samples
			}
		}
		return n
	}
	for _, s := range minb.Stacks {
		if s.State != "S" {
			t.Errorf("--state S kept state %s: %+v", s.State, s)
		}
		if s.OffCPU < limit*time.Duration(s.Samples) {
			t.Errorf("%s: %d blocks in %v: some shorter than --min-block %v", s.Group, s.Samples, s.OffCPU, limit)
		}
	}
	t.Logf("halfsleep sleeps: %d traced, %d of %v or more; piper blocks: %d traced, %d with --max-block",
		blocks(all, "halfsleep", "S"), blocks(minb, "halfsleep", "S"), limit, blocks(all, "piper", "S"), blocks(maxb, "piper", "S"))
	if a, m := blocks(all, "halfsleep", "S"), blocks(minb, "halfsleep", "S"); m >= a || a == 0 {
		t.Errorf("--min-block %v kept %d of halfsleep's %d sleeps", limit, m, a)
	}
	if blocks(minb, "piper", "S") == 0 {
		t.Error("--min-block dropped piper's long blocks")
	}
	if n := blocks(maxb, "piper", "S"); n != 0 || blocks(all, "piper", "S") == 0 {
		t.Errorf("--max-block %v kept %d piper blocks", limit, n)
	}
	for _, s := range maxb.Stacks {
		if s.OffCPU > limit*time.Duration(s.Samples) {
			t.Errorf("%s: %d blocks in %v: some longer than --max-block %v", s.Group, s.Samples, s.OffCPU, limit)
		}
	}
	if len(one.Stacks) == 0 {
		t.Error("-t futexer: nothing traced")
	}
	for _, s := range one.Stacks {
		if s.Group != "futexer" {
			t.Errorf("-t %d: stack of %s", tids["futexer"], s.Group)
		}
	}
}

// TestTraceExit checks that a thread's last switch-out (TASK_DEAD) is not
// counted as a block that never ends: a shell that waits for sleep(1) and
// exits while the whole system is traced.
func TestTraceExit(t *testing.T) {
	requireRoot(t)
	tr := startTracer(t, TraceOptions{Options: Options{KernelOnly: true, Group: ByPID}})
	sh := exec.Command("sh", "-c", "sleep 0.2; true")
	if err := sh.Run(); err != nil {
		t.Skipf("sh: %v", err)
	}
	p, err := tr.Profile()
	if err != nil {
		t.Fatal(err)
	}
	waited := false
	for _, s := range p.Stacks {
		if s.PID != sh.Process.Pid {
			continue
		}
		if s.State == "X" {
			t.Errorf("an exited thread counted as blocked: %+v", s)
		}
		if strings.Contains(strings.Join(s.Kernel, ";"), "wait") {
			waited = true
		}
	}
	if !waited {
		t.Error("sh's wait for sleep not traced")
	}
}

// TestParseKey decodes keys of the counts map as the BPF program writes
// them: the comm is cut at its NUL whatever follows it (the bytes of a
// longer name the thread had before, say), so such keys group under
// the thread's name.
func TestParseKey(t *testing.T) {
	key := func(tgid, pid uint32, kid, uid int32, state uint32, comm string) [keySize]byte {
		var k [keySize]byte
		binary.LittleEndian.PutUint32(k[0:], tgid)
		binary.LittleEndian.PutUint32(k[4:], pid)
		binary.LittleEndian.PutUint32(k[8:], uint32(kid))
		binary.LittleEndian.PutUint32(k[12:], uint32(uid))
		binary.LittleEndian.PutUint32(k[16:], state)
		copy(k[24:40], comm)
		return k
	}
	for _, tc := range []struct {
		key  [keySize]byte
		want traceKey
	}{
		{key(100, 101, 7, -14, 1, "kinst\x00\xfe\xfd\x01"), traceKey{100, 101, 7, -14, 1, "kinst"}},
		{key(1, 1, -17, 3, 0x80000000, "systemd\x00\x00\x00"), traceKey{1, 1, -17, 3, 0x80000000, "systemd"}},
		{key(5, 9, 0, 0, 2, "0123456789abcde\x00"), traceKey{5, 9, 0, 0, 2, "0123456789abcde"}},
		{key(5, 9, 0, 0, 2, "\x00junk"), traceKey{5, 9, 0, 0, 2, ""}},
	} {
		if got := parseKey(tc.key); got != tc.want {
			t.Errorf("parseKey(% x) = %+v, want %+v", tc.key, got, tc.want)
		}
	}
}
