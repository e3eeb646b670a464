package cli

import (
	"bufio"
	"context"
	"debug/elf"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/bpfprobe"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/process"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

//go:embed csrc/hitloop.c
var hitLoopSource []byte

// hitLoop is the running workload of `bench hit --user`.
type hitLoop struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// run times n calls of hit() in the workload, by its own clock.
func (h *hitLoop) run(n int) (float64, error) {
	fmt.Fprintf(h.in, "run %d\n", n)
	l, err := h.out.ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("workload: %v", err)
	}
	var ns, sum int64
	if _, err := fmt.Sscanf(l, "ns %d sum %d", &ns, &sum); err != nil {
		return 0, fmt.Errorf("workload said %q", l)
	}
	return float64(ns) / float64(n), nil
}

// BenchHitUser measures, on this machine's hardware, the per-hit cost of
// a counter in a user process: a tight loop calling a small function,
// bare, with kinst's splices of each class (through ptrace and a shared
// memfd, package process), a tracefs uprobe and a BPF uprobe. Each run
// times the bare loop, then the loop with one mechanism; a row's ratio
// is the median of its runs' ratios. Every row's hits must equal the
// calls it timed. Each run also times putting the mechanism in and taking
// it out: the request cost, kinst's splice against a uprobe's.
func BenchHitUser(ctx context.Context, o HitOptions, env Env) error {
	if o.Calls <= 0 || o.Runs <= 0 {
		return errors.New("bench hit --user: --calls and --runs must be positive")
	}
	dir, err := os.MkdirTemp("", "kinst-hit-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	h, bin, err := startHitLoop(ctx, dir)
	if err != nil {
		return err
	}
	defer h.stop()
	tg, err := process.Attach(h.cmd.Process.Pid)
	if err != nil {
		return err
	}
	defer tg.Close()
	entry, err := tg.Resolve("hit")
	if err != nil {
		return err
	}
	rep := output.HitReport{Function: "hit()", Calls: o.Calls, Runs: o.Runs, Expected: uint64(o.Calls) * uint64(o.Runs), User: true}
	fmt.Fprintf(env.Err, "kinst: timing %d×%d calls of hit() per mechanism, interleaved with bare runs…\n", o.Runs, o.Calls)
	h.run(o.Calls) // warm up
	mechs := userMechs(tg, entry.Fn, bin, o.Calls)
	rows, err := h.time(mechs, o)
	if err != nil {
		return err
	}
	rep.Rows = rows
	return writeHitReport(env.Out, rep, o.JSON)
}

// startHitLoop builds the workload in dir and starts it, ready to run.
func startHitLoop(ctx context.Context, dir string) (h *hitLoop, bin string, err error) {
	src, bin := filepath.Join(dir, "hitloop.c"), filepath.Join(dir, "hitloop")
	if err := os.WriteFile(src, hitLoopSource, 0o644); err != nil {
		return nil, "", err
	}
	if out, err := exec.CommandContext(ctx, "gcc", "-O2", "-fno-PIE", "-no-pie", "-o", bin, src).CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("bench hit --user builds its workload with gcc: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, bin)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	h = &hitLoop{cmd: cmd, in: in, out: bufio.NewReader(out)}
	if l, _ := h.out.ReadString('\n'); l != "ready\n" {
		h.stop()
		return nil, "", fmt.Errorf("workload said %q", l)
	}
	return h, bin, nil
}

// stop ends the workload.
func (h *hitLoop) stop() { h.in.Close(); h.cmd.Wait() }

// userMech is one mechanism `bench hit --user` times.
type userMech struct {
	name, point string
	calls       int // per run, if fewer than HitOptions.Calls
	// attach puts the mechanism on; the function it returns takes it
	// off and says how many hits it counted.
	attach  func() (func() (uint64, error), error)
	skipped string
}

// userMechs are the mechanisms timed on hit() (f): each splice class at
// the first instruction that takes it (a trap splice at the entry), a
// tracefs uprobe and a BPF uprobe.
func userMechs(tg *process.Target, f *cfg.Function, bin string, calls int) []userMech {
	var mechs []userMech
	// A trap into the kernel and back costs microseconds: the trap
	// splice and uprobe rows time fewer calls.
	trapCalls := min(calls, 100_000)
	for _, class := range []springboard.Class{springboard.Direct, springboard.Springboard, springboard.Cover, springboard.Trap} {
		name := class.String() + " splice"
		s := firstOfClass(tg, f, class)
		if s == nil {
			mechs = append(mechs, userMech{name: name, skipped: "no instruction of hit() takes this class"})
			continue
		}
		n := 0
		if class == springboard.Trap {
			n = trapCalls
		}
		mechs = append(mechs, userMech{name: name, point: s.Where(), calls: n, attach: func() (func() (uint64, error), error) {
			// The trap row is an int3's: no pun stands in for it.
			tg.SetPuns(class != springboard.Trap)
			defer tg.SetPuns(true)
			return countAt(tg, s, class)
		}})
	}
	// A punned jmp where a trap splice was asked for: the first
	// instruction too short for a jmp rel32.
	if s := firstShort(tg, f); s == nil {
		mechs = append(mechs, userMech{name: "punned splice", skipped: "no instruction of hit() is shorter than a jmp rel32"})
	} else {
		mechs = append(mechs, userMech{name: "punned splice", point: s.Where(), attach: func() (func() (uint64, error), error) {
			return countAt(tg, s, springboard.Pun)
		}})
	}
	off, err := fileOffset(bin, f.Addr)
	mechs = append(mechs, userMech{name: "uprobe (tracefs)", point: "hit", calls: trapCalls, attach: func() (func() (uint64, error), error) {
		if err != nil {
			return nil, err
		}
		return attachUprobe(bin, off)
	}})
	mechs = append(mechs, userMech{name: "bpf uprobe", point: "hit", calls: trapCalls, attach: func() (func() (uint64, error), error) {
		set, err := bpfprobe.NewSet(1)
		if err != nil {
			return nil, err
		}
		if _, err := set.Uprobe(bin, "hit", 0); err != nil {
			set.Close()
			return nil, err
		}
		return func() (uint64, error) { n := set.Counter(0); return n, set.Close() }, nil
	}})
	return mechs
}

// countAt counts at s, which must be installed as class c; the function
// it returns takes the count off and says how many hits it counted.
func countAt(tg *process.Target, s *splice.Site, c springboard.Class) (func() (uint64, error), error) {
	reqs, err := tg.Count("bench", []*splice.Site{s})
	if err != nil {
		return nil, err
	}
	remove := func() (uint64, error) {
		n := tg.Counter(reqs[0], 0)
		return n, errors.Join(tg.RemoveEach(reqs)...)
	}
	if got := tg.Installed(reqs[0]).Class; got != c {
		remove()
		return nil, fmt.Errorf("installed as a %v splice, not %v", got, c)
	}
	return remove, nil
}

// firstShort is the first instruction of f (up to its first ret) shorter
// than a jmp rel32, planned as a trap splice (which a process makes a
// punned jmp), nil if none is.
func firstShort(tg *process.Target, f *cfg.Function) *splice.Site {
	for i := range f.Insns {
		if f.Insns[i].Len() < springboard.JmpRel32Len {
			if s, err := tg.ResolveAs(fmt.Sprintf("%s+%#x", f.Name, f.Insns[i].Addr-f.Addr), springboard.Trap); err == nil {
				return s
			}
		}
		if strings.HasPrefix(f.Insns[i].String(), "ret") {
			break
		}
	}
	return nil
}

// firstOfClass is the first instruction of f (up to its first ret) that
// takes a splice of class c, nil if none does.
func firstOfClass(tg *process.Target, f *cfg.Function, c springboard.Class) *splice.Site {
	for i := range f.Insns {
		if s, err := tg.ResolveAs(fmt.Sprintf("%s+%#x", f.Name, f.Insns[i].Addr-f.Addr), c); err == nil {
			return s
		}
		if strings.HasPrefix(f.Insns[i].String(), "ret") {
			break
		}
	}
	return nil
}

// time runs the workload under each mechanism o.Runs times, each run
// beside a bare one, and gives the report's rows: the medians.
func (h *hitLoop) time(mechs []userMech, o HitOptions) ([]output.HitRow, error) {
	ratios := make([][]float64, len(mechs))
	nss := make([][]float64, len(mechs))
	hits := make([]uint64, len(mechs))
	skipped := make([]string, len(mechs))
	attachNS, detachNS := make([][]float64, len(mechs)), make([][]float64, len(mechs))
	var bases []float64
	for r := 0; r < o.Runs; r++ {
		for i, m := range mechs {
			if m.skipped != "" || skipped[i] != "" {
				continue
			}
			calls := o.Calls
			if m.calls != 0 {
				calls = m.calls
			}
			base, err := h.run(calls)
			if err != nil {
				return nil, err
			}
			bases = append(bases, base)
			t0 := time.Now()
			detach, err := m.attach()
			if err != nil {
				skipped[i] = err.Error()
				continue
			}
			attachNS[i] = append(attachNS[i], float64(time.Since(t0)))
			ns, err := h.run(calls)
			t1 := time.Now()
			n, derr := detach()
			detachNS[i] = append(detachNS[i], float64(time.Since(t1)))
			if err != nil {
				return nil, err
			}
			if derr != nil {
				skipped[i] = derr.Error()
				continue
			}
			hits[i] += n
			nss[i] = append(nss[i], ns)
			ratios[i] = append(ratios[i], ns/base)
		}
	}
	rows := []output.HitRow{{Mechanism: "none", NsPerCall: median(bases), Ratio: 1}}
	for i, m := range mechs {
		switch {
		case m.skipped != "":
			rows = append(rows, output.HitRow{Mechanism: m.name, Point: m.point, Skipped: m.skipped})
		case skipped[i] != "":
			rows = append(rows, output.HitRow{Mechanism: m.name, Point: m.point, Skipped: skipped[i]})
		default:
			ratio := median(ratios[i])
			row := output.HitRow{Mechanism: m.name, Point: m.point, NsPerCall: median(nss[i]), Ratio: ratio, Overhead: ratio - 1, Hits: hits[i],
				AttachNS: median(attachNS[i]), DetachNS: median(detachNS[i])}
			if m.calls != 0 {
				row.Calls = uint64(m.calls) * uint64(o.Runs)
			}
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// fileOffset is the file offset of vaddr in the ELF file at path, as
// uprobe_events wants it.
func fileOffset(path string, vaddr uint64) (uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && vaddr >= p.Vaddr && vaddr < p.Vaddr+p.Filesz {
			return vaddr - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("%#x is in no segment of %s", vaddr, path)
}

// attachUprobe defines and enables a tracefs uprobe at path:off; detach
// disables and deletes it and returns its hits from uprobe_profile. A
// tracefs it had to mount is unmounted again: the bench leaves nothing
// mounted that it did not find.
func attachUprobe(path string, off uint64) (func() (uint64, error), error) {
	events := filepath.Join(tracefs, "uprobe_events")
	unmount := func() {}
	if _, err := os.Stat(events); err != nil {
		// Not mounted yet (a fresh host): mount it, as perf does.
		if unix.Mount("nodev", tracefs, "tracefs", 0, "") == nil {
			unmount = func() { unix.Unmount(tracefs, 0) }
		}
		if _, err := os.Stat(events); err != nil {
			unmount()
			return nil, fmt.Errorf("no uprobe_events in %s (mount tracefs there; CONFIG_UPROBE_EVENTS)", tracefs)
		}
	}
	const group, event = "kinst_bench", "uhit"
	if err := appendLine(events, fmt.Sprintf("p:%s/%s %s:%#x", group, event, path, off)); err != nil {
		unmount()
		return nil, err
	}
	enable := filepath.Join(tracefs, "events", group, event, "enable")
	remove := func() {
		os.WriteFile(enable, []byte("0"), 0)
		appendLine(events, "-:"+group+"/"+event)
		unmount()
	}
	if err := os.WriteFile(enable, []byte("1"), 0); err != nil {
		remove()
		return nil, err
	}
	return func() (uint64, error) {
		n, err := uprobeHits(filepath.Join(tracefs, "uprobe_profile"), event)
		remove()
		return n, err
	}, nil
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(line + "\n")
	return err
}

// uprobeHits reads an event's hits from uprobe_profile, whose lines are
// "  PATH EVENT HITS".
func uprobeHits(profile, event string) (uint64, error) {
	b, err := os.ReadFile(profile)
	if err != nil {
		return 0, err
	}
	return parseUprobeProfile(string(b), event)
}

func parseUprobeProfile(s, event string) (uint64, error) {
	for _, l := range strings.Split(s, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[1] == event {
			var n uint64
			_, err := fmt.Sscan(f[2], &n)
			return n, err
		}
	}
	return 0, fmt.Errorf("no %s in uprobe_profile", event)
}
