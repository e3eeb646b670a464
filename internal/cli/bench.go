package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/kinst/kinst/kerninstd"
)

// BenchSplice runs `kinst bench splice`.
func BenchSplice(ctx context.Context, c *kerninstd.Client, point string, cycles int, asJSON bool, w, stderr io.Writer) error {
	fmt.Fprintf(stderr, "kinst: %d splice/unsplice cycles at %s…\n", cycles, point)
	res, err := c.BenchSplice(ctx, kerninstd.BenchRequest{Point: point, Cycles: cycles})
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, res)
	}
	r := res.Point
	fmt.Fprintf(w, "%s at %s+%#x (%#x): %d-byte %q, %d cycles, text restored: %v\n",
		r.Point, r.Function, r.Offset, uint64(r.Address), r.Length, r.Instruction, res.Cycles, res.Restored)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\tn\tmedian\tp90\tmin\tmax\t")
	for _, row := range []struct {
		name string
		d    kerninstd.Durations
	}{
		{"resolve (read, decode, liveness)", res.Resolve},
		{"codegen (build, verify)", res.Codegen},
		{"patch write", res.Patch},
		{"splice (driver)", res.Splice},
		{"unsplice (driver)", res.Unsplice},
		{"free (RCU-tasks wait)", res.Free},
	} {
		d := row.d
		fmt.Fprintf(tw, "%s\t%d\t%v\t%v\t%v\t%v\t\n", row.name, d.N, time.Duration(d.Median), time.Duration(d.P90), time.Duration(d.Min), time.Duration(d.Max))
	}
	return tw.Flush()
}
