package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kinst/kinst/internal/cli"
	"github.com/kinst/kinst/kerninstd"
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
		return cli.BenchHit(ctx, kerninstd.NewClient(*addr), o, os.Stdout, os.Stderr)
	}
	if len(args) == 0 || args[0] != "splice" {
		return fmt.Errorf("bench: want `kinst bench splice POINT` or `kinst bench hit [FUNC]`")
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
	return cli.BenchSplice(ctx, kerninstd.NewClient(*addr), fs.Arg(0), *cycles, *kprobe, *asJSON, os.Stdout, os.Stderr)
}
