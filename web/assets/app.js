// kinst's web view: find a function, draw its control-flow graph (dagre),
// put counters, timers and coverage on it through kinst web's /api (which
// is kerninstd's API), and draw their values as they come (/api/events).
'use strict';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
const CHAR_W = 6.7, LINE_H = 14, PAD = 8;
const HISTORY = 300; // samples kept for the plot

const state = {
  route: null,      // the name in /fn/NAME
  cfg: null,        // /api/cfg of the function shown
  blocks: [],       // {index, start, end} (BigInt addresses), by start
  cover: null,      // the coverage session whose blocks are drawn
  events: null,     // the EventSource
  sessions: [],     // as of the last event
  series: new Map(),// label -> [values], aligned with times
  times: [],
  plot: null,
  plotKey: '',
};

// csrf is the token the server wrote into the page: every change sends it.
const csrf = document.querySelector('meta[name="kinst-csrf"]').content;

async function api(method, path, body) {
  const opt = { method, headers: {} };
  if (method !== 'GET') opt.headers['X-Kinst-Csrf'] = csrf;
  if (body !== undefined) {
    opt.headers['Content-Type'] = 'application/json';
    opt.body = JSON.stringify(body);
  }
  const r = await fetch(path, opt);
  let j = null;
  try { j = await r.json(); } catch (e) { j = { error: r.statusText }; }
  if (!r.ok) throw new Error((j && j.error) || r.statusText);
  return j;
}

function status(msg, isError) {
  const s = $('status');
  s.textContent = msg || '';
  s.className = isError ? 'error' : '';
}

const hex = (n) => '0x' + n.toString(16);

// ---- search ----------------------------------------------------------

let searchSeq = 0, searchTimer = null;

function search(q) {
  const seq = ++searchSeq;
  api('GET', '/api/functions?limit=200&q=' + encodeURIComponent(q)).then((res) => {
    if (seq !== searchSeq) return;
    const ol = $('results');
    ol.replaceChildren();
    $('results-count').textContent = res.total > res.functions.length ? `(${res.functions.length} of ${res.total})` : `(${res.total})`;
    for (const f of res.functions) {
      const li = document.createElement('li');
      const a = document.createElement('a');
      a.href = '/fn/' + encodeURIComponent(f.name);
      a.dataset.fn = f.name;
      a.textContent = f.name;
      if (f.classic) {
        const c = document.createElement('span');
        c.className = 'classic';
        c.textContent = ' → ' + f.classic.linux;
        a.title = f.classic.why;
        a.append(c);
      }
      if (f.module) {
        const m = document.createElement('span');
        m.className = 'mod';
        m.textContent = ' [' + f.module + ']';
        a.append(m);
      }
      li.append(a);
      ol.append(li);
    }
  }).catch((e) => status(e.message, true));
}

$('search').addEventListener('input', (e) => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => search(e.target.value.trim()), 120);
});
$('search').addEventListener('keydown', (e) => {
  if (e.key === 'Enter') {
    const first = document.querySelector('#results a');
    if (first) go(first.dataset.fn);
  }
});
$('results').addEventListener('click', (e) => {
  const a = e.target.closest('a');
  if (!a) return;
  e.preventDefault();
  go(a.dataset.fn);
});

// ---- routing ---------------------------------------------------------

function go(name) {
  history.pushState(null, '', '/fn/' + encodeURIComponent(name));
  route();
}

function route() {
  const m = location.pathname.match(/^\/fn\/(.+)$/);
  if (!m) {
    $('function').hidden = true;
    $('welcome').hidden = false;
    state.route = null;
    state.cfg = null;
    listen();
    return;
  }
  openFunction(decodeURIComponent(m[1]));
}
window.addEventListener('popstate', route);

// ---- a function ------------------------------------------------------

