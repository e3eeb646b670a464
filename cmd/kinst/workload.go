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
	args:    "stat N PATH | files DIR ROUNDS | syscalls DURATION | creat DIR N | spin DURATION",
	summary: "kernel activity of a known shape, for tests and the demo",
	hidden:  true,
	words:   []string{"stat", "files", "syscalls", "creat", "spin"},
	setup: func(fs *pflag.FlagSet) runFunc {
		return func(ctx context.Context, inv invocation) (int, error) {
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
		return workload.Stat(a[1], n)
	case kind == "files" && len(a) == 2:
		n, err := strconv.Atoi(a[1])
		if err != nil {
			return err
		}
		return workload.Files(a[0], n)
	case kind == "syscalls" && len(a) == 1:
		d, err := time.ParseDuration(a[0])
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		// Ctrl-C ends the load early but still reports it.
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
		defer stop()
		n := workload.Syscalls(ctx, "/")
		fmt.Fprintf(inv.err, "workload: %d stat calls\n", n)
		return nil
	case kind == "creat" && len(a) == 2:
		n, err := strconv.Atoi(a[1])
		if err != nil {
			return err
		}
		return workload.Creat(a[0], n)
	case kind == "spin" && len(a) == 1:
		d, err := time.ParseDuration(a[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(inv.err, "workload: %d getppid calls\n", workload.Spin(d))
		return nil
	}
	return usagef("want %s", inv.cmd.args)
}
