package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/kinst/kinst/internal/outfile"
	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/unwind/flamegraph"
	"github.com/kinst/kinst/unwind/folded"
	"github.com/kinst/kinst/unwind/offcpu"
	"golang.org/x/sys/unix"
)

// OffCPUOptions are the flags of `kinst offcpu`.
type OffCPUOptions struct {
	offcpu.Options
	Trace     bool
	Frequency int           // sampling passes per second
	Duration  time.Duration // 0: until Ctrl-C
	MinBlock  time.Duration // tracing
	MaxBlock  time.Duration // tracing
	// StackStorage sizes the tracer's BPF stack map (distinct stacks).
	StackStorage uint32
	Fold         offcpu.FoldOptions
	Folded       bool   // folded stacks on stdout
	JSON         bool   // JSON report on stdout
	Top          int    // stacks in the text and JSON reports
	SVG          string // write a flame graph here
	Pprof        string // write a pprof profile here
	Title        string
	// NoDemangle keeps C++ and Rust user frames as the symbol tables
	// spell them.
	NoDemangle bool
}

// OffCPU profiles where threads wait, by sampling /proc or by tracing
// sched_switch, and writes the reports o asks for.
func OffCPU(ctx context.Context, o OffCPUOptions, stdout, stderr io.Writer) error {
	if err := checkOffCPU(o); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	until := "until Ctrl-C"
	if o.Duration > 0 {
		until = "for " + o.Duration.String()
	}
	var p *offcpu.Profile
	var err error
	attach := ""
	if o.Trace {
		p, attach, err = traceOffCPU(ctx, o, until, stderr)
	} else {
		p, err = sampleOffCPU(ctx, o, until, stderr)
	}
	if err != nil {
		return err
	}
	if !o.NoDemangle {
		p.Demangle()
	}
	f := p.Folded(o.Fold)
	fmt.Fprintf(stderr, "kinst: %s\n", summary(p, f))
	for _, file := range slices.Sorted(maps.Keys(p.DebugNotes)) {
		fmt.Fprintf(stderr, "kinst: note: %s: %s\n", file, p.DebugNotes[file])
	}
	if o.SVG != "" {
		if err := writeSVG(o, p, f); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "kinst: flame graph in %s\n", o.SVG)
	}
	if o.Pprof != "" {
		if err := outfile.Write(o.Pprof, func(w io.Writer) error { return p.WritePprof(w, o.Fold) }); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "kinst: pprof profile in %s (go tool pprof -top %s)\n", o.Pprof, o.Pprof)
	}
	switch {
	case o.Folded:
		return folded.Write(stdout, f.Stacks())
	case o.JSON:
		r := offCPUReport(p, attach, o.Group, o.Top)
		r.DebugNotes = p.DebugNotes
		return writeJSON(stdout, r)
	case o.SVG != "" || o.Pprof != "":
		return nil
	}
	return writeOffCPUText(stdout, p, o)
}

// checkOffCPU checks o's flags together, and its output paths now rather
// than after a long profile.
func checkOffCPU(o OffCPUOptions) error {
	if o.Folded && o.JSON {
		return errors.New("offcpu: --folded and --json both want stdout; pick one")
	}
	if !o.Trace && (o.MinBlock > 0 || o.MaxBlock > 0) {
		return errors.New("offcpu: --min-block and --max-block measure blocks: they need --trace")
	}
	if !o.Trace && (o.Frequency <= 0 || o.Frequency > 1000) {
		return fmt.Errorf("offcpu: -F %d: want 1 to 1000 passes per second", o.Frequency)
	}
	if !o.Trace && strings.Contains(string(o.States), "R") {
		return errors.New("offcpu: state R (preempted) is only visible with --trace: a sample cannot tell a runnable thread from a running one")
	}
	for _, path := range []string{o.SVG, o.Pprof} {
		if err := checkOutputDir("offcpu", path); err != nil {
			return err
		}
	}
	return nil
}

