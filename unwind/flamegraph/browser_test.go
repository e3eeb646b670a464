package flamegraph

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/kinst/kinst/unwind/folded"
	"github.com/kinst/kinst/web/webtest"
)

// browserFrame is one frame as the browser lays it out and paints it.
type browserFrame struct {
	Name   string  `json:"name"`
	Hidden bool    `json:"hidden"` // display: none, as computed from the stylesheet
	X      float64 `json:"x"`      // the rectangle's bounding box on the page
	W      float64 `json:"w"`
	Fill   string  `json:"fill"`  // computed fill colour
	Label  string  `json:"label"` // the text drawn on the frame
	// TextW is the label's rendered length in pixels.
	TextW float64 `json:"textW"`
}

type browserState struct {
	Frames  []browserFrame `json:"frames"`
	Unzoom  bool           `json:"unzoom"` // Reset Zoom shown
	Search  string         `json:"search"`
	Matched string         `json:"matched"`
	Details string         `json:"details"`
}

const snapshotJS = `(() => {
	const shown = e => getComputedStyle(e).display !== "none";
	const frames = Array.from(document.getElementById("frames").children).map(g => {
		const r = g.querySelector("rect"), t = g.querySelector("text"), b = r.getBoundingClientRect();
		return { name: g.getAttribute("data-name"), hidden: !shown(g), x: b.x, w: b.width,
			fill: getComputedStyle(r).fill, label: t.textContent, textW: shown(g) ? t.getComputedTextLength() : 0 };
	});
	return { frames, unzoom: shown(document.getElementById("unzoom")),
		search: document.getElementById("search").textContent,
		matched: document.getElementById("matched").textContent,
		details: document.getElementById("details").textContent };
})()`

