package main

import (
	"context"
	"fmt"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

func timeCmd(ctx context.Context, args []string) (int, error) {
	fs, addr := newFlags("time", "time FUNC… [--pid P|--tid T|--comm C] [--duration D] [--interval I] [--plot FILE.svg] [--name N] [--ttl D] [--json] [-- CMD…]")
	var o cli.TimeOptions
	fs.IntVar(&o.Filter.PID, "pid", 0, "count only calls made by this process (its tgid)")
	fs.IntVar(&o.Filter.TID, "tid", 0, "count only calls made by this thread")
	fs.StringVar(&o.Filter.Comm, "comm", "", "count only calls made by tasks with this command name (up to 15 bytes)")
	fs.BoolVar(&o.Virtual, "virtual", false, "also measure on-CPU (virtual) time")
	timeFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	var pos []string
	pos, o.Command = splitCommand(fs)
	o.Functions = pos
	return cli.Time(ctx, api.NewClient(*addr), o, stdEnv())
}

func waitersCmd(ctx context.Context, args []string) (int, error) {
	fs, addr := newFlags("waiters", "waiters LOCKSYM|0xADDR [--duration D] [--interval I] [--plot FILE.svg] [--json] [-- CMD…]\n\n"+
		"Average number of tasks waiting for one kernel mutex: mutex_lock's slow path is timed for that\n"+
		"lock only; concurrency is the average number of waiters, avg virtual the spinning part of a wait.")
	var o cli.TimeOptions
	timeFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	var pos []string
	pos, o.Command = splitCommand(fs)
	if len(pos) != 1 {
		return 2, fmt.Errorf("waiters: name one lock: a kernel data symbol or 0xADDR")
	}
	o.Lock = pos[0]
	return cli.Time(ctx, api.NewClient(*addr), o, stdEnv())
}

func drilldownCmd(ctx context.Context, args []string) error {
	fs, addr := newFlags("drilldown", "drilldown FUNC [--depth N] [--callees N] [--min-share F] [--json] -- CMD…\n\n"+
		"Times FUNC and the functions it calls directly over one run of CMD, follows the callee with the\n"+
		"most wall time, and repeats: KernInst's way of finding where a path's time goes.")
	o := cli.DrillOptions{}
	fs.IntVar(&o.Depth, "depth", 4, "levels to descend at most")
	fs.IntVar(&o.Callees, "callees", 24, "callees timed per level at most (first call sites first)")
	fs.Float64Var(&o.MinShare, "min-share", 0.3, "stop when the heaviest callee has less than this share of its caller's wall time")
	fs.BoolVar(&o.JSON, "json", false, "print the levels as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var pos []string
	pos, o.Command = splitCommand(fs)
	if len(pos) != 1 {
		return fmt.Errorf("drilldown: name one function to start from")
	}
	o.Root = pos[0]
	return cli.DrillDown(ctx, api.NewClient(*addr), o, stdEnv())
}

// timeFlags are the flags time and waiters share.
func timeFlags(fs *pflag.FlagSet, o *cli.TimeOptions) {
	fs.DurationVarP(&o.Duration, "duration", "d", 0, "stop after this long (default: until Ctrl-C, or until CMD exits)")
	fs.DurationVarP(&o.Interval, "interval", "i", 1e9, "print rates this often")
	fs.StringVar(&o.SVG, "plot", "", "write a chart of calls/s and concurrency (waiters) over time to this SVG `file`")
	fs.StringVar(&o.Name, "name", "", "session name (see kinst ls, kinst detach)")
	fs.DurationVar(&o.TTL, "ttl", 0, "remove the instrumentation after this long even if kinst is gone")
	fs.BoolVar(&o.JSON, "json", false, "print one JSON report at the end instead of live rows")
}
