package process

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// workload is the test program, built with flags, started and ready.
type workload struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func build(t *testing.T, flags ...string) string {
	t.Helper()
	return compile(t, "gcc", "testdata/work.c", append([]string{"-pthread"}, flags...)...)
}

// compile builds the test program src with compiler cc at -O2 and
// flags, skipping the test when cc (or the LLD a flag asks for) is not
// installed.
func compile(t *testing.T, cc, src string, flags ...string) string {
	t.Helper()
	if _, err := exec.LookPath(cc); err != nil {
		t.Skip("no " + cc)
	}
	if slices.Contains(flags, "-fuse-ld=lld") {
		// gcc says only "cannot find 'ld'" when ld.lld is missing.
		if _, err := exec.LookPath("ld.lld"); err != nil {
			t.Skip("no ld.lld (scripts/deps.sh installs lld)")
		}
	}
	bin := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), filepath.Ext(src)))
	args := append([]string{"-O2", "-o", bin, src}, flags...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		if strings.Contains(string(out), "lld") {
			t.Skipf("no lld: %s", out)
		}
		t.Fatalf("%s %v: %v\n%s", cc, args, err, out)
	}
	return bin
}

func start(t *testing.T, bin string, args ...string) *workload {
	t.Helper()
	cmd := exec.Command(bin, args...)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &workload{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	if l, _ := w.out.ReadString('\n'); l != "ready\n" {
		t.Fatalf("workload said %q", l)
	}
	return w
}

// round runs one round of calls and returns the program's own line.
func (w *workload) round(t *testing.T) string {
	t.Helper()
	fmt.Fprintln(w.in, "go")
	l, err := w.out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(l)
}

// spin has the program's threads call work() and mix() until unspin,
// checking each result.
func (w *workload) spin(t *testing.T) {
	t.Helper()
	fmt.Fprintln(w.in, "spin")
	if l, _ := w.out.ReadString('\n'); l != "spinning\n" {
		t.Fatalf("workload said %q", l)
	}
}

// unspin stops the spinning threads and returns how many calls they
// made; a program that died (of a stray SIGTRAP, or trapping on a wrong
// result) fails the test.
func (w *workload) unspin(t *testing.T) string {
	t.Helper()
	fmt.Fprintln(w.in, "stop")
	l, err := w.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(l, "spun ") {
		w.cmd.Wait()
		t.Fatalf("workload after the rounds: %q, %v: %v (a stray SIGTRAP, or a wrong result)", l, err, w.cmd.ProcessState)
	}
	return strings.TrimSpace(strings.TrimPrefix(l, "spun "))
}

func needPtrace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the process engine's tests run as root (ptrace of a child, /proc/PID/mem)")
	}
}

// TestCountInProcess splices counters into a running multi-threaded
// program, built several ways, at work()'s entry and at an instruction of
// its entry block: each count equals the program's own count of calls;
// its output is what it is without them; detaching restores every byte
// (read through /proc/PID/mem), and the program runs on.
func TestCountInProcess(t *testing.T) {
	needPtrace(t)
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"pie", []string{"-fPIE", "-pie"}},
		{"no-pie", []string{"-fno-PIE", "-no-pie"}},
		{"frame-pointers", []string{"-fno-omit-frame-pointer"}},
		{"lld", []string{"-fuse-ld=lld"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := start(t, build(t, tc.flags...))
			want := w.round(t) // uninstrumented
			pid := w.cmd.Process.Pid
			tg, entry := attachWork(t, pid)
			fn := entry.Fn
			orig := textOf(t, pid, fn)
			points := []string{"work"}
			if len(fn.Insns) > 2 {
				points = append(points, fmt.Sprintf("work+%#x", fn.Insns[1].Addr-fn.Addr))
			}
			sitesP, classes := resolveAll(t, tg, points)
			// And one point of each class at an instruction of mix(),
			// straight-line code called as often as work().
			p, s, c := classSites(t, tg, "mix", sitesP)
			points, sitesP, classes = append(points, p...), append(sitesP, s...), append(classes, c...)
			reqs, err := tg.Count("test", sitesP)
			if err != nil {
				t.Fatalf("count %v: %v", points, err)
			}
			got := w.round(t)
			if got != want {
				t.Errorf("output with counters %q, without %q", got, want)
			}
			var calls int
			fmt.Sscanf(got, "calls %d", &calls)
			for i, r := range reqs {
				if n := tg.Counter(r, 0); n != uint64(calls) {
					t.Errorf("%s (%s splice): %d, want the program's %d calls", points[i], classes[i], n, calls)
				}
				// A process makes a trap splice a punned jmp where one fits.
				if in := tg.Installed(r); in.Class.String() != classes[i] && !(classes[i] == "trap" && in.Class == springboard.Pun) {
					t.Errorf("%s: installed as a %s splice, planned %s", points[i], in.Class, classes[i])
				}
			}
			t.Logf("%v (%v): %d calls counted", points, classes, calls)
			if err := tg.Close(); err != nil {
				t.Fatal(err)
			}
			now := make([]byte, len(orig))
			m, _ := openMem(pid)
			defer m.close()
			if err := m.read(fn.Addr, now); err != nil || !bytes.Equal(now, orig) {
				t.Errorf("after detach: %x (%v), want %x", now, err, orig)
			}
			if again := w.round(t); again != want {
				t.Errorf("after detach: %q, want %q", again, want)
			}
		})
	}
}

// TestAttachDetachUnderLoad splices and unsplices work() while four
// threads call it and check every result: none may see a torn
// instruction or a wrong result (the program traps), the count is at
// most the calls made, and the bytes are restored.
func TestAttachDetachUnderLoad(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t))
	pid := w.cmd.Process.Pid
	w.spin(t)
	var orig []byte
	for round := 0; round < 5; round++ {
		tg, err := Attach(pid)
		if err != nil {
			t.Fatal(err)
		}
		sites, classes := resolveAll(t, tg, []string{"work"})
		if orig == nil {
			orig = textOf(t, pid, sites[0].Fn)
		}
		reqs, err := tg.Count("test", sites)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		n := tg.Counter(reqs[0], 0)
		if errs := tg.RemoveEach(reqs); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if err := tg.Close(); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Errorf("round %d (%s splice): no call counted in 50 ms of four threads calling", round, classes[0])
		}
		now := make([]byte, len(orig))
		m, _ := openMem(pid)
		m.read(sites[0].Fn.Addr, now)
		m.close()
		if !bytes.Equal(now, orig) {
			t.Fatalf("round %d: after detach %x, want %x", round, now, orig)
		}
	}
	t.Logf("five attach/detach rounds under load; the program made %s calls", w.unspin(t))
}