// TestBrowser loads a flame graph rendered from known folded stacks in
// headless Chromium and works it as a user would, with real mouse events
// on the page: clicking a frame zooms into it (ancestors span the width,
// descendants scale by the zoom ratio, everything else is hidden by the
// stylesheet, labels grow), hovering shows the frame's title, Reset Zoom
// restores the picture, and Search (its prompt answered through the
// DevTools protocol) paints the matching frames and prints their share
// of the total, which is checked against the folded stacks themselves.
func TestBrowser(t *testing.T) {
	const width = 410 // 390 px for 120 samples: futex_wait_[k] is too narrow for its name
	svg := render(t, Options{Width: width})
	dir := t.TempDir()
	path := filepath.Join(dir, "fg.svg")
	if err := os.WriteFile(path, svg, 0o644); err != nil {
		t.Fatal(err)
	}
	stacks, err := folded.Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}

	ctx := webtest.Browser(t, width+100, 400)
	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		defer scancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	snapshot := func() browserState {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		defer scancel()
		s, err := chromedp.Run(sctx, chromedp.Evaluate[browserState](snapshotJS))
		if err != nil {
			t.Fatalf("reading the page: %v", err)
		}
		return s
	}
	// The search prompt: answered with the next term.
	prompts := make(chan string, 1)
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			p := page.HandleJavaScriptDialogParams{Accept: ev.Type == page.DialogTypePrompt}
			select {
			case p.PromptText = <-prompts:
			default:
				p.Accept = false
			}
			chromedp.Call(ctx, page.HandleJavaScriptDialog, p)
		}
	}()
	frame := func(name string) chromedp.CSS {
		return chromedp.CSS(fmt.Sprintf(`#frames > g[data-name=%q] > rect`, name))
	}

	step("loading the SVG", chromedp.Navigate("file://"+path))
	initial := snapshot()
	if len(initial.Frames) == 0 {
		t.Fatal("no frames on the page")
	}
	const pad, full = 10.0, width - 20.0
	near := func(a, b float64) bool { return math.Abs(a-b) < 0.05 }
	by := func(s browserState, name string) browserFrame {
		t.Helper()
		for _, f := range s.Frames {
			if f.Name == name {
				return f
			}
		}
		t.Fatalf("no frame %q on the page", name)
		return browserFrame{}
	}
	// Geometry before any click, from the folded values: x and width
	// proportional to the samples.
	for name, v := range map[string]float64{"all": 120, "sleeper": 60, "read_pipe": 40, "pipe_read_[k]": 30, "<a&b>": 20, "futex_wait_[k]": 20} {
		if f := by(initial, name); f.Hidden || !near(f.W, v*full/120) {
			t.Errorf("initially: %s width %.2f hidden=%v, want %.2f", name, f.W, f.Hidden, v*full/120)
		}
	}
	if initial.Unzoom {
		t.Error("Reset Zoom shown before any zoom")
	}
	checkLabels(t, "initially", initial)
	if l := by(initial, "futex_wait_[k]").Label; l != "futex_.." {
		t.Errorf("initially: futex_wait_[k] labelled %q, want the cut %q", l, "futex_..")
	}

	// Zoom into read_pipe (40 of 120 samples) with a click on its frame.
	step("clicking read_pipe", chromedp.Click(frame("read_pipe")))
	zoomed := snapshot()
	for _, name := range []string{"all", "reader", "main", "read_pipe"} {
		if f := by(zoomed, name); f.Hidden || !near(f.X, pad) || !near(f.W, full) {
			t.Errorf("zoomed: %s at x=%.2f w=%.2f hidden=%v, want the full width", name, f.X, f.W, f.Hidden)
		}
	}
	if f := by(zoomed, "pipe_read_[k]"); f.Hidden || !near(f.X, pad) || !near(f.W, full*30/40) {
		t.Errorf("zoomed: pipe_read_[k] at x=%.2f w=%.2f, want x=%.0f w=%.2f", f.X, f.W, pad, full*30/40)
	}
	for _, name := range []string{"sleeper", "hrtimer_nanosleep_[k]", "waiter", "<a&b>", "futex_wait_[k]"} {
		if f := by(zoomed, name); !f.Hidden {
			t.Errorf("zoomed: %s still shown", name)
		}
	}
	if !zoomed.Unzoom {
		t.Error("zoomed: Reset Zoom not shown")
	}
	checkLabels(t, "zoomed", zoomed)
	// Hovering a frame shows its title in the details line.
	step("hovering pipe_read_[k]", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		f := by(zoomed, "pipe_read_[k]")
		y, err := chromedp.Evaluate[float64](`(() => { const b = document.querySelector('#frames > g[data-name="pipe_read_[k]"] > rect').getBoundingClientRect(); return b.y + b.height / 2; })()`)(ctx, tg)
		if err != nil {
			return err
		}
		_, err = chromedp.MouseEvent("mouseMoved", f.X+f.W/2, y)(ctx, tg)
		return err
	}))
	if d := snapshot().Details; d != "pipe_read_[k] (30 samples, 25.00%)" {
		t.Errorf("hover: details %q", d)
	}

	step("clicking Reset Zoom", chromedp.Click(chromedp.ID("unzoom")))
	unzoomed := snapshot()
	for i, f := range unzoomed.Frames {
		if init := initial.Frames[i]; f.Hidden || !near(f.X, init.X) || !near(f.W, init.W) || f.Label != init.Label {
			t.Errorf("after Reset Zoom: %s x=%.2f w=%.2f %q, was x=%.2f w=%.2f %q", f.Name, f.X, f.W, f.Label, init.X, init.W, init.Label)
		}
	}
	if unzoomed.Unzoom {
		t.Error("Reset Zoom still shown after a reset")
	}

	// A zoom into a narrow frame lengthens its children's labels.
	step("clicking <a&b>", chromedp.Click(frame("<a&b>")))
	z2 := snapshot()
	if f := by(z2, "futex_wait_[k]"); f.Hidden || !near(f.W, full) || f.Label != "futex_wait_[k]" {
		t.Errorf("zoomed into <a&b>: futex_wait_[k] w=%.2f %q, want w=%.0f and the whole name", f.W, f.Label, full)
	}
	checkLabels(t, "zoomed into <a&b>", z2)
	step("clicking Reset Zoom", chromedp.Click(chromedp.ID("unzoom")))

	for _, term := range []string{"pipe", `_\[k\]$`, "^(main|waiter)$"} {
		prompts <- term
		step("searching "+term, chromedp.Click(chromedp.ID("search")))
		s := snapshot()
		re := regexp.MustCompile(term)
		// The share: samples of the stacks with at least one matching frame.
		var hit, total int64
		for _, st := range stacks.Stacks() {
			total += st.Value
			for _, f := range st.Frames {
				if re.MatchString(f) {
					hit += st.Value
					break
				}
			}
		}
		if want := fmt.Sprintf("Matched: %.1f%%", 100*float64(hit)/float64(total)); s.Matched != want || s.Search != "Reset Search" {
			t.Errorf("search %q: %q and button %q, want %q and Reset Search", term, s.Matched, s.Search, want)
		}
		for i, f := range s.Frames {
			if hl := f.Fill == "rgb(230, 0, 230)"; hl != re.MatchString(f.Name) {
				t.Errorf("search %q: %s painted %s", term, f.Name, f.Fill)
			} else if !hl && f.Fill != initial.Frames[i].Fill {
				t.Errorf("search %q: %s repainted %s, was %s", term, f.Name, f.Fill, initial.Frames[i].Fill)
			}
		}
		// The same button, now Reset Search, restores the colours.
		step("resetting the search", chromedp.Click(chromedp.ID("search")))
		r := snapshot()
		if strings.TrimSpace(r.Matched) != "" || r.Search != "Search" {
			t.Errorf("after Reset Search: %q, button %q", r.Matched, r.Search)
		}
		for i, f := range r.Frames {
			if f.Fill != initial.Frames[i].Fill {
				t.Errorf("after Reset Search: %s fill %s, was %s", f.Name, f.Fill, initial.Frames[i].Fill)
			}
		}
	}
}

// checkLabels: every shown label is the frame's name or a prefix of it
// ending in "..", and the text the browser drew fits inside its frame.
func checkLabels(t *testing.T, when string, s browserState) {
	t.Helper()
	for _, f := range s.Frames {
		if f.Hidden || f.Label == "" {
			continue
		}
		if f.Label != f.Name && !(strings.HasSuffix(f.Label, "..") && strings.HasPrefix(f.Name, strings.TrimSuffix(f.Label, ".."))) {
			t.Errorf("%s: %s labelled %q", when, f.Name, f.Label)
		}
		if f.TextW+3 > f.W {
			t.Errorf("%s: %s's label %q is %.1f px wide, its frame %.1f px", when, f.Name, f.Label, f.TextW, f.W)
		}
	}
}