async function openFunction(name) {
  state.route = name;
  $('welcome').hidden = true;
  $('function').hidden = false;
  $('fn-name').textContent = name;
  $('fn-meta').textContent = '';
  $('graph').replaceChildren();
  document.body.dataset.ready = '';
  status('reading ' + name + '…');
  let cfg;
  try {
    cfg = await api('GET', '/api/cfg?func=' + encodeURIComponent(name));
  } catch (e) {
    status(e.message, true);
    return;
  }
  if (state.route !== name) return;
  state.cfg = cfg;
  state.series = new Map();
  state.times = [];
  state.plotKey = '';
  $('plot').replaceChildren();
  state.plot = null;
  document.title = cfg.function + ' · kinst';
  $('fn-name').textContent = cfg.function + (cfg.function !== name ? ' (' + name + ')' : '');
  const padding = cfg.blocks.filter((b) => b.padding).length;
  $('fn-meta').textContent = `${cfg.module ? '[' + cfg.module + '] ' : ''}${cfg.address}, ${cfg.size} bytes, ${cfg.blocks.length - padding} blocks` +
    (padding ? ` (and ${padding} of padding, not drawn)` : '') +
    (cfg.truncated ? ', decoding stopped early' : '');
  state.blocks = cfg.blocks.map((b) => {
    const last = b.instructions[b.instructions.length - 1];
    return { index: b.index, start: BigInt(b.start), end: BigInt(last.address) + BigInt(last.length) };
  }).sort((a, b) => (a.start < b.start ? -1 : 1));
  const t0 = performance.now();
  draw(cfg);
  // How long the layout and drawing took, for tests and benchmarks.
  document.body.dataset.drawMs = (performance.now() - t0).toFixed(1);
  state.cover = sessionStorage.getItem('cover') || null;
  status('');
  document.body.dataset.ready = cfg.function;
  listen();
}

function blockOf(addr) {
  for (const b of state.blocks) if (addr >= b.start && addr < b.end) return b.index;
  return -1;
}

// insnLine is an instruction as the graph prints it.
function insnLine(i) {
  const w = state.cfg ? state.cfg.size.toString(16).length : 3;
  return '+' + i.offset.toString(16).padStart(w, '0') + '  ' + i.text + (i.target ? '  → ' + i.target : '');
}

function el(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// draw lays the blocks out with dagre and draws them as SVG: each block a
// <g data-block="INDEX">, each instruction a <text data-offset>.
function draw(cfg) {
  const g = new dagre.graphlib.Graph({ multigraph: true });
  g.setGraph({ rankdir: 'TB', nodesep: 24, ranksep: 34, edgesep: 12, marginx: 12, marginy: 12 });
  g.setDefaultEdgeLabel(() => ({}));
  // Padding (int3 or nops after the function's last instruction) is not
  // drawn: it is never run and takes no probe.
  const drawn = cfg.blocks.filter((b) => !b.padding);
  const shown = new Set(drawn.map((b) => b.index));
  for (const b of drawn) {
    // Rows: each instruction, and its source line (from a debug vmlinux)
    // above it where the line changes, as perf annotate shows them.
    const rows = [];
    let prev = '';
    for (const ins of b.instructions) {
      if (ins.line && ins.line !== prev) rows.push({ src: ins.line });
      prev = ins.line || prev;
      rows.push({ ins, text: insnLine(ins) });
    }
    const head = headLine(b, 0);
    const w = Math.max(head.length + 12, ...rows.map((r) => (r.src ? shortPath(r.src).length + 3 : r.text.length))) * CHAR_W + 2 * PAD;
    g.setNode(String(b.index), { width: w, height: (rows.length + 1) * LINE_H + PAD, block: b, rows });
  }
  for (const b of drawn) {
    // Named by kind and position: a table's cases to one block stay apart.
    (b.succs || []).forEach((s, k) => { if (shown.has(s.to)) g.setEdge(String(b.index), String(s.to), { kind: s.kind }, s.kind + k); });
  }
  dagre.layout(g);
  const svg = $('graph');
  svg.replaceChildren();
  const gw = g.graph().width, gh = g.graph().height;
  svg.setAttribute('width', gw);
  svg.setAttribute('height', gh);
  svg.setAttribute('viewBox', `0 0 ${gw} ${gh}`);
  const defs = el('defs');
  const marker = el('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' });
  marker.append(el('path', { d: 'M 0 0 L 10 5 L 0 10 z', fill: '#888' }));
  defs.append(marker);
  svg.append(defs);
  for (const e of g.edges()) {
    const ed = g.edge(e);
    const d = ed.points.map((p, i) => (i ? 'L' : 'M') + p.x.toFixed(1) + ' ' + p.y.toFixed(1)).join(' ');
    svg.append(el('path', { class: 'edge ' + ed.kind, d, 'data-from': e.v, 'data-to': e.w }));
  }
  for (const v of g.nodes()) {
    const n = g.node(v);
    const b = n.block;
    const grp = el('g', { class: 'block', 'data-block': b.index, transform: `translate(${(n.x - n.width / 2).toFixed(1)},${(n.y - n.height / 2).toFixed(1)})` });
    if (b.padding) grp.setAttribute('data-padding', '');
    grp.append(el('rect', { class: 'box', width: n.width, height: n.height, rx: 3 }));
    grp.append(el('text', { class: 'hdr', x: PAD, y: LINE_H }, headLine(b, 0)));
    grp.append(el('text', { class: 'count', x: n.width - PAD, y: LINE_H, 'text-anchor': 'end' }, ''));
    n.rows.forEach((r, k) => {
      const y = (k + 2) * LINE_H;
      if (r.src) {
        grp.append(el('text', { class: 'src', x: PAD, y }, '// ' + shortPath(r.src)));
        return;
      }
      const ins = r.ins;
      let cls = 'insn';
      if (ins.splice_class === 'refused') cls += ' refused-insn';
      if (ins.target && callTarget(ins)) cls += ' call';
      const t = el('text', { class: cls, x: PAD, y, 'data-offset': ins.offset }, r.text);
      t.addEventListener('mousemove', (ev) => tip(ev, insnTip(ins)));
      t.addEventListener('mouseleave', () => tip(null));
      grp.append(t);
    });
    grp.addEventListener('click', (ev) => clickBlock(ev, b));
    svg.append(grp);
  }
  // Start with the entry block in view.
  const entry = g.node(String(cfg.blocks[0].index));
  if (entry) {
    const wrap = $('graph-wrap');
    wrap.scrollLeft = Math.max(0, entry.x - wrap.clientWidth / 2);
    wrap.scrollTop = 0;
  }
}