// TestTimeInProcess times nap() (a 2 ms sleep) over 50 calls and work()
// over a round of the four threads: calls equal the program's, nap's
// wall time is at least 50 × 2 ms, no thread is left inside, and the
// bytes are restored.
func TestTimeInProcess(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t))
	pid := w.cmd.Process.Pid
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	clock := metrics.NewClock()
	for _, tc := range []struct {
		fn, cmd string
		calls   uint64
		minNS   float64
	}{
		{"nap", "nap 50", 50, 50 * 2e6},
		{"work", "go", 400000, 1},
	} {
		tm, err := tg.Time("test", tc.fn)
		if err != nil {
			t.Fatal(err)
		}
		var acc metrics.TimerAcc
		_, word0 := tm.Read()
		acc.Add(word0, metrics.TSC())
		fmt.Fprintln(w.in, tc.cmd)
		if _, err := w.out.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		calls, word := tm.Read()
		ns := clock.Nanos(acc.Add(word, metrics.TSC()))
		inside := metrics.TimerInside(word)
		if err := tg.Untime(tm); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d calls, %.3f ms inside, %d exits timed", tc.fn, calls, ns/1e6, len(tm.Exits))
		if calls != tc.calls || ns < tc.minNS || inside != 0 {
			t.Errorf("%s: %d calls (want %d), %.0f ns (want ≥ %.0f), %d inside", tc.fn, calls, tc.calls, ns, tc.minNS, inside)
		}
	}
	if n := tg.Splices(); n != 0 {
		t.Errorf("%d splices left", n)
	}
}

func resolveAll(t *testing.T, tg *Target, points []string) ([]*splice.Site, []string) {
	t.Helper()
	var out []*splice.Site
	var classes []string
	for _, p := range points {
		s, err := tg.Resolve(p)
		if err != nil {
			t.Fatalf("resolve %s: %v", p, err)
		}
		out = append(out, s)
		classes = append(classes, s.Class.String())
	}
	return out, classes
}

// TestBadInput: a process that does not exist, a function that does not,
// a mid-instruction offset: clear errors, nothing written.
func TestBadInput(t *testing.T) {
	needPtrace(t)
	if _, err := Attach(1<<22 + 12345); !errors.Is(err, ErrNoProcess) {
		t.Errorf("attach to no process: %v", err)
	}
	// A kernel thread (kthreadd, or whichever this system shows).
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, e := range ents {
			if pid, err := strconv.Atoi(e.Name()); err == nil && kernelThread(pid) {
				if _, err := Attach(pid); !errors.Is(err, ErrNotTraceable) || !strings.Contains(err.Error(), "kernel thread") {
					t.Errorf("attach to kernel thread %d: %v", pid, err)
				}
				break
			}
		}
	}
	w := start(t, build(t))
	pid := w.cmd.Process.Pid
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if _, err := tg.Resolve("no_such_function"); !errors.Is(err, ErrNoFunction) {
		t.Errorf("unknown function: %v", err)
	}
	entry, err := tg.Resolve("work")
	if err != nil {
		t.Fatal(err)
	}
	if l := len(entry.Fn.Insns[0].Bytes); l > 1 {
		if _, err := tg.Resolve("work+0x1"); err == nil || !strings.Contains(err.Error(), "boundary") {
			t.Errorf("mid-instruction offset: %v", err)
		}
	}
	if _, err := tg.Resolve("libc:no_such_function"); !errors.Is(err, ErrNoFunction) {
		t.Errorf("unknown library function: %v", err)
	}
	// What the user needs next: where the function is, or which
	// libraries there are.
	for _, tc := range []struct{ point, says string }{
		{"nanosleep", "name it libc:nanosleep"},
		{"nanosl*", "name it libc:nanosl*"},
		{"libm:sin", "maps no library libm (it maps "},
	} {
		err := lookupErr(tg, tc.point)
		if !errors.Is(err, ErrNoFunction) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want ErrNoFunction saying %q", tc.point, err, tc.says)
		}
	}
	// glibc's strlen is an IFUNC: its symbol is the resolver, and a point
	// there is planned at the implementation the process runs
	// (TestIndirectFunction), which writes nothing either.
	if s, err := tg.Resolve("libc:strlen"); err != nil || s.Fn.Name == "strlen" {
		t.Errorf("libc:strlen (an IFUNC): %v, want its implementation", err)
	}
	if tg.Splices() != 0 {
		t.Errorf("%d splices after refusals", tg.Splices())
	}
	// Nothing was written: not even kinst's region is mapped.
	if maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); tg.Mapped() || bytes.Contains(maps, []byte("kinst-patches")) {
		t.Errorf("after refusals only, the process maps kinst's region:\n%s", maps)
	}
}

