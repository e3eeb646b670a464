package offcpu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/unwind/flamegraph"
)

// kernelPaths are the kernel functions each workload thread must be
// blocked in, as substrings so that they hold across kernel versions
// (pipe_read became anon_pipe_read in 6.x, futex_wait_queue became
// futex_do_wait). The test cross-checks each against the thread's own
// /proc/PID/task/TID/wchan before trusting it.
var kernelPaths = map[string]string{
	"sleeper": "nanosleep",
	"piper":   "pipe_read",
	"futexer": "futex",
}

// userPaths are the workload's own functions each thread's user stack
// must name (the binary has no frame pointers: only CFI can find them).
var userPaths = map[string][]string{
	"sleeper": {"sleep_forever", "sleeper_main"},
	"piper":   {"read_pipe", "piper_main"},
	"futexer": {"wait_futex", "futexer_main"},
}

func TestSampleWorkload(t *testing.T) {
	requireRoot(t)
	w := startWorkload(t)
	pid := w.pid
	// The independent oracle: each thread's wchan from the kernel.
	tids := workloadTIDs(t, pid)
	for name, want := range kernelPaths {
		// The thread may be between two blocks: ask a few times.
		var w []byte
		for try := 0; try < 50; try++ {
			var err error
			if w, err = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tids[name]) + "/wchan"); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(w), want) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.Contains(string(w), want) {
			t.Fatalf("%s: the kernel says wchan %q, the test expects %q: is the workload blocked where it should be?", name, w, want)
		}
	}
	const period = 10 * time.Millisecond
	s, err := NewSampler(Options{PID: pid}, period)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const passes = 200
	before := w.halfsleep(t)
	for i := 0; i < passes; i++ {
		if _, err := s.Pass(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(period)
	}
	account := w.halfsleep(t).sub(before)
	p := s.Profile()
	if p.Passes != passes {
		t.Errorf("passes %d, want %d", p.Passes, passes)
	}
	byThread := map[string]int64{}
	for _, st := range p.Stacks {
		byThread[st.Group] += st.Samples
		t.Logf("%-10s %s %4d kernel=%v user=%v %s", st.Group, st.State, st.Samples, st.Kernel, st.User, st.UserError)
	}
	for name, want := range kernelPaths {
		var got int64
		for _, st := range p.Stacks {
			if st.Group == name && strings.Contains(strings.Join(st.Kernel, ";"), want) {
				got += st.Samples
				if !strings.Contains(st.Wchan, want) && !strings.Contains(strings.Join(st.Kernel, ";"), st.Wchan) {
					t.Errorf("%s: wchan %q not in its stack", name, st.Wchan)
				}
			}
		}
		// A thread blocked all the time is off CPU in (nearly) every pass.
		if got < passes*9/10 {
			t.Errorf("%s: %d of %d samples in %s", name, got, passes, want)
		}
	}
	// User frames name the workload's own functions, innermost first, in
	// call order: found through CFI, since there are no frame pointers.
	for name, want := range userPaths {
		found := false
		for _, st := range p.Stacks {
			if st.Group == name && containsInOrder(st.User, want) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no stack whose user frames include %v", name, want)
		}
	}
	// halfsleep sleeps about half the time, by its own measurement; the
	// samples must say the same against sleeper, asleep all the time. Its
	// time in state S lies between the sleep it asked for and its time in
	// nanosleep, which adds the wait for a CPU after waking (state R):
	// the two differ only on a loaded machine.
	low, high := account.asleep/account.elapsed, account.inCall/account.elapsed
	ratio := float64(byThread["halfsleep"]) / float64(byThread["sleeper"])
	t.Logf("halfsleep/sleeper samples = %d/%d = %.2f; halfsleep's own account: asleep %.2f to %.2f of the time",
		byThread["halfsleep"], byThread["sleeper"], ratio, low, high)
	if ratio < low-0.1 || ratio > high+0.1 {
		t.Errorf("halfsleep/sleeper sample ratio %.2f, the thread was asleep %.2f to %.2f of the time", ratio, low, high)
	}
	checkOutputs(t, p)
}

// workloadTIDs maps the workload's thread names to their tids.
func workloadTIDs(t testing.TB, pid int) map[string]int {
	t.Helper()
	tids := map[string]int{}
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", e.Name(), "comm"))
		tid, _ := strconv.Atoi(e.Name())
		tids[strings.TrimSpace(string(comm))] = tid
	}
	return tids
}

