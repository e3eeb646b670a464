package main

import (
	"context"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var linesCommand = &command{
	name:    "lines",
	args:    "FUNC",
	summary: "a kernel function's source lines and whether each takes a probe (FILE:LINE points)",
	help: `Lists the source lines of FUNC's code, from the debug vmlinux (--vmlinux
PATH, else the running kernel's under /usr/lib/debug), as perf probe -L does:
each line where its code starts first in FUNC, as FUNC+0xOFF, and the splice
class of the instruction there or why it is refused. These are the lines a
FILE:LINE point (kinst count fs/stat.c:192) can name; lines inlined into FUNC
from other files (headers) are listed with their file. The function's
declaration is printed too: FUNC:+N counts from it.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.DebugOptions
		var asJSON bool
		vmlinuxFlag(fs, &o)
		jsonFlag(fs, &asJSON, "the lines (file, line, offset, point, splice_class, refused)")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("want one FUNC")
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.Lines(ctx, inv.client(), inv.args[0], o, asJSON, env) })
		}
	},
}
