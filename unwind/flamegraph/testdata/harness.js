// Runs a flame graph's inline script against a minimal DOM built from the
// SVG's frames (given as JSON on stdin), clicks and searches, and prints
// the resulting geometry and colours as JSON.
"use strict";
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));

class El {
	constructor(tag, attrs, text) {
		this.tagName = tag;
		this.attrs = Object.assign({}, attrs);
		this.children = [];
		this.parentNode = null;
		this._text = text || "";
		this.listeners = {};
		const el = this;
		this.classList = {
			add(c) { const s = new Set((el.attrs.class || "").split(" ").filter(Boolean)); s.add(c); el.attrs.class = [...s].join(" "); },
			remove(c) { el.attrs.class = (el.attrs.class || "").split(" ").filter(x => x && x !== c).join(" "); },
			contains(c) { return (el.attrs.class || "").split(" ").includes(c); },
		};
		this.firstChild = { nodeValue: this._text };
	}
	append(c) { c.parentNode = this; this.children.push(c); return c; }
	getAttribute(n) { return n in this.attrs ? String(this.attrs[n]) : null; }
	setAttribute(n, v) { this.attrs[n] = String(v); }
	hasAttribute(n) { return n in this.attrs; }
	removeAttribute(n) { delete this.attrs[n]; }
	get textContent() { return this._text; }
	set textContent(v) { this._text = String(v); }
	querySelector(tag) { return this.children.find(c => c.tagName === tag) || null; }
	addEventListener(ev, fn) { this.listeners[ev] = fn; }
	closest(tag) { let e = this; while (e && e.tagName !== tag) e = e.parentNode; return e; }
}

const svg = new El("svg", input.svg);
const byId = {};
for (const t of input.texts) {
	byId[t.id] = svg.append(new El("text", { id: t.id, class: t.class || "" }, t.text));
}
const frames = byId.frames = svg.append(new El("g", { id: "frames" }));
for (const f of input.frames) {
	const g = frames.append(new El("g", {}));
	g.append(new El("title", {}, f.title));
	g.append(new El("rect", f.rect));
	g.append(new El("text", f.textAttrs, f.text));
}
global.document = { documentElement: svg, getElementById: id => byId[id] || null };
global.window = { addEventListener() {} };
global.prompt = () => null;
global.alert = msg => { throw new Error("alert: " + msg); };

eval(input.script + "\n;global.__fg = { init, zoom, unzoom, search, reset_search };");
__fg.init({});

function snapshot() {
	return frames.children.map(g => ({
		name: g.getAttribute("data-name"),
		hidden: g.classList.contains("hide"),
		x: parseFloat(g.querySelector("rect").getAttribute("x")),
		w: parseFloat(g.querySelector("rect").getAttribute("width")),
		fill: g.querySelector("rect").getAttribute("fill"),
		label: g.querySelector("text").textContent,
	}));
}
const out = { initial: snapshot() };
const target = frames.children.find(g => g.getAttribute("data-name") === input.zoomTo);
// Click on the frame's rectangle, as a user would.
frames.listeners.click({ target: target.querySelector("rect") });
out.zoomed = snapshot();
out.unzoomVisible = !byId.unzoom.classList.contains("hide");
byId.unzoom.listeners.click({});
out.unzoomed = snapshot();
__fg.search(input.search);
out.searched = snapshot();
out.matched = byId.matched.textContent;
out.searchButton = byId.search.textContent;
__fg.reset_search();
out.reset = snapshot();
console.log(JSON.stringify(out));