// TestStockBinary counts libc's read in a stock dd copying one byte per
// read: the count is dd's reads, resolved as LIB:FUNC through the
// process's mappings and libc's dynamic symbols.
func TestStockBinary(t *testing.T) {
	needPtrace(t)
	const n = 3000
	cmd := exec.Command("dd", "bs=1", fmt.Sprintf("count=%d", n), "of=/dev/null", "status=none")
	in, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Skipf("no dd: %v", err)
	}
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	// Wait until dd blocks in its first read, with libc mapped.
	for i := 0; i < 200; i++ {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
		m, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if len(b) > 0 && string(b) != "0" && strings.Contains(string(m), "libc") {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	sites, classes := resolveAll(t, tg, []string{"libc:read"})
	reqs, err := tg.Count("test", sites)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write(bytes.Repeat([]byte{'x'}, n)); err != nil {
		t.Fatal(err)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dd: %v", err)
	}
	got := tg.Counter(reqs[0], 0)
	tg.Abandon()
	t.Logf("libc:read (%s, %s splice): %d calls for %d one-byte reads", sites[0].Where(), classes[0], got, n)
	// The read dd was blocked in when kinst attached entered read before
	// the splice: it is not counted.
	if got < n-1 || got > n+1 {
		t.Errorf("counted %d reads, want %d (±1)", got, n)
	}
}

// textOf reads fn's bytes from the process.
func textOf(t *testing.T, pid int, fn *cfg.Function) []byte {
	t.Helper()
	last := fn.Insns[len(fn.Insns)-1]
	b := make([]byte, last.Addr+uint64(len(last.Bytes))-fn.Addr)
	m, err := openMem(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	if err := m.read(fn.Addr, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// catchesSIGTRAP reads whether the process has a SIGTRAP handler
// (/proc/PID/status SigCgt, bit 5 for signal 5).
func catchesSIGTRAP(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "SigCgt:\t"); ok {
			var mask uint64
			fmt.Sscanf(v, "%x", &mask)
			return mask&(1<<(5-1)) != 0
		}
	}
	t.Fatal("no SigCgt in status")
	return false
}

// classSite is the first instruction of work() that takes a splice of
// class c.
// classSites plans a point of each class (direct, springboard, covering,
// trap) at instructions of fn that none of taken, nor each other, use.
func classSites(t *testing.T, tg *Target, fn string, taken []*splice.Site) (points []string, sites []*splice.Site, classes []string) {
	t.Helper()
	entry, err := tg.Resolve(fn)
	if err != nil {
		t.Fatal(err)
	}
	f := entry.Fn
	used := map[uint64]bool{}
	for _, s := range taken {
		used[s.Addr()] = true
		for _, c := range s.Covered() {
			used[c.Addr()] = true
		}
	}
	for _, c := range []springboard.Class{springboard.Direct, springboard.Springboard, springboard.Cover, springboard.Trap} {
		for _, in := range f.Insns {
			spec := fmt.Sprintf("%s+%#x", fn, in.Addr-f.Addr)
			s, err := tg.ResolveAs(spec, c)
			if used[in.Addr] || err != nil {
				continue
			}
			clash := false
			for _, x := range s.Covered() {
				clash = clash || used[x.Addr()]
			}
			if clash {
				continue
			}
			used[in.Addr] = true
			for _, x := range s.Covered() {
				used[x.Addr()] = true
			}
			points, sites, classes = append(points, spec), append(sites, s), append(classes, c.String())
			break
		}
	}
	return points, sites, classes
}

func classSite(t *testing.T, tg *Target, c springboard.Class) *splice.Site {
	t.Helper()
	entry, err := tg.Resolve("work")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range entry.Fn.Insns {
		if s, err := tg.ResolveAs(fmt.Sprintf("work+%#x", in.Addr-entry.Fn.Addr), c); err == nil {
			return s
		}
	}
	t.Skipf("no instruction of work() takes a %s splice", c)
	return nil
}

// TestTrapAndCoveringSplices: a trap splice (an int3 whose SIGTRAP
// kinst's handler in the process sends to the patch) and a covering
// splice count every call of the multi-threaded program, its output
// unchanged; detaching restores the bytes and SIGTRAP's default action.
func TestTrapAndCoveringSplices(t *testing.T) {
	needPtrace(t)
	bin := build(t)
	for _, c := range []springboard.Class{springboard.Trap, springboard.Pun, springboard.Cover} {
		t.Run(c.String(), func(t *testing.T) {
			w := start(t, bin)
			want := w.round(t)
			pid := w.cmd.Process.Pid
			tg, err := Attach(pid)
			if err != nil {
				t.Fatal(err)
			}
			tg.SetPuns(c == springboard.Pun) // an int3 for the trap row
			asked := c
			if c == springboard.Pun {
				asked = springboard.Trap // a pun is what a trap splice becomes
			}
			s := classSite(t, tg, asked)
			orig := textOf(t, pid, s.Fn)
			reqs, err := tg.Count("test", []*splice.Site{s})
			if err != nil {
				t.Fatal(err)
			}
			if in := tg.Installed(reqs[0]); in.Class != c {
				t.Fatalf("%s: installed as %s, want %s", s.Where(), in.Class, c)
			}
			if c == springboard.Trap && !catchesSIGTRAP(t, pid) {
				t.Error("a trap splice is in, and the process has no SIGTRAP handler")
			}
			if c == springboard.Pun && catchesSIGTRAP(t, pid) {
				t.Error("a punned splice only, and the process has a SIGTRAP handler")
			}
			got := w.round(t)
			if got != want {
				t.Errorf("output with the %s splice %q, without %q", c, got, want)
			}
			var calls uint64
			fmt.Sscanf(got, "calls %d", &calls)
			if n := tg.Counter(reqs[0], 0); n != calls {
				t.Errorf("%s (%s splice): %d, want the program's %d calls", s.Where(), c, n, calls)
			}
			if err := tg.Close(); err != nil {
				t.Fatal(err)
			}
			if now := textOf(t, pid, s.Fn); !bytes.Equal(now, orig) {
				t.Errorf("after detach: %x, want %x", now, orig)
			}
			if catchesSIGTRAP(t, pid) {
				t.Error("after detach, the process still catches SIGTRAP")
			}
			if again := w.round(t); again != want {
				t.Errorf("after detach: %q, want %q", again, want)
			}
		})
	}
}

// TestTrapSpliceUnderLoad adds and removes a trap splice at work()
// while four threads call it and check each result: a SIGTRAP on its way
// when the int3 goes must run the original instruction, not kill the
// program.
func TestTrapSpliceUnderLoad(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t))
	pid := w.cmd.Process.Pid
	w.spin(t)
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	tg.SetPuns(false) // the int3's handling is what this tests
	s := classSite(t, tg, springboard.Trap)
	orig := textOf(t, pid, s.Fn)
	var total uint64
	for round := 0; round < 10; round++ {
		reqs, err := tg.Count("test", []*splice.Site{s})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		total += tg.Counter(reqs[0], 0)
		if errs := tg.RemoveEach(reqs); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	if err := tg.Close(); err != nil {
		t.Fatal(err)
	}
	if total == 0 {
		t.Error("no call counted in ten rounds of four threads calling")
	}
	if now := textOf(t, pid, s.Fn); !bytes.Equal(now, orig) {
		t.Fatalf("after detach %x, want %x", now, orig)
	}
	w.unspin(t)
	t.Logf("ten trap splice rounds under load: %d hits counted", total)
}

// TestTrapSpliceRefused: a process that handles SIGTRAP itself takes no
// trap splice: ErrUnsupported, its text and its handler as they were.
func TestTrapSpliceRefused(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t), "sigtrap")
	want := w.round(t)
	pid := w.cmd.Process.Pid
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	tg.SetPuns(false) // an int3, which the program's own handler would take
	s := classSite(t, tg, springboard.Trap)
	orig := textOf(t, pid, s.Fn)
	if _, err := tg.Count("test", []*splice.Site{s}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("count with a trap splice in a process that catches SIGTRAP: %v, want ErrUnsupported", err)
	} else {
		t.Log(err)
	}
	if now := textOf(t, pid, s.Fn); !bytes.Equal(now, orig) {
		t.Errorf("after the refusal: %x, want %x", now, orig)
	}
	if !catchesSIGTRAP(t, pid) {
		t.Error("after the refusal, the program's own SIGTRAP handler is gone")
	}
	if got := w.round(t); got != want {
		t.Errorf("after the refusal: %q, want %q", got, want)
	}
}