// shortPath drops the build directory before a source path (Debian's
// debian/build/build_amd64_none_amd64/fs/stat.c is fs/stat.c); the
// tooltip keeps the whole.
function shortPath(line) {
  return line.replace(/^(.*\/)?build_[^/]+\//, '');
}

function headLine(b, count) {
  const table = (b.succs || []).filter((s) => s.kind === 'table').length;
  return '#' + b.index + (b.exit ? '  ' + b.exit : '') + (table ? `  jump table: ${table} cases` : '') + (b.padding ? '  padding' : '');
}

// callTarget is the function a call or jump instruction names, if it
// names one at its start.
function callTarget(ins) {
  if (!ins.target || !/^call|^jmp/.test(ins.text)) return null;
  const m = ins.target.match(/^([A-Za-z_.][\w.]*)(\+0x0)?$/);
  return m && m[1] !== state.cfg.function ? m[1] : null;
}

function insnTip(ins) {
  let s = `${ins.address}  ${ins.bytes}\n${ins.text}\nsplice: ${ins.splice_class}`;
  if (ins.refused) s += `\nrefused: ${ins.refused}`;
  s += `\nlive in: ${(ins.live_in || []).join(' ') || '(none)'}`;
  if (ins.target) s += `\ntarget: ${ins.target}`;
  if (ins.line) s += `\nsource: ${ins.line}`;
  return s;
}

function tip(ev, text) {
  const t = $('tip');
  if (!ev) { t.hidden = true; return; }
  t.textContent = text;
  t.hidden = false;
  t.style.left = Math.min(ev.clientX + 14, window.innerWidth - t.offsetWidth - 8) + 'px';
  t.style.top = (ev.clientY + 14) + 'px';
}

// ---- instrumenting from the page --------------------------------------

function sessionNamed(name) {
  return state.sessions.find((s) => s.name === name);
}

async function toggle(name, req, what) {
  const live = sessionNamed(name);
  try {
    if (live) {
      status('removing ' + what + '…');
      await api('DELETE', '/api/sessions/' + encodeURIComponent(live.id));
      status('removed ' + what + ' (session ' + live.id + ')');
    } else {
      status('adding ' + what + '…');
      const s = await api('POST', '/api/sessions', Object.assign({ name }, req));
      status('added ' + what + ' (session ' + s.id + ')');
    }
  } catch (e) {
    status(e.message, true);
  }
  refresh();
}

function clickBlock(ev, b) {
  const fn = state.cfg.function;
  const insn = ev.target.closest('text.insn');
  if (insn && insn.classList.contains('call') && !ev.shiftKey) {
    const ins = b.instructions[[...insn.parentNode.querySelectorAll('text.insn')].indexOf(insn)];
    const target = callTarget(ins);
    if (target) { go(target); return; }
  }
  if (insn && ev.shiftKey) {
    const off = Number(insn.dataset.offset);
    toggle(`web-${fn}-${hex(off)}`, { points: [`${fn}+${hex(off)}`] }, `a counter at ${fn}+${hex(off)}`);
    return;
  }
  toggle(`web-${fn}-b${b.index}`, { points: [`${fn}:${b.index}`] }, `a counter at block ${b.index}`);
}

$('count-all').addEventListener('click', () => {
  const fn = state.cfg.function;
  const points = state.cfg.blocks.filter((b) => !b.padding && b.instructions.some((i) => i.splice_class !== 'refused')).map((b) => `${fn}:${b.index}`);
  toggle(`web-${fn}-blocks`, { points }, `counters at ${points.length} blocks`);
});
$('time-wall').addEventListener('click', () => {
  const fn = state.cfg.function;
  toggle(`web-${fn}-time`, { timers: [fn] }, `a wall timer on ${fn}`);
});
$('time-virtual').addEventListener('click', () => {
  const fn = state.cfg.function;
  toggle(`web-${fn}-vtime`, { timers: [fn], virtual: true }, `a virtual timer on ${fn}`);
});
$('cover').addEventListener('click', async () => {
  const fn = state.cfg.function;
  const name = `web-${fn}-cover`;
  const live = sessionNamed(name);
  if (!live) {
    try {
      status('arming coverage of ' + fn + '…');
      const s = await api('POST', '/api/sessions', { name, cover: [fn] });
      showCover(s.id);
      status(`coverage of ${fn}: ${s.cover.armed} probes armed (session ${s.id})`);
    } catch (e) {
      status(e.message, true);
    }
    return;
  }
  await toggle(name, null, 'the coverage session');
  showCover(null);
});

// showCover draws coverage session id's blocks on every page (null: none).
function showCover(id) {
  state.cover = id;
  if (id) sessionStorage.setItem('cover', id); else sessionStorage.removeItem('cover');
  clearCover();
  listen();
}

// The sidebar's coverage form: a glob, a module, or a function and its
// callees, in one session whose colours every function's page shows.
$('cover-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const what = $('cover-what').value.trim(), kind = $('cover-kind').value;
  if (!what) return;
  const req = { name: `web-cover-${kind}-${what}` };
  if (kind === 'module') req.cover_modules = [what];
  else if (kind === 'callees') { req.cover_callees = [what]; req.cover_depth = 1; }
  else req.cover = [what];
  try {
    status(`arming coverage of ${kind} ${what}…`);
    const s = await api('POST', '/api/sessions', req);
    showCover(s.id);
    status(`coverage of ${kind} ${what}: ${s.cover.armed} probes armed over ${s.cover.function_count} functions (session ${s.id}); open a function to see its blocks`);
  } catch (err) {
    status(err.message, true);
  }
  refresh();
});

