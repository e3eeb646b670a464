package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var countCommand = &command{
	name:    "count",
	args:    "POINT… [-- CMD…]",
	summary: "live call counts at kernel functions or instructions",
	help: pointHelp + "see kinst --help.\n\n" +
		`Instructions of 5 bytes or more take a direct splice (jmp rel32), shorter ones a
springboard (jmp rel8 to a slot in nearby padding), a covering splice (one jmp
over them and the next instructions of their block) or, with neither, a trap
splice (int3). Several requests at one point share one patch.

kinst count also takes FILE:LINE (fs/stat.c:192, matched by path suffix),
as perf probe does: the line's code is found in the debug vmlinux
(--vmlinux PATH, else the running kernel's under /usr/lib/debug), one
counter where it starts in each function that holds it (its inlined
copies included), each row named by the line. FUNC:+N is the line N after
FUNC's declaration, in FUNC only (perf probe's relative lines). A module's
lines are MODULE:FILE:LINE (ext4:fs/ext4/inode.c:120), from the module's debug
file (--module-debug DIR, else Debian's -dbg tree or /lib/modules), as are a
module function's FUNC:+N; their points name the module (MODULE:FUNC+0xOFF,
a syntax every point takes: a module's static function may share its name
with the core kernel's). With -p, lines of the executable (its DWARF, -g,
or its debug file by build id) or a library's as LIB:FILE:LINE. A line that
starts no code is refused with the nearest lines that do; kinst lines FUNC
lists them, and FUNC's declaration.

Counts print every --interval until --duration ends, CMD exits (kinst then
exits with its status; ended by --duration it gets SIGTERM, and kinst exits
0) or Ctrl-C; then the totals, and the splices are removed. Each total is
read as its splice goes, so that two counters on one straight-line path
end equal: the totals include the calls made while the removal ran (a
moment; seconds in an emulated guest), and counters on one instruction,
removed one after another, can differ by those.
Live rows and CMD's output share stdout: -o FILE keeps the report apart.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.CountOptions
		durationFlag(fs, &o.Duration, "stop after this long (default: until Ctrl-C, or until CMD exits)")
		intervalFlag(fs, &o.Interval, "print counts this often (0: only the totals at the end)")
		sessionFlags(fs, &o.Name, &o.TTL)
		svgFlag(fs, &o.SVG, "a chart of the counts per second over time")
		jsonCmdFlag(fs, &o.JSON, "one report")
		vmlinuxFlag(fs, &o.Debug)
		pid := fs.IntP("pid", "p", 0, "count in the user process `PID` instead of the kernel: POINT is FUNC[+0xOFF], FUNC:BLOCK or LIB:FUNC (the engine runs in kinst through ptrace; no kerninstd). With -p 0 -- CMD, CMD is started and spliced at its entry point (its libraries mapped, none of its code run)")
		return func(ctx context.Context, inv invocation) (int, error) {
			o.Points, o.Command = inv.args, inv.command
			o.TotalsOnly = fs.Changed("interval") && o.Interval == 0
			if len(o.Points) == 0 {
				return 2, usagef("name at least one POINT (FUNC, FUNC+0xOFF, FUNC:BLOCK, FILE:LINE or a classic name such as lookuppn)")
			}
			if fs.Changed("pid") {
				if *pid < 0 || (*pid == 0) == (len(o.Command) == 0) {
					return 2, usagef("-p PID names a running process, or -p 0 with -- CMD a command to start")
				}
				ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
				defer stop()
				return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.CountProcess(ctx, *pid, o, env) })
			}
			return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.Count(ctx, inv.client(), o, env) })
		}
	},
}
