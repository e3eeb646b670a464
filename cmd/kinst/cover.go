package main

import (
	"context"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var coverCommand = &command{
	name:    "cover",
	args:    "[TARGET…] [--module MOD] [--callees FUNC [--depth N]] [-- CMD…]",
	summary: "which basic blocks of kernel functions run, with probes that remove themselves",
	help: `TARGET is a kernel function or a glob over function names (vfs_*, 'ext4_*');
--module MOD adds every function of a loaded module's text, --callees FUNC
adds FUNC and the functions it calls directly or by tail call, --depth calls
down (the edges kinst cfg --calls lists; indirect calls are not followed).
They combine; each function is covered once.

Every basic block gets one probe, at its cheapest spliceable instruction
(direct < springboard < covering < trap splice), that records its first run
(movb $1 into the counter heap; guarded by --pid or --comm when given).
kerninstd looks at the flags every 50 ms and removes the probes that have run,
in batches, so the overhead falls as coverage saturates. A block that cannot
take a probe is reported with the reason.

Coverage runs until --duration ends, CMD exits (kinst then exits with its
status) or Ctrl-C; then the remaining probes are removed and the report
printed: per function and per block (indices as kinst cfg prints them), and
the live probes over time. --svg FILE draws that timeline: live probes
falling as blocks are covered (the overhead's decay), above blocks covered.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.CoverOptions
		durationFlag(fs, &o.Duration, "stop after this long (default: until Ctrl-C, or until CMD exits)")
		pidFlag(fs, &o.Filter.PID, "cover only this process's execution (its tgid)")
		fs.StringVar(&o.Filter.Comm, "comm", "", "cover only the execution of tasks with this command `name` (up to 15 bytes)")
		fs.StringSliceVar(&o.Modules, "module", nil, "cover every function of the loaded module `MOD`'s text (repeatable; names as lsmod prints them: ext4, virtio_net)")
		fs.StringSliceVar(&o.Callees, "callees", nil, "cover `FUNC` and the functions it calls directly or by tail call (repeatable; see --depth)")
		fs.IntVar(&o.Depth, "depth", 1, "with --callees: follow calls this many `levels` down (1: FUNC and its direct callees)")
		sessionFlags(fs, &o.Name, &o.TTL)
		svgFlag(fs, &o.SVG, "a chart of live probes and covered blocks over time")
		jsonCmdFlag(fs, &o.JSON, "the report")
		return func(ctx context.Context, inv invocation) (int, error) {
			o.Targets, o.Command = inv.args, inv.command
			if len(o.Targets) == 0 && len(o.Modules) == 0 && len(o.Callees) == 0 {
				return 2, usagef("name at least one kernel function or glob (vfs_*), --module MOD or --callees FUNC")
			}
			if fs.Changed("depth") && len(o.Callees) == 0 {
				return 2, usagef("--depth goes with --callees FUNC")
			}
			if o.Depth < 1 {
				return 2, usagef("--depth %d: want 1 or more (name FUNC alone as a TARGET to cover just it)", o.Depth)
			}
			return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.Cover(ctx, inv.client(), o, env) })
		}
	},
}
