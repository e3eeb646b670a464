package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/output"
)

// WatchOptions are the flags of `kinst watch`.
type WatchOptions struct {
	Interval   time.Duration
	Iterations int // refreshes before exiting; 0: until Ctrl-C
	History    int // sparkline length
	JSON       bool
}

// watched is one metric across refreshes.
type watched struct {
	row  output.WatchRow
	last metrics.Point
	seen bool
}

// watchRows are Watch's rows by metric, across refreshes.
type watchRows struct {
	rows    map[string]*watched
	history int // rates kept a row
	live    map[string]bool
}

// refresh updates the rows from the sessions' totals, drops those of
// sessions gone, and gives them, busiest first.
func (wr *watchRows) refresh(list []api.Session, now time.Time) []output.WatchRow {
	wr.live = map[string]bool{}
	for _, s := range list {
		for _, t := range s.Timers {
			metric := "time " + t.Function
			if t.Filter != "" {
				metric += " (" + t.Filter + ")"
			}
			wr.update(s.ID+"/t/"+t.Function, output.WatchRow{Session: s.Name, Metric: metric}, metrics.Point(t.Totals))
		}
		for _, p := range s.Probes {
			wr.update(s.ID+"/c/"+location(p.Resolved), output.WatchRow{Session: s.Name, Metric: "count " + location(p.Resolved)},
				metrics.Point{Time: now, Calls: p.Count})
		}
	}
	for k := range wr.rows {
		if !wr.live[k] {
			delete(wr.rows, k)
		}
	}
	sorted := make([]output.WatchRow, 0, len(wr.rows))
	for _, w := range wr.rows {
		sorted = append(sorted, w.row)
	}
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].PerSec != sorted[j].PerSec {
			return sorted[i].PerSec > sorted[j].PerSec
		}
		return sorted[i].Session+sorted[i].Metric < sorted[j].Session+sorted[j].Metric
	})
	return sorted
}

// update takes a metric's new point: its rate since the last one.
func (wr *watchRows) update(key string, row output.WatchRow, p metrics.Point) {
	wr.live[key] = true
	w := wr.rows[key]
	if w == nil {
		w = &watched{row: row}
		wr.rows[key] = w
	}
	if w.seen {
		r := metrics.Derive(w.last, p)
		w.row.PerSec, w.row.AvgWallNS, w.row.Concurrency = r.CallsPerSec, r.AvgWallNS, r.Concurrency
		w.row.History = append(w.row.History, r.CallsPerSec)
		if len(w.row.History) > wr.history {
			w.row.History = w.row.History[len(w.row.History)-wr.history:]
		}
	}
	w.row.Total, w.row.Inside = p.Calls, p.Inside
	w.last, w.seen = p, true
}

// Watch shows every active metric of every session, refreshed like top:
// sorted by rate, with a sparkline of the recent rates per row.
func Watch(ctx context.Context, c *api.Client, o WatchOptions, env Env) error {
	stdout := env.Out
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.History <= 0 {
		o.History = 30
	}
	rows := watchRows{rows: map[string]*watched{}, history: o.History}
	next := env.now()
	for i := 0; o.Iterations == 0 || i <= o.Iterations; i++ {
		list, err := c.Sessions(ctx)
		if err != nil {
			return err
		}
		now := env.now()
		sorted := rows.refresh(list, now)
		last := o.Iterations != 0 && i == o.Iterations
		if o.JSON {
			if last {
				return writeJSON(stdout, sorted)
			}
		} else {
			drawWatch(stdout, now, len(list), sorted)
		}
		if last {
			return nil
		}
		// Refresh on a fixed grid, as a ticker would, skipping what a
		// slow refresh missed.
		t := env.now()
		for !next.After(t) {
			next = next.Add(o.Interval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-env.after(next.Sub(t)):
		}
	}
	return nil
}

// drawWatch redraws the screen.
func drawWatch(w io.Writer, now time.Time, sessions int, rows []output.WatchRow) {
	fmt.Fprint(w, "\x1b[H\x1b[2J") // home, clear
	fmt.Fprintf(w, "kinst watch — %s — %d session(s), %d metric(s); Ctrl-C to quit\n\n", now.Format("15:04:05"), sessions, len(rows))
	tw := newTable(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tMETRIC\tTOTAL\tPER SEC\tAVG WALL\tCONC\tINSIDE\tHISTORY")
	for _, r := range rows {
		wall, conc, inside := "", "", ""
		if strings.HasPrefix(r.Metric, "time ") {
			wall, conc, inside = fmtNS(r.AvgWallNS), fmt.Sprintf("%.2f", r.Concurrency), fmt.Sprint(r.Inside)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t%s\n", r.Session, r.Metric, r.Total, r.PerSec, wall, conc, inside, Sparkline(r.History))
	}
	tw.Flush()
}

// Sparkline draws values as a row of block characters scaled to their
// maximum.
func Sparkline(v []float64) string {
	const bars = "▁▂▃▄▅▆▇█"
	levels := []rune(bars)
	hi := 0.0
	for _, x := range v {
		hi = max(hi, x)
	}
	var b strings.Builder
	for _, x := range v {
		i := 0
		if hi > 0 {
			i = int(x / hi * float64(len(levels)-1))
		}
		b.WriteRune(levels[min(max(i, 0), len(levels)-1)])
	}
	return b.String()
}