// traceOffCPU profiles by tracing sched_switch with BPF; it gives the
// profile and how the tracer attached.
func traceOffCPU(ctx context.Context, o OffCPUOptions, until string, stderr io.Writer) (*offcpu.Profile, string, error) {
	t, err := offcpu.NewTracer(offcpu.TraceOptions{Options: o.Options, MinBlock: o.MinBlock, MaxBlock: o.MaxBlock, StackEntries: o.StackStorage})
	if err != nil {
		return nil, "", err
	}
	defer t.Close()
	fmt.Fprintf(stderr, "kinst: tracing sched_switch (%s) %s\n", t.Attach, until)
	if err := traceBeside(ctx, o, t); err != nil {
		return nil, "", err
	}
	p, err := t.Profile()
	return p, t.Attach, err
}

// sampleOffCPU profiles by sampling every thread's state and stack,
// with progress on a terminal.
func sampleOffCPU(ctx context.Context, o OffCPUOptions, until string, stderr io.Writer) (*offcpu.Profile, error) {
	period := time.Second / time.Duration(o.Frequency)
	s, err := offcpu.NewSampler(o.Options, period)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	fmt.Fprintf(stderr, "kinst: sampling off-CPU threads at %d Hz %s\n", o.Frequency, until)
	tty := isTerminal(stderr)
	began, last := time.Now(), time.Now()
	err = s.Run(ctx, o.Duration, func(pass, visited int) {
		if pass == 1 && time.Since(began) > time.Second {
			// Opening every thread and every binary's unwind table.
			fmt.Fprintf(stderr, "kinst: first pass over %d threads took %v\n", visited, time.Since(began).Round(time.Millisecond))
		}
		if tty && time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(stderr, "\r  %d passes, %d threads in the last pass", pass, visited)
		}
	})
	if tty {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		return nil, err
	}
	return s.Profile(), nil
}

func summary(p *offcpu.Profile, f *folded.Profile) string {
	if p.Mode == "trace" {
		var total time.Duration
		var blocks int64
		for _, s := range p.Stacks {
			total += s.OffCPU
			blocks += s.Samples
		}
		msg := fmt.Sprintf("%d blocks, %v off CPU in %d distinct stacks over %.1f s", blocks, total.Round(time.Millisecond), len(p.Stacks), p.Duration.Seconds())
		if p.Lost > 0 {
			msg += fmt.Sprintf("; %d blocks lost their kernel stack (stack map full? raise --stack-storage-size)", p.Lost)
		}
		if p.UserCut > 0 || p.UserCompleted > 0 {
			msg += fmt.Sprintf("; user stacks cut short by frame pointers: %d blocks completed from sampled stacks, %d left cut", p.UserCompleted, p.UserCut)
		}
		return msg
	}
	perPass := 0
	if p.Passes > 0 {
		perPass = p.Threads / p.Passes
	}
	msg := fmt.Sprintf("%d passes over %.1f s, %d threads per pass, %d off-CPU samples in %d distinct stacks (threads read through %s)",
		p.Passes, p.Duration.Seconds(), perPass, f.Total(), f.Len(), p.Source)
	if p.Unreadable > 0 {
		msg += fmt.Sprintf("; %d thread visits unreadable (permissions: run as root to see every user's threads; or the descriptor limit)", p.Unreadable)
	}
	return msg
}

func writeSVG(o OffCPUOptions, p *offcpu.Profile, f *folded.Profile) error {
	title := o.Title
	if title == "" {
		title = "Off-CPU Time Flame Graph"
	}
	sub := fmt.Sprintf("kinst offcpu, %s mode, %.1f s", p.Mode, p.Duration.Seconds())
	if p.Mode == "sample" {
		sub += fmt.Sprintf(", %d passes every %v", p.Passes, p.Period.Round(time.Microsecond))
	}
	return outfile.Write(o.SVG, func(w io.Writer) error {
		return flamegraph.Render(w, f.Stacks(), flamegraph.Options{Title: title, Subtitle: sub, Unit: p.Unit()})
	})
}

