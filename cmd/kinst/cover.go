package main

import (
	"context"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var coverCommand = &command{
	name:    "cover",
	args:    "TARGET… [-- CMD…]",
	summary: "which basic blocks of kernel functions run, with probes that remove themselves",
	help: `TARGET is a kernel function or a glob over function names (vfs_*, 'ext4_*').
Every basic block gets one probe, at its cheapest spliceable instruction
(direct < springboard < covering < trap splice), that records its first run
(movb $1 into the counter heap; guarded by --pid or --comm when given).
kerninstd looks at the flags every 50 ms and removes the probes that have run,
in batches, so the overhead falls as coverage saturates. A block that cannot
take a probe is reported with the reason.

Coverage runs until --duration ends, CMD exits (kinst then exits with its
status) or Ctrl-C; then the remaining probes are removed and the report
printed: per function and per block (indices as kinst cfg prints them), and
the live probes over time.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.CoverOptions
		durationFlag(fs, &o.Duration, "stop after this long (default: until Ctrl-C, or until CMD exits)")
		pidFlag(fs, &o.Filter.PID, "cover only this process's execution (its tgid)")
		fs.StringVar(&o.Filter.Comm, "comm", "", "cover only the execution of tasks with this command `name` (up to 15 bytes)")
		sessionFlags(fs, &o.Name, &o.TTL)
		jsonCmdFlag(fs, &o.JSON, "the report")
		return func(ctx context.Context, inv invocation) (int, error) {
			o.Targets, o.Command = inv.args, inv.command
			if len(o.Targets) == 0 {
				return 2, usagef("name at least one kernel function or glob (vfs_*)")
			}
			return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.Cover(ctx, inv.client(), o, env) })
		}
	},
}
