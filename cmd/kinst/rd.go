package main

import (
	"context"
	"strconv"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var rdCommand = &command{
	name:    "rd",
	args:    "ADDR|SYM[+0xOFF] [LEN]",
	summary: "hex dump of live kernel memory (LEN bytes, default 64), like crash's rd",
	help: `kinst's own splices show as they are in memory: analysis reads the original
bytes under them, rd the live ones.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var asJSON bool
		jsonFlag(fs, &asJSON, "the bytes")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) < 1 || len(inv.args) > 2 {
				return 2, usagef("want ADDR|SYM[+0xOFF] [LEN]")
			}
			n := 64
			if len(inv.args) == 2 {
				v, err := strconv.ParseUint(inv.args[1], 0, 32)
				if err != nil {
					return 2, usagef("bad length %q", inv.args[1])
				}
				n = int(v)
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.Read(ctx, inv.client(), inv.args[0], n, asJSON, env) })
		}
	},
}
