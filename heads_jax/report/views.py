"""The interactive head view of the analysis report: click a head, see its attention.

`head_view_section(examples, tests_df, clusters_df)` builds one self-contained HTML section:

* a role grid (layers x heads; each cell striped with the head's coarse roles) and, when the
  clusters have t-SNE coordinates, the t-SNE of the heads (coloured by cluster), both drawn as
  inline SVG; every head is clickable;
* a panel that shows the clicked head's attention on its example sequences (``examples.json``,
  chosen at analysis time by ``heads_jax.stats.examples``: the sequences with the highest sieve
  bias for the head's roles), as token-to-token lines (query tokens left, key tokens right, line
  opacity = attention; hovering a token keeps only its lines and prints the weights) or as a
  heatmap (hovering a cell highlights its query and key and prints the value).

Self-contained: the data is embedded as JSON and the JavaScript is inlined; no CDN, no external
request. ``#head=L:H`` in the page URL opens a head on load. No jax.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from heads_jax.hoststats import roles as roles_lib
from heads_jax.report import style
from heads_jax.report.page import esc

SECTION_TITLE = "Head view: attention on example sequences"
CELL = 26          # role grid cell, pixels
TSNE_SIZE = (380, 300)
NO_ROLE_COLOR = "#e9e9e9"

CSS = """
.hv { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.hv-pick h3, .hv-panel h3 { margin: 4px 0 6px; font-size: 14px; }
.hv-pick svg [data-head] { cursor: pointer; }
.hv-pick svg [data-head]:hover { stroke: #222; stroke-width: 2; }
.hv-pick svg .hv-sel { stroke: #000 !important; stroke-width: 3 !important; }
.hv-legend { font-size: 12px; color: #444; margin: 4px 0 10px; }
.hv-legend span.sw { display: inline-block; width: 11px; height: 11px; margin: 0 3px 0 10px;
                     vertical-align: -1px; border: 1px solid #bbb; }
.hv-panel { flex: 1 1 520px; min-width: 420px; border: 1px solid #e1e4e8; border-radius: 6px;
            padding: 10px 14px; background: #fcfcfd; }
.hv-panel button { font-size: 12.5px; margin: 0 6px 6px 0; padding: 3px 9px; border: 1px solid #c8ccd0;
                   border-radius: 4px; background: #fff; cursor: pointer; }
.hv-panel button.on { background: #0b5cad; color: #fff; border-color: #0b5cad; }
#hv-status { font-size: 12.5px; color: #333; min-height: 18px; font-variant-numeric: tabular-nums; }
#hv-view { overflow: auto; max-height: 1100px; }
#hv-view text { font-size: 11.5px; font-family: Menlo, Consolas, monospace; cursor: default; }
#hv-view text.hl { font-weight: 700; fill: #b2182b; }
#hv-view .dim { opacity: 0.08; }
"""

JS = r"""
(function () {
  "use strict";
  var holder = document.getElementById("hv-data");
  if (!holder) { return; }
  var data = JSON.parse(holder.textContent);
  var Q = data.quantization || 255;
  var heads = {};
  data.heads.forEach(function (h) { heads[h.layer + ":" + h.head] = h; });
  var state = { key: null, ex: 0, mode: "lines" };
  var SVGNS = "http://www.w3.org/2000/svg";

  function el(name, attrs, text) {
    var e = document.createElementNS(SVGNS, name);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function decode(b64, n) {
    var s = atob(b64), a = new Float32Array(n * n);
    for (var i = 0; i < n * n; i++) { a[i] = s.charCodeAt(i) / Q; }
    return a;
  }
  function fmt(v) { return v.toFixed(3); }
  function status(text) { document.getElementById("hv-status").textContent = text; }

  function select(key) {
    if (!heads[key]) { return; }
    state.key = key; state.ex = 0;
    document.querySelectorAll(".hv-pick [data-head]").forEach(function (e) {
      e.classList.toggle("hv-sel", e.getAttribute("data-head") === key);
    });
    render();
  }

  function button(label, on, handler) {
    var b = document.createElement("button");
    b.textContent = label;
    if (on) { b.className = "on"; }
    b.addEventListener("click", handler);
    return b;
  }

  function render() {
    var h = heads[state.key];
    var title = document.getElementById("hv-title");
    var controls = document.getElementById("hv-controls");
    var view = document.getElementById("hv-view");
    controls.innerHTML = ""; view.innerHTML = ""; status("");
    title.textContent = "Layer " + h.layer + ", head " + h.head + ": " +
      (h.roles.length ? (h.assigned ? "roles " : "no role; strongest ") + h.roles.join(", ") : "no role");
    if (!h.examples.length) {
      view.textContent = "No sequence has a score for this head's roles.";
      return;
    }
    h.examples.forEach(function (x, i) {
      controls.appendChild(button("example " + (i + 1) + ": " + x.role + " " + x.score.toFixed(2),
        i === state.ex, function () { state.ex = i; render(); }));
    });
    controls.appendChild(document.createElement("br"));
    ["lines", "heatmap"].forEach(function (m) {
      controls.appendChild(button(m, state.mode === m, function () { state.mode = m; render(); }));
    });
    var x = h.examples[state.ex];
    var seq = data.sequences[x.sequence];
    var n = seq.tokens.length;
    var a = decode(x.map, n);
    view.appendChild(state.mode === "lines" ? lines(seq.tokens, a, n) : heatmap(seq.tokens, a, n));
  }

  function lines(tokens, a, n) {
    var row = 17, top = 36, left = 150, right = 330, w = 480;
    var svg = el("svg", { width: w, height: top + n * row + 8, "class": "hv-lines" });
    svg.appendChild(el("text", { x: left, y: 12, "text-anchor": "end" }, "query"));
    svg.appendChild(el("text", { x: right, y: 12 }, "key"));
    var g = el("g", {});
    svg.appendChild(g);
    var qs = [], ks = [], vals = [];
    for (var t = 0; t < n; t++) {
      for (var s = 0; s < n; s++) {
        var v = a[t * n + s];
        if (v < 0.01) { continue; }
        var ln = el("line", { x1: left + 6, y1: top + t * row - 4, x2: right - 6, y2: top + s * row - 4,
          stroke: "#2166ac", "stroke-width": 2, "stroke-opacity": Math.min(1, v) });
        ln.setAttribute("data-q", t); ln.setAttribute("data-k", s);
        g.appendChild(ln);
      }
    }
    function show(side, i) {
      g.querySelectorAll("line").forEach(function (ln) {
        ln.classList.toggle("dim", ln.getAttribute(side) !== String(i));
      });
    }
    function clear() {
      g.querySelectorAll("line").forEach(function (ln) { ln.classList.remove("dim"); });
      qs.concat(ks).forEach(function (e) { e.classList.remove("hl"); });
      vals.forEach(function (e) { e.textContent = ""; });
      status("");
    }
    for (var i = 0; i < n; i++) {
      var q = el("text", { x: left, y: top + i * row, "text-anchor": "end" }, tokens[i]);
      var k = el("text", { x: right, y: top + i * row }, tokens[i]);
      var val = el("text", { x: w - 6, y: top + i * row, "text-anchor": "end", fill: "#555" }, "");
      q.setAttribute("data-i", i); k.setAttribute("data-i", i);
      qs.push(q); ks.push(k); vals.push(val);
      svg.appendChild(q); svg.appendChild(k); svg.appendChild(val);
      q.addEventListener("mouseenter", function (ev) {
        var t = +ev.target.getAttribute("data-i");
        show("data-q", t); ev.target.classList.add("hl");
        for (var s = 0; s < n; s++) { vals[s].textContent = fmt(a[t * n + s]); }
        status("attention from query " + t + " '" + tokens[t] + "' to each key (right)");
      });
      k.addEventListener("mouseenter", function (ev) {
        var s = +ev.target.getAttribute("data-i");
        show("data-k", s); ev.target.classList.add("hl");
        status("attention to key " + s + " '" + tokens[s] + "' from each query");
      });
      q.addEventListener("mouseleave", clear); k.addEventListener("mouseleave", clear);
    }
    return svg;
  }

  function heatmap(tokens, a, n) {
    var c = Math.max(6, Math.min(16, Math.floor(520 / n))), lab = 110;
    var svg = el("svg", { width: lab + n * c + 10, height: lab + n * c + 10, "class": "hv-heatmap" });
    var rows = [], cols = [];
    for (var i = 0; i < n; i++) {
      var r = el("text", { x: lab - 4, y: lab + i * c + c * 0.75, "text-anchor": "end" }, tokens[i]);
      var x = lab + i * c + c * 0.7;
      var k = el("text", { x: x, y: lab - 4, transform: "rotate(-60 " + x + " " + (lab - 4) + ")" }, tokens[i]);
      rows.push(r); cols.push(k); svg.appendChild(r); svg.appendChild(k);
    }
    var g = el("g", {});
    svg.appendChild(g);
    for (var t = 0; t < n; t++) {
      for (var s = 0; s < n; s++) {
        var v = a[t * n + s];
        var cell = el("rect", { x: lab + s * c, y: lab + t * c, width: c, height: c,
          fill: "rgb(" + Math.round(255 - 222 * v) + "," + Math.round(255 - 153 * v) + "," + Math.round(255 - 83 * v) + ")" });
        cell.setAttribute("data-q", t); cell.setAttribute("data-k", s);
        g.appendChild(cell);
      }
    }
    g.addEventListener("mouseover", function (ev) {
      var q = ev.target.getAttribute("data-q"), k = ev.target.getAttribute("data-k");
      if (q === null) { return; }
      rows.forEach(function (e, i) { e.classList.toggle("hl", String(i) === q); });
      cols.forEach(function (e, i) { e.classList.toggle("hl", String(i) === k); });
      status("query " + q + " '" + tokens[+q] + "' -> key " + k + " '" + tokens[+k] + "': " + fmt(a[+q * n + +k]));
    });
    g.addEventListener("mouseleave", function () {
      rows.concat(cols).forEach(function (e) { e.classList.remove("hl"); });
      status("");
    });
    return svg;
  }

  document.querySelectorAll(".hv-pick [data-head]").forEach(function (e) {
    e.addEventListener("click", function () { select(e.getAttribute("data-head")); });
  });
  var m = /head=(\d+:\d+)/.exec(window.location.hash || "");
  if (m) { select(m[1]); }
})();
"""


def _coarse_by_head(tests_df: pd.DataFrame) -> dict[tuple[int, int], list[str]]:
  assigned = tests_df[tests_df["assigned"].astype(bool)]
  out: dict[tuple[int, int], list[str]] = {}
  for (l, h), group in assigned.groupby(["layer", "head"]):
    fine = set(group["role"])
    out[(int(l), int(h))] = [c for c, members in roles_lib.COARSE_ROLES.items() if fine & set(members)]
  return out


def role_grid_svg(tests_df: pd.DataFrame, num_layers: int, num_heads: int) -> str:
  """Layers (rows) x heads (columns); each cell striped with the head's coarse roles."""
  coarse = _coarse_by_head(tests_df)
  pad_left, pad_top = 58, 22
  width, height = pad_left + num_heads * CELL + 6, pad_top + num_layers * CELL + 6
  parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'class="hv-grid" role="img" aria-label="role grid">',
           f'<text x="{pad_left - 6}" y="{pad_top - 3}" font-size="10" text-anchor="end">head</text>']
  for h in range(num_heads):
    parts.append(f'<text x="{pad_left + h * CELL + CELL / 2:.0f}" y="{pad_top - 3}" font-size="10" '
                 f'text-anchor="middle">{h}</text>')
  for l in range(num_layers):
    y = pad_top + l * CELL
    parts.append(f'<text x="{pad_left - 6}" y="{y + CELL * 0.65:.0f}" font-size="10" '
                 f'text-anchor="end">layer {l}</text>')
    for h in range(num_heads):
      x = pad_left + h * CELL
      names = coarse.get((l, h), [])
      label = f"{l}:{h} " + (", ".join(names) if names else "no role")
      stripes = names or [None]
      w = (CELL - 2) / len(stripes)
      for i, name in enumerate(stripes):
        color = style.COARSE_COLORS.get(name, NO_ROLE_COLOR) if name else NO_ROLE_COLOR
        parts.append(f'<rect x="{x + 1 + i * w:.1f}" y="{y + 1}" width="{w:.1f}" height="{CELL - 2}" '
                     f'fill="{color}" pointer-events="none"/>')
      parts.append(f'<rect x="{x + 1}" y="{y + 1}" width="{CELL - 2}" height="{CELL - 2}" '
                   f'fill="transparent" stroke="#fff" data-head="{l}:{h}"><title>{esc(label)}</title></rect>')
  parts.append("</svg>")
  return "".join(parts)


def tsne_svg(clusters_df: pd.DataFrame) -> str | None:
  """The heads' t-SNE (clusters.csv ``tsne_x``/``tsne_y``) coloured by cluster, or None."""
  if clusters_df is None or not {"tsne_x", "tsne_y", "layer", "head"} <= set(clusters_df.columns):
    return None
  xy = clusters_df[["tsne_x", "tsne_y"]].astype(float).to_numpy()
  if not len(xy) or not np.isfinite(xy).all():
    return None
  w, h = TSNE_SIZE
  lo, hi = xy.min(0), xy.max(0)
  span = np.where(hi > lo, hi - lo, 1.0)
  pts = 12 + (xy - lo) / span * (np.array([w, h]) - 24)
  names = (clusters_df["cluster_name"].astype(str) if "cluster_name" in clusters_df.columns
           else pd.Series(["heads"] * len(clusters_df)))
  colors = style.cluster_colors(names)
  parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" class="hv-tsne" '
           f'role="img" aria-label="t-SNE of the heads"><rect width="{w}" height="{h}" fill="#fff" '
           f'stroke="#ddd"/>']
  for (x, y), l, hd, name in zip(pts, clusters_df["layer"], clusters_df["head"], names):
    parts.append(f'<circle cx="{x:.1f}" cy="{h - y:.1f}" r="5.5" fill="{colors[name]}" '
                 f'fill-opacity="0.85" stroke="#fff" data-head="{int(l)}:{int(hd)}">'
                 f'<title>{int(l)}:{int(hd)} {esc(name)}</title></circle>')
  parts.append("</svg>")
  legend = "".join(f'<span class="sw" style="background:{c}"></span>{esc(n)}' for n, c in colors.items())
  return "".join(parts) + f'<div class="hv-legend">{legend}</div>'


def head_view_section(examples: dict, tests_df: pd.DataFrame,
                      clusters_df: pd.DataFrame | None = None) -> dict:
  """The head view as a report section ``{"title", "html"}`` (module docstring)."""
  heads = examples["heads"]
  num_layers = 1 + max(int(h["layer"]) for h in heads)
  num_heads = 1 + max(int(h["head"]) for h in heads)
  legend = "".join(f'<span class="sw" style="background:{c}"></span>{esc(n)}'
                   for n, c in style.COARSE_COLORS.items())
  legend += f'<span class="sw" style="background:{NO_ROLE_COLOR}"></span>no role'
  pickers = (f'<div class="hv-pick"><h3>Role grid (click a head)</h3>'
             f'{role_grid_svg(tests_df, num_layers, num_heads)}<div class="hv-legend">{legend}</div>')
  tsne = tsne_svg(clusters_df)
  if tsne:
    pickers += f"<h3>t-SNE of the heads' distance features (click a point)</h3>{tsne}"
  pickers += "</div>"
  rule = examples.get("rule")
  note = ('<p class="note">Each head shows up to '
          f'{int(examples.get("per_head", 3))} sequences of this run with the highest sieve bias '
          "for its roles (taken in turns over its roles; a head without a role: its strongest role, "
          f"by test statistic; sequences of at most {int(examples.get('max_tokens', 40))} positions "
          "preferred), chosen when the analysis ran"
          + (f" under the {esc(rule)} rule" if rule else "")
          + ". Lines: query tokens on the left, key tokens on the right, opacity = attention "
          "(weights below 0.01 not drawn); hover a token to keep only its lines. Heatmap: rows are "
          "queries, columns keys; hover a cell. Values are stored to 1/255 (examples.json).</p>")
  panel = ('<div class="hv-panel" id="hv-panel"><h3 id="hv-title">Click a head in the role grid'
           + (" or the t-SNE" if tsne else "") + '</h3><div id="hv-controls"></div>'
           '<div id="hv-status"></div><div id="hv-view"></div></div>')
  # "<" only occurs inside JSON strings, where \u003c reads back as "<": no "</script>" in the page
  payload = json.dumps(examples, separators=(",", ":")).replace("<", "\\u003c")
  html = (f"<style>{CSS}</style>{note}<div class=\"hv\" id=\"hv\">{pickers}{panel}</div>"
          f'<script type="application/json" id="hv-data">{payload}</script>'
          f"<script>{JS}</script>")
  return {"title": SECTION_TITLE, "html": html}