// TestTrapHandlerBytes: the handler kinst copies into processes is
// testdata/sigtrap.S, assembled by the system's assembler.
func TestTrapHandlerBytes(t *testing.T) {
	if _, err := exec.LookPath("as"); err != nil {
		t.Skip("no as")
	}
	dir := t.TempDir()
	obj, bin := filepath.Join(dir, "t.o"), filepath.Join(dir, "t.bin")
	for _, c := range [][]string{{"as", "--64", "-o", obj, "testdata/sigtrap.S"}, {"objcopy", "-O", "binary", "-j", ".text", obj, bin}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	got, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != trapTable || !bytes.Equal(got[:len(trapHandler)], trapHandler) {
		t.Fatalf("assembled % x\n(%d bytes), kinst has % x", got, len(got), trapHandler)
	}
	out, _ := exec.Command("nm", obj).Output()
	if !strings.Contains(string(out), fmt.Sprintf("%016x T restorer", trapRestorer)) {
		t.Errorf("nm: %s; want restorer at %#x", out, trapRestorer)
	}
}

// TestDetachUnderSignals adds and removes a counter at mix() while four
// threads call it and a profiling signal interrupts them every 100 us
// with a slow handler: a thread interrupted inside a patch returns into
// it after kinst has freed it, which must still be the patch's code.
func TestDetachUnderSignals(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t), "prof")
	pid := w.cmd.Process.Pid
	w.spin(t)
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	// A direct splice: its patch is the only code of kinst's a thread
	// can be in (a springboard slot is text; see docs/processes.md).
	s, err := tg.ResolveAs("mix", springboard.Direct)
	if err != nil {
		t.Skip(err)
	}
	sites := []*splice.Site{s}
	for round := 0; round < 200; round++ {
		reqs, err := tg.Count("test", sites)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
		if errs := tg.RemoveEach(reqs); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	if err := tg.Close(); err != nil {
		t.Fatal(err)
	}
	w.unspin(t)
}

// TestExecutableAndLibrary counts points in the executable and in libc
// at once: two regions of kinst's, one near each (they are farther apart
// than a rel32 jump), each count the program's own; then the same with
// trap splices in both, whose one SIGTRAP handler serves both regions.
func TestExecutableAndLibrary(t *testing.T) {
	needPtrace(t)
	bin := build(t)
	for _, trap := range []bool{false, true} {
		t.Run(fmt.Sprintf("trap=%v", trap), func(t *testing.T) {
			w := start(t, bin)
			pid := w.cmd.Process.Pid
			tg, err := Attach(pid)
			if err != nil {
				t.Fatal(err)
			}
			tg.SetPuns(!trap)
			points := []string{"work", "libc:nanosleep"}
			var sites []*splice.Site
			for _, p := range points {
				s, err := tg.Resolve(p)
				if trap {
					s, err = tg.ResolveAs(p, springboard.Trap)
				}
				if err != nil {
					t.Fatal(err)
				}
				sites = append(sites, s)
			}
			reqs, err := tg.Count("test", sites)
			if err != nil {
				t.Fatal(err)
			}
			got := w.round(t)
			fmt.Fprintln(w.in, "nap 7")
			if l, _ := w.out.ReadString('\n'); l != "napped 7\n" {
				t.Fatalf("workload said %q", l)
			}
			var calls uint64
			fmt.Sscanf(got, "calls %d", &calls)
			if n := tg.Counter(reqs[0], 0); n != calls {
				t.Errorf("work: %d, want %d", n, calls)
			}
			if n := tg.Counter(reqs[1], 0); n != 7 {
				t.Errorf("libc:nanosleep: %d, want the 7 naps", n)
			}
			regions := len(tg.regions)
			if err := tg.Close(); err != nil {
				t.Fatal(err)
			}
			if maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); bytes.Count(maps, []byte("kinst-patches")) != regions {
				t.Errorf("%d regions, maps:\n%s", regions, maps)
			}
			if catchesSIGTRAP(t, pid) {
				t.Error("after detach, the process still catches SIGTRAP")
			}
			if again := w.round(t); again != got {
				t.Errorf("after detach: %q, want %q", again, got)
			}
			t.Logf("%d regions", regions)
		})
	}
}

