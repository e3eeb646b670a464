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
	calls := Panel{ID: "calls"}
	conc := Panel{ID: "concurrency", Label: "concurrency (average threads inside)"}
	names := make([]string, len(series))
	timed := false
	for i := range series {
		s := &series[i]
		names[i] = s.Name
		c, q := Curve{Name: s.Name}, Curve{Name: s.Name}
		for _, p := range s.Points {
			timed = timed || p.WallNS > 0
		}
		if len(s.Points) > 0 {
			t0 := s.Points[0].Time
			for j, r := range s.Rates() {
				x := s.Points[j+1].Time.Sub(t0).Seconds()
				c.X, c.Y = append(c.X, x), append(c.Y, r.CallsPerSec)
				q.X, q.Y = append(q.X, x), append(q.Y, r.Concurrency)
			}
		}
		calls.Curves, conc.Curves = append(calls.Curves, c), append(conc.Curves, q)
	}
	calls.Label = "calls made to " + strings.Join(names, ", ") + " (per second)"
	panels := []Panel{calls, conc}
	// Counts alone (kinst count) have no time: no concurrency panel.
	if !timed {
		panels = panels[:1]
	}
	return PlotPanels(w, title, panels)
}

// Panel is one panel of a chart: curves over the chart's time axis.
type Panel struct {
	ID, Label string
	Curves    []Curve
	// Step draws each value as holding until the next point (a count
	// sampled when it changes), not as a line between points.
	Step  bool
	Marks []Mark // vertical lines at moments worth a label
	// YMax is the top of the value axis (0: the curves' maximum rounded
	// up to 1, 2 or 5 times a power of ten).
	YMax float64
}

// Curve is one series of a panel: Y at X seconds. Curves of the same
// name share a colour and one legend entry across panels.
type Curve struct {
	Name string
	X, Y []float64
}

// Mark is a labelled vertical line at X seconds.
type Mark struct {
	X     float64
	Label string
}

// plotScales gives each curve's colour in order of appearance (the
// legend), and the time axis's and each panel's y axis's maximum.
func plotScales(panels []Panel, palette []string) (legend []string, colour map[string]string, tmax float64, ymax []float64) {
	colour = map[string]string{}
	ymax = make([]float64, len(panels))
	for i, pn := range panels {
		for _, c := range pn.Curves {
			if _, ok := colour[c.Name]; !ok {
				colour[c.Name] = palette[len(legend)%len(palette)]
				legend = append(legend, c.Name)
			}
			for j := range c.X {
				tmax, ymax[i] = math.Max(tmax, c.X[j]), math.Max(ymax[i], c.Y[j])
			}
		}
		ymax[i] = niceMax(ymax[i])
		if pn.YMax > 0 {
			ymax[i] = pn.YMax
		}
	}
	return legend, colour, niceMax(tmax), ymax
}

// curvePath is an SVG path of c's points; step: a staircase.
func curvePath(c Curve, step bool, xAt, yAt func(float64) float64) string {
	var d strings.Builder
	for j := range c.X {
		x, y := xAt(c.X[j]), yAt(c.Y[j])
		switch {
		case j == 0:
			fmt.Fprintf(&d, "M%.1f,%.1f ", x, y)
		case step:
			fmt.Fprintf(&d, "L%.1f,%.1f L%.1f,%.1f ", x, yAt(c.Y[j-1]), x, y)
		default:
			fmt.Fprintf(&d, "L%.1f,%.1f ", x, y)
		}
	}
	return strings.TrimSpace(d.String())
}

// PlotPanels draws panels stacked over one time axis (0 to the last X of
// any curve), each with its own value axis from 0, and a legend of the
// curves' names.
func PlotPanels(w io.Writer, title string, panels []Panel) error {
	const (
		width, height     = 800, 560
		left, right       = 80, 20
		top, gap, bottom  = 50, 60, 70
		panelW            = width - left - right
		legendY           = height - 20
		fontFamily        = "sans-serif"
		tickCount         = 5
		strokeWidth       = 1.5
		strokeWidthLegend = 3
	)
	palette := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}
	if len(panels) == 0 {
		return fmt.Errorf("plot %q: no panels", title)
	}
	// Two panels share the height as Figure 11's do; more divide it.
	panelH := (height - top - bottom - gap*(max(len(panels), 2)-1)) / max(len(panels), 2)
	legend, colour, tmax, ymax := plotScales(panels, palette)

	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" font-size="12">`+"\n",
		width, height, width, height, fontFamily)
	p(`<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	p(`<text x="%d" y="24" font-size="16" text-anchor="middle">%s</text>`+"\n", width/2, html.EscapeString(title))
	for pi, pn := range panels {
		y0 := float64(top + pi*(panelH+gap))
		xAt := func(x float64) float64 { return float64(left) + float64(panelW)*x/tmax }
		yAt := func(v float64) float64 { return y0 + float64(panelH) - float64(panelH)*v/ymax[pi] }
		p(`<g class="panel" id="%s">`+"\n", pn.ID)
		p(`<text class="panel-title" x="%d" y="%.0f">%s</text>`+"\n", left, y0-8, html.EscapeString(pn.Label))
		p(`<rect class="frame" x="%d" y="%.0f" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", left, y0, panelW, panelH)
		// Axes and ticks.
		p(`<g class="y-axis">`)
		for k := 0; k <= tickCount; k++ {
			v := ymax[pi] * float64(k) / tickCount
			y := yAt(v)
			p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`, left, y, left+panelW, y)
			p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`, left-6, y+4, tickLabel(v))
		}
		p("</g>\n")
		p(`<g class="x-axis">`)
		for k := 0; k <= tickCount; k++ {
			v := tmax * float64(k) / tickCount
			x := xAt(v)
			p(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#888"/>`, x, y0+float64(panelH), x, y0+float64(panelH)+4)
			p(`<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`, x, y0+float64(panelH)+18, tickLabel(v))
		}
		p("</g>\n")
		for k, m := range pn.Marks {
			// Labels one below the other, so that close marks stay
			// legible.
			x := xAt(m.X)
			p(`<g class="mark"><line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#555" stroke-dasharray="4,3"/>`,
				x, y0, x, y0+float64(panelH))
			p(`<text x="%.1f" y="%.0f" font-size="11" fill="#333">%s</text></g>`+"\n", x+4, y0+14+float64(14*k), html.EscapeString(m.Label))
		}
		for _, c := range pn.Curves {
			if len(c.X) == 0 {
				continue
			}
			p(`<path class="series" data-series="%s" d="%s" fill="none" stroke="%s" stroke-width="%g"/>`+"\n",
				html.EscapeString(c.Name), curvePath(c, pn.Step, xAt, yAt), colour[c.Name], strokeWidth)
		}
		p("</g>\n")
	}
	p(`<text class="x-label" x="%d" y="%d" text-anchor="middle">time (s)</text>`+"\n", left+panelW/2, height-bottom+40)
	p(`<g class="legend">`)
	for i, name := range legend {
		x := left + i*160
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="%d"/>`, x, legendY-4, x+20, legendY-4, colour[name], strokeWidthLegend)
		p(`<text x="%d" y="%d">%s</text>`, x+26, legendY, html.EscapeString(name))
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
