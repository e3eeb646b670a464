package metrics

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTimerWordDecoding(t *testing.T) {
	// Entries at TSC 1000 and 1500, exit of the first at 4000: integral
	// at 5000 is (4000-1000) + (5000-1500) = 6500 with one thread inside.
	enter := func(tsc uint64) uint64 { return 1 - tsc<<16 }
	exit := func(tsc uint64) uint64 { return tsc<<16 - 1 }
	w := enter(1000) + enter(1500) + exit(4000)
	if TimerInside(w) != 1 || TimerIntegral(w, 5000) != 6500 {
		t.Fatalf("inside %d integral %d; want 1 and 6500", TimerInside(w), TimerIntegral(w, 5000))
	}
	// TSC values beyond 2^48 wrap, but differences stay exact.
	big := uint64(1)<<50 + 12345
	w = enter(big)
	if d := TimerDelta(TimerIntegral(w, big+10), TimerIntegral(w, big+25)); d != 15 {
		t.Fatalf("delta across the wrap %d, want 15", d)
	}
}

func TestTimerAcc(t *testing.T) {
	var a TimerAcc
	one := uint64(1)
	w := one - 100<<16 // one thread entered at 100
	if got := a.Add(w, 300); got != 200 {
		t.Fatalf("total %d, want 200", got)
	}
	// A reading a little behind (another CPU's TSC) is ignored...
	if got := a.Add(w, 290); got != 200 {
		t.Fatalf("total after a backwards reading %d, want 200", got)
	}
	// ...and time catches up.
	if got := a.Add(w+(600<<16-1), 900); got != 500 {
		t.Fatalf("total after the exit at 600 %d, want 500", got)
	}
}

func TestDerive(t *testing.T) {
	t0 := time.Unix(100, 0)
	a := Point{Time: t0, Calls: 10, WallNS: 1e9}
	b := Point{Time: t0.Add(2 * time.Second), Calls: 30, WallNS: 5e9, VirtualNS: 1e9}
	r := Derive(a, b)
	if r.CallsPerSec != 10 || r.AvgWallNS != 2e8 || r.Concurrency != 2 || r.AvgVirtualNS != 5e7 {
		t.Fatalf("rates %+v", r)
	}
	var s Series
	s.Max = 2
	s.Add(a)
	s.Add(b)
	s.Add(Point{Time: t0.Add(3 * time.Second), Calls: 30, WallNS: 5e9})
	if len(s.Points) != 2 || s.Points[0] != b {
		t.Fatalf("bounded series %+v", s.Points)
	}
}

func TestClockRate(t *testing.T) {
	c := NewClock()
	start := TSC()
	time.Sleep(300 * time.Millisecond)
	ticks := TSC() - start
	ns := c.Nanos(ticks)
	if math.Abs(ns-3e8)/3e8 > 0.2 {
		t.Fatalf("300 ms of TSC converts to %.0f ns", ns)
	}
}

func plotSeries() []Series {
	t0 := time.Unix(0, 0)
	var a, b Series
	a.Name, b.Name = "do_sys_openat2", "do_filp_open"
	for i := 0; i <= 10; i++ {
		ti := t0.Add(time.Duration(i) * time.Second)
		a.Add(Point{Time: ti, Calls: uint64(i * 1000), WallNS: float64(i) * 2e9})
		b.Add(Point{Time: ti, Calls: uint64(i * i * 100), WallNS: float64(i) * 1e9})
	}
	return []Series{a, b}
}

