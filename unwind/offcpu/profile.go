// Package offcpu owns off-CPU profiling: where threads wait, and for how
// long. Two collectors fill one Profile:
//
//   - Sampler (the default) wakes at an interval and, for every thread that
//     is not running, reads its state, kernel stack and (for a thread
//     blocked in a system call) user stack from /proc without stopping it.
//     Its cost is proportional to the number of threads, not to the
//     scheduler event rate — Brendan Gregg's FreeBSD procstat method, with
//     cached /proc file descriptors and binary-search symbolisation.
//   - Tracer attaches a BPF program to the sched_switch tracepoint and
//     measures every block: the time from a thread's switch-out to its next
//     switch-in, summed in the kernel per (process, thread, kernel stack,
//     user stack). User stacks from BPF need frame pointers.
//
// A Profile converts to folded stacks (flamegraph.pl), to the SVG of
// package flamegraph and to a pprof profile.
package offcpu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kinst/kinst/unwind/folded"
)

// Stack is one distinct off-CPU stack and what was measured for it.
type Stack struct {
	// Group is the first frame of the folded stack: the thread name, or
	// what Options.Group asks for.
	Group string `json:"group"`
	PID   int    `json:"pid,omitempty"` // set when grouping by process or thread id
	TID   int    `json:"tid,omitempty"` // set when grouping by thread id
	// State is the thread's scheduler state letter as /proc shows it (S
	// sleeping, D uninterruptible, T stopped, I idle kernel thread, …);
	// in trace mode the state at switch-out, R meaning preempted.
	State string `json:"state,omitempty"`
	// Wchan is the wait channel: the innermost kernel function that is
	// not part of the scheduler, as /proc/PID/wchan reports it.
	Wchan string `json:"wchan,omitempty"`
	// Kernel and User are function names, innermost first.
	Kernel []string `json:"kernel,omitempty"`
	User   []string `json:"user,omitempty"`
	// UserError says why the user stack is missing or truncated.
	UserError string `json:"user_error,omitempty"`
	// Samples counts samples (sampling) or blocks (tracing).
	Samples int64 `json:"samples"`
	// OffCPU is the time off CPU: measured when tracing, estimated as
	// the run's duration × samples / passes when sampling (a thread off
	// CPU in every pass gets the whole run).
	OffCPU time.Duration `json:"off_cpu_ns"`
}

// Profile is the result of a collection.
type Profile struct {
	Mode     string        `json:"mode"` // "sample" or "trace"
	Start    time.Time     `json:"start"`
	Duration time.Duration `json:"duration_ns"`
	// Period is the sampling interval (sampling mode only).
	Period time.Duration `json:"period_ns,omitempty"`
	// Passes is how many sampling passes ran; Threads how many thread
	// visits they made in total.
	Passes  int `json:"passes,omitempty"`
	Threads int `json:"thread_visits,omitempty"`
	// Unreadable counts thread visits whose /proc files could not be
	// opened (descriptor limit, permissions).
	Unreadable int `json:"unreadable,omitempty"`
	// Lost counts events the tracer could not record (full maps,
	// stack-id collisions).
	Lost   int64   `json:"lost,omitempty"`
	Stacks []Stack `json:"stacks"`
	// DebugNotes say, per file whose frames symbolisation looked up a
	// separate debug file for, why none was found.
	DebugNotes map[string]string `json:"debug_notes,omitempty"`

	// UserCut counts traced blocks whose user stack was cut short (frame
	// pointers ended) and could not be completed from a sampled stack of
	// the same thread; UserCompleted those that were (trace mode only).
	UserCut       int64 `json:"user_cut_blocks,omitempty"`
	UserCompleted int64 `json:"user_completed_blocks,omitempty"`
	// Source is where sampling read the threads: "bpf_iter" (the BPF
	// task iterator) or "proc" (the /proc files).
	Source string `json:"source,omitempty"`
}

// FoldOptions choose what goes into folded stacks.
type FoldOptions struct {
	KernelOnly bool // leave out user frames
	UserOnly   bool // leave out kernel frames
	// Delimiter puts a "-" frame between the user and kernel stacks, as
	// BCC's offcputime -d does.
	Delimiter bool
	// State adds the scheduler state as a frame after the group
	// ("[S]", "[D]").
	State bool
}

// KernelSuffix marks kernel frames in folded stacks, the convention of
// perf and flamegraph.pl's colour palettes.
const KernelSuffix = "_[k]"

