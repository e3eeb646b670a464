package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/bpfprobe"
	"github.com/kinst/kinst/output"
)

// HitOptions configure `kinst bench hit`.
type HitOptions struct {
	Function string // a function the loop enters once per call
	Calls    int    // system calls per timed run
	Runs     int    // timed runs per mechanism (the median is kept)
	JSON     bool
}

const tracefs = "/sys/kernel/tracing"

// BenchHit measures the per-hit cost of a counter at a hot function: a
// loop of getppid(2) calls (each enters Function once) timed bare, with a
// counter spliced directly, through a springboard and as a trap splice,
// with a tracefs kprobe as int3 and optimized (jump) kprobe, and with a
// BPF program attached as a kprobe, all at instructions of the function's
// entry block. It runs where kerninstd
// runs (the guest) and needs root for tracefs.
func BenchHit(ctx context.Context, c *api.Client, o HitOptions, env Env) error {
	w, stderr := env.Out, env.Err
	if o.Calls <= 0 || o.Runs <= 0 {
		return errors.New("bench hit: --calls and --runs must be positive")
	}
	g, err := c.CFG(ctx, o.Function)
	if err != nil {
		return err
	}
	if len(g.Blocks) == 0 {
		return fmt.Errorf("bench hit: %s has no blocks", o.Function)
	}
	byClass := entryByClass(g)
	// One OS thread for the whole benchmark: the BPF rows count this
	// thread's calls only.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	loop := func() float64 {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		start := time.Now()
		for i := 0; i < o.Calls; i++ {
			unix.Getppid()
		}
		return float64(time.Since(start).Nanoseconds()) / float64(o.Calls)
	}
	rep := output.HitReport{Function: o.Function, Calls: o.Calls, Runs: o.Runs, Expected: uint64(o.Calls) * uint64(o.Runs)}
	fmt.Fprintf(stderr, "kinst: timing %d×%d getppid calls per mechanism…\n", o.Runs, o.Calls)
	// Untimed first: the emulator translates the path once, and the
	// first timed loop would pay for it.
	loop()
	m := &hitMeasure{loop: loop, runs: o.Runs}
	measure := func(name, point string, attach func() (func() (uint64, error), error)) {
		rep.Rows = append(rep.Rows, m.row(name, point, attach))
	}
	for _, class := range []string{"direct", "springboard", "covering", "trap"} {
		in, ok := byClass[class]
		if !ok {
			rep.Rows = append(rep.Rows, output.HitRow{Mechanism: class + " splice", Skipped: "no instruction of this class in the entry block"})
			continue
		}
		point := fmt.Sprintf("%s+%#x", o.Function, in.Offset)
		measure(class+" splice", point, func() (func() (uint64, error), error) { return attachSplice(ctx, c, point, class) })
	}
	if in, ok := byClass["direct"]; ok {
		point := fmt.Sprintf("%s+%#x", o.Function, in.Offset)
		for _, opt := range []bool{false, true} {
			name := "kprobe (int3)"
			if opt {
				name = "kprobe (optimized)"
			}
			measure(name, point, func() (func() (uint64, error), error) { return attachKprobe(point, opt) })
		}
		// A BPF program attached as a kprobe at the same instruction,
		// counting in an array map; kprobes-optimization on, as the
		// kernel's default has it.
		measure("bpf kprobe", point, func() (func() (uint64, error), error) { return attachBPF(bpfprobe.Kprobe, o.Function, in.Offset, 0) })
	}
	// The same program by the mechanisms kerninstd uses without the
	// driver at a function's entry: an fentry trampoline and a
	// kprobe.multi (fprobe). They need an ftrace site, which the syscall
	// wrappers lack, so they go to the function getppid(2) calls once,
	// __task_pid_nr_ns, counting this thread's hits only (other tasks
	// call it too); the thread check is in the program.
	for _, mech := range []string{bpfprobe.FEntry, bpfprobe.KprobeMulti} {
		const fn = "__task_pid_nr_ns"
		measure("bpf "+mech, fn+" (this thread)", func() (func() (uint64, error), error) { return attachBPF(mech, fn, 0, tid) })
	}
	rep.Rows = append([]output.HitRow{{Mechanism: "none", NsPerCall: median(m.bases), Ratio: 1}}, rep.Rows...)
	return writeHitReport(w, rep, o.JSON)
}

