package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var annotateCommand = &command{
	name:    "annotate",
	args:    "FUNC [-p PID] [-- CMD…]",
	summary: "a kernel or process function's instructions and source lines with per-block counts or coverage",
	help: `Prints FUNC block by block: each block's count, then its instructions, with
the source line (from the debug vmlinux: --vmlinux PATH, else the running
kernel's) above each instruction whose line changes, as perf annotate does.
The counts come from a live run: a counter at every block that takes one
(kinst cfg shows why the others do not), for --duration, for CMD's lifetime,
or until Ctrl-C; the counters are then removed. With --from REPORT, the
blocks are marked covered or not from a saved kinst cover --json report
instead, and nothing is installed. With --session NAME, they are marked from
a session already running in kerninstd (a kinst cover --name NAME in another
terminal: its coverage so far; or a kinst count of FUNC:BLOCK points: its
counts so far), and nothing is installed either.

With -p PID, FUNC (or LIB:FUNC) is a function of that user process: the
counters are spliced into it by kinst (no kerninstd), the lines come from
the executable's or the library's DWARF or debug file. -p 0 -- CMD starts
CMD stopped at its entry point, counts over its run and exits with its
status. With --from, a kinst cover --user --json report gives the coverage
instead (its function of the same name and library: a process's addresses
move from run to run); -p 0 -- CMD then starts CMD only to read it, and
kills it.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.AnnotateOptions
		durationFlag(fs, &o.Duration, "count for this long (default: until Ctrl-C, or until CMD exits)")
		fs.StringVar(&o.From, "from", "", "mark coverage from this kinst cover --json `REPORT` instead of counting")
		fs.StringVar(&o.Session, "session", "", "mark the blocks from this running kerninstd session (`NAME` or ID, as kinst ls lists): its coverage so far, or its probes' counts (kinst count FUNC:BLOCK … --name NAME), instead of counting; nothing is installed")
		vmlinuxFlag(fs, &o.Debug)
		jsonCmdFlag(fs, &o.JSON, "the blocks (index, start, count or covered, refused) with their instructions (offset, text, line)")
		pid := fs.IntP("pid", "p", 0, "a function of the user process `PID` instead of the kernel's (0: of -- CMD, started for it)")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("want one FUNC")
			}
			o.Function, o.Command = inv.args[0], inv.command
			if o.Session != "" && (o.From != "" || len(inv.command) > 0 || fs.Changed("duration") || fs.Changed("pid")) {
				return 2, usagef("--session reads a running kernel session: no --from, -p, -- CMD or --duration")
			}
			if fs.Changed("pid") {
				if o.From != "" && fs.Changed("duration") {
					return 2, usagef("--from reads a saved report: no --duration")
				}
				if err := checkProcessFlags(fs, *pid, inv.command); err != nil {
					return 2, err
				}
				ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
				defer stop()
				return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.AnnotateProcess(ctx, *pid, o, env) })
			}
			if o.From != "" && (len(inv.command) > 0 || fs.Changed("duration")) {
				return 2, usagef("--from reads a saved report: no -- CMD or --duration")
			}
			return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.AnnotateFunction(ctx, inv.client(), o, env) })
		}
	},
}
