package flamegraph

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os/exec"
	"testing"
)

type jsFrame struct {
	Title     string            `json:"title"`
	Rect      map[string]string `json:"rect"`
	TextAttrs map[string]string `json:"textAttrs"`
	Text      string            `json:"text"`
}

type jsText struct {
	ID    string `json:"id"`
	Class string `json:"class"`
	Text  string `json:"text"`
}

type jsInput struct {
	SVG    map[string]string `json:"svg"`
	Texts  []jsText          `json:"texts"`
	Frames []jsFrame         `json:"frames"`
	Script string            `json:"script"`
	ZoomTo string            `json:"zoomTo"`
	Search string            `json:"search"`
}

type jsState struct {
	Name   string  `json:"name"`
	Hidden bool    `json:"hidden"`
	X      float64 `json:"x"`
	W      float64 `json:"w"`
	Fill   string  `json:"fill"`
	Label  string  `json:"label"`
}

type jsOutput struct {
	Initial, Zoomed, Unzoomed, Searched, Reset []jsState
	UnzoomVisible                              bool
	Matched, SearchButton                      string
}

func attrMap(as []xml.Attr) map[string]string {
	m := map[string]string{}
	for _, a := range as {
		m[a.Name.Local] = a.Value
	}
	return m
}

// parseForJS turns the SVG into the harness's input: the elements the
// script touches, with their attributes and text.
func parseForJS(t *testing.T, svg []byte) jsInput {
	t.Helper()
	var in jsInput
	dec := xml.NewDecoder(bytes.NewReader(svg))
	var stack []string
	var cur *jsFrame
	var text *jsText
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			stack = append(stack, e.Name.Local)
			a := attrMap(e.Attr)
			switch {
			case e.Name.Local == "svg":
				in.SVG = a
			case e.Name.Local == "g" && a["id"] == "" && cur == nil:
				cur = &jsFrame{}
			case e.Name.Local == "rect" && cur != nil:
				cur.Rect = a
			case e.Name.Local == "text" && cur != nil:
				cur.TextAttrs = a
			case e.Name.Local == "text" && a["id"] != "":
				text = &jsText{ID: a["id"], Class: a["class"]}
			}
		case xml.CharData:
			switch {
			case len(stack) > 0 && stack[len(stack)-1] == "script":
				in.Script += string(e)
			case cur != nil && stack[len(stack)-1] == "title":
				cur.Title += string(e)
			case cur != nil && stack[len(stack)-1] == "text":
				cur.Text += string(e)
			case text != nil:
				text.Text += string(e)
			}
		case xml.EndElement:
			stack = stack[:len(stack)-1]
			if e.Name.Local == "g" && cur != nil {
				in.Frames = append(in.Frames, *cur)
				cur = nil
			}
			if e.Name.Local == "text" && text != nil {
				in.Texts = append(in.Texts, *text)
				text = nil
			}
		}
	}
	return in
}

// TestScript runs the SVG's own JavaScript in node against a small DOM:
// clicking a frame zooms into it (its ancestors span the width, its
// descendants scale, the rest hide), Reset Zoom restores the picture,
// and a search highlights matches and reports their share of the total.
func TestScript(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed: cannot run the flame graph's script")
	}
	in := parseForJS(t, render(t, Options{Width: 1010}))
	in.ZoomTo, in.Search = "read_pipe", "pipe"
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, "testdata/harness.js")
	cmd.Stdin = bytes.NewReader(b)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var out jsOutput
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("%v: %s", err, outb)
	}
	find := func(states []jsState, name string) jsState {
		for _, s := range states {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no frame %q", name)
		return jsState{}
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 0.01 }
	const full = 990.0 // 1010 px less 10 px padding each side
	// read_pipe is 40 of 120 samples; its child pipe_read_[k] 30 of them.
	for _, name := range []string{"read_pipe", "reader", "all", "main"} {
		if s := find(out.Zoomed, name); s.Hidden || !near(s.X, 10) || !near(s.W, full) {
			t.Errorf("zoomed: %s at x=%.2f w=%.2f hidden=%v, want the full width", name, s.X, s.W, s.Hidden)
		}
	}
	if s := find(out.Zoomed, "pipe_read_[k]"); s.Hidden || !near(s.W, full*30/40) || !near(s.X, 10) {
		t.Errorf("zoomed: pipe_read_[k] x=%.2f w=%.2f, want x=10 w=%.2f", s.X, s.W, full*30/40)
	}
	for _, name := range []string{"sleeper", "hrtimer_nanosleep_[k]", "waiter"} {
		if s := find(out.Zoomed, name); !s.Hidden {
			t.Errorf("zoomed: %s still shown", name)
		}
	}
	if !out.UnzoomVisible {
		t.Error("Reset Zoom not shown after a zoom")
	}
	for i, s := range out.Unzoomed {
		if init := out.Initial[i]; s.Hidden || !near(s.X, init.X) || !near(s.W, init.W) {
			t.Errorf("after Reset Zoom: %s x=%.2f w=%.2f, was x=%.2f w=%.2f", s.Name, s.X, s.W, init.X, init.W)
		}
	}
	// "pipe" matches read_pipe (40) and pipe_read_[k] (30, inside it):
	// the union is 40 of 120.
	if out.Matched != "Matched: 33.3%" || out.SearchButton != "Reset Search" {
		t.Errorf("search: %q, button %q", out.Matched, out.SearchButton)
	}
	for i, s := range out.Searched {
		matched := s.Name == "read_pipe" || s.Name == "pipe_read_[k]"
		if (s.Fill == "rgb(230,0,230)") != matched {
			t.Errorf("search: %s fill %s", s.Name, s.Fill)
		}
		if out.Reset[i].Fill != out.Initial[i].Fill {
			t.Errorf("after Reset Search: %s fill %s, was %s", s.Name, out.Reset[i].Fill, out.Initial[i].Fill)
		}
	}
}
