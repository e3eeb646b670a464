package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/output"
)

// BenchSplice runs `kinst bench splice`.
func BenchSplice(ctx context.Context, c *api.Client, point string, cycles int, kprobe, asJSON bool, env Env) error {
	w, stderr := env.Out, env.Err
	// The same request made with a kprobe through tracefs, in the same
	// kernel, first: define and enable, then disable and delete. (Timed
	// before kinst's own cycles: in the emulated guest, tracefs kprobe
	// events toggled right after a long splice burst once left a CPU
	// looping on the int3 of a static-call update in __schedule; see the
	// known issue in docs/splicing.md.)
	r0, err := c.Resolve(ctx, point)
	if err != nil {
		return err
	}
	kp := output.KprobeRequest{Point: fmt.Sprintf("%s+%#x", r0.Function, r0.Offset)}
	if kprobe {
		fmt.Fprintf(stderr, "kinst: %d tracefs kprobe requests at %s…\n", min(cycles, 100), kp.Point)
		if err := timeKprobeRequests(&kp, min(cycles, 100)); err != nil {
			kp.Skipped = err.Error()
		}
	} else {
		kp.Skipped = "not asked for (--kprobe)"
	}
	fmt.Fprintf(stderr, "kinst: %d splice/unsplice cycles at %s…\n", cycles, point)
	res, err := c.BenchSplice(ctx, api.BenchRequest{Point: point, Cycles: cycles})
	if err != nil {
		return err
	}
	// Liveness is part of resolve, relocation part of codegen.
	ours := res.Resolve.Median + res.PatchAlloc.Median + res.Codegen.Median + res.Patch.Median +
		res.SlotFind.Median + res.Springboard.Median + res.Splice.Median
	if kp.Skipped == "" && ours > 0 {
		kp.Ratio = float64(kp.Attach.Median) / float64(ours)
	}
	if asJSON {
		return writeJSON(w, output.BenchSpliceReport{BenchResult: res, Request: ours, Kprobe: kp})
	}
	r := res.Point
	fmt.Fprintf(w, "%s at %s+%#x (%#x): %d-byte %q, %d cycles, text restored: %v\n",
		r.Point, r.Function, r.Offset, uint64(r.Address), r.Length, r.Instruction, res.Cycles, res.Restored)
	rows := []durationRow{
		{"resolve (read, decode, liveness)", res.Resolve},
		{"liveness (part of resolve)", res.Liveness},
		{"patch allocation", res.PatchAlloc},
		{"codegen (build, verify)", res.Codegen},
		{"relocation (part of codegen)", res.Relocation},
		{"patch write", res.Patch},
		{"springboard slot find", res.SlotFind},
		{"springboard slot write", res.Springboard},
		{"splice (driver)", res.Splice},
		{"unsplice (driver)", res.Unsplice},
		{"free (batched: one RCU-tasks wait a batch, see max)", res.Free},
	}
	var taken []durationRow
	for _, r := range rows {
		if r.d.N != 0 { // else a step this point's class does not take
			taken = append(taken, r)
		}
	}
	if kp.Skipped == "" {
		taken = append(taken, durationRow{"kprobe define+enable (tracefs)", kp.Attach}, durationRow{"kprobe disable+delete (tracefs)", kp.Detach})
	}
	if err := writeDurations(w, "step", taken); err != nil {
		return err
	}
	fmt.Fprintf(w, "a whole request (resolve + patch allocation + codegen + patch write + springboard + splice, medians): %v\n", time.Duration(ours))
	if kp.Skipped != "" {
		fmt.Fprintf(w, "kprobe comparison skipped: %s\n", kp.Skipped)
	} else {
		fmt.Fprintf(w, "the same point as a tracefs kprobe (define + enable): %v, %.1f× kinst's request\n", time.Duration(kp.Attach.Median), kp.Ratio)
	}
	return nil
}

func timeKprobeRequests(kp *output.KprobeRequest, n int) error {
	events := filepath.Join(tracefs, "kprobe_events")
	if _, err := os.Stat(events); err != nil {
		return fmt.Errorf("no tracefs at %s", tracefs)
	}
	const group, event = "kinst_bench", "req"
	enable := filepath.Join(tracefs, "events", group, event, "enable")
	var at, de []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := appendFile(events, fmt.Sprintf("p:%s/%s %s\n", group, event, kp.Point)); err != nil {
			return fmt.Errorf("add kprobe at %s: %w", kp.Point, err)
		}
		if err := os.WriteFile(enable, []byte("1"), 0); err != nil {
			appendFile(events, fmt.Sprintf("-:%s/%s\n", group, event))
			return err
		}
		t1 := time.Now()
		os.WriteFile(enable, []byte("0"), 0)
		if err := appendFile(events, fmt.Sprintf("-:%s/%s\n", group, event)); err != nil {
			return err
		}
		at = append(at, t1.Sub(t0))
		de = append(de, time.Since(t1))
	}
	kp.Attach, kp.Detach = durations(at), durations(de)
	return nil
}

func durations(ds []time.Duration) api.Durations {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return api.Durations{}
	}
	return api.Durations{N: len(s), Median: int64(s[len(s)/2]), P90: int64(s[len(s)*9/10]), Min: int64(s[0]), Max: int64(s[len(s)-1])}
}

// BenchChurn runs kerninstd's churn: cycles of splice, re-splice and
// unsplice over a pool of points, and prints what each kind of change
// cost and whether the text came back.
func BenchChurn(ctx context.Context, c *api.Client, req api.ChurnRequest, asJSON bool, env Env) error {
	w, stderr := env.Out, env.Err
	fmt.Fprintf(stderr, "kinst: %d churn cycles (12 request changes each)…\n", req.Cycles)
	res, err := c.BenchChurn(ctx, req)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, res)
	}
	fmt.Fprintf(w, "%d cycles over %d points in %.1fs, text restored: %v\n", res.Cycles, res.Pool, res.Seconds, res.Restored)
	if err := writeDurations(w, "change", []durationRow{
		{"splice (first request at a point)", res.Splice},
		{"re-splice (patch rebuilt, splice re-pointed)", res.Resplice},
		{"unsplice (last request removed)", res.Unsplice},
	}); err != nil {
		return err
	}
	if !res.Restored {
		return fmt.Errorf("churn: not restored: %s", strings.Join(res.NotRestored, ", "))
	}
	return nil
}

// durationRow is one line of a table of measured durations.
type durationRow struct {
	name string
	d    api.Durations
}

// writeDurations prints rows under a header whose first column is title:
// n, median, p90, min and max of each.
func writeDurations(w io.Writer, title string, rows []durationRow) error {
	tw := newTable(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tn\tmedian\tp90\tmin\tmax\t\n", title)
	for _, r := range rows {
		d := r.d
		fmt.Fprintf(tw, "%s\t%d\t%v\t%v\t%v\t%v\t\n", r.name, d.N, time.Duration(d.Median), time.Duration(d.P90), time.Duration(d.Min), time.Duration(d.Max))
	}
	return tw.Flush()
}
