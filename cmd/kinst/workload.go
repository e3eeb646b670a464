package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/kinst/kinst/app/workload"
	"github.com/spf13/pflag"
)

// workloadCommand is a hidden helper for tests and the demo: kernel
// activity of a known shape.
var workloadCommand = &command{
	name:    "workload",
	args:    "stat N PATH | files DIR ROUNDS | syscalls DURATION | creat DIR N | spin DURATION | mixed DIR DURATION [MODULE.ko]",
	summary: "kernel activity of a known shape, for tests and the demo",
	hidden:  true,
	words:   []string{"stat", "files", "syscalls", "creat", "spin", "mixed"},
	setup: func(fs *pflag.FlagSet) runFunc {
		nice := fs.Int("nice", 0, "run at this nice value (19: only on cycles nothing else wants)")
		return func(ctx context.Context, inv invocation) (int, error) {
			if *nice != 0 {
				if err := workload.Nice(*nice); err != nil {
					return 1, err
				}
			}
			return 0, runWorkload(ctx, inv)
		}
	},
}

func runWorkload(ctx context.Context, inv invocation) error {
	a := inv.args
	if len(a) == 0 {
		return usagef("want %s", inv.cmd.args)
	}
	kind, a := a[0], a[1:]
	switch {
	case kind == "stat" && len(a) == 2:
		n, err := strconv.Atoi(a[0])
		if err != nil {
			return err
		}
		return workload.Stat(ctx, a[1], n)
	case kind == "files" && len(a) == 2:
		n, err := strconv.Atoi(a[1])
		if err != nil {
			return err
		}
		return workload.Files(ctx, a[0], n)
	case kind == "syscalls" && len(a) == 1:
		ctx, stop, err := forDuration(ctx, a[0])
		if err != nil {
			return err
		}
		defer stop()
		n := workload.Syscalls(ctx, "/")
		fmt.Fprintf(inv.err, "workload: %d stat calls\n", n)
		return nil
	case kind == "creat" && len(a) == 2:
		n, err := strconv.Atoi(a[1])
		if err != nil {
			return err
		}
		return workload.Creat(ctx, a[0], n)
	case kind == "mixed" && (len(a) == 2 || len(a) == 3):
		ctx, stop, err := forDuration(ctx, a[1])
		if err != nil {
			return err
		}
		defer stop()
		module := ""
		if len(a) == 3 {
			module = a[2]
		}
		c := workload.Mixed(ctx, a[0], module)
		fmt.Fprintf(inv.err, "workload: %d files, %d execs, %d signals, %d timers, %d pipes, %d tcp, %d hotplugs, %d module reloads\n",
			c.Files, c.Execs, c.Signals, c.Timers, c.Pipes, c.TCP, c.Hotplugs, c.Modules)
		if c.HotplugErr != "" {
			fmt.Fprintf(inv.err, "workload: no CPU taken offline: %s\n", c.HotplugErr)
		}
		if c.ModuleErr != "" {
			fmt.Fprintf(inv.err, "workload: module: %s\n", c.ModuleErr)
		}
		return nil
	case kind == "spin" && len(a) == 1:
		d, err := time.ParseDuration(a[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(inv.err, "workload: %d getppid calls\n", workload.Spin(ctx, d))
		return nil
	}
	return usagef("want %s", inv.cmd.args)
}

// forDuration is ctx ended after the duration d, or by Ctrl-C, which ends
// a load early but still lets it report.
func forDuration(ctx context.Context, d string) (context.Context, func(), error) {
	dur, err := time.ParseDuration(d)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, dur)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	return ctx, func() { stop(); cancel() }, nil
}
