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

Self-contained: the data is embedded as JSON and the JavaScript (assets/head_view.js) and CSS
(assets/head_view.css) are inlined; no CDN, no external
request. ``#head=L:H`` in the page URL opens a head on load. No jax.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from heads_jax.hoststats import roles as roles_lib
from heads_jax.report import style
from heads_jax.report.page import asset, esc

SECTION_TITLE = "Head view: attention on example sequences"
CELL = 26          # role grid cell, pixels
TSNE_SIZE = (380, 300)
NO_ROLE_COLOR = "#e9e9e9"

CSS = asset("head_view.css")

JS = asset("head_view.js")  # inlined into the page (self-contained)


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
