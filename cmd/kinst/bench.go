package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kinst/kinst/internal/cli"
	"github.com/kinst/kinst/kerninstd"
)

func benchCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "splice" {
		return fmt.Errorf("bench: want `kinst bench splice POINT`")
	}
	fs, addr := newFlags("bench splice", "bench splice POINT [--cycles N] [--json]")
	cycles := fs.IntP("cycles", "n", 1000, "splice/unsplice cycles")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("bench splice: want one POINT")
	}
	return cli.BenchSplice(ctx, kerninstd.NewClient(*addr), fs.Arg(0), *cycles, *asJSON, os.Stdout, os.Stderr)
}