// writeOffCPUText prints the heaviest stacks, innermost frame first, as
// BCC's offcputime does without -f.
func writeOffCPUText(w io.Writer, p *offcpu.Profile, o OffCPUOptions) error {
	top := p.Top(o.Top)
	tw := newTable(w, 0, 8, 2, ' ', 0)
	for _, s := range top {
		if !o.Fold.UserOnly {
			for _, k := range s.Kernel {
				fmt.Fprintf(tw, "    %s\n", k)
			}
		}
		if !o.Fold.UserOnly && !o.Fold.KernelOnly {
			fmt.Fprintf(tw, "    --\n")
		}
		if !o.Fold.KernelOnly {
			for _, u := range s.User {
				fmt.Fprintf(tw, "    %s\n", u)
			}
			if s.UserError != "" {
				fmt.Fprintf(tw, "    [%s]\n", s.UserError)
			}
		}
		who := s.Group
		if s.TID != 0 {
			who += fmt.Sprintf(" (tid %d)", s.TID)
		} else if s.PID != 0 {
			who += fmt.Sprintf(" (pid %d)", s.PID)
		}
		fmt.Fprintf(tw, "    -\t%s\tstate %s\twchan %s\n", who, s.State, orDash(s.Wchan))
		if p.Mode == "trace" {
			fmt.Fprintf(tw, "        %v in %d blocks\n\n", s.OffCPU.Round(time.Microsecond), s.Samples)
		} else {
			fmt.Fprintf(tw, "        %d samples (~%v)\n\n", s.Samples, s.OffCPU.Round(time.Millisecond))
		}
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// offCPUReport is the JSON report of p, with its top stacks: every key
// present, null where it does not apply to the mode or the grouping (see
// output.OffCPUReport).
func offCPUReport(p *offcpu.Profile, attach string, g offcpu.Group, top int) output.OffCPUReport {
	r := output.OffCPUReport{Mode: p.Mode, DurationNS: int64(p.Duration), Stacks: len(p.Stacks), Top: []output.OffCPUStack{}}
	if p.Mode == "trace" {
		r.Attach, r.Lost = &attach, &p.Lost
		r.UserCut, r.UserCompleted = &p.UserCut, &p.UserCompleted
	} else {
		period := int64(p.Period)
		r.PeriodNS, r.Passes, r.Visits, r.Unreadable = &period, &p.Passes, &p.Threads, &p.Unreadable
		r.Source = &p.Source
	}
	for _, s := range p.Stacks {
		r.TotalNS += int64(s.OffCPU)
	}
	for _, s := range p.Top(top) {
		j := output.OffCPUStack{Group: s.Group, State: s.State, Wchan: s.Wchan, Kernel: s.Kernel, User: s.User,
			UserError: s.UserError, Samples: s.Samples, OffCPUNS: int64(s.OffCPU)}
		switch g {
		case offcpu.ByTID:
			j.TID = &s.TID
			fallthrough
		case offcpu.ByPID:
			j.PID = &s.PID
		}
		r.Top = append(r.Top, j)
	}
	return r
}

// traceBeside waits for the trace to end while, unless --kernel-only, a
// sampler unwinds the same threads' user stacks with DWARF CFI at -F
// passes per second: Profile completes with them the user stacks that
// frame pointers cut short.
func traceBeside(ctx context.Context, o OffCPUOptions, t *offcpu.Tracer) error {
	if ctx.Err() != nil {
		return nil
	}
	if o.KernelOnly || o.Frequency <= 0 {
		t.Wait(ctx, o.Duration)
		return nil
	}
	so := o.Options
	so.UserOnly, so.States = true, ""
	s, err := offcpu.NewSampler(so, time.Second/time.Duration(o.Frequency))
	if err != nil {
		return err
	}
	defer s.Close()
	t.CompleteFrom(s)
	start := time.Now()
	if err := s.Run(ctx, o.Duration, nil); err != nil {
		// The process went away, say: the trace goes on without it.
		if o.Duration == 0 {
			t.Wait(ctx, 0)
		} else if rest := o.Duration - time.Since(start); rest > 0 {
			t.Wait(ctx, rest)
		}
	}
	return nil
}
