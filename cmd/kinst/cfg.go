package main

import (
	"context"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var cfgCommand = &command{
	name:    "cfg",
	args:    "FUNC | --stats | --calls FUNC",
	summary: "basic blocks, edges, live registers and flags, and the splice class of every instruction",
	help: `kinst cfg FUNC          a function's control-flow graph (--dot: for graphviz)
kinst cfg --stats       the whole kernel and its modules: functions, blocks,
                        bytes, splice classes, springboard space
kinst cfg --calls FUNC  FUNC's callers and callees (direct and tail calls)
kinst cfg -p PID FUNC   a function of a user process (FUNC or LIB:FUNC), read
                        through /proc/PID/mem: no kerninstd, nothing written;
                        the block indices of FUNC:BLOCK and kinst cover --user`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		calls := fs.Bool("calls", false, "FUNC's callers and callees in the whole-kernel call graph (direct and tail calls)")
		stats := fs.Bool("stats", false, "analyse the whole kernel and its modules: functions, blocks, bytes, splice classes")
		var asJSON bool
		jsonFlag(fs, &asJSON, "the graph (blocks → instructions with address, length, text, live_in, splice_class), the census or the call graph")
		dot := fs.Bool("dot", false, "print a graphviz digraph")
		pid := fs.IntP("pid", "p", 0, "a function of the user process `PID` instead of the kernel's")
		return func(ctx context.Context, inv invocation) (int, error) {
			switch {
			case fs.Changed("pid") && (*stats || *calls || *pid <= 0):
				return 2, usagef("-p PID names a running process, and takes no --stats or --calls")
			case *stats && (len(inv.args) != 0 || *dot || *calls):
				return 2, usagef("--stats takes no FUNC, --dot or --calls")
			case *stats:
				return inv.reportErr(asJSON, func(env cli.Env) error { return cli.ShowStats(ctx, inv.client(), asJSON, env) })
			case len(inv.args) != 1:
				return 2, usagef("want one FUNC (or --stats)")
			case asJSON && *dot:
				return 2, usagef("--json and --dot are exclusive")
			case *calls:
				return inv.reportErr(asJSON, func(env cli.Env) error { return cli.ShowCalls(ctx, inv.client(), inv.args[0], asJSON, env) })
			}
			format := cli.CFGText
			switch {
			case asJSON:
				format = cli.CFGJSON
			case *dot:
				format = cli.CFGDot
			}
			if fs.Changed("pid") {
				return inv.reportErr(asJSON, func(env cli.Env) error { return cli.ShowCFGProcess(*pid, inv.args[0], format, env) })
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.ShowCFG(ctx, inv.client(), inv.args[0], format, env) })
		}
	},
}
