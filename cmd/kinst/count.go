package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/kinst/kinst/internal/cli"
	"github.com/kinst/kinst/kerninstd"
	"github.com/kinst/kinst/splice"
)

func countCmd(ctx context.Context, args []string) (int, error) {
	fs, addr := newFlags("count", "count POINT… [--duration D] [--interval I] [--json] [-- CMD…]\n\n"+
		"POINT is FUNC (its entry), FUNC+0xOFF (any instruction boundary), FUNC:BLOCK (a basic\n"+
		"block, numbered as kinst cfg FUNC prints them) or a classic name ("+classicList()+").\n"+
		"Instructions of 5 bytes or more take a direct splice (jmp rel32), shorter ones a\n"+
		"springboard (jmp rel8 to a slot in nearby padding) or, with no slot in reach or for one\n"+
		"byte, a trap splice (int3). Several requests at one point share one patch.")
	var o cli.CountOptions
	fs.DurationVarP(&o.Duration, "duration", "d", 0, "stop after this long (default: until Ctrl-C, or until CMD exits)")
	fs.DurationVarP(&o.Interval, "interval", "i", 1e9, "print counts this often")
	fs.BoolVar(&o.JSON, "json", false, "print one JSON report at the end instead of live rows")
	fs.StringVar(&o.Plot, "plot", "", "write a chart of counts per second over time to this SVG `file`")
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	var pos []string
	pos, o.Command = splitCommand(fs)
	o.Points = pos
	return cli.Count(ctx, kerninstd.NewClient(*addr), o, os.Stdout, os.Stderr)
}

func classicList() string {
	var s []string
	for _, n := range splice.ClassicNames() {
		s = append(s, fmt.Sprintf("%s→%s", n, splice.Classic[n].Linux))
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}
