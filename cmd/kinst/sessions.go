package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/cli"
)

func lsCmd(ctx context.Context, args []string) error {
	fs, addr := newFlags("ls", "ls [--json]")
	asJSON := fs.Bool("json", false, "print the sessions as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("ls takes no arguments")
	}
	return cli.Ls(ctx, api.NewClient(*addr), *asJSON, stdEnv())
}

func detachCmd(ctx context.Context, args []string) error {
	fs, addr := newFlags("detach", "detach NAME|ID [--json]")
	asJSON := fs.Bool("json", false, "print the final totals as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("detach: name one session (see kinst ls)")
	}
	return cli.Detach(ctx, api.NewClient(*addr), fs.Arg(0), *asJSON, stdEnv())
}

func watchCmd(ctx context.Context, args []string) error {
	fs, addr := newFlags("watch", "watch [--interval I] [--iterations N] [--json]")
	var o cli.WatchOptions
	fs.DurationVarP(&o.Interval, "interval", "i", 1e9, "refresh this often")
	fs.IntVarP(&o.Iterations, "iterations", "n", 0, "exit after this many refreshes (default: until Ctrl-C)")
	fs.IntVar(&o.History, "history", 30, "sparkline length, in refreshes")
	fs.BoolVar(&o.JSON, "json", false, "print the rows once as JSON after the last refresh (needs --iterations)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.JSON && o.Iterations == 0 {
		return fmt.Errorf("watch --json needs --iterations N")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	return cli.Watch(ctx, api.NewClient(*addr), o, stdEnv())
}
