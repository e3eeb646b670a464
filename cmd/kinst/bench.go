package main

import (
	"context"
	"fmt"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/cli"
)

func benchCmd(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "hit" {
		fs, addr := newFlags("bench hit", "bench hit [FUNC] [--calls N] [--runs R] [--json]\n\n"+
			"Per-call cost of a getppid(2) loop with a counter at FUNC (default __x64_sys_getppid):\n"+
			"bare, direct, springboard and trap splices, int3 and optimized tracefs kprobes, and a\n"+
			"BPF kprobe counting in an array map. Every row's hits should be calls × runs. Runs\n"+
			"where kerninstd runs (as root, for tracefs and BPF). Guest times under emulation: read the ratios.")
		var o cli.HitOptions
		fs.IntVar(&o.Calls, "calls", 100000, "system calls per timed run")
		fs.IntVar(&o.Runs, "runs", 3, "timed runs per mechanism (the median is kept)")
		fs.BoolVar(&o.JSON, "json", false, "print JSON")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		o.Function = "__x64_sys_getppid"
		if fs.NArg() > 0 {
			o.Function = fs.Arg(0)
		}
		return cli.BenchHit(ctx, api.NewClient(*addr), o, stdEnv())
	}
	if len(args) > 0 && args[0] == "churn" {
		fs, addr := newFlags("bench churn", "bench churn [POINT…] [--function FUNC…] [--cycles N] [--seed S] [--json]\n\n"+
			"Cycles of splice, re-splice and unsplice over a pool of points, through the path sessions take:\n"+
			"each cycle adds a counter at three points of the pool, a second one at two of them and one more,\n"+
			"then removes all six. A point that already has a request (a session's) is re-spliced, never\n"+
			"unspliced. Run it with a workload going to stress the splice protocol; every point must read\n"+
			"back as the kernel's own bytes at the end.")
		var req api.ChurnRequest
		fs.StringSliceVarP(&req.Functions, "function", "f", nil, "add every instruction of FUNC that may be spliced to the pool (repeatable)")
		fs.IntVarP(&req.Cycles, "cycles", "n", 1000, "cycles")
		fs.Int64Var(&req.Seed, "seed", 1, "seed of the choice of points")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		req.Points = fs.Args()
		if len(req.Points) == 0 && len(req.Functions) == 0 {
			fs.Usage()
			return fmt.Errorf("bench churn: want POINTs or --function FUNC")
		}
		return cli.BenchChurn(ctx, api.NewClient(*addr), req, *asJSON, stdEnv())
	}
	if len(args) == 0 || args[0] != "splice" {
		return fmt.Errorf("bench: want `kinst bench splice POINT`, `kinst bench churn POINT…` or `kinst bench hit [FUNC]`")
	}
	fs, addr := newFlags("bench splice", "bench splice POINT [--cycles N] [--json]")
	cycles := fs.IntP("cycles", "n", 1000, "splice/unsplice cycles")
	asJSON := fs.Bool("json", false, "print JSON")
	kprobe := fs.Bool("kprobe", false, "also time the same request as a tracefs kprobe (root, tracefs)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("bench splice: want one POINT")
	}
	return cli.BenchSplice(ctx, api.NewClient(*addr), fs.Arg(0), *cycles, *kprobe, *asJSON, stdEnv())
}
