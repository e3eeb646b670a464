package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var lsCommand = &command{
	name:    "ls",
	summary: "the live sessions: their instrumentation and totals",
	daemon:  true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var asJSON bool
		jsonFlag(fs, &asJSON, "the sessions")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 0 {
				return 2, usagef("ls takes no arguments")
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.Ls(ctx, inv.client(), asJSON, env) })
		}
	},
}

var detachCommand = &command{
	name:    "detach",
	args:    "NAME|ID",
	summary: "remove a session's instrumentation and print its final totals",
	daemon:  true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var asJSON bool
		jsonFlag(fs, &asJSON, "the final totals")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("name one session (see kinst ls)")
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.Detach(ctx, inv.client(), inv.args[0], asJSON, env) })
		}
	},
}

var watchCommand = &command{
	name:    "watch",
	summary: "every active metric of every session, refreshed like top",
	help:    `Rows are sorted by rate, each with a sparkline of its recent rates.`,
	daemon:  true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.WatchOptions
		intervalFlag(fs, &o.Interval, "refresh this often")
		fs.IntVarP(&o.Iterations, "iterations", "n", 0, "exit after this many refreshes (default: until Ctrl-C)")
		fs.IntVar(&o.History, "history", 30, "sparkline length, in refreshes")
		jsonFlag(fs, &o.JSON, "the rows once, after the last refresh (needs --iterations),")
		return func(ctx context.Context, inv invocation) (int, error) {
			if o.JSON && o.Iterations == 0 {
				return 2, usagef("--json needs --iterations N")
			}
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
			defer stop()
			return inv.reportErr(o.JSON, func(env cli.Env) error { return cli.Watch(ctx, inv.client(), o, env) })
		}
	},
}