function clearCover() {
  for (const g of document.querySelectorAll('#graph .block')) g.removeAttribute('data-covered');
}

// ---- live values -----------------------------------------------------

function listen() {
  if (state.events) state.events.close();
  const q = state.cover ? '?cover=' + encodeURIComponent(state.cover) : '';
  state.events = new EventSource('/api/events' + q);
  state.events.onmessage = (m) => update(JSON.parse(m.data));
}

function refresh() {
  api('GET', '/api/sessions').then((ss) => update({ sessions: ss, time: new Date().toISOString(), partial: true })).catch(() => {});
}

// events counts the updates received and the longest gap between two
// (data-events, data-max-gap-ms on <body>), so a test can tell whether
// updates were dropped.
let events = 0, lastEvent = 0, maxGap = 0;

function update(ev) {
  if (!ev.partial) {
    const now = performance.now();
    if (lastEvent) maxGap = Math.max(maxGap, now - lastEvent);
    lastEvent = now;
    document.body.dataset.events = ++events;
    document.body.dataset.maxGapMs = maxGap.toFixed(0);
  }
  if (ev.error) {
    // kerninstd stopped answering (restarted, killed): said, and the
    // values stay as last drawn until it answers again.
    status('kerninstd: ' + ev.error, true);
    return;
  }
  state.sessions = ev.sessions || [];
  drawSessions();
  if (!state.cfg) return;
  const fn = state.cfg.function;
  // Counts: every session's probes in this function, by block and by
  // instruction.
  const byBlock = new Map(), byInsn = new Map();
  const series = new Map();
  for (const s of state.sessions) {
    for (const p of s.probes || []) {
      if (p.function !== fn) continue;
      const addr = BigInt(p.address);
      const bi = blockOf(addr);
      byBlock.set(bi, (byBlock.get(bi) || 0) + p.count);
      byInsn.set(Number(addr - BigInt(state.cfg.address)), true);
      series.set(`${s.name}: ${p.point}`, p.count);
    }
    for (const t of s.timers || []) {
      if (t.function !== fn) continue;
      series.set(`${s.name}: calls`, t.calls);
      series.set(`${s.name}: wall ms`, Math.round(t.wall_ns / 1e6));
    }
    if (s.cover && s.id === state.cover) series.set(`${s.name}: live probes`, s.cover.armed - s.cover.removed);
  }
  // Heat: a counted block's fill goes from pale to deep orange with the
  // logarithm of its count against the function's largest.
  const top = Math.max(1, ...byBlock.values());
  for (const g of document.querySelectorAll('#graph .block')) {
    const i = Number(g.dataset.block);
    const label = g.querySelector('text.count');
    const box = g.querySelector('rect.box');
    if (byBlock.has(i)) {
      const n = byBlock.get(i);
      g.setAttribute('data-counted', '');
      g.setAttribute('data-count', n);
      label.textContent = n.toLocaleString();
      const heat = n > 0 ? Math.log1p(n) / Math.log1p(top) : 0;
      box.style.fill = `hsl(28, 90%, ${(96 - 36 * heat).toFixed(0)}%)`;
    } else {
      g.removeAttribute('data-counted');
      g.removeAttribute('data-count');
      label.textContent = '';
      box.style.fill = '';
    }
    for (const t of g.querySelectorAll('text.insn')) t.classList.toggle('counted', byInsn.has(Number(t.dataset.offset)));
  }
  if (ev.cover) {
    drawCover(ev.cover, fn);
  } else if (state.cover && !ev.partial && !state.sessions.some((s) => s.id === state.cover)) {
    // The coverage session went (kinst detach, its TTL): the colours stay
    // as its last report left them.
    state.cover = null;
    sessionStorage.removeItem('cover');
    listen();
  }
  drawTimers(fn);
  if (!ev.partial) plot(ev.time, series);
  document.querySelectorAll('#actions button').forEach((b) => b.classList.remove('on'));
  const on = (id, name) => $(id).classList.toggle('on', !!sessionNamed(name));
  on('count-all', `web-${fn}-blocks`); on('time-wall', `web-${fn}-time`);
  on('time-virtual', `web-${fn}-vtime`); on('cover', `web-${fn}-cover`);
}