// Frames returns s as folded frames, root first.
func (s *Stack) Frames(o FoldOptions) []string {
	out := make([]string, 0, 2+len(s.User)+len(s.Kernel))
	out = append(out, s.Group)
	if o.State && s.State != "" {
		out = append(out, "["+s.State+"]")
	}
	if !o.KernelOnly {
		for i := len(s.User) - 1; i >= 0; i-- {
			out = append(out, s.User[i])
		}
	}
	if o.Delimiter && !o.KernelOnly && !o.UserOnly {
		out = append(out, "-")
	}
	if !o.UserOnly {
		for i := len(s.Kernel) - 1; i >= 0; i-- {
			out = append(out, s.Kernel[i]+KernelSuffix)
		}
	}
	return out
}

// Value is what a folded line counts: samples when sampling, microseconds
// off CPU when tracing (BCC's unit, so flamegraph.pl --countname=us fits).
func (p *Profile) Value(s *Stack) int64 {
	if p.Mode == "trace" {
		return int64(s.OffCPU / time.Microsecond)
	}
	return s.Samples
}

// Unit names what Value counts.
func (p *Profile) Unit() string {
	if p.Mode == "trace" {
		return "us"
	}
	return "samples"
}

// Folded aggregates the profile into folded stacks; stacks that become
// equal under o (say, differing only in user frames with KernelOnly)
// merge.
func (p *Profile) Folded(o FoldOptions) *folded.Profile {
	f := folded.New()
	for i := range p.Stacks {
		if v := p.Value(&p.Stacks[i]); v > 0 {
			f.Add(p.Stacks[i].Frames(o), v)
		}
	}
	return f
}

// merge adds up stacks that are equal once symbolised (raw stacks differ
// by address: the same code in two processes, or a user stack cut short
// at different garbage words).
func merge(stacks []Stack) []Stack {
	index := map[string]int{}
	out := stacks[:0]
	for _, st := range stacks {
		key := strings.Join([]string{st.Group, strconv.Itoa(st.PID), strconv.Itoa(st.TID), st.State, st.UserError,
			strings.Join(st.Kernel, ";"), strings.Join(st.User, ";")}, "\x00")
		if i, ok := index[key]; ok {
			out[i].Samples += st.Samples
			out[i].OffCPU += st.OffCPU
			continue
		}
		index[key] = len(out)
		out = append(out, st)
	}
	return out
}

// Top returns the n stacks with the most off-CPU time (all when n <= 0).
func (p *Profile) Top(n int) []Stack {
	out := slices.Clone(p.Stacks)
	slices.SortStableFunc(out, func(a, b Stack) int {
		if a.OffCPU != b.OffCPU {
			if a.OffCPU > b.OffCPU {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Group, b.Group)
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// Group says what the first frame of each stack names.
type Group int

const (
	ByThreadName  Group = iota // the thread's name (comm), like BCC's offcputime
	ByProcessName              // the process's name
	ByPID                      // process name and pid: "name-1234"
	ByTID                      // thread name and tid: "name-1234"
)

// ParseGroup parses "thread", "process", "pid" or "tid".
func ParseGroup(s string) (Group, error) {
	switch s {
	case "thread", "comm":
		return ByThreadName, nil
	case "process":
		return ByProcessName, nil
	case "pid":
		return ByPID, nil
	case "tid":
		return ByTID, nil
	}
	return 0, fmt.Errorf("unknown grouping %q: want thread, process, pid or tid", s)
}

func (g Group) label(procName, threadName string, pid, tid int) (string, int, int) {
	switch g {
	case ByProcessName:
		return procName, 0, 0
	case ByPID:
		return procName + "-" + strconv.Itoa(pid), pid, 0
	case ByTID:
		return threadName + "-" + strconv.Itoa(tid), pid, tid
	}
	return threadName, 0, 0
}

// States is a set of scheduler state letters.
type States string

// ParseStates accepts letters such as "S", "D", "SD" or "S,D". The letters
// are those of /proc/PID/stat; R (runnable, preempted) only makes sense
// when tracing.
func ParseStates(s string) (States, error) {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case ',', ' ':
			continue
		case 'R', 'S', 'D', 'T', 't', 'I', 'P', 'W', 'K', 'X', 'Z':
			b.WriteRune(r)
		default:
			return "", fmt.Errorf("unknown thread state %q in %q: want letters of S (sleeping), D (uninterruptible), T (stopped), t (traced), I (idle), R (preempted, tracing only)", r, s)
		}
	}
	return States(b.String()), nil
}

// Has reports whether the set holds the state c; an empty set holds all.
func (s States) Has(c byte) bool { return s == "" || strings.IndexByte(string(s), c) >= 0 }
