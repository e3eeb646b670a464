package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/kinst/kinst/app/cli"
	"github.com/kinst/kinst/app/hostdriver"
	"github.com/spf13/pflag"
)

var driverCommand = &command{
	name:    "driver",
	summary: "kinst's kernel half on this host: build and load kerninst.ko, start kerninstd",
	help: `On a real host (not the test VM): load builds kerninst.ko against
/lib/modules/$(uname -r)/build (kept under the cache, per kernel build id),
loads it and starts kerninstd; unload stops kerninstd (the driver restores
every splice when its device closes) and removes the module; status says
what is loaded and what would stop a load (missing headers, Secure Boot or
lockdown, kernel options kinst needs). scripts/kerninstd.service runs the
same under systemd.`,
	sub: []*command{driverLoadCommand, driverUnloadCommand, driverStatusCommand},
}

// hostFlags are the paths every driver command takes.
func hostFlags(fs *pflag.FlagSet) *hostdriver.Host {
	h := &hostdriver.Host{}
	fs.StringVar(&h.CacheDir, "cache", defaultCache(), "cache `dir` for built modules (env KINST_CACHE)")
	fs.StringVar(&h.Socket, "socket", "", "kerninstd's unix `socket` (default /run/kerninstd.sock)")
	fs.StringVar(&h.PIDFile, "pid-file", "", "kerninstd's pid `file` (default /run/kerninstd.pid)")
	return h
}

var driverLoadCommand = &command{
	name:    "load",
	summary: "build (or take) kerninst.ko, load it and start kerninstd",
	help: `Needs root. Without --ko, the module is built against --headers (default
/lib/modules/$(uname -r)/build) unless the cache holds one for this kernel's
build id. kerninstd runs in its own session, logging to --log; extra
kerninstd flags follow --, e.g. kinst driver load -- --listen 0.0.0.0:7070
--token-file /etc/kinst/token.`,
	setup: func(fs *pflag.FlagSet) runFunc {
		h := hostFlags(fs)
		var o hostdriver.LoadOptions
		fs.StringVar(&o.Module, "ko", "", "load this built kerninst.ko `file` instead of building one")
		fs.StringVar(&o.Headers, "headers", "", "kernel build tree `dir` to build against (default /lib/modules/$(uname -r)/build)")
		fs.BoolVar(&o.NoDaemon, "no-daemon", false, "load the module only; do not start kerninstd (for systemd's ExecStartPre)")
		fs.StringVar(&h.Kerninstd, "kerninstd", "", "kerninstd binary `path` (default: next to kinst, else PATH)")
		fs.StringVar(&h.LogFile, "log", "", "kerninstd's log `file` (default /var/log/kerninstd.log)")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) > 0 {
				return 2, usagef("unexpected %q (kerninstd's flags go after --)", inv.args[0])
			}
			h.Args = inv.command
			h.Say = func(f string, a ...any) { fmt.Fprintf(inv.err, "kinst driver: "+f+"\n", a...) }
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
			defer stop()
			return 0, h.Load(ctx, o)
		}
	},
}

var driverUnloadCommand = &command{
	name:    "unload",
	summary: "stop kerninstd (every splice is restored) and remove kerninst.ko",
	setup: func(fs *pflag.FlagSet) runFunc {
		h := hostFlags(fs)
		var o hostdriver.UnloadOptions
		fs.BoolVar(&o.ModuleOnly, "module-only", false, "leave kerninstd alone, remove the module only (for systemd's ExecStopPost)")
		return func(ctx context.Context, inv invocation) (int, error) {
			h.Say = func(f string, a ...any) { fmt.Fprintf(inv.err, "kinst driver: "+f+"\n", a...) }
			return 0, h.Unload(ctx, o)
		}
	},
}

var driverStatusCommand = &command{
	name:    "status",
	summary: "what is loaded, and what would stop kinst on this kernel",
	report:  true,
	setup: func(fs *pflag.FlagSet) runFunc {
		h := hostFlags(fs)
		var asJSON bool
		jsonFlag(fs, &asJSON, "the status")
		return func(ctx context.Context, inv invocation) (int, error) {
			st := h.Status(ctx)
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.DriverStatus(st, asJSON, env.Out) })
		}
	},
}
