// Package flamegraph renders folded stacks as a self-contained interactive
// SVG flame graph in the manner of flamegraph.pl: one rectangle per frame,
// width proportional to its value, callers below callees; click a frame to
// zoom into it, "Reset Zoom" to go back, "Search" to highlight frames
// matching a regular expression (with the matched share of the total).
// The JavaScript is inline in the SVG, so the file needs nothing else.
package flamegraph

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"html"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/kinst/kinst/unwind/folded"
)

// Options control the picture. Zero values take flamegraph.pl's defaults.
type Options struct {
	Title    string // shown at the top; default "Flame Graph"
	Subtitle string // second line, e.g. the command and duration
	Unit     string // what a value counts, e.g. "samples" or "ns"; default "samples"
	Width    int    // image width in pixels; default 1200
	// FrameHeight is the height of one frame row in pixels; default 16.
	FrameHeight int
	// MinWidth drops frames narrower than this many pixels (they could
	// not be read or clicked); default 0.1.
	MinWidth float64
	// Inverted draws an icicle graph: roots at the top.
	Inverted bool
}

// ErrEmpty is returned when there is nothing to draw.
var ErrEmpty = errors.New("flamegraph: no stacks with a positive value")

type node struct {
	name     string
	value    int64
	children []*node
	index    map[string]*node
}

func (n *node) child(name string) *node {
	if c, ok := n.index[name]; ok {
		return c
	}
	if n.index == nil {
		n.index = make(map[string]*node)
	}
	c := &node{name: name}
	n.index[name] = c
	n.children = append(n.children, c)
	return c
}

// withDefaults is o with its zero fields given their defaults.
func (o Options) withDefaults() Options {
	if o.Title == "" {
		o.Title = "Flame Graph"
	}
	if o.Unit == "" {
		o.Unit = "samples"
	}
	if o.Width <= 0 {
		o.Width = 1200
	}
	if o.FrameHeight <= 0 {
		o.FrameHeight = 16
	}
	if o.MinWidth <= 0 {
		o.MinWidth = 0.1
	}
	return o
}

// mergeStacks merges the stacks into one tree, and gives its depth.
func mergeStacks(stacks []folded.Stack) (root *node, depth int) {
	root = &node{name: "all"}
	for _, s := range stacks {
		if s.Value <= 0 {
			continue
		}
		root.value += s.Value
		n := root
		for _, f := range s.Frames {
			n = n.child(f)
			n.value += s.Value
		}
		depth = max(depth, len(s.Frames))
	}
	return root, depth
}