// TestSampleOneThread samples with -t: only that thread, with its stacks.
func TestSampleOneThread(t *testing.T) {
	requireRoot(t)
	w := startWorkload(t)
	tid := workloadTIDs(t, w.pid)["piper"]
	// "ready" comes before the thread reaches its read: on a busy machine
	// it can still be runnable for the whole sampling run below.
	waitBlocked(t, w.pid, tid, 0) // read(2)
	s, err := NewSampler(Options{TID: tid, States: "S", Group: ByTID}, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 20; i++ {
		if _, err := s.Pass(); err != nil {
			t.Fatal(err)
		}
	}
	p := s.Profile()
	var n int64
	for _, st := range p.Stacks {
		if st.TID != tid || st.PID != w.pid {
			t.Errorf("-t %d: stack of pid %d tid %d", tid, st.PID, st.TID)
		}
		n += st.Samples
	}
	if n < 15 || !containsInOrder(p.Top(1)[0].User, userPaths["piper"]) {
		t.Errorf("-t %d: %d samples, top %+v", tid, n, p.Top(1))
	}
}

// checkOutputs renders the profile every way kinst can: folded text that
// parses back, an SVG that is well-formed, and a pprof file that `go tool
// pprof -top` reads.
func checkOutputs(t *testing.T, p *Profile) {
	t.Helper()
	f := p.Folded(FoldOptions{})
	if f.Total() == 0 {
		t.Fatal("empty folded profile")
	}
	var svg bytes.Buffer
	if err := flamegraph.Render(&svg, f.Stacks(), flamegraph.Options{Title: "off-CPU", Unit: p.Unit()}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(svg.Bytes(), []byte("_[k]")) {
		t.Error("SVG has no kernel frames")
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			t.Log("go tool not found: pprof check skipped")
			return
		}
	}
	path := filepath.Join(t.TempDir(), "offcpu.pb.gz")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WritePprof(out, FoldOptions{}); err != nil {
		t.Fatal(err)
	}
	out.Close()
	b, err := exec.Command(gobin, "tool", "pprof", "-top", path).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof -top: %v\n%s", err, b)
	}
	for _, want := range []string{"off_cpu", "sleeper"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("pprof -top output lacks %q:\n%s", want, b)
		}
	}
}