func TestParsePoint(t *testing.T) {
	for _, tc := range []struct {
		spec, lib, fn string
		off           uint64
		block         int
		hasOff, hasBl bool
		bad           bool
	}{
		{spec: "work", fn: "work"},
		{spec: "work+0x4", fn: "work", off: 4, hasOff: true},
		{spec: "work:3", fn: "work", block: 3, hasBl: true},
		{spec: "libc:malloc", lib: "libc", fn: "malloc"},
		{spec: "libc:malloc+0xb", lib: "libc", fn: "malloc", off: 0xb, hasOff: true},
		{spec: "libc.so.6:malloc:2", lib: "libc.so.6", fn: "malloc", block: 2, hasBl: true},
		{spec: "shapes::Circle::area", fn: "shapes::Circle::area"},
		{spec: "shapes::Circle::area() const", fn: "shapes::Circle::area() const"},
		{spec: "shapes::Circle::area:1", fn: "shapes::Circle::area", block: 1, hasBl: true},
		{spec: "libstdc++:std::operator+(int, int)+0x10", lib: "libstdc++", fn: "std::operator+(int, int)", off: 0x10, hasOff: true},
		{spec: "Vec<int>::push(int)", fn: "Vec<int>::push(int)"},
		{spec: "", bad: true},
		{spec: "libc:", bad: true},
	} {
		lib, p, err := parsePoint(tc.spec)
		if (err != nil) != tc.bad {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		if tc.bad {
			continue
		}
		if lib != tc.lib || p.Function != tc.fn || p.Offset != tc.off || p.HasOffset != tc.hasOff || p.Block != tc.block || p.HasBlock != tc.hasBl {
			t.Errorf("%q: lib %q %+v", tc.spec, lib, p)
		}
	}
}

// TestCPlusPlus counts and covers a C++ program's methods by the names
// its programmer writes (shapes::Circle::area, with or without "() const",
// or a glob over them), not only by their mangled symbols.
func TestCPlusPlus(t *testing.T) {
	needPtrace(t)
	w := start(t, compile(t, "g++", "testdata/shapes.cc"))
	tg, err := Attach(w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	points := []string{"shapes::Circle::area", "shapes::Square::area() const"}
	sites, _ := resolveAll(t, tg, points)
	if sites[0].Fn.Name != "_ZNK6shapes6Circle4areaEv" || sites[1].Fn.Name != "_ZNK6shapes6Square4areaEv" {
		t.Fatalf("resolved to %s and %s", sites[0].Fn.Name, sites[1].Fn.Name)
	}
	// The mangled name works too, with an offset.
	second := fmt.Sprintf("_ZNK6shapes6Circle4areaEv+%#x", sites[0].Fn.Insns[1].Addr-sites[0].Fn.Addr)
	if s, err := tg.Resolve(second); err != nil || s.Addr() != sites[0].Fn.Insns[1].Addr {
		t.Errorf("%s: %v", second, err)
	}
	reqs, err := tg.Count("test", sites[:2])
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(w.in, "go 1000")
	if l, _ := w.out.ReadString('\n'); !strings.HasPrefix(l, "calls 1000 ") {
		t.Fatalf("workload said %q", l)
	}
	for i, r := range reqs {
		if n := tg.Counter(r, 0); n != 1000 {
			t.Errorf("%s: %d, want 1000", points[i], n)
		}
	}
	fns, err := tg.Functions("shapes::*::area")
	if err != nil || len(fns) != 2 {
		t.Errorf("glob shapes::*::area: %d functions, %v", len(fns), err)
	}
	if _, err := tg.Resolve("shapes::Triangle::area"); !errors.Is(err, ErrNoFunction) {
		t.Errorf("no such method: %v", err)
	}
}

// TestForkedChild: a child forked while a splice is in keeps its copy of
// the spliced text after kinst restores the parent's and lets go; its
// calls must still run right: through the patch, kept intact, for a
// direct splice, and for a trap splice through the handler, which sends
// an int3 whose splice is gone to the last patch when the int3 is still
// in the text.
func TestForkedChild(t *testing.T) {
	needPtrace(t)
	bin := build(t)
	for _, c := range []springboard.Class{springboard.Direct, springboard.Trap} {
		t.Run(c.String(), func(t *testing.T) {
			w := start(t, bin)
			tg, err := Attach(w.cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			tg.SetPuns(false) // the trap row's int3 in the child is what this tests
			s := classSite(t, tg, c)
			if _, err := tg.Count("test", []*splice.Site{s}); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(w.in, "fork 100000")
			time.Sleep(50 * time.Millisecond) // the child is asleep, its text spliced
			if err := tg.Close(); err != nil {
				t.Fatal(err)
			}
			if l, _ := w.out.ReadString('\n'); l != "child exit 0\n" {
				t.Errorf("the child forked with a %s splice in: %q", c, l)
			}
		})
	}
}

// TestTracedProcess: a process another tracer holds (here the test, as a
// debugger would) cannot be spliced: ErrNotTraceable naming the tracer,
// and nothing mapped into it.
func TestTracedProcess(t *testing.T) {
	needPtrace(t)
	runtime.LockOSThread() // ptrace's tracer is this thread
	defer runtime.UnlockOSThread()
	cmd := exec.Command("sleep", "10")
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(cmd.Process.Pid, &ws, 0, nil); err != nil || !ws.Stopped() {
		t.Fatalf("the traced child did not stop at its exec: %v, %v", ws, err)
	}
	tg, err := Attach(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	fns, err := tg.Functions("ld-linux-x86-64:_dl_*")
	if err != nil || len(fns) == 0 {
		t.Fatalf("the dynamic linker's functions: %v", err)
	}
	var s *splice.Site
	for _, f := range fns {
		if f.Err == nil {
			// A direct splice: its code is made before any patch is
			// allocated, with the counter's address in it.
			if s, err = f.Func.Resolve(splice.Point{Function: f.Sym.Name}); err == nil && s.Class == springboard.Direct {
				break
			}
			s = nil
		}
	}
	if s == nil {
		t.Fatal("no function of the dynamic linker takes a direct splice at its entry")
	}
	_, err = tg.Count("test", []*splice.Site{s})
	if !errors.Is(err, ErrNotTraceable) || !strings.Contains(err.Error(), "traces it") {
		t.Errorf("count in a traced process: %v, want ErrNotTraceable naming the tracer", err)
	}
	if maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", cmd.Process.Pid)); bytes.Contains(maps, []byte("kinst-patches")) {
		t.Errorf("kinst's region mapped into a process it could not trace:\n%s", maps)
	}
}

// TestThreadID: -p may name any thread (top and ps -L show their IDs);
// kinst attaches to its process.
func TestThreadID(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t))
	w.spin(t)
	defer w.unspin(t)
	pid := w.cmd.Process.Pid
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var tid int
	for _, e := range ents {
		if n, _ := strconv.Atoi(e.Name()); n != pid {
			tid = n
		}
	}
	if tid == 0 {
		t.Fatal("the workload has one thread")
	}
	tg, err := Attach(tid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if tg.PID != pid {
		t.Errorf("Attach(thread %d).PID = %d, want process %d", tid, tg.PID, pid)
	}
}

// attachWork attaches to pid and plans work()'s entry.
func attachWork(t *testing.T, pid int) (*Target, *splice.Site) {
	t.Helper()
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := tg.Resolve("work")
	if err != nil {
		t.Fatal(err)
	}
	return tg, entry
}

// countWork attaches to pid and counts work()'s calls; the target is
// closed when the test ends. what names the process in a failure.
func countWork(t *testing.T, pid int, what string) (*Target, *splice.Site, []*engine.Request) {
	t.Helper()
	tg, s := attachWork(t, pid)
	t.Cleanup(func() { tg.Close() })
	reqs, err := tg.Count("test", []*splice.Site{s})
	if err != nil {
		t.Fatalf("count in %s: %v", what, err)
	}
	return tg, s, reqs
}

// TestPidNamespace: a process in a container (its own pid namespace and
// /proc, where kinst's pid does not exist) is spliced like any other: the
// region is made by the process itself. The count is the program's own.
func TestPidNamespace(t *testing.T) {
	needPtrace(t)
	if out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "true").CombinedOutput(); err != nil {
		t.Skipf("unshare cannot make a pid namespace here: %v %s", err, out)
	}
	bin := build(t)
	w := start(t, "unshare", "--pid", "--fork", "--mount-proc", bin)
	want := w.round(t)
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", w.cmd.Process.Pid, w.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(children)))
	if err != nil {
		t.Fatalf("the workload's pid under unshare: %q", children)
	}
	tg, _, reqs := countWork(t, pid, "a pid namespace")
	got := w.round(t)
	if got != want {
		t.Errorf("output with a counter %q, without %q", got, want)
	}
	var calls uint64
	fmt.Sscanf(got, "calls %d", &calls)
	if n := tg.Counter(reqs[0], 0); n != calls || calls == 0 {
		t.Errorf("work: %d, want the program's %d calls", n, calls)
	}
	if errs := tg.RemoveEach(reqs); errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestSeccompProcess: a process whose seccomp filter forbids
// memfd_create (testdata/seccomp.c) opens kinst's memfd instead; its
// splice counts and detaching restores its bytes.
func TestSeccompProcess(t *testing.T) {
	needPtrace(t)
	w := start(t, compile(t, "gcc", "testdata/seccomp.c"))
	pid := w.cmd.Process.Pid
	tg, s, reqs := countWork(t, pid, "a process that may not memfd_create")
	var orig []byte // as the planner read them: the bytes before the splice
	for _, in := range s.Fn.Insns {
		orig = append(orig, in.Bytes...)
	}
	deadline := time.Now().Add(5 * time.Second)
	for tg.Counter(reqs[0], 0) < 10 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := tg.Counter(reqs[0], 0); n < 10 {
		t.Errorf("work counted %d times in 5 s of a loop calling it every ms", n)
	}
	if errs := tg.RemoveEach(reqs); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if now := textOf(t, pid, s.Fn); !bytes.Equal(now, orig) {
		t.Errorf("after removal: %x, want %x", now, orig)
	}
}

// TestKinstDies: kinst killed (SIGKILL, nothing restored) while a point
// of every class is spliced: the process runs on through the patches and
// the trap handler it was left with, its threads checking every result,
// its output what it was. The helper below is the kinst that dies: this
// test binary run again.
func TestKinstDies(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t))
	want := w.round(t)
	pid := w.cmd.Process.Pid
	tg, entry := attachWork(t, pid) // to read the text only
	defer tg.Abandon()
	orig := textOf(t, pid, entry.Fn)
	helper := exec.Command(os.Args[0], "-test.run=^TestHelperKinst$")
	helper.Env = append(os.Environ(), fmt.Sprintf("KINST_HELPER_PID=%d", pid))
	out, _ := helper.StdoutPipe()
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer helper.Wait()
	defer helper.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "spliced ") {
		t.Fatalf("the helper said %q, %v", line, err)
	}
	t.Logf("helper: %s", strings.TrimSpace(line))
	helper.Process.Kill()
	helper.Wait()
	if bytes.Equal(textOf(t, pid, entry.Fn), orig) {
		t.Fatal("work() is not spliced after the helper died: nothing tested")
	}
	w.spin(t)
	time.Sleep(300 * time.Millisecond)
	w.unspin(t)
	if got := w.round(t); got != want {
		t.Errorf("a round after kinst died: %q, want %q", got, want)
	}
}

