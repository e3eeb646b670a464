package main

import (
	"context"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var annotateCommand = &command{
	name:    "annotate",
	args:    "FUNC [-- CMD…]",
	summary: "a kernel function's instructions and source lines with per-block counts or coverage",
	help: `Prints FUNC block by block: each block's count, then its instructions, with
the source line (from the debug vmlinux: --vmlinux PATH, else the running
kernel's) above each instruction whose line changes, as perf annotate does.
The counts come from a live run: a counter at every block that takes one
(kinst cfg shows why the others do not), for --duration, for CMD's lifetime,
or until Ctrl-C; the counters are then removed. With --from REPORT, the
blocks are marked covered or not from a saved kinst cover --json report
instead, and nothing is installed.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.AnnotateOptions
		durationFlag(fs, &o.Duration, "count for this long (default: until Ctrl-C, or until CMD exits)")
		fs.StringVar(&o.From, "from", "", "mark coverage from this kinst cover --json `REPORT` instead of counting")
		vmlinuxFlag(fs, &o.Debug)
		jsonCmdFlag(fs, &o.JSON, "the blocks (index, start, count or covered, refused) with their instructions (offset, text, line)")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("want one FUNC")
			}
			if o.From != "" && (len(inv.command) > 0 || fs.Changed("duration")) {
				return 2, usagef("--from reads a saved report: no -- CMD or --duration")
			}
			o.Function, o.Command = inv.args[0], inv.command
			return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.AnnotateFunction(ctx, inv.client(), o, env) })
		}
	},
}
