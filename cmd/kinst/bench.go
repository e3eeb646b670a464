package main

import (
	"context"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var benchCommand = &command{
	name:    "bench",
	summary: "what instrumentation costs: a request's steps, a hit, splice churn, arming many probes, coverage's decay",
	sub:     []*command{benchSpliceCommand, benchHitCommand, benchChurnCommand, benchArmCommand, benchDecayCommand},
}

var benchDecayCommand = &command{
	name:    "cover-decay",
	args:    "[FUNC]",
	summary: "a system call's throughput as a coverage session's probes remove themselves",
	help: `A loop of stat(2) calls (on --path) runs on one thread throughout: uninstrumented
for --baseline, then under a coverage session over FUNC (default
__x64_sys_newfstatat, the call the loop makes) and its callees --depth calls
down, for --duration from the moment the probes are armed, then uninstrumented
again; --runs times. Prints the loop's throughput per --step relative to the
uninstrumented median (the median over runs), with the probes still live at
each step's end (from the sessions' timelines), and when the throughput came
back to 0.95 of it for good. Runs where kerninstd runs. Guest times under
emulation: read the ratios.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		o := cli.DecayOptions{Callees: "__x64_sys_newfstatat"}
		fs.IntVar(&o.Depth, "depth", 4, "cover FUNC's callees this many `levels` down")
		fs.StringVar(&o.Path, "path", "/", "the `path` the loop stats")
		fs.DurationVar(&o.Step, "step", 100*time.Millisecond, "throughput per step of this `length`")
		fs.DurationVar(&o.Baseline, "baseline", time.Second, "time the loop uninstrumented this long, before and after")
		fs.DurationVarP(&o.Duration, "duration", "d", 3*time.Second, "time the loop under coverage this long after arming")
		fs.IntVar(&o.Runs, "runs", 3, "arm a session this many times in a row (each step's median over runs is kept)")
		jsonFlag(fs, &o.JSON, "the steps")
		return func(ctx context.Context, inv invocation) (int, error) {
			if err := optionalFunc(inv, &o.Callees); err != nil {
				return 2, err
			}
			return inv.reportErr(o.JSON, func(env cli.Env) error { return cli.BenchDecay(ctx, inv.client(), o, env) })
		}
	},
}

var benchSpliceCommand = &command{
	name:    "splice",
	args:    "POINT",
	summary: "latency of each step of an instrumentation request, and of the same request as a tracefs kprobe",
	help: `Steps as KernInst's Figure 4: resolve (lookup, read, decode, classify,
liveness), patch allocation, codegen (build and verify, with relocation),
patch write, springboard slot, splice and unsplice, free. --kprobe times
the same request as a tracefs kprobe first (run it in a VM booted with
kinst vm up --accel tcg-single: see docs/splicing.md's known issue).`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		cycles := fs.IntP("cycles", "n", 1000, "splice/unsplice cycles")
		kprobe := fs.Bool("kprobe", false, "also time the same request as a tracefs kprobe (root, tracefs)")
		var asJSON bool
		jsonFlag(fs, &asJSON, "the step timings")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("want one POINT")
			}
			return inv.reportErr(asJSON, func(env cli.Env) error {
				return cli.BenchSplice(ctx, inv.client(), inv.args[0], *cycles, *kprobe, asJSON, env)
			})
		}
	},
}

var benchHitCommand = &command{
	name:    "hit",
	args:    "[FUNC]",
	summary: "per-hit cost of direct, springboard, covering and trap splices against int3, optimized and BPF kprobes",
	help: `Per-call cost of a getppid(2) loop with a counter at FUNC (default
__x64_sys_getppid): bare, each splice class, int3 and optimized tracefs
kprobes, and a BPF kprobe counting in an array map. Every row's hits should
be calls × runs. Runs where kerninstd runs (as root, for tracefs and BPF).
Guest times under emulation: read the ratios. With --user, the same
comparison in a user process on this machine (see --user).`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.HitOptions
		fs.IntVar(&o.Calls, "calls", 100000, "system calls per timed run")
		fs.IntVar(&o.Runs, "runs", 3, "timed runs per mechanism (the median is kept)")
		jsonFlag(fs, &o.JSON, "the rows")
		user := fs.Bool("user", false, "measure in a user process on this machine instead: a tight loop calling a small function (built with gcc), bare, with kinst's splices of each class, a punned jump among them (ptrace and a shared memfd; no kerninstd), a tracefs uprobe and a BPF uprobe; needs root; real hardware time")
		return func(ctx context.Context, inv invocation) (int, error) {
			if *user {
				if !fs.Changed("calls") {
					o.Calls = 10_000_000
				}
				if !fs.Changed("runs") {
					o.Runs = 5
				}
				return inv.reportErr(o.JSON, func(env cli.Env) error { return cli.BenchHitUser(ctx, o, env) })
			}
			o.Function = "__x64_sys_getppid"
			if err := optionalFunc(inv, &o.Function); err != nil {
				return 2, err
			}
			return inv.reportErr(o.JSON, func(env cli.Env) error { return cli.BenchHit(ctx, inv.client(), o, env) })
		}
	},
}

