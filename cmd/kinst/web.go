package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var webCommand = &command{
	name:    "web",
	summary: "a web page of the kernel's code with counters, timers and coverage on it",
	help: `Serves a page, on loopback by default, that finds kernel functions (classic
names too), draws a function's control-flow graph with its instructions (on
hover: the splice class, or why a splice is refused, and the live
registers), and instruments it by clicking: a block for a counter, an
instruction (shift-click) for a counter there, buttons for a wall or
virtual timer and for a coverage session. Values are drawn on the graph
and plotted every second. Each is a kerninstd session like the CLI's:
kinst ls lists it, kinst detach ends it, and removing it on the page puts
every byte back. The URL is the first line printed; a function's page is
/fn/NAME. The page's libraries are embedded: it works offline.

With -p PID the page serves a user process instead: its functions (a
library's as LIB:NAME), counters, timers and coverage spliced by kinst
itself through ptrace, as kinst count -p does; stopping kinst web removes
them all.

Beyond loopback (--listen 0.0.0.0:PORT) the page needs kerninstd's token
(--token-file): the URL printed carries it once, as a cookie afterwards.`,
	daemon: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.WebOptions
		fs.StringVar(&o.Listen, "listen", "127.0.0.1:7654", "serve on this `HOST:PORT` (port 0: any free port)")
		pidFlag(fs, &o.PID, "serve this user process instead of the kernel: kinst attaches to it (ptrace) and hosts its sessions itself, removing them when it stops; a library's function is /fn/LIB:NAME")
		fs.StringVar(&o.Debug.Vmlinux, "vmlinux", "", "source lines beside the instructions from this debug vmlinux (default: the running kernel's, looked up as kinst cover does; without one, none)")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 0 {
				return 2, usagef("web takes no arguments (a function's page is /fn/NAME)")
			}
			o.Token = inv.g.token
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			return 0, cli.Web(ctx, inv.client(), o, cli.Env{Out: inv.out, Err: inv.err})
		}
	},
}