// entryByClass is the first instruction of each splice class in g's
// entry block, calls left out (an optimized kprobe would refuse or
// emulate one): the kprobes go where the direct splice does.
func entryByClass(g api.CFG) map[string]api.CFGInstruction {
	byClass := map[string]api.CFGInstruction{}
	for _, in := range g.Blocks[0].Instructions {
		if _, ok := byClass[in.SpliceClass]; !ok && in.SpliceClass != "refused" && !strings.HasPrefix(in.Text, "call") {
			byClass[in.SpliceClass] = in
		}
	}
	return byClass
}

// hitMeasure times mechanisms over a loop. The guest's clock drifts
// under emulation (other VMs share the host): every timed run with a
// mechanism is paired with a bare run just before it, and the ratio is
// the median of the pairs'.
type hitMeasure struct {
	loop  func() float64 // ns a call
	runs  int
	bases []float64 // every bare run's
}

// row times the loop under attach's mechanism; a mechanism that cannot
// be attached or detached is a skipped row, with the reason.
func (m *hitMeasure) row(name, point string, attach func() (func() (uint64, error), error)) output.HitRow {
	var ratios, nss []float64
	var hits uint64
	for r := 0; r < m.runs; r++ {
		base := m.loop()
		m.bases = append(m.bases, base)
		detach, err := attach()
		if err != nil {
			return output.HitRow{Mechanism: name, Point: point, Skipped: err.Error()}
		}
		ns := m.loop()
		h, err := detach()
		if err != nil {
			return output.HitRow{Mechanism: name, Point: point, Skipped: err.Error()}
		}
		hits += h
		nss = append(nss, ns)
		ratios = append(ratios, ns/base)
	}
	ratio := median(ratios)
	return output.HitRow{Mechanism: name, Point: point, NsPerCall: median(nss), Ratio: ratio, Overhead: ratio - 1, Hits: hits}
}

// attachSplice counts at point through a kerninstd session, which must
// splice it as class; the function it returns ends the session and
// gives the count.
func attachSplice(ctx context.Context, c *api.Client, point, class string) (func() (uint64, error), error) {
	s, err := c.CreateSession(ctx, api.SessionRequest{Points: []string{point}})
	if err != nil {
		return nil, err
	}
	if got := s.Probes[0].SpliceClass; got != class {
		c.RemoveSession(ctx, s.ID)
		return nil, fmt.Errorf("spliced as %s", got)
	}
	// A covering splice runs as a trap splice until the driver's grace
	// period lets its jmp in: time the jmp.
	if err := waitCoveringFinished(ctx, c); err != nil {
		c.RemoveSession(ctx, s.ID)
		return nil, err
	}
	return func() (uint64, error) {
		final, err := c.RemoveSession(ctx, s.ID)
		if err != nil {
			return 0, err
		}
		return final.Probes[0].Count, nil
	}, nil
}

// writeHitReport prints bench hit's table, or its JSON.
func writeHitReport(w io.Writer, rep output.HitReport, asJSON bool) error {
	if asJSON {
		return writeJSON(w, rep)
	}
	if rep.User {
		fmt.Fprintf(w, "per-call cost of a call of %s with a counter in it (this machine's time;\neach ratio is the median over runs of mechanism / the bare loop timed just before it)\n", rep.Function)
	} else {
		fmt.Fprintf(w, "per-call cost of getppid(2) with a counter at %s (guest time under emulation: compare ratios;\neach ratio is the median over runs of mechanism / the bare loop timed just before it)\n", rep.Function)
	}
	tw := newTable(w, 0, 0, 2, ' ', 0)
	if rep.User {
		fmt.Fprintln(tw, "mechanism\tpoint\tns/call\tratio\toverhead\thits\tattach\tdetach\t")
	} else {
		fmt.Fprintln(tw, "mechanism\tpoint\tns/call\tratio\toverhead\thits\t")
	}
	for _, r := range rep.Rows {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t(skipped: %s)\n", r.Mechanism, r.Point, r.Skipped)
			continue
		}
		if rep.User {
			att, det := "-", "-"
			if r.Mechanism != "none" {
				att, det = fmtNS(r.AttachNS), fmtNS(r.DetachNS)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.3f\t%+.1f%%\t%d\t%s\t%s\t%s\n", r.Mechanism, r.Point, r.NsPerCall, r.Ratio, 100*r.Overhead, r.Hits, att, det, hitNote(rep, r))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.3f\t%+.1f%%\t%d\t%s\n", r.Mechanism, r.Point, r.NsPerCall, r.Ratio, 100*r.Overhead, r.Hits, hitNote(rep, r))
	}
	return tw.Flush()
}

