package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/internal/outfile"
	"github.com/kinst/kinst/metrics"
)

// checkOutputDir finds a bad output path before a long run, not after.
func checkOutputDir(what, path string) error {
	if err := outfile.Check(path); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// coverPanels are kinst cover --svg's chart: live probes over time above
// blocks covered, both held between the daemon's sweeps (step curves),
// drawn to the end of the session, on value axes up to the probes armed;
// dashed lines mark when half and 90% of the probes that were removed had
// gone (the overhead's decay).
func coverPanels(r api.CoverReport) []metrics.Panel {
	live := metrics.Curve{Name: "live probes"}
	cov := metrics.Curve{Name: "blocks covered"}
	for _, s := range r.Timeline {
		x := time.Duration(s.ElapsedNS).Seconds()
		live.X, live.Y = append(live.X, x), append(live.Y, float64(s.LiveProbes))
		cov.X, cov.Y = append(cov.X, x), append(cov.Y, float64(s.Covered))
	}
	if n := len(live.X); n > 0 {
		if end := time.Duration(r.DurationNS).Seconds(); end > live.X[n-1] {
			live.X, live.Y = append(live.X, end), append(live.Y, live.Y[n-1])
			cov.X, cov.Y = append(cov.X, end), append(cov.Y, cov.Y[n-1])
		}
	}
	// Both value axes end at the probes armed: the live probes start at
	// the top, and the covered blocks can reach it.
	top := float64(r.Armed)
	probes := metrics.Panel{ID: "live-probes", Step: true, Curves: []metrics.Curve{live}, YMax: top,
		Label: fmt.Sprintf("live probes (%d armed; each removed after its block's first run)", r.Armed)}
	if gone := r.Armed - liveAtEnd(r); gone > 0 {
		for _, q := range []struct {
			frac  float64
			label string
		}{{0.5, "half"}, {0.9, "90%"}} {
			for _, s := range r.Timeline {
				if float64(r.Armed-s.LiveProbes) >= q.frac*float64(gone) {
					x := time.Duration(s.ElapsedNS).Seconds()
					probes.Marks = append(probes.Marks, metrics.Mark{X: x,
						Label: fmt.Sprintf("%s of %d removed by %.3g s", q.label, gone, x)})
					break
				}
			}
		}
	}
	covered := metrics.Panel{ID: "covered", Step: true, Curves: []metrics.Curve{cov}, YMax: top,
		Label: fmt.Sprintf("blocks covered (of %d; %d refused a probe)", r.TotalBlocks, r.TotalBlocks-r.Armed)}
	return []metrics.Panel{probes, covered}
}

// liveAtEnd is the probes live at the report's last timeline row.
func liveAtEnd(r api.CoverReport) int {
	if len(r.Timeline) == 0 {
		return r.Armed
	}
	return r.Timeline[len(r.Timeline)-1].LiveProbes
}

// writeCoverPlot writes kinst cover's chart to path.
func writeCoverPlot(path string, r api.CoverReport) error {
	title := "kinst cover"
	if r.Session != "" {
		title += " " + r.Session
	}
	return outfile.Write(path, func(w io.Writer) error { return metrics.PlotPanels(w, title, coverPanels(r)) })
}
