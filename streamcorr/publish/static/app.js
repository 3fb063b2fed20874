"use strict";
// Live view of a streamcorr engine: WebSocket messages in, canvas drawings out. No dependencies, no build.
// Test hooks: #heatmap carries data-seq (last rendered snapshot), its geometry (data-x0, data-y0, data-cell
// in CSS pixels), data-screened, data-insignificant and data-flashing (cell counts) and data-render-ms; #detail carries data-pair;
// #detail-meta data-source and data-dependent; #table carries data-grid and data-pair once drawn; #lag (the pair's
// MI against lag, in #lag-box, hidden when lags are off) data-pair, data-lag-s (the reported lag, "" if none) and
// data-points (network estimates drawn).
(() => {
  const MAX_EVENTS = 100; // list length; older entries are removed
  const FLASH_MS = 3000, FLASH = "#ff9f1c"; // a pair's cell is outlined this long after a change event on it
  const HISTORY_MAX = 1000; // points kept for the sparkline of the selected pair
  const TABLE_REFRESH_MS = 5000; // the selected pair's table is refetched at most this often
  const NAN_GREY = "#4a505a";
  const SCREEN_MARK = "#c8ced6", SOURCE_SCREEN = 2; // snapshot source: 0 none, 1 network, 2 the screen's figure
  // a cell with MI that the change detector does not find dependent: dimmed toward the page, then hatched
  const PANEL = [28, 32, 39], NS_DIM = 0.55, NS_HATCH = "rgba(154,164,177,0.4)"; // light: seen on dark cells too
  // viridis at ten stops: perceptually even, readable on a dark background
  const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e",
    "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"].map(hexRgb);

  const $ = (id) => document.getElementById(id);
  const heat = $("heatmap"), legend = $("legend"), spark = $("spark"), tableCv = $("table"), lagCv = $("lag");
  const st = {
    snap: null, layout: null, vmax: 1, sel: null, pinned: false, detail: null,
    fetchToken: 0, fetchTimer: 0, lastFetchMs: 0, renderQueued: false, retryMs: 1000, ws: null,
    flash: new Map(), // "a|b" -> Date.now() until which the pair's cell flashes
  };

  // -- colours -------------------------------------------------------------------------------------
  function hexRgb(h) { const v = parseInt(h.slice(1), 16); return [v >> 16, (v >> 8) & 255, v & 255]; }
  function clamp(x, lo, hi) { return Math.min(hi, Math.max(lo, x)); }
  function mix(a, b, f) { return a.map((x, k) => Math.round(x + (b[k] - x) * f)); }
  function rgb(c) { return `rgb(${c[0]},${c[1]},${c[2]})`; }
  function ramp(t) {
    const x = clamp(t, 0, 1) * (VIRIDIS.length - 1), k = Math.min(VIRIDIS.length - 2, Math.floor(x));
    return mix(VIRIDIS[k], VIRIDIS[k + 1], x - k);
  }
  function miColor(v) { return v === null ? NAN_GREY : rgb(ramp(v / st.vmax)); }
  function nsColor(v) { return rgb(mix(ramp(v / st.vmax), PANEL, NS_DIM)); }
  function hatch(ctx, x, y, w) { // diagonal stripes over one square cell
    ctx.save(); ctx.beginPath(); ctx.rect(x, y, w, w); ctx.clip();
    ctx.strokeStyle = NS_HATCH; ctx.lineWidth = 1; ctx.beginPath();
    const step = Math.max(4, Math.floor(w / 4));
    for (let d = -w; d < w; d += step) { ctx.moveTo(x + d, y + w); ctx.lineTo(x + d + w, y); }
    ctx.stroke(); ctx.restore();
  }
  function notSignificant(s, i, j) { return !!s.dependent && s.mi[i][j] !== null && !s.dependent[i][j]; }
  function thetaColor(v, m) { // diverging around θ = 0: blue below, red above
    if (v === null) return NAN_GREY;
    const t = clamp(v / m, -1, 1), mid = [238, 238, 238];
    return rgb(t < 0 ? mix(mid, [44, 110, 200], -t) : mix(mid, [205, 55, 50], t));
  }
  function sizeCanvas(cv, w, h) { // backing store in device pixels, drawing in CSS pixels
    const dpr = window.devicePixelRatio || 1;
    cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr);
    cv.style.width = `${w}px`; cv.style.height = `${h}px`;
    const ctx = cv.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }
  function fmt(v, d = 3) { return v === null || v === undefined ? "–" : Number(v).toFixed(d); }
  function fmtLag(s) { return Math.abs(s) < 1 ? `${Math.round(Math.abs(s) * 1000)} ms` : `${Math.abs(s).toFixed(2)} s`; }
  function leadText(a, b, s) { // lag_s > 0: the pair's second channel follows the first
    if (Math.round(Math.abs(s) * 1000) === 0) return `${a} and ${b} move together (lag 0 ms)`;
    return s > 0 ? `${b} follows ${a} by ${fmtLag(s)}` : `${a} follows ${b} by ${fmtLag(s)}`;
  }
  function fmtTime(tNs) { // epoch-like stream times as clock time, replayed/simulated ones as seconds
    return tNs > 1e17 ? new Date(tNs / 1e6).toLocaleTimeString([], { hour12: false }) : `${(tNs / 1e9).toFixed(1)} s`;
  }

  // -- heatmap -------------------------------------------------------------------------------------
  function layout(channels) {
    const n = Math.max(channels.length, 1), avail = Math.max(240, $("heat-wrap").clientWidth - 4);
    const ctx = heat.getContext("2d");
    const font = clamp(Math.floor((avail - 100) / n) - 2, 7, 12);
    ctx.font = `${font}px system-ui, sans-serif`;
    const label = Math.ceil(Math.max(20, ...channels.map((c) => ctx.measureText(c).width))) + 8;
    const cell = clamp(Math.floor((avail - label) / n), 6, 48);
    return { key: channels.join("\u0000") + "|" + avail, n, cell, font, x0: label, y0: label, size: label + n * cell };
  }

  function niceMax(v) { return Math.max(1, Math.ceil(v * 2) / 2); } // scale in half-nat steps, at least 1 nat

  function render() {
    st.renderQueued = false;
    const t0 = performance.now();
    const s = st.snap;
    if (!s) return;
    const L0 = layout(s.channels);
    if (!st.layout || st.layout.key !== L0.key) st.layout = L0;
    const L = st.layout, n = s.channels.length;
    const ctx = sizeCanvas(heat, L.size + 2, L.size + 2);
    let max = 0;
    for (const row of s.mi) for (const v of row) if (v !== null && v > max) max = v;
    st.vmax = niceMax(max);
    const gap = L.cell >= 10 ? 1 : 0;
    let insignificant = 0;
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        const ns = notSignificant(s, i, j);
        ctx.fillStyle = ns ? nsColor(s.mi[i][j]) : miColor(s.mi[i][j]);
        ctx.fillRect(L.x0 + j * L.cell, L.y0 + i * L.cell, L.cell - gap, L.cell - gap);
        if (!ns) continue;
        insignificant++;
        if (L.cell >= 6) hatch(ctx, L.x0 + j * L.cell, L.y0 + i * L.cell, L.cell - gap); // smaller: dimmed only
      }
    }
    // a cell holding the screen's figure (the pair failed the cheap screen) rather than a network estimate gets
    // a corner mark: its value is a small-dependence bound, not InfoNet's estimate
    let screened = 0;
    if (s.source) {
      const m = Math.max(3, Math.floor((L.cell - gap) / 3));
      ctx.fillStyle = SCREEN_MARK;
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < n; j++) {
          if (s.source[i][j] !== SOURCE_SCREEN) continue;
          screened++;
          if (L.cell < 6) continue; // too small to mark; the count and the detail line still say it
          const x = L.x0 + j * L.cell, y = L.y0 + i * L.cell;
          ctx.beginPath(); ctx.moveTo(x, y); ctx.lineTo(x + m, y); ctx.lineTo(x, y + m); ctx.closePath(); ctx.fill();
        }
      }
    }
    if (L.cell >= 34) { // room for the numbers themselves
      ctx.font = `${Math.min(12, L.cell / 3.2)}px system-ui, sans-serif`;
      ctx.textAlign = "center"; ctx.textBaseline = "middle";
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < n; j++) {
          const v = s.mi[i][j];
          if (v === null) continue;
          ctx.fillStyle = v / st.vmax > 0.6 && !notSignificant(s, i, j) ? "#111" : "#eee";
          ctx.fillText(v.toFixed(2), L.x0 + (j + 0.5) * L.cell, L.y0 + (i + 0.5) * L.cell);
        }
      }
    }
    const si = st.sel ? s.channels.indexOf(st.sel.a) : -1, sj = st.sel ? s.channels.indexOf(st.sel.b) : -1;
    ctx.font = `${L.font}px system-ui, sans-serif`; ctx.textBaseline = "middle";
    for (let k = 0; k < n; k++) {
      const hot = k === si || k === sj;
      ctx.fillStyle = hot ? "#fff" : "#9aa4b1";
      ctx.textAlign = "right";
      ctx.fillText(s.channels[k], L.x0 - 4, L.y0 + (k + 0.5) * L.cell);
      ctx.save();
      ctx.translate(L.x0 + (k + 0.5) * L.cell, L.y0 - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(s.channels[k], 0, 0);
      ctx.restore();
    }
    let flashing = 0; // cells of pairs with a change event in the last FLASH_MS, drawn as soon as it arrives
    const now = Date.now();
    ctx.strokeStyle = FLASH; ctx.lineWidth = 3;
    for (const [key, until] of st.flash) {
      if (until < now) { st.flash.delete(key); continue; }
      const [a, b] = key.split("|"), fi = s.channels.indexOf(a), fj = s.channels.indexOf(b);
      if (fi < 0 || fj < 0) continue;
      flashing++;
      for (const [r, c] of [[fi, fj], [fj, fi]]) ctx.strokeRect(L.x0 + c * L.cell + 1.5, L.y0 + r * L.cell + 1.5, L.cell - gap - 3, L.cell - gap - 3);
    }
    if (si >= 0 && sj >= 0) {
      ctx.strokeStyle = "#fff"; ctx.lineWidth = 2;
      for (const [r, c] of [[si, sj], [sj, si]]) ctx.strokeRect(L.x0 + c * L.cell, L.y0 + r * L.cell, L.cell - gap, L.cell - gap);
    }
    Object.assign(heat.dataset, { seq: s.seq, n, cell: L.cell, x0: L.x0, y0: L.y0, vmax: st.vmax, screened,
      insignificant, flashing });
    drawLegend(screened > 0, insignificant > 0);
    heat.dataset.renderMs = (performance.now() - t0).toFixed(2);
  }

  function drawLegend(screenedShown, insignificantShown) {
    const w = Math.max(240, Math.min(460, $("heat-wrap").clientWidth - 4));
    const ctx = sizeCanvas(legend, w, 44 + 18 * (screenedShown + insignificantShown)), barW = w - 120;
    legend.dataset.screen = String(screenedShown);
    legend.dataset.insignificant = String(insignificantShown);
    for (let x = 0; x < barW; x++) { ctx.fillStyle = rgb(ramp(x / (barW - 1))); ctx.fillRect(x, 4, 1, 14); }
    ctx.fillStyle = "#9aa4b1"; ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "top";
    const step = st.vmax <= 2 ? 0.25 : st.vmax <= 4 ? 0.5 : 1, ticks = Math.floor(st.vmax / step + 1e-9);
    for (let k = 0; k <= ticks; k++) {
      const x = ((k * step) / st.vmax) * (barW - 1);
      ctx.fillRect(x, 18, 1, 4);
      ctx.textAlign = k === 0 ? "left" : x > barW - 12 ? "right" : "center";
      ctx.fillText((k * step).toFixed(2), x, 24);
    }
    ctx.textAlign = "left"; ctx.fillText("MI (nats)", barW + 10, 4);
    ctx.fillStyle = NAN_GREY; ctx.fillRect(barW + 10, 24, 12, 12);
    ctx.fillStyle = "#9aa4b1"; ctx.fillText("no estimate", barW + 26, 24);
    let y = 42;
    if (screenedShown) { // the corner mark's meaning, beside the grey of "no estimate"
      ctx.fillStyle = NAN_GREY; ctx.fillRect(barW + 10, y, 12, 12);
      ctx.fillStyle = SCREEN_MARK; ctx.beginPath(); ctx.moveTo(barW + 10, y); ctx.lineTo(barW + 16, y);
      ctx.lineTo(barW + 10, y + 6); ctx.closePath(); ctx.fill();
      ctx.fillStyle = "#9aa4b1"; ctx.fillText("screen figure", barW + 26, y);
      y += 18;
    }
    if (insignificantShown) { // a mid-scale cell as the page draws one the detector does not find dependent
      ctx.fillStyle = rgb(mix(ramp(0.5), PANEL, NS_DIM)); ctx.fillRect(barW + 10, y, 12, 12);
      hatch(ctx, barW + 10, y, 12);
      ctx.fillStyle = "#9aa4b1"; ctx.fillText("not significant", barW + 26, y);
    }
  }

  function queueRender() {
    if (!st.renderQueued) { st.renderQueued = true; requestAnimationFrame(render); }
  }

  function cellAt(ev) {
    const L = st.layout, s = st.snap;
    if (!L || !s) return null;
    const j = Math.floor((ev.offsetX - L.x0) / L.cell), i = Math.floor((ev.offsetY - L.y0) / L.cell);
    if (i < 0 || j < 0 || i >= s.channels.length || j >= s.channels.length || i === j) return null;
    return { a: s.channels[i], b: s.channels[j] };
  }

  function select(pair) {
    if (!pair || (st.sel && st.sel.a === pair.a && st.sel.b === pair.b)) return;
    st.sel = pair; st.detail = null;
    $("detail").dataset.pair = `${pair.a}|${pair.b}`;
    $("detail-pair").textContent = `${pair.a} × ${pair.b}`;
    tableCv.dataset.grid = "0"; tableCv.dataset.pair = "";
    $("table-note").textContent = "loading…";
    lagCv.dataset.pair = ""; lagCv.dataset.lagS = ""; $("lag-note").textContent = "loading…";
    st.lastFetchMs = Date.now(); // the debounced fetch below is the first one
    updateDetail();
    clearTimeout(st.fetchTimer);
    st.fetchTimer = setTimeout(fetchPair, 120); // sweeping the mouse across cells should not flood the model
    queueRender();
  }

  heat.addEventListener("mousemove", (ev) => { if (!st.pinned) select(cellAt(ev)); });
  heat.addEventListener("click", (ev) => {
    const pair = cellAt(ev);
    if (!pair) return;
    st.pinned = !(st.pinned && st.sel && st.sel.a === pair.a && st.sel.b === pair.b);
    select(pair);
    $("detail").dataset.pinned = st.pinned ? "1" : "";
  });
  window.addEventListener("resize", queueRender);

  // -- pair detail ---------------------------------------------------------------------------------
  async function fetchPair() {
    const sel = st.sel;
    if (!sel) return;
    const token = ++st.fetchToken;
    st.lastFetchMs = Date.now();
    let body;
    try {
      const r = await fetch(`api/pair?a=${encodeURIComponent(sel.a)}&b=${encodeURIComponent(sel.b)}`);
      body = await r.json();
      if (!r.ok && !body.history) throw new Error(body.error || `HTTP ${r.status}`);
    } catch (err) {
      if (token === st.fetchToken) $("table-note").textContent = `detail unavailable: ${err.message}`;
      return;
    }
    if (token !== st.fetchToken) return; // a newer selection or refresh superseded this answer
    st.detail = { t: body.history.t_ns, v: body.history.mi };
    drawSpark();
    drawTable(sel, body);
    drawLag(sel, body.lag);
  }

  function updateDetail() {
    const s = st.snap, sel = st.sel;
    if (!s || !sel) return;
    const i = s.channels.indexOf(sel.a), j = s.channels.indexOf(sel.b);
    if (i < 0 || j < 0) return;
    const v = s.mi[i][j];
    $("detail-mi").textContent = v === null ? "no estimate" : `${fmt(v)} nats`;
    const cov = s.coverage[i][j], age = s.age_s[i][j];
    const src = s.source ? s.source[i][j] : null;
    const what = src === SOURCE_SCREEN ? " · screen figure (failed the screen; not a network estimate)"
      : src === 1 ? " · network estimate" : "";
    const dep = s.dependent && v !== null ? s.dependent[i][j] : null, nEff = s.n_eff ? s.n_eff[i][j] : null;
    const verdict = dep === null ? "" : dep ? " · dependent" : " · not significant";
    const size = nEff === null ? "" : ` · n_eff ${nEff.toFixed(0)}`; // effective sample size of the window
    const lagS = s.lag_s ? s.lag_s[i][j] : null; // > 0: b follows a
    const lag = lagS === null ? "" : ` · lag ${lagS < 0 ? "−" : "+"}${fmtLag(lagS)}`;
    $("detail-meta").textContent =
      `coverage ${cov === null ? "–" : (100 * cov).toFixed(0) + "%"} · refreshed ${age === null ? "never" : fmt(age, 1) + " s ago"}${what}${verdict}${size}${lag}`;
    $("detail-meta").dataset.source = src === null ? "" : String(src);
    $("detail-meta").dataset.dependent = dep === null ? "" : String(dep);
    const d = st.detail;
    if (d && (d.t.length === 0 || s.t_ns > d.t[d.t.length - 1])) { // extend the fetched history live
      d.t.push(s.t_ns); d.v.push(v);
      if (d.t.length > HISTORY_MAX) { d.t.shift(); d.v.shift(); }
      drawSpark();
    }
    if (Date.now() - st.lastFetchMs > TABLE_REFRESH_MS) fetchPair();
  }

  function drawSpark() {
    const d = st.detail, w = 320, h = 70, ctx = sizeCanvas(spark, w, h);
    if (!d) return;
    const vals = d.v.filter((x) => x !== null);
    spark.dataset.points = String(vals.length);
    if (vals.length === 0) { ctx.fillStyle = "#9aa4b1"; ctx.fillText("no estimates yet", 4, h / 2); return; }
    const hi = Math.max(0.1, ...vals), pad = 4, n = d.v.length;
    const x = (k) => pad + (n === 1 ? 0 : (k / (n - 1)) * (w - 2 * pad - 40));
    const y = (v) => h - pad - (v / hi) * (h - 2 * pad);
    ctx.strokeStyle = "#2c323c"; ctx.beginPath(); ctx.moveTo(pad, y(0)); ctx.lineTo(w - 40, y(0)); ctx.stroke();
    ctx.strokeStyle = "#35b779"; ctx.lineWidth = 1.5; ctx.beginPath();
    let pen = false;
    d.v.forEach((v, k) => { // gaps (no estimate) break the line
      if (v === null) { pen = false; return; }
      if (pen) ctx.lineTo(x(k), y(v)); else ctx.moveTo(x(k), y(v));
      pen = true;
    });
    ctx.stroke();
    ctx.fillStyle = "#9aa4b1"; ctx.font = "10px system-ui, sans-serif"; ctx.textAlign = "left";
    ctx.textBaseline = "top"; ctx.fillText(fmt(hi, 2), w - 36, pad);
    ctx.textBaseline = "bottom"; ctx.fillText("0", w - 36, h - pad);
  }

  function drawTable(sel, body) {
    const ctx = sizeCanvas(tableCv, 160, 160);
    if (!body.table) {
      $("table-note").textContent = body.table_error || "no table for this pair yet";
      return;
    }
    const g = body.grid, px = 160 / g;
    const finite = body.table.flat().filter((v) => v !== null);
    const lo = Math.min(...finite), hi = Math.max(...finite);
    // colour scale at the 95th percentile of |θ|: a few extreme corner nodes must not wash out the rest
    const mags = finite.map(Math.abs).sort((x, y) => x - y);
    const m = Math.max(1e-9, mags[Math.floor(0.95 * (mags.length - 1))] || 0);
    for (let i = 0; i < g; i++) { // θ[i][j]: i = rank node of a (x, rightwards), j = rank node of b (y, upwards)
      for (let j = 0; j < g; j++) {
        ctx.fillStyle = thetaColor(body.table[i][j], m);
        ctx.fillRect(i * px, (g - 1 - j) * px, Math.ceil(px), Math.ceil(px));
      }
    }
    Object.assign(tableCv.dataset, { grid: g, pair: `${sel.a}|${sel.b}` });
    $("table-note").textContent = "";
    const note = $("table-note");
    for (const line of [`θ on a ${g}×${g} rank grid`, `x: rank of ${sel.a}`, `y: rank of ${sel.b}`,
      `θ from ${fmt(lo, 2)} to ${fmt(hi, 2)}`, `colour: ±${fmt(m, 2)} (blue − / red +)`]) {
      const div = document.createElement("div"); div.textContent = line; note.appendChild(div);
    }
  }

  function drawLag(sel, lag) { // the lag search's curve: scan (a shape) as a line, network estimates as dots
    const box = $("lag-box"), note = $("lag-note");
    box.hidden = !lag && !(st.snap && st.snap.lag_s); // lags off: no section
    if (box.hidden) return;
    const w = 320, h = 110, ctx = sizeCanvas(lagCv, w, h);
    Object.assign(lagCv.dataset, { pair: `${sel.a}|${sel.b}`, lagS: "", points: "0" });
    note.replaceChildren();
    if (!lag) { note.textContent = "no lag search for this pair yet"; return; }
    const xs = lag.lags_s, lo = xs[0], hi = xs[xs.length - 1], padL = 4, padR = 40, padT = 6, padB = 16;
    const pts = lag.points_s.map((t, k) => [t, lag.points_mi[k]]).filter(([t, v]) => t !== null && v !== null);
    const top = 1.1 * Math.max(0.1, lag.threshold || 0, ...lag.scan_mi.filter((v) => v !== null), ...pts.map((p) => p[1]));
    const x = (t) => padL + ((t - lo) / (hi - lo || 1)) * (w - padL - padR);
    const y = (v) => h - padB - (v / top) * (h - padT - padB);
    ctx.strokeStyle = "#2c323c"; ctx.lineWidth = 1; ctx.beginPath(); // base line and zero lag
    ctx.moveTo(padL, y(0)); ctx.lineTo(w - padR, y(0)); ctx.moveTo(x(0), padT); ctx.lineTo(x(0), y(0)); ctx.stroke();
    if (lag.threshold) { // what the best lag's MI had to clear
      ctx.setLineDash([3, 3]); ctx.strokeStyle = "#8b95a3"; ctx.beginPath();
      ctx.moveTo(padL, y(lag.threshold)); ctx.lineTo(w - padR, y(lag.threshold)); ctx.stroke(); ctx.setLineDash([]);
    }
    ctx.strokeStyle = "#26828e"; ctx.lineWidth = 1.5; ctx.beginPath();
    let pen = false;
    lag.scan_mi.forEach((v, k) => {
      if (v === null) { pen = false; return; }
      if (pen) ctx.lineTo(x(xs[k]), y(v)); else ctx.moveTo(x(xs[k]), y(v));
      pen = true;
    });
    ctx.stroke();
    if (lag.lag_s !== null) { // the reported lag, under the dots
      ctx.strokeStyle = "#fff"; ctx.lineWidth = 1.5; ctx.beginPath();
      ctx.moveTo(x(lag.lag_s), padT); ctx.lineTo(x(lag.lag_s), y(0)); ctx.stroke();
    }
    ctx.fillStyle = "#fde725";
    for (const [t, v] of pts) { ctx.beginPath(); ctx.arc(x(t), y(v), 3, 0, 2 * Math.PI); ctx.fill(); }
    ctx.fillStyle = "#9aa4b1"; ctx.font = "10px system-ui, sans-serif"; ctx.textBaseline = "top";
    for (const [t, align] of [[lo, "left"], [0, "center"], [hi, "right"]]) {
      ctx.textAlign = align; ctx.fillText(t === 0 ? "0" : `${t < 0 ? "−" : "+"}${fmtLag(t)}`, x(t), h - padB + 3);
    }
    ctx.textAlign = "left"; ctx.fillText(fmt(top / 1.1, 2), w - padR + 4, padT);
    ctx.textBaseline = "bottom"; ctx.fillText("0", w - padR + 4, y(0));
    Object.assign(lagCv.dataset, { points: String(pts.length), lagS: lag.lag_s === null ? "" : String(lag.lag_s) });
    const lead = document.createElement("div");
    if (lag.lag_s !== null) {
      const span = document.createElement("span"); span.className = "lead";
      span.textContent = leadText(sel.a, sel.b, lag.lag_s);
      lead.append(span, ` · MI ${fmt(lag.mi_lag, 2)} nats`);
    } else lead.textContent = `no significant lag (best MI under ${fmt(lag.threshold, 2)} nats)`;
    const key = document.createElement("div");
    key.textContent = "line: scan · dots: network estimates · dashed: threshold";
    note.append(lead, key);
  }

  // -- events and status ---------------------------------------------------------------------------
  function addEvent(ev) {
    const li = document.createElement("li");
    li.dataset.change = ev.change; li.dataset.pair = ev.pair.join("|");
    if (ev.initial) li.dataset.initial = "1"; // dependent from the pair's first assessment, not an onset
    const when = document.createElement("span"); when.className = "when"; when.textContent = fmtTime(ev.t_ns);
    const change = document.createElement("span"); change.className = "change";
    change.textContent = ev.initial ? `${ev.change} (initial)` : ev.change;
    if (ev.initial) change.title = "dependent from the pair's first assessment, not an onset";
    const shift = ev.change === "lag-shift" && ev.lag_s !== null && ev.lag_s !== undefined; // lags in seconds
    const what = document.createTextNode(` ${ev.pair[0]} × ${ev.pair[1]}: ` + (shift
      ? `lag ${fmt(ev.previous_lag_s, 2)} s → ${fmt(ev.lag_s, 2)} s (${leadText(ev.pair[0], ev.pair[1], ev.lag_s)})`
      : `${fmt(ev.previous, 2)} → ${fmt(ev.current, 2)} nats`));
    li.append(when, change, what);
    if (ev.path) li.dataset.path = ev.path; // "fast": the fast path saw it, before the window estimate moved
    if (ev.onset_t_ns !== null && ev.onset_t_ns !== undefined) { // how long after its estimated start it was seen
      const lag = document.createElement("span"); lag.className = "onset";
      lag.textContent = ` · began ${fmt((ev.t_ns - ev.onset_t_ns) / 1e9, 1)} s before${ev.path === "fast" ? " (fast)" : ""}`;
      li.append(lag);
    }
    st.flash.set(ev.pair.join("|"), Date.now() + FLASH_MS);
    queueRender();
    setTimeout(queueRender, FLASH_MS + 50); // and once more to clear it
    const list = $("events");
    list.prepend(li);
    while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
  }

  function showStatus(msg) { // the publisher's state and its status-line counters
    const box = $("stats");
    box.replaceChildren();
    box.dataset.state = msg.state;
    for (const [k, v] of Object.entries(msg.counters)) {
      const span = document.createElement("span");
      span.dataset.key = k;
      const shown = typeof v === "number" && !Number.isInteger(v) ? v.toPrecision(3) : String(v);
      span.textContent = `${k.replaceAll("_", " ")} ${shown}`;
      box.appendChild(span);
    }
  }

  function tickAge() {
    const s = st.snap;
    $("age").textContent = s && s.wall_ns > 0 ? `age ${fmt(Math.max(0, Date.now() / 1e3 - s.wall_ns / 1e9), 1)} s` : "age –";
  }
  setInterval(tickAge, 500);

  function setConn(state, text) { $("status").dataset.state = state; $("conn").textContent = text; }

  // -- connection ----------------------------------------------------------------------------------
  function connect() {
    const url = new URL("ws", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(url);
    st.ws = ws;
    ws.onopen = () => {
      st.retryMs = 1000;
      setConn("live", "● live");
      $("events").replaceChildren(); // the server replays its recent events to every new connection
    };
    ws.onmessage = (m) => {
      let msg;
      try { msg = JSON.parse(m.data); } catch { return; }
      if (msg.kind === "snapshot") {
        st.snap = msg;
        $("seq").textContent = `seq ${msg.seq}`;
        $("nch").textContent = `${msg.channels.length} channels`;
        tickAge(); updateDetail(); queueRender();
      } else if (msg.kind === "event") addEvent(msg);
      else if (msg.kind === "status") showStatus(msg);
    };
    ws.onclose = () => {
      const wait = st.retryMs * (0.75 + 0.5 * Math.random()); // jitter: many tabs do not reconnect in step
      setConn("closed", `disconnected, retrying in ${(wait / 1000).toFixed(0)} s`);
      st.retryMs = Math.min(st.retryMs * 2, 10000);
      setTimeout(connect, wait);
    };
  }
  connect();
})();
