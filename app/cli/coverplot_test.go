package cli

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cover"
	"github.com/kinst/kinst/kerninstd/kerninstdtest"
)

// svgPanel is a chart panel as the SVG holds it.
type svgPanel struct {
	ID    string `xml:"id,attr"`
	Title string `xml:"text"`
	Rects []struct {
		X      float64 `xml:"x,attr"`
		Y      float64 `xml:"y,attr"`
		Width  float64 `xml:"width,attr"`
		Height float64 `xml:"height,attr"`
	} `xml:"rect"`
	Paths []struct {
		Series string `xml:"data-series,attr"`
		D      string `xml:"d,attr"`
	} `xml:"path"`
	Groups []struct {
		Class string `xml:"class,attr"`
		Text  string `xml:"text"`
	} `xml:"g"`
}

// kinst cover --callees do_sys_openat2 --svg: the JSON report's timeline
// drawn as steps; a live-probe curve that starts at the probes armed,
// falls at each sweep that removed probes and holds to the end of the
// session; the covered curve mirrors it; the marks name when half and
// 90% of the removals had happened.
func TestCoverPlot(t *testing.T) {
	f := newFixture(t, true)
	svg := filepath.Join(t.TempDir(), "cov.svg")
	f.workloads["opens"] = func(io.Writer) int {
		f.streaming(2)
		f.must(f.s.Kernel.Count(kerninstdtest.Addr("do_sys_openat2", 0x9), 1))
		f.s.Clock.Advance(cover.Poll)
		f.covered(1)
		f.must(f.s.Kernel.Count(kerninstdtest.Addr("do_filp_open", 0x9), 1))
		f.must(f.s.Kernel.Count(kerninstdtest.Addr("putname", 0x9), 1))
		f.s.Clock.Advance(3 * cover.Poll)
		f.covered(3)
		f.s.Clock.Advance(time.Second)
		return 0
	}
	status, err := Cover(context.Background(), f.c, CoverOptions{Callees: []string{"do_sys_openat2"}, JSON: true, Name: "cov",
		SVG: svg, Command: []string{"opens"}}, f.env)
	if err != nil || status != 0 {
		t.Fatalf("status %d, %v", status, err)
	}
	var rep api.CoverReport
	if err := json.Unmarshal([]byte(f.stdout.String()), &rep); err != nil {
		t.Fatal(err)
	}
	var fns []string
	for _, fn := range rep.Functions {
		fns = append(fns, fn.Function)
	}
	if strings.Join(fns, " ") != "do_sys_openat2 do_filp_open putname" || rep.CoveredBlocks != 3 || len(rep.Timeline) != 3 {
		t.Fatalf("functions %v, %d covered, timeline %+v", fns, rep.CoveredBlocks, rep.Timeline)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Title  string     `xml:"text"`
		Panels []svgPanel `xml:"g"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	panels := map[string]svgPanel{}
	for _, p := range doc.Panels {
		panels[p.ID] = p
	}
	live, cov := panels["live-probes"], panels["covered"]
	if len(live.Paths) != 1 || len(cov.Paths) != 1 || live.Paths[0].Series != "live probes" || cov.Paths[0].Series != "blocks covered" {
		t.Fatalf("panels %+v", doc.Panels)
	}
	if !strings.Contains(live.Title, fmt.Sprintf("%d armed", rep.Armed)) || !strings.Contains(cov.Title, fmt.Sprintf("of %d", rep.TotalBlocks)) {
		t.Errorf("titles %q, %q", live.Title, cov.Title)
	}
	// The curves in data units: x from the frame, y from the value axis
	// (0 at the bottom, the panel's nice maximum at the top).
	points := func(p svgPanel, ymax float64) [][2]float64 {
		fr := p.Rects[0]
		var out [][2]float64
		for _, pt := range strings.Fields(p.Paths[0].D) {
			var x, y float64
			if _, err := fmt.Sscanf(pt[1:], "%f,%f", &x, &y); err != nil {
				t.Fatalf("point %q: %v", pt, err)
			}
			out = append(out, [2]float64{(x - fr.X) / fr.Width, (fr.Y + fr.Height - y) / fr.Height * ymax})
		}
		return out
	}
	// The fake clock makes the timeline exact: armed 3, one block seen
	// at the first poll, two more at the second; the session ends after
	// the workload's last second.
	wantTL := []api.CoverSample{{LiveProbes: 3}, {ElapsedNS: int64(cover.Poll), LiveProbes: 2, Covered: 1},
		{ElapsedNS: int64(2 * cover.Poll), Covered: 3}}
	if fmt.Sprint(rep.Timeline) != fmt.Sprint(wantTL) || rep.Armed != 3 || rep.DurationNS != int64(4*cover.Poll+time.Second) {
		t.Fatalf("armed %d, duration %d, timeline %+v; want 3, 1.2 s and %+v", rep.Armed, rep.DurationNS, rep.Timeline, wantTL)
	}
	// Steps: the first point, then two per change (across, then down),
	// and the last value held to the end of the session (1.2 s on an
	// axis to 2 s); values on an axis to the 3 probes armed.
	lp := points(live, 3)
	wantPts := [][2]float64{{0, 3}, {0.025, 3}, {0.025, 2}, {0.05, 2}, {0.05, 0}, {0.6, 0}, {0.6, 0}}
	cp := points(cov, 3)
	wantCov := [][2]float64{{0, 0}, {0.025, 0}, {0.025, 1}, {0.05, 1}, {0.05, 3}, {0.6, 3}, {0.6, 3}}
	for _, c := range []struct {
		name      string
		got, want [][2]float64
	}{{"live probes", lp, wantPts}, {"blocks covered", cp, wantCov}} {
		bad := len(c.got) != len(c.want)
		for i := 0; !bad && i < len(c.got); i++ {
			bad = abs(c.got[i][0]-c.want[i][0]) > 0.002 || abs(c.got[i][1]-c.want[i][1]) > 0.02
		}
		if bad {
			t.Errorf("%s path %v, want %v", c.name, c.got, c.want)
		}
	}
	var marks []string
	for _, g := range live.Groups {
		if g.Class == "mark" {
			marks = append(marks, g.Text)
		}
	}
	if strings.Join(marks, "; ") != "half of 3 removed by 0.1 s; 90% of 3 removed by 0.1 s" {
		t.Errorf("marks %q", marks)
	}
}

func abs(x float64) float64 { return max(x, -x) }