// TestHelperKinst is TestKinstDies's kinst: it splices a point of every
// class into the process KINST_HELPER_PID names, says so, and waits to
// be killed.
func TestHelperKinst(t *testing.T) {
	pid, err := strconv.Atoi(os.Getenv("KINST_HELPER_PID"))
	if err != nil {
		t.Skip("run by TestKinstDies")
	}
	tg, entry := attachWork(t, pid)
	_, sites, classes := classSites(t, tg, "mix", []*splice.Site{entry})
	if _, err := tg.Count("helper", append(sites, entry)); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("spliced %d points: %v and work\n", len(sites)+1, classes)
	select {}
}

// TestRefresh: a library the process loads with dlopen after kinst
// attached is not there to name until Refresh reads it; then its
// functions resolve and count.
func TestRefresh(t *testing.T) {
	needPtrace(t)
	w := start(t, compile(t, "gcc", "testdata/dlopen.c", "-ldl"))
	tg, err := Attach(w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if _, err := tg.Resolve("libm:cbrt"); !errors.Is(err, ErrNoFunction) {
		t.Fatalf("libm:cbrt before the dlopen: %v", err)
	}
	if mods, err := tg.Refresh(); err != nil || len(mods) != 0 {
		t.Errorf("Refresh with nothing new: %v, %v", mods, err)
	}
	fmt.Fprintln(w.in, "load")
	if l, _ := w.out.ReadString('\n'); l != "loaded 1\n" {
		t.Fatalf("dlopen: %q", l)
	}
	mods, err := tg.Refresh()
	if err != nil || len(mods) != 1 || !strings.HasPrefix(mods[0], "libm") {
		t.Fatalf("Refresh after the dlopen: %v, %v", mods, err)
	}
	s, err := tg.Resolve("libm:cbrt")
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := tg.Count("test", []*splice.Site{s})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.round(t); !strings.HasPrefix(got, "calls 1000") {
		t.Fatalf("the program said %q", got)
	}
	if n := tg.Counter(reqs[0], 0); n != 1000 {
		t.Errorf("libm:cbrt counted %d times, want the program's 1000", n)
	}
}

// A stripped executable (no .symtab, nothing of its own in .dynsym, as
// Debian ships xz): a name or glob that matches nothing of it says it is
// stripped, and, where libraries have matches, how to name them; it did
// say only "name it ld-linux-x86-64:*" for '*'.
func TestStrippedExecutableSaid(t *testing.T) {
	bin := build(t)
	if out, err := exec.Command("strip", "-s", bin).CombinedOutput(); err != nil {
		t.Skipf("strip: %v %s", err, out)
	}
	w := start(t, bin)
	tg, err := Attach(w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	for _, tc := range []struct{ point, says string }{
		{"*", "libc:*"},
		{"work", ""},
		{"nanosleep", "name them as libc:nanosleep"},
	} {
		err := lookupErr(tg, tc.point)
		if !errors.Is(err, ErrNoFunction) || !strings.Contains(err.Error(), "the executable is stripped") || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want ErrNoFunction saying the executable is stripped and %q", tc.point, err, tc.says)
		}
	}
}

// lookupErr is the error of looking point up: a glob's functions, or a
// point resolved.
func lookupErr(tg *Target, point string) error {
	if strings.Contains(point, "*") {
		_, err := tg.Functions(point)
		return err
	}
	_, err := tg.Resolve(point)
	return err
}

// TestEachFunc: planning on every CPU (EachFunc) resolves every block of
// libc's str* functions to the same instruction and class as planning
// them one by one, calls work once for each function that has one, and
// leaves each with the target's own verdict cache.
func TestEachFunc(t *testing.T) {
	needPtrace(t)
	w := start(t, build(t))
	tg, err := Attach(w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	plan := func(f *splice.Func) []string {
		var out []string
		for b := range f.Blocks {
			s, err := f.Resolve(splice.Point{Function: f.Fn.Name, Block: b, HasBlock: true})
			if err != nil {
				out = append(out, err.Error())
				continue
			}
			out = append(out, fmt.Sprintf("%#x %v", s.Addr(), s.Class))
		}
		return out
	}
	one, err := tg.Functions("libc:str*")
	if err != nil {
		t.Fatal(err)
	}
	want := make([][]string, len(one))
	for i, ct := range one {
		if ct.Func != nil {
			want[i] = plan(ct.Func)
		}
	}
	all, err := tg.Functions("libc:str*")
	if err != nil {
		t.Fatal(err)
	}
	got := make([][]string, len(all))
	calls := make([]atomic.Int32, len(all))
	tg.EachFunc(all, func(i int, f *splice.Func) {
		calls[i].Add(1)
		got[i] = plan(f)
	})
	planned := 0
	for i, ct := range all {
		if n := calls[i].Load(); n != map[bool]int32{true: 1, false: 0}[ct.Func != nil] {
			t.Errorf("%s: work called %d times", ct.Sym.Name, n)
		}
		if ct.Func == nil {
			continue
		}
		planned++
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("%s planned on every CPU:\n%q\none by one:\n%q", ct.Sym.Name, got[i], want[i])
		}
		if ct.Func.Verdicts() != tg.verdit {
			t.Errorf("%s: left with another verdict cache", ct.Sym.Name)
		}
	}
	if planned < 20 {
		t.Fatalf("only %d of libc's str* functions planned", planned)
	}
}

// startProgram builds the test program src and starts it, its stdin and
// stdout piped to the test; it is killed when the test ends.
func startProgram(t *testing.T, src string) (pid int, in io.Writer, out *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(compile(t, "gcc", src))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid, stdin, bufio.NewReader(stdout)
}

// TestVforkChild: a vfork child runs libc in its parent's memory, as
// posix_spawn's does until its exec, but is no thread of the process.
// Kinst writes nothing while it runs: the splice waits until the child
// has exited (its parent's thread stops only then), so the child, which
// calls strtol for 1.5 s, comes to no harm and none of its calls is
// counted; the parent's 1000 after it are, exactly. The wait is told, once,
// as the parent's thread in vfork.
func TestVforkChild(t *testing.T) {
	needPtrace(t)
	pid, in, r := startProgram(t, "testdata/vfork.c")
	if l, _ := r.ReadString('\n'); l != "child running\n" {
		t.Fatalf("the program said %q", l)
	}
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	var mu sync.Mutex
	var notes []string
	tg.SetStopNote(func(msg string) { mu.Lock(); notes = append(notes, msg); mu.Unlock() })
	sites, _ := resolveAll(t, tg, []string{"libc:strtol"})
	reqs, err := tg.Count("test", sites)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(notes) != 1 || !strings.Contains(notes[0], fmt.Sprintf("thread %d of process %d has not stopped", pid, pid)) || !strings.Contains(notes[0], "in vfork") {
		t.Errorf("the wait for the thread in vfork was told as %q, want once, as a thread in vfork", notes)
	}
	mu.Unlock()
	if l, _ := r.ReadString('\n'); l != "child 0\n" {
		t.Fatalf("the vfork child ended as %q, want \"child 0\"", l)
	}
	if n := tg.Counter(reqs[0], 0); n != 0 {
		t.Fatalf("strtol counted %d times before the parent called it: the vfork child's calls were counted, so its code was spliced while it ran", n)
	}
	fmt.Fprintln(in, "call 1000")
	if l, _ := r.ReadString('\n'); l != "done 7000\n" {
		t.Fatalf("the parent said %q", l)
	}
	if n := tg.Counter(reqs[0], 0); n != 1000 {
		t.Errorf("strtol counted %d times, want the parent's 1000", n)
	}
}

// TestIndirectFunction: a point at an indirect function (libc's strlen,
// an IFUNC) is spliced at the implementation the dynamic loader picked
// for this process -- the address the program's own calls go to, which
// it prints -- and counts them: a round of 1000 calls counts 1000 more
// than a round of none (printf may call strlen too).
func TestIndirectFunction(t *testing.T) {
	needPtrace(t)
	pid, in, r := startProgram(t, "testdata/ifunc.c")
	l, _ := r.ReadString('\n')
	impl, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(l), "0x"), 16, 64)
	if err != nil {
		t.Fatalf("the program said %q", l)
	}
	tg, err := Attach(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	s, err := tg.Resolve("libc:strlen")
	if err != nil {
		t.Fatal(err)
	}
	if s.Fn.Addr != impl {
		t.Fatalf("libc:strlen resolved to %s at %#x; the program's calls go to %#x", s.Fn.Name, s.Fn.Addr, impl)
	}
	if !strings.HasPrefix(s.Fn.Name, "__strlen_") {
		t.Errorf("libc:strlen resolved to %s", s.Fn.Name)
	}
	reqs, err := tg.Count("test", []*splice.Site{s})
	if err != nil {
		t.Fatal(err)
	}
	round := func(n int) uint64 {
		before := tg.Counter(reqs[0], 0)
		fmt.Fprintf(in, "call %d\n", n)
		if l, _ := r.ReadString('\n'); l != fmt.Sprintf("done %d\n", 7*n) {
			t.Fatalf("the program said %q", l)
		}
		return tg.Counter(reqs[0], 0) - before
	}
	none, some := round(0), round(1000)
	if some-none != 1000 {
		t.Errorf("a round of 1000 calls counted %d, a round of none %d: want 1000 more", some, none)
	}
	// A glob lists the resolver as unreadable, and the implementations
	// it matches by their own names.
	fns, err := tg.Functions("libc:strlen*")
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, ct := range fns {
		if ct.Sym.Name == "strlen" {
			listed = true
			if !errors.Is(ct.Err, ErrIndirect) {
				t.Errorf("libc:strlen* lists strlen as %v, want ErrIndirect", ct.Err)
			}
		}
	}
	if !listed {
		t.Error("libc:strlen* does not list strlen")
	}
}