// TestPlotSVG checks the chart's structure: it parses as XML, has the two
// panels of KernInst's Figure 11 with one path per function each, and the
// paths stay inside their panel frames. If rsvg-convert is installed it
// must also rasterise the file.
func TestPlotSVG(t *testing.T) {
	var buf bytes.Buffer
	if err := PlotSVG(&buf, "kinst time", plotSeries()); err != nil {
		t.Fatal(err)
	}
	type path struct {
		Class  string `xml:"class,attr"`
		Series string `xml:"data-series,attr"`
		D      string `xml:"d,attr"`
	}
	type rect struct {
		Class  string  `xml:"class,attr"`
		X      float64 `xml:"x,attr"`
		Y      float64 `xml:"y,attr"`
		Width  float64 `xml:"width,attr"`
		Height float64 `xml:"height,attr"`
	}
	type group struct {
		ID    string `xml:"id,attr"`
		Title string `xml:"text"`
		Rects []rect `xml:"rect"`
		Paths []path `xml:"path"`
	}
	var doc struct {
		XMLName xml.Name `xml:"svg"`
		Groups  []group  `xml:"g"`
	}
	if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	panels := map[string]group{}
	for _, g := range doc.Groups {
		if g.ID != "" {
			panels[g.ID] = g
		}
	}
	for _, id := range []string{"calls", "concurrency"} {
		g, ok := panels[id]
		if !ok {
			t.Fatalf("no %s panel", id)
		}
		if len(g.Paths) != 2 || g.Paths[0].Series != "do_sys_openat2" || g.Paths[1].Series != "do_filp_open" {
			t.Fatalf("%s panel paths %+v", id, g.Paths)
		}
		fr := g.Rects[0]
		for _, p := range g.Paths {
			pts := strings.Fields(p.D)
			if len(pts) != 10 { // 11 points, 10 intervals
				t.Errorf("%s/%s: %d points, want 10", id, p.Series, len(pts))
			}
			for _, pt := range pts {
				var x, y float64
				if _, err := fmtSscan(pt[1:], &x, &y); err != nil {
					t.Fatalf("path point %q: %v", pt, err)
				}
				if x < fr.X-0.1 || x > fr.X+fr.Width+0.1 || y < fr.Y-0.1 || y > fr.Y+fr.Height+0.1 {
					t.Errorf("%s/%s point %q outside the frame %+v", id, p.Series, pt, fr)
				}
			}
		}
	}
	if !strings.Contains(panels["calls"].Title, "calls made to do_sys_openat2, do_filp_open") {
		t.Errorf("calls panel title %q", panels["calls"].Title)
	}
	// do_sys_openat2: 1000 calls/s and concurrency 2 throughout, so its
	// concurrency path is flat.
	ys := map[string]bool{}
	for _, pt := range strings.Fields(panels["concurrency"].Paths[0].D) {
		ys[pt[strings.Index(pt, ","):]] = true
	}
	if len(ys) != 1 {
		t.Errorf("constant concurrency drawn at %d heights", len(ys))
	}

	rsvg, err := exec.LookPath("rsvg-convert")
	if err != nil {
		t.Skip("rsvg-convert not installed (apt-get install librsvg2-bin): structure checked, rasterising skipped")
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "plot.svg"), filepath.Join(dir, "plot.png")
	os.WriteFile(in, buf.Bytes(), 0o600)
	if b, err := exec.Command(rsvg, "-o", out, in).CombinedOutput(); err != nil {
		t.Fatalf("rsvg-convert: %v: %s", err, b)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("rasterised SVG is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 800 || b.Dy() != 560 {
		t.Fatalf("raster %v, want 800×560", b)
	}
	// Some pixel of the first curve's colour must be drawn.
	found := false
	for y := 0; y < 560 && !found; y++ {
		for x := 0; x < 800; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r>>8 == 0x1f && g>>8 == 0x77 && bl>>8 == 0xb4 {
				found = true
				break
			}
		}
	}
	if !found {
		t.Error("the raster has no pixel of the first series' colour")
	}
}

func fmtSscan(s string, x, y *float64) (int, error) {
	return fmt.Sscanf(s, "%f,%f", x, y)
}

// Counts alone get the calls panel only.
func TestPlotSVGCountsOnly(t *testing.T) {
	series := plotSeries()
	for i := range series {
		for j := range series[i].Points {
			series[i].Points[j].WallNS = 0
		}
	}
	var buf bytes.Buffer
	if err := PlotSVG(&buf, "kinst count", series); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `id="calls"`) || strings.Contains(buf.String(), `id="concurrency"`) {
		t.Fatal("want the calls panel alone")
	}
	if err := xml.Unmarshal(buf.Bytes(), new(struct{ XMLName xml.Name })); err != nil {
		t.Fatal(err)
	}
}
