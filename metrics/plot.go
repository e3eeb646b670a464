package metrics

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// PlotSVG draws series as a time-series chart in the style of KernInst's
// Figure 11: one panel of "calls made to" each function (calls per
// second) above one of its "concurrency" (average threads inside), over
// the same time axis; series without wall time (counts) get the first
// panel only. Each series is one curve in each panel; values are
// per sampling interval, drawn at the interval's end.
func PlotSVG(w io.Writer, title string, series []Series) error {
	const (
		width, height     = 800, 560
		left, right       = 80, 20
		top, gap, bottom  = 50, 60, 70
		panelW            = width - left - right
		panelH            = (height - top - gap - bottom) / 2
		legendY           = height - 20
		fontFamily        = "sans-serif"
		tickCount         = 5
		strokeWidth       = 1.5
		strokeWidthLegend = 3
	)
	palette := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}

	type curve struct{ x, calls, conc []float64 }
	curves := make([]curve, len(series))
	var tmax, cmax, qmax float64
	for i := range series {
		s := &series[i]
		if len(s.Points) == 0 {
			continue
		}
		t0 := s.Points[0].Time
		for j, r := range s.Rates() {
			x := s.Points[j+1].Time.Sub(t0).Seconds()
			curves[i].x = append(curves[i].x, x)
			curves[i].calls = append(curves[i].calls, r.CallsPerSec)
			curves[i].conc = append(curves[i].conc, r.Concurrency)
			tmax, cmax, qmax = math.Max(tmax, x), math.Max(cmax, r.CallsPerSec), math.Max(qmax, r.Concurrency)
		}
	}
	tmax, cmax, qmax = niceMax(tmax), niceMax(cmax), niceMax(qmax)

	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" font-size="12">`+"\n",
		width, height, width, height, fontFamily)
	p(`<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	p(`<text x="%d" y="24" font-size="16" text-anchor="middle">%s</text>`+"\n", width/2, html.EscapeString(title))
	names := make([]string, len(series))
	for i, s := range series {
		names[i] = s.Name
	}
	panels := []struct {
		id, label string
		ymax      float64
		values    func(c curve) []float64
	}{
		{"calls", "calls made to " + strings.Join(names, ", ") + " (per second)", cmax, func(c curve) []float64 { return c.calls }},
		{"concurrency", "concurrency (average threads inside)", qmax, func(c curve) []float64 { return c.conc }},
	}
	// Counts alone (kinst count) have no time: no concurrency panel.
	timed := false
	for _, s := range series {
		for _, p := range s.Points {
			timed = timed || p.WallNS > 0
		}
	}
	if !timed {
		panels = panels[:1]
	}
	for pi, pn := range panels {
		y0 := float64(top + pi*(panelH+gap))
		p(`<g class="panel" id="%s">`+"\n", pn.id)
		p(`<text class="panel-title" x="%d" y="%.0f">%s</text>`+"\n", left, y0-8, html.EscapeString(pn.label))
		p(`<rect class="frame" x="%d" y="%.0f" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", left, y0, panelW, panelH)
		// Axes and ticks.
		p(`<g class="y-axis">`)
		for k := 0; k <= tickCount; k++ {
			v := pn.ymax * float64(k) / tickCount
			y := y0 + float64(panelH) - float64(panelH)*float64(k)/tickCount
			p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`, left, y, left+panelW, y)
			p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`, left-6, y+4, tickLabel(v))
		}
		p("</g>\n")
		p(`<g class="x-axis">`)
		for k := 0; k <= tickCount; k++ {
			v := tmax * float64(k) / tickCount
			x := float64(left) + float64(panelW)*float64(k)/tickCount
			p(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#888"/>`, x, y0+float64(panelH), x, y0+float64(panelH)+4)
			p(`<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`, x, y0+float64(panelH)+18, tickLabel(v))
		}
		p("</g>\n")
		for i, c := range curves {
			vals := pn.values(c)
			if len(vals) == 0 {
				continue
			}
			var d strings.Builder
			for j, v := range vals {
				x := float64(left) + float64(panelW)*c.x[j]/tmax
				y := y0 + float64(panelH) - float64(panelH)*v/pn.ymax
				cmd := "L"
				if j == 0 {
					cmd = "M"
				}
				fmt.Fprintf(&d, "%s%.1f,%.1f ", cmd, x, y)
			}
			p(`<path class="series" data-series="%s" d="%s" fill="none" stroke="%s" stroke-width="%g"/>`+"\n",
				html.EscapeString(series[i].Name), strings.TrimSpace(d.String()), palette[i%len(palette)], strokeWidth)
		}
		p("</g>\n")
	}
	p(`<text class="x-label" x="%d" y="%d" text-anchor="middle">time (s)</text>`+"\n", left+panelW/2, height-bottom+40)
	p(`<g class="legend">`)
	for i, s := range series {
		x := left + i*160
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="%d"/>`, x, legendY-4, x+20, legendY-4, palette[i%len(palette)], strokeWidthLegend)
		p(`<text x="%d" y="%d">%s</text>`, x+26, legendY, html.EscapeString(s.Name))
	}
	p("</g>\n</svg>\n")
	return bw.Flush()
}

// niceMax rounds v up to 1, 2 or 5 times a power of ten (1 for 0).
func niceMax(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}

func tickLabel(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.3gk", v/1e3)
	}
	return fmt.Sprintf("%.3g", v)
}
