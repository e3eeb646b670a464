package main

import (
	"context"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var linesCommand = &command{
	name:    "lines",
	args:    "FUNC [-p PID | -p 0 -- CMD…]",
	summary: "a kernel or process function's source lines and whether each takes a probe (FILE:LINE points)",
	help: `Lists the source lines of FUNC's code, from the debug vmlinux (--vmlinux
PATH, else the running kernel's under /usr/lib/debug), as perf probe -L does:
each line where its code starts first in FUNC, as FUNC+0xOFF, and the splice
class of the instruction there or why it is refused. These are the lines a
FILE:LINE point (kinst count fs/stat.c:192) can name; lines inlined into FUNC
from other files (headers) are listed with their file. The function's
declaration is printed too: FUNC:+N counts from it.

With -p PID, FUNC (or LIB:FUNC) is a function of that user process, its
lines from the executable's or the library's DWARF, or their debug files by
build id (Debian's -dbg and -dbgsym packages), and the splice classes from
kinst's plan of the process: the lines kinst count -p PID FILE:LINE can
name. -p 0 -- CMD starts CMD stopped for it and kills it after. Nothing is
written into the process.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.DebugOptions
		var asJSON bool
		vmlinuxFlag(fs, &o)
		jsonFlag(fs, &asJSON, "the lines (file, line, offset, point, splice_class, refused)")
		pid := fs.IntP("pid", "p", 0, "a function of the user process `PID` instead of the kernel's (0: of -- CMD, started for it)")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("want one FUNC")
			}
			if fs.Changed("pid") {
				if err := checkProcessFlags(fs, *pid, inv.command); err != nil {
					return 2, err
				}
				return inv.reportErr(asJSON, func(env cli.Env) error {
					return cli.LinesProcess(ctx, *pid, inv.args[0], inv.command, asJSON, env)
				})
			}
			if len(inv.command) > 0 {
				return 2, usagef("-- CMD is for -p 0")
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.Lines(ctx, inv.client(), inv.args[0], o, asJSON, env) })
		}
	},
}
