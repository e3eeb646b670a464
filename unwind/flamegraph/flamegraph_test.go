package flamegraph

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kinst/kinst/unwind/folded"
)

var update = flag.Bool("update", false, "rewrite testdata/*.svg golden files")

const sample = `sleeper;main;sleep_forever;clock_nanosleep;hrtimer_nanosleep_[k] 60
reader;main;read_pipe;read;pipe_read_[k] 30
reader;main;read_pipe 10
waiter;main;<a&b>;futex_wait_[k] 20
`

func render(t *testing.T, o Options) []byte {
	t.Helper()
	p, err := folded.Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Render(&buf, p.Stacks(), o); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type frame struct {
	name string
	x, w float64
	dx   int64
	dw   int64
}

// frames parses the SVG with encoding/xml, which also proves it is well
// formed, and returns every frame rectangle with its title.
func frames(t *testing.T, svg []byte) []frame {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	var out []frame
	var cur *frame
	inTitle := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			switch e.Name.Local {
			case "g":
				cur = &frame{}
			case "title":
				inTitle = cur != nil
			case "rect":
				if cur == nil {
					continue
				}
				for _, a := range e.Attr {
					v, _ := strconv.ParseFloat(a.Value, 64)
					switch a.Name.Local {
					case "x":
						cur.x = v
					case "width":
						cur.w = v
					case "data-x":
						cur.dx = int64(v)
					case "data-w":
						cur.dw = int64(v)
					}
				}
			}
		case xml.CharData:
			if inTitle {
				cur.name = string(e)
			}
		case xml.EndElement:
			switch e.Name.Local {
			case "title":
				inTitle = false
			case "g":
				if cur != nil && cur.name != "" {
					out = append(out, *cur)
				}
				cur = nil
			}
		}
	}
	return out
}

func TestRenderGeometry(t *testing.T) {
	svg := render(t, Options{Title: "Off-CPU <time>", Subtitle: "test", Width: 1010})
	fs := frames(t, svg)
	byName := map[string]frame{}
	for _, f := range fs {
		byName[f.name[:strings.LastIndex(f.name, " (")]] = f
	}
	tests := []struct {
		name  string
		value int64
		title string
	}{
		{"all", 120, "all (120 samples, 100.00%)"},
		{"sleeper", 60, "sleeper (60 samples, 50.00%)"},
		{"read_pipe", 40, "read_pipe (40 samples, 33.33%)"},
		{"pipe_read_[k]", 30, "pipe_read_[k] (30 samples, 25.00%)"},
		{"<a&b>", 20, "<a&b> (20 samples, 16.67%)"},
	}
	for _, tc := range tests {
		f, ok := byName[tc.name]
		if !ok {
			t.Errorf("no frame %q", tc.name)
			continue
		}
		if f.name != tc.title || f.dw != tc.value {
			t.Errorf("%s: title %q value %d, want %q %d", tc.name, f.name, f.dw, tc.title, tc.value)
		}
		// 1010 px wide with 10 px padding each side: 990 px for 120 samples.
		if want := float64(tc.value) * 990 / 120; f.w < want-0.01 || f.w > want+0.01 {
			t.Errorf("%s: width %.2f, want %.2f", tc.name, f.w, want)
		}
		if want := 10 + float64(f.dx)*990/120; f.x < want-0.01 || f.x > want+0.01 {
			t.Errorf("%s: x %.2f, want %.2f", tc.name, f.x, want)
		}
	}
	// Children sit inside their parent.
	if r, p := byName["read_pipe"], byName["pipe_read_[k]"]; p.dx < r.dx || p.dx+p.dw > r.dx+r.dw {
		t.Errorf("pipe_read_[k] [%d,+%d] outside read_pipe [%d,+%d]", p.dx, p.dw, r.dx, r.dw)
	}
	for _, want := range []string{"function zoom(", "function search(", "Reset Zoom", "Off-CPU &lt;time&gt;"} {
		if !bytes.Contains(svg, []byte(want)) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

func TestRenderGolden(t *testing.T) {
	svg := render(t, Options{Title: "golden", Unit: "ns", Inverted: true})
	path := filepath.Join("testdata", "sample.svg")
	if *update {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(path, svg, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if !bytes.Equal(svg, want) {
		t.Errorf("SVG differs from %s (run go test -update after checking the change)", path)
	}
}

func TestRenderEmpty(t *testing.T) {
	err := Render(io.Discard, []folded.Stack{{Frames: []string{"a"}, Value: 0}}, Options{})
	if !errors.Is(err, ErrEmpty) {
		t.Fatalf("err %v, want ErrEmpty", err)
	}
}

// TestRasterise renders the SVG with librsvg, an independent SVG
// implementation, and checks it produced a PNG of the declared size.
func TestRasterise(t *testing.T) {
	conv, err := exec.LookPath("rsvg-convert")
	if err != nil {
		t.Skip("rsvg-convert not installed (apt-get install librsvg2-bin): cannot rasterise")
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "fg.svg")
	if err := os.WriteFile(in, render(t, Options{Width: 800}), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "fg.png")
	if b, err := exec.Command(conv, "-o", out, in).CombinedOutput(); err != nil {
		t.Fatalf("rsvg-convert: %v\n%s", err, b)
	}
	png, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(png) < 24 || string(png[1:4]) != "PNG" {
		t.Fatal("rsvg-convert did not write a PNG")
	}
	w := int(png[16])<<24 | int(png[17])<<16 | int(png[18])<<8 | int(png[19])
	if w != 800 {
		t.Errorf("PNG width %d, want 800", w)
	}
}