function drawCover(rep, fn) {
  const f = (rep.functions || []).find((x) => x.function === fn);
  if (!f) return;
  for (const b of f.blocks || []) {
    const g = document.querySelector(`#graph .block[data-block="${b.index}"]`);
    if (!g) continue;
    g.setAttribute('data-covered', b.covered ? 'covered' : b.refused ? 'refused' : 'uncovered');
    if (b.refused) g.setAttribute('data-refused', b.refused);
  }
  status(`coverage: ${f.covered} of ${f.total} blocks covered, ${f.refused} refused; ${rep.armed - rep.removed} probes still armed`);
}

function drawTimers(fn) {
  const tb = $('timers');
  tb.replaceChildren();
  const rows = [];
  for (const s of state.sessions) for (const t of s.timers || []) if (t.function === fn) rows.push([s, t]);
  if (!rows.length) return;
  tb.innerHTML = '<tr><th>timer</th><th>calls</th><th>wall (ms)</th><th>avg (µs)</th><th>on CPU (ms)</th><th>inside</th></tr>';
  for (const [s, t] of rows) {
    const tr = document.createElement('tr');
    const avg = t.calls ? (t.wall_ns / t.calls / 1e3).toFixed(2) : '–';
    for (const v of [s.name + (t.filter ? ' (' + t.filter + ')' : ''), t.calls.toLocaleString(), (t.wall_ns / 1e6).toFixed(2), avg,
      t.virtual ? (t.virtual_ns / 1e6).toFixed(2) : '–', t.inside]) {
      const td = document.createElement('td');
      td.textContent = v;
      tr.append(td);
    }
    tb.append(tr);
  }
}

