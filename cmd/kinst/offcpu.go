package main

import (
	"context"

	"github.com/kinst/kinst/app/cli"
	"github.com/kinst/kinst/unwind/offcpu"
	"github.com/spf13/pflag"
)

const offcpuHelp = `Runs on this host (no kerninstd needed), as root.

Sampling (default): every 1/F s, every thread that is not running: its
state, its kernel stack (/proc/PID/task/TID/stack) and, for a thread
blocked in a system call, its user stack, read without stopping it and
unwound with the DWARF CFI of its binaries (frame pointers not needed).
Every thread's state, registers and kernel stack come from one read of a
BPF task iterator (Linux 5.15+), else from its /proc files.
Cost grows with the number of threads, not with the scheduler event rate.

Tracing (--trace): a BPF program on sched_switch (tp_btf, else a raw
tracepoint; Linux 5.18+) measures every block from switch-out to switch-in,
summed in the kernel per stack. User stacks come from bpf_get_stackid,
which follows frame pointers: through code built without them the walk
stops early. Meanwhile the same threads are sampled at -F passes per
second and their user stacks unwound with DWARF CFI; a traced user stack
cut short takes its outer frames from a sampled stack of the same thread
that agrees with it from the innermost frame on. The report counts the
blocks so completed and those left cut (user_completed_blocks,
user_cut_blocks). Threads blocked since before the trace started are
not seen; blocks still in progress at the end count up to the end.

Outputs: a text report of the top stacks (default), folded stacks for
flamegraph.pl (--folded), an interactive SVG flame graph (--svg), a pprof
profile for go tool pprof (--pprof), JSON (--json). C++ and Rust names
are demangled in all of them (see --no-demangle). Internal functions of
stripped libraries are named through their separate debug files or
debuginfod (DEBUGINFOD_URLS), looked up once the profile ends, and Go
binaries linked without DWARF unwind by their .gopclntab: see kinst
unwind stack --help.

Examples:
  kinst offcpu -p 1234 --duration 10s --svg offcpu.svg
  kinst offcpu --state D --kernel-only --folded --duration 5s -o d.folded
  kinst offcpu --trace --min-block 1ms -p 1234 --duration 10s --pprof off.pb.gz`

var offcpuCommand = &command{
	name:    "offcpu",
	summary: "off-CPU profile of this host: where threads wait, and for how long",
	help:    offcpuHelp,
	report:  true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.OffCPUOptions
		var states, group string
		fs.BoolVar(&o.Trace, "trace", false, "trace every block with BPF on sched_switch instead of sampling")
		fs.IntVarP(&o.Frequency, "frequency", "F", 49, "sampling passes per second (with --trace: of the sampling that completes user stacks; 0 turns it off)")
		durationFlag(fs, &o.Duration, "stop after this long (default: until Ctrl-C)")
		pidFlag(fs, &o.PID, "only this process")
		tidFlag(fs, &o.TID, "only this thread")
		fs.BoolVarP(&o.UserThreadsOnly, "user-threads-only", "u", false, "leave out kernel threads")
		fs.BoolVarP(&o.KernelThreadsOnly, "kernel-threads-only", "k", false, "only kernel threads")
		fs.StringVar(&states, "state", "", "only threads in these `states`: letters of S (sleeping), D (uninterruptible), T, t, I, and R (preempted; --trace only)")
		fs.BoolVar(&o.KernelOnly, "kernel-only", false, "kernel stacks only")
		fs.BoolVar(&o.UserOnly, "user-only", false, "user stacks only")
		fs.DurationVar(&o.MinBlock, "min-block", 0, "--trace: ignore blocks shorter than this")
		fs.DurationVar(&o.MaxBlock, "max-block", 0, "--trace: ignore blocks longer than this")
		fs.Uint32Var(&o.StackStorage, "stack-storage-size", 16384, "--trace: distinct stacks the BPF stack map holds (a full map loses stacks, counted as lost)")
		fs.StringVar(&group, "group", "thread", "first frame of each stack: thread (name), process (name), pid (name-PID) or tid (name-TID)")
		valuesOf(fs, "group", "thread", "process", "pid", "tid")
		fs.BoolVar(&o.Folded, "folded", false, "print folded stacks (flamegraph.pl input): comm;frame;…;frame count")
		fs.BoolVar(&o.Fold.Delimiter, "delimiter", false, "put a \"-\" frame between user and kernel stacks")
		fs.BoolVar(&o.Fold.State, "state-frame", false, "put the thread state ([S], [D], …) after the first frame")
		fs.StringVar(&o.SVG, "svg", "", "write an interactive SVG flame graph to `FILE`")
		fs.StringVar(&o.Title, "title", "", "title of the flame graph")
		fs.StringVar(&o.Pprof, "pprof", "", "write a pprof profile (gzipped protobuf) to `FILE`")
		jsonFlag(fs, &o.JSON, "the top stacks")
		fs.IntVar(&o.Top, "top", 20, "stacks in the text and JSON reports (0: all)")
		noDemangleFlag(fs, &o.NoDemangle)
		fs.BoolVar(&o.IncludeSelf, "include-self", false, "also profile kinst's own threads")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) > 0 {
				return 2, usagef("unexpected argument %q", inv.args[0])
			}
			var err error
			if o.States, err = offcpu.ParseStates(states); err != nil {
				return 2, usageError{err}
			}
			if o.Group, err = offcpu.ParseGroup(group); err != nil {
				return 2, usageError{err}
			}
			if o.KernelOnly && o.UserOnly {
				return 2, usagef("--kernel-only and --user-only exclude each other")
			}
			o.Fold.KernelOnly, o.Fold.UserOnly = o.KernelOnly, o.UserOnly
			return inv.reportErr(o.JSON, func(env cli.Env) error { return cli.OffCPU(ctx, o, env.Out, env.Err) })
		}
	},
}
