package main

import (
	"context"
	"fmt"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/cli"
)

func cfgCmd(ctx context.Context, args []string) error {
	fs, addr := newFlags("cfg", "cfg FUNC [--json | --dot]\n       kinst cfg --stats [--json]\n       kinst cfg --calls FUNC [--json]")
	calls := fs.Bool("calls", false, "FUNC's callers and callees in the whole-kernel call graph (direct and tail calls)")
	stats := fs.Bool("stats", false, "analyse the whole kernel and its modules: functions, blocks, bytes, splice classes")
	asJSON := fs.Bool("json", false, "print JSON (blocks → instructions with address, length, text, live_in, splice_class)")
	dot := fs.Bool("dot", false, "print a graphviz digraph")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *stats {
		if fs.NArg() != 0 || *dot {
			return fmt.Errorf("cfg --stats takes no FUNC and no --dot")
		}
		return cli.ShowStats(ctx, api.NewClient(*addr), *asJSON, stdEnv())
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("cfg: want one FUNC (or --stats)")
	}
	if *calls {
		return cli.ShowCalls(ctx, api.NewClient(*addr), fs.Arg(0), *asJSON, stdEnv())
	}
	format := cli.CFGText
	switch {
	case *asJSON && *dot:
		return fmt.Errorf("cfg: --json and --dot are exclusive")
	case *asJSON:
		format = cli.CFGJSON
	case *dot:
		format = cli.CFGDot
	}
	return cli.ShowCFG(ctx, api.NewClient(*addr), fs.Arg(0), format, stdEnv())
}