// containsInOrder reports whether want appears in frames as a contiguous
// run.
func containsInOrder(frames, want []string) bool {
	for i := 0; i+len(want) <= len(frames); i++ {
		if slices.Equal(frames[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

// TestThreadKinds checks -u and -k over the whole system, sampling and
// tracing: kthreadd (always asleep) is a kernel thread; this test's own
// workload threads are not.
func TestThreadKinds(t *testing.T) {
	requireRoot(t)
	w := startWorkload(t)
	for _, trace := range []bool{false, true} {
		for _, kernel := range []bool{false, true} {
			// User stacks only where they must be absent: reading
			// every process's binaries would make this test slow.
			o := Options{UserThreadsOnly: !kernel, KernelThreadsOnly: kernel, KernelOnly: !kernel}
			var p *Profile
			if trace {
				tr := startTracer(t, TraceOptions{Options: o})
				time.Sleep(600 * time.Millisecond)
				var err error
				p, err = tr.Profile()
				tr.Close()
				if err != nil {
					t.Fatal(err)
				}
			} else {
				s, err := NewSampler(o, time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Pass(); err != nil {
					t.Fatal(err)
				}
				p = s.Profile()
				s.Close()
			}
			groups := map[string]bool{}
			for _, st := range p.Stacks {
				groups[st.Group] = true
				if kernel && len(st.User) > 0 {
					t.Errorf("trace=%v -k: user frames in %s: %v", trace, st.Group, st.User)
				}
			}
			if len(groups) == 0 {
				t.Errorf("trace=%v kernel=%v: nothing seen", trace, kernel)
			}
			if !trace && groups["kthreadd"] != kernel {
				t.Errorf("sampling, kernel-threads-only=%v: kthreadd seen %v", kernel, groups["kthreadd"])
			}
			if groups["waker"] == kernel {
				t.Errorf("trace=%v kernel-threads-only=%v: workload thread seen %v", trace, kernel, groups["waker"])
			}
		}
	}
	_ = w
}

// TestSampleEveryThread checks that a whole-system pass visits every
// thread: as many as os.ReadDir finds under /proc/*/task (less this
// process's own), give or take threads that come and go meanwhile.
func TestSampleEveryThread(t *testing.T) {
	requireRoot(t)
	s, err := NewSampler(Options{KernelOnly: true}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	count := func() int {
		n := 0
		procs, err := os.ReadDir("/proc")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			pid, err := strconv.Atoi(p.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			tasks, _ := os.ReadDir("/proc/" + p.Name() + "/task")
			n += len(tasks)
		}
		return n
	}
	before := count()
	visited, err := s.Pass()
	if err != nil {
		t.Fatal(err)
	}
	after := count()
	lo, hi := min(before, after), max(before, after)
	if visited < lo*9/10 || visited > hi*11/10 {
		t.Errorf("a pass visited %d threads; /proc lists %d then %d", visited, before, after)
	}
	if len(s.threads) == 0 || len(s.threads) > visited {
		t.Errorf("%d threads cached after visiting %d", len(s.threads), visited)
	}
}

// waitBlocked waits (up to 10 s) until thread tid of pid sleeps in system
// call nr (/proc's wchan reads 0 where kallsyms is restricted, so the
// syscall file says where it waits).
func waitBlocked(t testing.TB, pid, tid, nr int) {
	t.Helper()
	if tid == 0 {
		t.Fatalf("no such thread in pid %d", pid)
	}
	dir := fmt.Sprintf("/proc/%d/task/%d/", pid, tid)
	want := strconv.Itoa(nr) + " "
	var stat, sc []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		stat, _ = os.ReadFile(dir + "stat")
		sc, _ = os.ReadFile(dir + "syscall")
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'S' && bytes.HasPrefix(sc, []byte(want)) {
			return
		}
	}
	t.Fatalf("thread %d never blocked in system call %d (stat %q, syscall %q)", tid, nr, stat, sc)
}

// TestSampledTimeBlockedThroughout samples a thread that is blocked for
// the whole run (sleep(1) in clock_nanosleep; the oracle is its
// schedstat, whose count of times scheduled in must not move) at -F 5
// for 1.003 s: every pass sees it, and its off-CPU time is the run's
// duration, not one interval more (6 passes are 5 intervals: counting
// 200 ms per sample made it 1.2 s).
func TestSampledTimeBlockedThroughout(t *testing.T) {
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	pid := sleep.Process.Pid
	dir := "/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(dir + "wchan"); err == nil && strings.Contains(string(b), "nanosleep") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sleep never blocked in nanosleep")
		}
	}
	switches := func() string {
		b, err := os.ReadFile(dir + "schedstat")
		if err != nil {
			t.Skipf("no schedstat (CONFIG_SCHED_INFO): %v", err)
		}
		return strings.Fields(string(b))[2]
	}
	before := switches()
	s, err := NewSampler(Options{PID: pid, UserOnly: os.Geteuid() != 0}, time.Second/5)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Run(context.Background(), 1003*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	p := s.Profile()
	if after := switches(); after != before {
		t.Skipf("sleep was scheduled in during the run (%s → %s times): not blocked throughout", before, after)
	}
	var samples int64
	var off time.Duration
	for _, st := range p.Stacks {
		samples += st.Samples
		off += st.OffCPU
	}
	t.Logf("%d passes, %d samples, %v off CPU in a run of %v", p.Passes, samples, off, p.Duration)
	if p.Duration < 1003*time.Millisecond || p.Passes < 2 {
		t.Fatalf("a run of %v in %d passes: want at least 1.003 s and 2 passes", p.Duration, p.Passes)
	}
	if samples != int64(p.Passes) {
		t.Errorf("%d samples of a thread blocked throughout %d passes", samples, p.Passes)
	}
	if off != p.Duration {
		t.Errorf("off CPU %v for a thread blocked throughout a run of %v", off, p.Duration)
	}
}

// TestSampledTime checks the share of a run samples stand for: exact,
// and without overflow for a day at 1000 passes a second.
func TestSampledTime(t *testing.T) {
	day := 24 * time.Hour
	for _, tc := range []struct {
		d       time.Duration
		samples int64
		passes  int
		want    time.Duration
	}{
		{1003 * time.Millisecond, 6, 6, 1003 * time.Millisecond},
		{1003 * time.Millisecond, 3, 6, 501500 * time.Microsecond},
		{1003 * time.Millisecond, 0, 6, 0},
		{10, 1, 3, 3},
		{day, 86400 * 1000, 86400 * 1000, day},
		{day, 86400 * 500, 86400 * 1000, day / 2},
		{time.Second, 1, 0, 0},
	} {
		if got := sampledTime(tc.d, tc.samples, tc.passes); got != tc.want {
			t.Errorf("sampledTime(%v, %d, %d) = %v, want %v", tc.d, tc.samples, tc.passes, got, tc.want)
		}
	}
}

// TestSampleWorkloadLLD samples the workload linked by LLD and built
// without frame pointers: its executable mapping's load bias must come
// from the executable segment, not from the read-only one that starts in
// the same file page, for the user frames (found by CFI) to name the
// workload's functions in call order.
func TestSampleWorkloadLLD(t *testing.T) {
	w := startBuild(t, noFramePointersLLD)
	s, err := NewSampler(Options{PID: w.pid, UserOnly: os.Geteuid() != 0}, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 20; i++ {
		if _, err := s.Pass(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p := s.Profile()
	for name, want := range userPaths {
		found := false
		for _, st := range p.Stacks {
			if st.Group == name && containsInOrder(st.User, want) {
				found = true
			}
		}
		if !found {
			for _, st := range p.Stacks {
				if st.Group == name {
					t.Logf("%s: user %v %s", name, st.User, st.UserError)
				}
			}
			t.Errorf("%s: no stack whose user frames include %v", name, want)
		}
	}
}