// TestTimeKeepsCallersRegisters: GCC at -O2 lets a caller keep values in
// caller-saved registers across a call to a function it knows leaves
// them alone (-fipa-ra), so a timer's patches at a process function's
// entry and exits may use none of them unsaved. Timed at once, leaf's
// asm caller keeps eight registers across 1,000 calls, and fibRound
// keeps values in %edx, %r8d and %ecx across calls to tail and fib
// (testdata/callers.c; a program of that shape printed wrong sums, or
// crashed, when the timer took such registers for dead at entry).
func TestTimeKeepsCallersRegisters(t *testing.T) {
	needPtrace(t)
	w := start(t, compile(t, "gcc", "testdata/callers.c"))
	tg, err := Attach(w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	var timers []*Timer
	for _, fn := range []string{"leaf", "fib", "tail"} {
		tm, err := tg.Time("test", fn)
		if err != nil {
			t.Fatalf("time %s: %v", fn, err)
		}
		timers = append(timers, tm)
	}
	fibs := []int64{0, 1}
	for i := 2; i <= 20; i++ {
		fibs = append(fibs, fibs[i-1]+fibs[i-2])
	}
	for n := 15; n <= 20; n++ {
		fmt.Fprintln(w.in, n)
		l, err := w.out.ReadString('\n')
		if err != nil {
			w.cmd.Wait()
			t.Fatalf("n=%d: %v (%v)", n, err, w.cmd.ProcessState)
		}
		want := fmt.Sprintf("0 %d %d\n", fibs[n], 10*n*(10*n+1)/2)
		if l != want {
			t.Errorf("n=%d: the program printed %q, want %q (registers changed, then fib(n), sum 1..10n)", n, l, want)
		}
	}
	for i, tm := range timers {
		calls, _ := tm.Read()
		if calls == 0 {
			t.Errorf("timer %d counted no call", i)
		}
		if err := tg.Untime(tm); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTimeTinyFunction: a timer on a function of a lea and a ret, whose
// exit moves onto the entry's instruction (no jmp fits the ret), enters
// and then leaves at that instruction: 100 calls a millisecond apart are
// 100 calls of nanoseconds each. Its exit spliced as a site of its own
// ran before the entry, and the timer measured the millisecond between
// calls.
func TestTimeTinyFunction(t *testing.T) {
	needPtrace(t)
	w := start(t, compile(t, "gcc", "testdata/tiny.c"))
	tg, err := Attach(w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	tm, err := tg.Time("test", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	clock := metrics.NewClock()
	var acc metrics.TimerAcc
	_, word0 := tm.Read()
	acc.Add(word0, metrics.TSC())
	if l := w.round(t); l != "14950" {
		t.Fatalf("the program printed %q, want 14950", l)
	}
	calls, word := tm.Read()
	ns := clock.Nanos(acc.Add(word, metrics.TSC()))
	t.Logf("tiny: entry %s, exits %v: %d calls, %.0f ns inside in all", tm.Entry.Where(), tm.Exits, calls, ns)
	if calls != 100 || ns > 100*100e3 || metrics.TimerInside(word) != 0 {
		t.Errorf("%d calls, %.0f ns inside, %d inside now; want 100 calls of well under 100 µs each (a millisecond apart), none inside", calls, ns, metrics.TimerInside(word))
	}
	if err := tg.Untime(tm); err != nil {
		t.Fatal(err)
	}
}