var benchChurnCommand = &command{
	name:    "churn",
	args:    "[POINT…] [-f FUNC…]",
	summary: "cycles of splice, re-splice and unsplice over many points",
	help: `Cycles of splice, re-splice and unsplice over a pool of points, through the
path sessions take: each cycle adds a counter at three points of the pool, a
second one at two of them and one more, then removes all six. A point that
already has a request (a session's) is re-spliced, never unspliced. Run it
with a workload going to stress the splice protocol; every point must read
back as the kernel's own bytes at the end.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var req api.ChurnRequest
		fs.StringSliceVarP(&req.Functions, "function", "f", nil, "add every instruction of `FUNC` that may be spliced to the pool (repeatable)")
		fs.IntVarP(&req.Cycles, "cycles", "n", 1000, "cycles")
		fs.Int64Var(&req.Seed, "seed", 1, "seed of the choice of points")
		var asJSON bool
		jsonFlag(fs, &asJSON, "the change timings")
		return func(ctx context.Context, inv invocation) (int, error) {
			req.Points = inv.args
			if len(req.Points) == 0 && len(req.Functions) == 0 {
				return 2, usagef("want POINTs or --function FUNC")
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.BenchChurn(ctx, inv.client(), req, asJSON, env) })
		}
	},
}

var benchArmCommand = &command{
	name:    "arm",
	args:    "[TARGET…]",
	summary: "arm and remove coverage probes at thousands of blocks: batched against one at a time",
	help: `Arms a coverage probe (a hit flag, as kinst cover does) at the first N
basic blocks that take one, taken in address order from the TARGETs'
functions (functions or globs; default every function of the kernel),
then removes them all, and reports the wall time and the driver's CPU
synchronisation rounds (one IPI to every CPU each) of both halves.
Batched, the driver splices up to its batch size (4,096) in one round of
the cross-modification protocol: int3 everywhere, sync, tails, sync,
first bytes, sync. --single splices one at a time, as requests usually
are, for comparison. Blocks already instrumented are skipped. --all arms every
block that takes a probe: with no TARGET, the whole kernel (about 540,000
blocks of 6.1), the whole-kernel session the live tests soak. --skip K
passes over the first K of those blocks, so that a bisection of a
failing run can drop blocks from the front while keeping its last one
(the report names the first and last block armed). A batched arm's time
is split by stage: prepare (points, requests and springboard slots, on
one CPU), build (patches sized, allocated, generated and verified, on
every CPU), write (patches into the heap, read back) and splice (the
driver's batches, of which the time inside the driver is given too).`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.ArmOptions
		fs.IntSliceVarP(&o.Blocks, "blocks", "n", []int{1000, 10000}, "block counts, one run each")
		fs.BoolVar(&o.Single, "single", false, "also arm one splice at a time (slow: several sync rounds a probe)")
		fs.BoolVarP(&o.All, "all", "a", false, "one run over every block of the targets that takes a probe (--blocks is ignored)")
		fs.IntVar(&o.Skip, "skip", 0, "pass over the first `K` blocks that take a probe before arming any")
		jsonFlag(fs, &o.JSON, "the runs")
		return func(ctx context.Context, inv invocation) (int, error) {
			o.Targets = inv.args
			if o.Skip < 0 {
				return 2, usagef("--skip %d: want 0 or more", o.Skip)
			}
			for _, n := range o.Blocks {
				if n <= 0 {
					return 2, usagef("--blocks %d: want a positive count", n)
				}
			}
			return inv.reportErr(o.JSON, func(env cli.Env) error { return cli.BenchArm(ctx, inv.client(), o, env) })
		}
	},
}

// optionalFunc sets *fn to the command's one positional FUNC, if given
// (else *fn keeps its default).
func optionalFunc(inv invocation, fn *string) error {
	switch len(inv.args) {
	case 0:
	case 1:
		*fn = inv.args[0]
	default:
		return usagef("want at most one FUNC")
	}
	return nil
}