function plot(time, series) {
  const t = Date.parse(time) / 1000;
  state.times.push(t);
  for (const [k, v] of series) {
    if (!state.series.has(k)) state.series.set(k, new Array(state.times.length - 1).fill(null));
  }
  for (const [k, arr] of state.series) arr.push(series.has(k) ? series.get(k) : null);
  if (state.times.length > HISTORY) {
    state.times.shift();
    for (const arr of state.series.values()) arr.shift();
  }
  const live = [...state.series.keys()].filter((k) => state.series.get(k).some((v) => v !== null));
  if (!live.length) return;
  const key = live.join('\n');
  const data = [state.times, ...live.map((k) => state.series.get(k))];
  if (state.plotKey !== key || !state.plot) {
    $('plot').replaceChildren();
    const palette = ['#e8702a', '#3a63c4', '#3c9a4a', '#c0504d', '#8a5cc2', '#2a9d9a'];
    state.plot = new uPlot({
      width: Math.max(400, $('plot').clientWidth || 800), height: 220,
      series: [{}, ...live.map((k, i) => ({ label: k, stroke: palette[i % palette.length], width: 1.5 }))],
      axes: [{}, { size: 70 }],
    }, data, $('plot'));
    state.plotKey = key;
  } else {
    state.plot.setData(data);
  }
}

// drawSessions updates the sessions list in place (a session's row, and
// its detach button, stay the same element from one update to the next).
function drawSessions() {
  const ul = $('sessions');
  const none = ul.querySelector('.none');
  if (!state.sessions.length) {
    if (!none) ul.replaceChildren(Object.assign(document.createElement('li'), { className: 'none', textContent: 'none' }));
    return;
  }
  if (none) none.remove();
  const live = new Set(state.sessions.map((s) => s.id));
  for (const li of [...ul.querySelectorAll('li[data-session]')]) if (!live.has(li.dataset.session)) li.remove();
  for (const s of state.sessions) {
    let li = ul.querySelector(`li[data-session="${CSS.escape(s.id)}"]`);
    if (!li) {
      li = document.createElement('li');
      li.dataset.session = s.id;
      const b = document.createElement('button');
      b.textContent = 'detach';
      b.addEventListener('click', async () => {
        try {
          await api('DELETE', '/api/sessions/' + encodeURIComponent(s.id));
          status('detached ' + s.name);
        } catch (e) { status(e.message, true); }
        refresh();
      });
      const what = document.createElement('div');
      what.className = 'what';
      li.append(b, what);
      ul.append(li);
    }
    let desc = s.name + (s.name !== s.id ? ' (' + s.id + ')' : '');
    if (s.cover) desc += ` · cover ${s.cover.covered_blocks}/${s.cover.total_blocks}`;
    const probes = s.probes || [];
    if (probes.length) desc += ` · ${probes.length} probe${probes.length > 1 ? 's' : ''}: ${probes.reduce((a, p) => a + p.count, 0).toLocaleString()}`;
    for (const t of s.timers || []) desc += ` · ${t.function} ${t.calls.toLocaleString()} calls`;
    li.querySelector('.what').textContent = desc;
  }
}

// ---- start -----------------------------------------------------------

api('GET', '/api/info').then((i) => {
  $('kernel').textContent = `${i.target || i.kernel_release || ''} · ${i.mechanism || ''}${i.no_splice ? ' (' + i.no_splice + ')' : ''}`;
  if (i.mechanism === 'process') {
    // One process: no on-CPU time of its own threads here, no kernel
    // modules (a library's functions are covered as LIB:*).
    $('time-virtual').disabled = true;
    $('time-virtual').title = 'not for a process';
    $('cover-kind').querySelector('option[value="module"]').disabled = true;
    $('cover-what').placeholder = 'parse_*, libc.so.6:str*, main';
  }
  if (i.mechanism === 'bpf') {
    // Without the driver there are no block counters inside a function
    // or coverage: BPF probes function entries.
    for (const id of ['cover', 'time-virtual', 'cover-go']) {
      $(id).disabled = true;
      $(id).title = 'not without the driver (kerninstd runs on BPF: ' + (i.no_splice || 'no driver') + ')';
    }
  }
}).catch((e) => status(e.message, true));
search('');
route();