// hitNote flags a row whose hits are not the calls it timed.
func hitNote(rep output.HitReport, r output.HitRow) string {
	want := rep.Expected
	if r.Calls != 0 {
		want = r.Calls
	}
	if r.Mechanism != "none" && r.Hits != want {
		return fmt.Sprintf("(hits ≠ %d calls)", want)
	}
	return ""
}

// attachBPF loads a BPF program that counts hits in an array map and
// attaches it at fn+off by one mechanism (bpfprobe.FEntry, KprobeMulti or
// Kprobe; a kprobe with kprobe optimization on, the kernel's default);
// detach reads the count and unloads it.
func attachBPF(mechanism, fn string, off uint64, tid int) (func() (uint64, error), error) {
	restore := func() {}
	if mechanism == bpfprobe.Kprobe {
		var err error
		if restore, err = setKprobeOptimization(true); err != nil {
			return nil, err
		}
	}
	set, err := bpfprobe.NewSet(1)
	if err != nil {
		restore()
		return nil, err
	}
	if _, err := set.CountThread(mechanism, fn, off, 0, tid); err != nil {
		set.Close()
		restore()
		return nil, err
	}
	if mechanism == bpfprobe.Kprobe {
		// Optimization runs from delayed work: give it time.
		time.Sleep(300 * time.Millisecond)
	}
	return func() (uint64, error) {
		defer restore()
		n := set.Counter(0)
		return n, set.Close()
	}, nil
}

// setKprobeOptimization sets the kprobes-optimization sysctl; restore puts
// the old value back.
func setKprobeOptimization(on bool) (restore func(), err error) {
	const sysctl = "/proc/sys/debug/kprobes-optimization"
	old, err := os.ReadFile(sysctl)
	if err != nil {
		return nil, err
	}
	want := "0"
	if on {
		want = "1"
	}
	if err := os.WriteFile(sysctl, []byte(want), 0); err != nil {
		return nil, err
	}
	return func() { os.WriteFile(sysctl, old, 0) }, nil
}

// attachKprobe defines and enables a tracefs kprobe at point
// (FUNC+0xOFF), optimized into a jump or kept as an int3 through the
// kprobes-optimization sysctl; detach disables and deletes it and returns
// its hits from kprobe_profile.
func attachKprobe(point string, optimized bool) (func() (uint64, error), error) {
	events := filepath.Join(tracefs, "kprobe_events")
	if _, err := os.Stat(events); err != nil {
		return nil, fmt.Errorf("no tracefs at %s", tracefs)
	}
	restore, err := setKprobeOptimization(optimized)
	if err != nil {
		return nil, err
	}
	const group, event = "kinst_bench", "hit"
	remove := func() {
		appendFile(events, fmt.Sprintf("-:%s/%s\n", group, event))
		restore()
	}
	if err := appendFile(events, fmt.Sprintf("p:%s/%s %s\n", group, event, point)); err != nil {
		restore()
		return nil, fmt.Errorf("add kprobe: %w", err)
	}
	enable := filepath.Join(tracefs, "events", group, event, "enable")
	if err := os.WriteFile(enable, []byte("1"), 0); err != nil {
		remove()
		return nil, err
	}
	if optimized {
		// Optimization runs from delayed work: give it time.
		time.Sleep(300 * time.Millisecond)
	}
	return func() (uint64, error) {
		os.WriteFile(enable, []byte("0"), 0)
		defer remove()
		prof, err := os.ReadFile(filepath.Join(tracefs, "kprobe_profile"))
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(prof), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == event {
				return strconv.ParseUint(f[1], 10, 64)
			}
		}
		return 0, nil
	}, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// waitCoveringFinished waits until no covering splice is armed (int3
// only), at most 30 s.
func waitCoveringFinished(ctx context.Context, c *api.Client) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		in, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if in.CoveringArmed == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d covering splices still armed after 30 s", in.CoveringArmed)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