// Render writes the SVG for stacks to w.
func Render(w io.Writer, stacks []folded.Stack, o Options) error {
	o = o.withDefaults()
	root, depth := mergeStacks(stacks)
	if root.value == 0 {
		return ErrEmpty
	}
	const (
		xpad     = 10.0
		fontSize = 12
	)
	top := 3.0 * float64(fontSize) * 2 // title, subtitle, details line
	if o.Subtitle == "" {
		top -= fontSize
	}
	bottom := 2.0 * fontSize
	fh := float64(o.FrameHeight)
	height := top + float64(depth+1)*fh + bottom
	width := float64(o.Width)
	scale := (width - 2*xpad) / float64(root.value)

	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<?xml version="1.0" standalone="no"?>
<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">
<svg version="1.1" width="%d" height="%.0f" onload="init(evt)" viewBox="0 0 %d %.0f" xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" data-unit="%s" data-total="%d" data-inverted="%t">
`, o.Width, height, o.Width, height, esc(o.Unit), root.value, o.Inverted)
	bw.WriteString(style)
	bw.WriteString("<script type=\"text/ecmascript\"><![CDATA[\n" + script + "]]></script>\n")
	fmt.Fprintf(bw, `<rect x="0" y="0" width="100%%" height="100%%" fill="#f8f8f8"/>
<text id="title" x="%.1f" y="%d" text-anchor="middle">%s</text>
`, width/2, fontSize*2, esc(o.Title))
	if o.Subtitle != "" {
		fmt.Fprintf(bw, `<text id="subtitle" x="%.1f" y="%d" text-anchor="middle">%s</text>
`, width/2, fontSize*3+4, esc(o.Subtitle))
	}
	fmt.Fprintf(bw, `<text id="details" x="%.1f" y="%.0f"> </text>
<text id="unzoom" x="%.1f" y="%d" class="hide">Reset Zoom</text>
<text id="search" x="%.1f" y="%d">Search</text>
<text id="matched" x="%.1f" y="%.0f"> </text>
<g id="frames">
`, xpad, height-fontSize/2, xpad, fontSize*2, width-xpad-100, fontSize*2, width-xpad-100, height-fontSize/2)

	// Depth-first, children in name order so the output is deterministic.
	var draw func(n *node, xv int64, d int)
	draw = func(n *node, xv int64, d int) {
		x := float64(xv) * scale
		wpx := float64(n.value) * scale
		if wpx < o.MinWidth {
			return
		}
		y := top + float64(depth-d)*fh
		if o.Inverted {
			y = top + float64(d)*fh
		}
		pct := 100 * float64(n.value) / float64(root.value)
		name := esc(n.name)
		fmt.Fprintf(bw, `<g><title>%s (%d %s, %.2f%%)</title><rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s" rx="2" ry="2" data-x="%d" data-w="%d"/><text x="%.2f" y="%.1f">%s</text></g>
`, name, n.value, esc(o.Unit), pct, xpad+x, y, wpx, fh-1, color(n.name, d), xv, n.value, xpad+x+3, y+fh-5, esc(label(n.name, wpx, fontSize)))
		slices.SortFunc(n.children, func(a, b *node) int { return strings.Compare(a.name, b.name) })
		cx := xv
		for _, c := range n.children {
			draw(c, cx, d+1)
			cx += c.value
		}
	}
	draw(root, 0, 0)
	bw.WriteString("</g>\n</svg>\n")
	return bw.Flush()
}

// label is the part of name that fits in wpx pixels, "" when not even
// two characters would.
func label(name string, wpx float64, fontSize int) string {
	chars := int(math.Floor((wpx - 6) / (float64(fontSize) * 0.59)))
	if chars < 3 {
		return ""
	}
	r := []rune(name)
	if len(r) <= chars {
		return name
	}
	return string(r[:chars-2]) + ".."
}

func esc(s string) string { return html.EscapeString(s) }

// color picks flamegraph.pl's palettes: kernel frames ("_[k]") orange,
// thread names (depth 1) grey-blue, other frames in the warm "hot" range;
// the shade comes from a hash of the name so a function keeps its colour.
func color(name string, depth int) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	v := float64(h.Sum32()%1000) / 1000
	switch {
	case depth == 0:
		return "rgb(200,200,200)"
	case depth == 1:
		return fmt.Sprintf("rgb(%d,%d,%d)", 110+int(40*v), 140+int(40*v), 200+int(40*v))
	case strings.HasSuffix(name, "_[k]"):
		return fmt.Sprintf("rgb(%d,%d,%d)", 220+int(35*v), 120+int(60*v), 20+int(30*v))
	}
	return fmt.Sprintf("rgb(%d,%d,%d)", 205+int(50*v), int(230*v), int(55*v))
}

const style = `<style type="text/css">
text { font-family: Verdana, sans-serif; font-size: 12px; fill: rgb(0,0,0); }
#title { font-size: 17px; }
#search, #unzoom { cursor: pointer; }
#search:hover, #unzoom:hover { fill: rgb(0,0,200); }
#frames > g { cursor: pointer; }
#frames > g:hover > rect { stroke: rgb(0,0,0); stroke-width: 0.5; }
.hide { display: none; }
</style>
`

// script is the viewer: frames keep their geometry in data-x (left edge in
// value units) and data-w (value); zoom rescales those, search recolours.
const script = `"use strict";
var svg, frames, details, matchedtxt, searchbtn, unzoombtn, total, unit, fh, inverted;
var xpad = 10, searching = null;
function init(evt) {
	svg = document.documentElement;
	frames = document.getElementById("frames");
	details = document.getElementById("details").firstChild;
	matchedtxt = document.getElementById("matched");
	searchbtn = document.getElementById("search");
	unzoombtn = document.getElementById("unzoom");
	total = parseFloat(svg.getAttribute("data-total"));
	unit = svg.getAttribute("data-unit");
	inverted = svg.getAttribute("data-inverted") == "true";
	var gs = frames.children, width = parseFloat(svg.getAttribute("width")) - 2 * xpad;
	for (var i = 0; i < gs.length; i++) {
		var t = gs[i].querySelector("title").textContent;
		gs[i].setAttribute("data-name", t.substring(0, t.lastIndexOf(" (")));
		var txt = gs[i].querySelector("text");
		txt.setAttribute("data-full", gs[i].getAttribute("data-name"));
	}
	fh = gs.length ? parseFloat(gs[0].querySelector("rect").getAttribute("height")) + 1 : 16;
	searchbtn.addEventListener("click", search_prompt);
	unzoombtn.addEventListener("click", unzoom);
	frames.addEventListener("click", function(e) {
		var g = e.target.closest("g");
		if (g && g.parentNode == frames) zoom(g);
	});
	frames.addEventListener("mouseover", function(e) {
		var g = e.target.closest("g");
		if (g && g.parentNode == frames) details.nodeValue = g.querySelector("title").textContent;
	});
	frames.addEventListener("mouseout", function() { details.nodeValue = " "; });
	window.addEventListener("keydown", function(e) {
		if (e.keyCode === 114 || (e.ctrlKey && e.keyCode === 70)) { e.preventDefault(); search_prompt(); }
	});
}
function geom(g) {
	var r = g.querySelector("rect");
	return { x: parseFloat(r.getAttribute("data-x")), w: parseFloat(r.getAttribute("data-w")), y: parseFloat(r.getAttribute("y")) };
}
function place(g, x, w) {
	var r = g.querySelector("rect"), t = g.querySelector("text");
	var width = parseFloat(svg.getAttribute("width")) - 2 * xpad;
	r.setAttribute("x", xpad + x);
	r.setAttribute("width", w);
	t.setAttribute("x", xpad + x + 3);
	// As label() in Go: 0.59 of the 12 px font per character.
	var full = t.getAttribute("data-full"), n = Math.floor((w - 6) / (12 * 0.59));
	t.textContent = n < 3 ? "" : (full.length <= n ? full : full.substring(0, n - 2) + "..");
}
function zoom(target) {
	var z = geom(target), gs = frames.children;
	var width = parseFloat(svg.getAttribute("width")) - 2 * xpad, ratio = width / z.w;
	unzoombtn.classList.remove("hide");
	for (var i = 0; i < gs.length; i++) {
		var g = gs[i], a = geom(g);
		var below = inverted ? a.y <= z.y : a.y >= z.y;
		if (below) {
			// The frame and its ancestors: full width if they contain it.
			if (a.x <= z.x && a.x + a.w >= z.x + z.w) { g.classList.remove("hide"); place(g, 0, width); }
			else g.classList.add("hide");
		} else if (a.x >= z.x && a.x + a.w <= z.x + z.w) {
			g.classList.remove("hide");
			place(g, (a.x - z.x) * ratio, a.w * ratio);
		} else g.classList.add("hide");
	}
	if (searching) search(searching);
}
function unzoom() {
	var gs = frames.children, width = parseFloat(svg.getAttribute("width")) - 2 * xpad;
	unzoombtn.classList.add("hide");
	for (var i = 0; i < gs.length; i++) {
		var a = geom(gs[i]);
		gs[i].classList.remove("hide");
		place(gs[i], a.x * width / total, a.w * width / total);
	}
	if (searching) search(searching);
}
function search_prompt() {
	if (searching) { reset_search(); return; }
	var term = prompt("Search for (regular expression):", "");
	if (term) search(term);
}
function reset_search() {
	var gs = frames.children;
	for (var i = 0; i < gs.length; i++) {
		var r = gs[i].querySelector("rect");
		if (r.hasAttribute("data-fill")) { r.setAttribute("fill", r.getAttribute("data-fill")); r.removeAttribute("data-fill"); }
	}
	searching = null;
	searchbtn.textContent = "Search";
	matchedtxt.textContent = " ";
}
function search(term) {
	var re;
	try { re = new RegExp(term); } catch (e) { alert("bad regular expression: " + e.message); return; }
	reset_search();
	searching = term;
	var gs = frames.children, spans = [];
	for (var i = 0; i < gs.length; i++) {
		var g = gs[i];
		if (!re.test(g.getAttribute("data-name"))) continue;
		var r = g.querySelector("rect"), a = geom(g);
		r.setAttribute("data-fill", r.getAttribute("fill"));
		r.setAttribute("fill", "rgb(230,0,230)");
		spans.push([a.x, a.x + a.w]);
	}
	// Matched share: the union of matched spans, so nested matches count once.
	spans.sort(function(p, q) { return p[0] - q[0]; });
	var sum = 0, end = -1;
	for (var j = 0; j < spans.length; j++) {
		var s = Math.max(spans[j][0], end);
		if (spans[j][1] > s) { sum += spans[j][1] - s; end = spans[j][1]; }
	}
	searchbtn.textContent = "Reset Search";
	matchedtxt.textContent = "Matched: " + (100 * sum / total).toFixed(1) + "%";
}
`
