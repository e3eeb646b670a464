package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

const timeHelp = `Splices the function's entry and every exit (ret, return-thunk jumps, tail
calls, indirect jumps) and reports calls/s, total and average wall time, and
concurrency: the average number of threads inside (KernInst's AOT). --virtual
adds on-CPU time, through a hook in the context switch.

FILE:A-B (or FILE:LINE) times the code of those source lines as a region, in
every function holding it (inlined copies included), from the kernel's debug
vmlinux (--vmlinux; a module's as MODULE:FILE:A-B, from its debug file): a
thread is inside from when control passes into the lines' instructions (and
the code of calls inlined on them) until it passes out, the calls they make
included. One snippet serves every edge into its instruction, so where the
range's code and other code lead to one instruction, the few instructions of
the smaller side go with the larger (the branch that skips a conditional call
is timed with it; the jmp that ends an if's arm is left out). Calls counts the
passes into the range from code before it. A range the timer cannot follow (a
call outside it and the range's code leading to one instruction, or code that
branches to a .cold part) is refused with the address. With --user, a line
range is the executable's, from its DWARF (build it with -g) or its debug
file by build id, or a library's as LIB:FILE:A-B.

Rates print every --interval until --duration ends, CMD exits (kinst then
exits with its status; ended by --duration it gets SIGTERM, and kinst exits
0) or Ctrl-C; then the totals, and the splices are removed.
Live rows and CMD's output share stdout: -o FILE keeps the report apart.`

var timeCommand = &command{
	name:    "time",
	args:    "FUNC|FILE:A-B… [-- CMD…]",
	summary: "calls/s, average and total wall time and concurrency of kernel functions or source line ranges",
	help:    timeHelp,
	daemon:  true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.TimeOptions
		pidFlag(fs, &o.Filter.PID, "count only calls made by this process (its tgid)")
		tidFlag(fs, &o.Filter.TID, "count only calls made by this thread")
		fs.StringVar(&o.Filter.Comm, "comm", "", "count only calls made by tasks with this command `name` (up to 15 bytes)")
		fs.BoolVar(&o.Virtual, "virtual", false, "also measure on-CPU (virtual) time")
		timeFlags(fs, &o)
		vmlinuxFlag(fs, &o.Debug)
		user := fs.Bool("user", false, "time FUNC (FUNC or LIB:FUNC) in the user process -p PID instead of the kernel, or with -p 0 in -- CMD, started and spliced at its entry point (its libraries mapped, none of its code run); the engine runs in kinst through ptrace (no kerninstd)")
		return func(ctx context.Context, inv invocation) (int, error) {
			o.Functions, o.Command = inv.args, inv.command
			o.TotalsOnly = fs.Changed("interval") && o.Interval == 0
			if len(o.Functions) == 0 {
				return 2, usagef("name at least one kernel function or source line range (FILE:A-B)")
			}
			if err := checkKernelPID(fs, "time", o.Filter.PID, *user); err != nil {
				return 2, err
			}
			if *user {
				pid := o.Filter.PID
				o.Filter.PID = 0
				if !fs.Changed("pid") || pid < 0 || (pid == 0) == (len(o.Command) == 0) {
					return 2, usagef("--user -p PID names a running process, or --user -p 0 with -- CMD a command to start")
				}
				ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
				defer stop()
				return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.TimeProcess(ctx, pid, o, env) })
			}
			return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.Time(ctx, inv.client(), o, env) })
		}
	},
}

var waitersCommand = &command{
	name:    "waiters",
	args:    "LOCKSYM|0xADDR [-- CMD…]",
	summary: "average number of tasks waiting for one kernel mutex",
	help: `mutex_lock's slow path is timed for that lock only: concurrency is the
average number of waiters, avg virtual the spinning part of a wait.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.TimeOptions
		timeFlags(fs, &o)
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("name one lock: a kernel data symbol or 0xADDR")
			}
			o.Lock, o.Command = inv.args[0], inv.command
			o.TotalsOnly = fs.Changed("interval") && o.Interval == 0
			return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.Time(ctx, inv.client(), o, env) })
		}
	},
}

// timeFlags are the flags time and waiters share.
func timeFlags(fs *pflag.FlagSet, o *cli.TimeOptions) {
	durationFlag(fs, &o.Duration, "stop after this long (default: until Ctrl-C, or until CMD exits)")
	intervalFlag(fs, &o.Interval, "print rates this often (0: only the totals at the end)")
	sessionFlags(fs, &o.Name, &o.TTL)
	svgFlag(fs, &o.SVG, "a chart of calls/s and concurrency (waiters) over time")
	jsonCmdFlag(fs, &o.JSON, "one report")
}

var drilldownCommand = &command{
	name:    "drilldown",
	args:    "FUNC -- CMD…",
	summary: "where a kernel path's time goes: FUNC's heaviest callees, level by level",
	help: `Times FUNC and the functions it calls directly over one run of CMD, follows
the callee with the most wall time, and repeats: KernInst's way of finding
where a path's time goes. CMD runs once per level.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		o := cli.DrillOptions{}
		fs.IntVar(&o.Depth, "depth", 4, "levels to descend at most")
		fs.IntVar(&o.Callees, "callees", 24, "callees timed per level at most (first call sites first)")
		fs.Float64Var(&o.MinShare, "min-share", 0.3, "stop when the heaviest callee has less than this share of its caller's wall time")
		jsonCmdFlag(fs, &o.JSON, "the levels")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 || len(inv.command) == 0 {
				return 2, usagef("name one function to start from and a workload: drilldown FUNC -- CMD…")
			}
			o.Root, o.Command = inv.args[0], inv.command
			return inv.reportErr(o.JSON, func(env cli.Env) error { return cli.DrillDown(ctx, inv.client(), o, env) })
		}
	},
}
