package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/output"
)

// ArmOptions are the flags of `kinst bench arm`.
type ArmOptions struct {
	Blocks  []int    // block counts, one run (or two, with Single) each
	All     bool     // one run (or two) over every block that takes a probe, not Blocks
	Single  bool     // also arm one splice at a time
	Targets []string // functions or globs; none: every function
	Skip    int      // blocks passed over before the first one armed
	JSON    bool
}

// BenchArm runs kerninstd's arm bench: for each block count, coverage
// probes armed in driver batches (and, with Single, one at a time), then
// removed; the time and CPU synchronisation rounds of each half.
func BenchArm(ctx context.Context, c *api.Client, o ArmOptions, env Env) error {
	var rep output.ArmReport
	counts := o.Blocks
	if o.All {
		counts = []int{0}
	}
	for _, n := range counts {
		modes := []bool{false}
		if o.Single {
			modes = append(modes, true)
		}
		for _, single := range modes {
			mode := "batched"
			if single {
				mode = "single"
			}
			if o.All {
				fmt.Fprintf(env.Err, "kinst: arming every block that takes a probe (%s)…\n", mode)
			} else {
				fmt.Fprintf(env.Err, "kinst: arming %d blocks (%s)…\n", n, mode)
			}
			res, err := c.BenchArm(ctx, api.ArmRequest{Blocks: n, Targets: o.Targets, Single: single, All: o.All, Skip: o.Skip})
			if err != nil {
				return err
			}
			rep.Runs = append(rep.Runs, res)
		}
	}
	if o.JSON {
		return writeJSON(env.Out, rep)
	}
	return writeArm(env.Out, rep)
}

// writeArm prints the runs of kinst bench arm and the refusals.
func writeArm(w io.Writer, rep output.ArmReport) error {
	tw := newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tblocks\tfunctions\tarmed\trefused\tplan\tarm\tper probe\tarm syncs\tremove\tremove syncs\tpatch KiB\tkerninstd peak MiB\t")
	for _, r := range rep.Runs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d\t\n", r.Mode, r.Blocks, r.Functions, r.Armed, r.Refused,
			fmtNS(float64(r.PlanNS)), fmtNS(float64(r.ArmNS)), fmtNS(float64(r.ArmNS)/float64(max(r.Armed, 1))),
			r.ArmSyncs, fmtNS(float64(r.RemoveNS)), r.RemoveSyncs, r.PatchBytes>>10, r.PeakRSS>>20)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.Runs {
		if r.First != "" {
			fmt.Fprintf(w, "%s: blocks %s … %s\n", r.Mode, r.First, r.Last)
		}
		if st := r.ArmStages; st != nil {
			fmt.Fprintf(w, "%s: arm %s = prepare %s + build %s + write %s + splice %s (%s in the driver)\n", r.Mode, fmtNS(float64(r.ArmNS)),
				fmtNS(float64(st.PrepareNS)), fmtNS(float64(st.BuildNS)), fmtNS(float64(st.WriteNS)), fmtNS(float64(st.SpliceNS)), fmtNS(float64(st.DriverNS)))
		}
	}
	for _, r := range rep.Runs {
		if len(r.Refusals) == 0 {
			continue
		}
		var ks []string
		for k := range r.Refusals {
			ks = append(ks, k)
		}
		sort.Slice(ks, func(i, j int) bool {
			a, b := r.Refusals[ks[i]], r.Refusals[ks[j]]
			return a > b || a == b && ks[i] < ks[j]
		})
		fmt.Fprintf(w, "\nrefused (%s, %d blocks):\n", r.Mode, r.Blocks)
		for _, k := range ks {
			fmt.Fprintf(w, "%8d  %s (first at %s)\n", r.Refusals[k], k, r.RefusedAt[k])
		}
	}
	return nil
}
