"""Self-contained HTML reports of an analysis run and of a before/after fine-tuning comparison.

A report is one ``report.html``: CSS inline, every PNG figure embedded as a base64 data URI,
no external links or scripts, so it can be mailed or archived as a single file. All text
from the inputs is HTML-escaped. Host side: numpy / pandas only, no jax.

Summary dictionary (``summary.json``, written by ``heads_jax.hoststats.summary``). Any keys
are rendered (nested dicts flattened to ``outer.inner``, None shown as "n/a"). These keys, or
the aliases listed in ``SUMMARY_FIELDS``, are shown as the paper's headline figures next to
the published reference values:

==============================  ==============================================================
key                             meaning
==============================  ==============================================================
``share_delimiter``             share of heads (0..1) with the coarse role delimiter
``share_local``                 ... local
``share_syntactic``             ... syntactic
``share_block``                 ... block
``share_unskilled``             share of heads with no role at all
``share_syntactic_also_local``  share of the syntactic heads that are also local
``spearman_local_syntactic``    Spearman rho of local vs syntactic sieve bias
``spearman_p_value``            its p-value
``mean_sieve_score``            mean of all sieve bias scores
``share_p_between``             share of p-values in (0.05, 0.95) (``p_interval``)
==============================  ==============================================================
"""

from __future__ import annotations

import base64
import datetime as _dt
import html as _html
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax.data import batch as batch_lib
from heads_jax.report import figures as figures_lib
from heads_jax.report import style

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# (canonical key, label, kind, aliases, paper (BERT-base), reference (DESIGN.md: MiniLM-L6 on
# the first 200 UD EWT test sentences)). kind: share | float | corr | p
SUMMARY_FIELDS = (
    ("share_delimiter", "Heads with a delimiter role ([CLS], [SEP] or both)", "share",
     ("delimiter", "shares_delimiter", "delimiter_share", "share_delimiter_heads"), None, None),
    ("share_local", "Heads with a local role (local, previous or next)", "share",
     ("local", "shares_local", "local_share", "share_local_heads"), None, None),
    ("share_syntactic", "Heads with a syntactic role (any of the four relations)", "share",
     ("syntactic", "shares_syntactic", "syntactic_share", "share_syntactic_heads"), None, None),
    ("share_block", "Heads with the block role", "share",
     ("block", "shares_block", "block_share", "share_block_heads"), None, None),
    ("share_unskilled", "Heads without any role (unskilled)", "share",
     ("unskilled", "shares_unskilled", "share_none", "share_no_role", "unskilled_share"), None, None),
    ("share_syntactic_also_local", "Syntactic heads that are also local", "share",
     ("syntactic_also_local", "share_syntactic_local", "overlap_syntactic_local",
      "syntactic_local_overlap"), None, None),
    ("spearman_local_syntactic", "Spearman rho, local vs syntactic sieve bias", "corr",
     ("spearman_rho", "spearman_local_syntactic_rho", "spearman"), None, None),
    ("spearman_p_value", "Spearman p-value", "p",
     ("spearman_p", "spearman_local_syntactic_p", "spearman_pvalue"), None, None),
    ("mean_sieve_score", "Mean of all sieve bias scores", "float",
     ("mean_score", "mean_sieve_bias", "mean_all_scores", "mean_of_all_sieve_scores",
      "mean_all_sieve_scores"), "2.8", "2.75"),
    ("share_p_between", "p-values in (0.05, 0.95)", "share",
     ("share_p_mid", "share_p_in_band", "share_p_005_095", "share_p_in_005_095",
      "share_pvalues_mid", "share_p_values_mid", "p_mid_share", "share_p_middle"), "1.8%", "2.5%"),
)

# The paper's settings, shown beside the run's.
PAPER_SETTINGS = {"tau": "3", "alpha": "0.05", "test": "z-statistic (one-sided)",
                  "correction": "none", "direction": "dependent -> head"}

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; color: #222;
       margin: 0; background: #ffffff; line-height: 1.45; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 32px 48px; }
h1 { font-size: 26px; margin: 8px 0 4px; }
h2 { font-size: 20px; margin: 36px 0 10px; padding-bottom: 4px; border-bottom: 2px solid #e4e4e4; }
h3 { font-size: 16px; margin: 22px 0 6px; }
p.meta { color: #666; font-size: 13px; margin: 0 0 12px; }
nav.toc { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 6px; padding: 10px 18px;
          font-size: 14px; }
nav.toc ol { margin: 4px 0; padding-left: 22px; columns: 2; }
a { color: #0b5cad; text-decoration: none; }
a:hover { text-decoration: underline; }
table { border-collapse: collapse; font-size: 12.5px; margin: 6px 0 14px; }
th, td { border: 1px solid #dcdcdc; padding: 3px 8px; vertical-align: top; }
th { background: #f0f3f6; text-align: left; font-weight: 600; position: sticky; top: 0; }
tr:nth-child(even) td { background: #fafbfc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.ref { color: #555; }
.scroll { overflow-x: auto; max-width: 100%; }
.tall { max-height: 640px; overflow-y: auto; border: 1px solid #eee; display: inline-block; }
figure { margin: 14px 0 28px; padding: 12px; border: 1px solid #e6e6e6; border-radius: 6px;
         background: #fff; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { font-size: 13.5px; margin-top: 8px; }
figcaption .how { color: #555; display: block; margin-top: 3px; }
.note { color: #555; font-size: 13px; }
.empty { color: #888; font-style: italic; }
ul.warnings { background: #fff8e1; border: 1px solid #f0d58c; border-radius: 6px; padding: 8px 28px; }
footer { margin-top: 40px; color: #888; font-size: 12px; }
"""


# ---------------------------------------------------------------------------------------------
# small HTML builders


def esc(value) -> str:
  """HTML-escape any value's text (quotes included, safe inside attributes)."""
  return _html.escape(str(value), quote=True)


def slug(text: str) -> str:
  """An id for an anchor: lower-case letters, digits and dashes."""
  s = re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")
  return s or "section"


def png_data_uri(path) -> str:
  """``data:image/png;base64,...`` of a PNG file (checked by its signature)."""
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"figure {str(path)!r} does not exist; draw it first "
                            "(heads_jax.report.figures) or leave it out of `figures`")
  data = path.read_bytes()
  if not data.startswith(PNG_SIGNATURE):
    raise ValueError(f"figure {str(path)!r} is not a PNG file; figures must be written as PNG")
  return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _is_missing(v) -> bool:
  if v is None or v is pd.NA or v is pd.NaT:
    return True
  try:
    return isinstance(v, (float, np.floating)) and math.isnan(v)
  except TypeError:
    return False


def format_value(v, kind: str | None = None) -> str:
  """Text of one value: shares as percentages, floats with 4 significant digits, lists joined."""
  if _is_missing(v):
    return "n/a"
  if isinstance(v, (bool, np.bool_)):
    return "yes" if v else "no"
  if isinstance(v, (list, tuple, np.ndarray)):
    return ", ".join(format_value(x) for x in v)
  if isinstance(v, dict):
    return "; ".join(f"{k}: {format_value(x)}" for k, x in v.items())
  if isinstance(v, (int, np.integer)):
    return f"{int(v):,}" if kind != "p" else f"{int(v)}"
  if isinstance(v, (float, np.floating)):
    v = float(v)
    if kind == "share" and 0.0 <= v <= 1.0:
      return f"{v:.1%}"
    if kind == "corr":
      return f"{v:.3f}"
    if kind == "p":
      return "< 1e-300" if v == 0 else f"{v:.2g}"
    if kind == "float":
      return f"{v:.2f}"
    return f"{v:.4g}"
  return str(v)


def _is_number(v) -> bool:
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def table_html(df: pd.DataFrame, *, table_id: str | None = None, index: bool = False,
               float_format: str = "{:.3f}", max_rows: int | None = None, tall: bool = False) -> str:
  """An HTML table of a DataFrame: escaped text, right-aligned numbers, optional row limit."""
  if index:
    df = df.reset_index()
  note = ""
  if max_rows is not None and len(df) > max_rows:
    note = (f'<p class="note">Showing the first {max_rows} of {len(df)} rows; the full table '
            "is in the CSV file.</p>")
    df = df.head(max_rows)
  head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
  rows = []
  for row in df.itertuples(index=False, name=None):
    cells = []
    for v in row:
      if isinstance(v, (float, np.floating)) and not _is_missing(v):
        cells.append(f'<td class="num">{esc(float_format.format(float(v)))}</td>')
      elif _is_number(v):
        cells.append(f'<td class="num">{esc(format_value(v))}</td>')
      else:
        cells.append(f"<td>{esc(format_value(v))}</td>")
    rows.append("<tr>" + "".join(cells) + "</tr>")
  body = "".join(rows) if rows else f'<tr><td class="empty" colspan="{max(1, len(df.columns))}">' \
                                    "(no rows)</td></tr>"
  attr = f' id="{esc(table_id)}"' if table_id else ""
  wrapper = "scroll tall" if tall else "scroll"
  return (f'<div class="{wrapper}"><table{attr}><thead><tr>{head}</tr></thead>'
          f"<tbody>{body}</tbody></table></div>{note}")


def kv_table_html(items, *, table_id: str | None = None, headers=("setting", "value"),
                  extra_columns: dict | None = None) -> str:
  """A two-column (or wider, with ``extra_columns: {header: {key: text}}``) key/value table."""
  extra_columns = extra_columns or {}
  head = "".join(f"<th>{esc(h)}</th>" for h in list(headers) + list(extra_columns))
  rows = []
  for key, value in items:
    cells = [f"<td>{esc(key)}</td>", f"<td>{esc(format_value(value))}</td>"]
    for col in extra_columns.values():
      cells.append(f'<td class="ref">{esc(col.get(key, ""))}</td>')
    rows.append("<tr>" + "".join(cells) + "</tr>")
  if not rows:
    rows = [f'<tr><td class="empty" colspan="{len(headers) + len(extra_columns)}">(none)</td></tr>']
  attr = f' id="{esc(table_id)}"' if table_id else ""
  return (f'<div class="scroll"><table{attr}><thead><tr>{head}</tr></thead>'
          f"<tbody>{''.join(rows)}</tbody></table></div>")


def flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
  """``[(dotted key, value)]`` of a possibly nested dict, in insertion order."""
  out = []
  for k, v in (d or {}).items():
    key = f"{prefix}{k}"
    if isinstance(v, dict) and v:
      out.extend(flatten(v, key + "."))
    else:
      out.append((key, v))
  return out


def _norm_key(key: str) -> str:
  return re.sub(r"[^a-z0-9]+", "_", str(key).lower()).strip("_")


def match_summary(summary: dict) -> tuple[dict[str, tuple[str, object]], list[tuple[str, object]]]:
  """Split a summary into the known headline fields and the rest.

  Returns ``({canonical key: (original key, value)}, [(key, value) of the other entries]))``.
  """
  items = flatten(summary or {})
  known, used = {}, set()
  normed = {_norm_key(k): (k, v) for k, v in items}
  for key, _label, _kind, aliases, _paper, _ref in SUMMARY_FIELDS:
    for cand in (key,) + tuple(aliases):
      if cand in normed and normed[cand][0] not in used:
        known[key] = normed[cand]
        used.add(normed[cand][0])
        break
  rest = [(k, v) for k, v in items if k not in used]
  return known, rest


def summary_value(summary: dict, key: str):
  """The value of a headline field (canonical ``key`` of ``SUMMARY_FIELDS``) or None."""
  known, _ = match_summary(summary)
  return known.get(key, (None, None))[1]


def _figure_html(name: str, spec) -> str:
  """``<figure>`` of one PNG; ``spec`` is a path or a dict with path, title, caption, how."""
  if isinstance(spec, dict):
    if "path" not in spec:
      raise ValueError(f"figure {name!r}: a dict spec needs a 'path' key, got {sorted(spec)}")
    path = spec["path"]
  else:
    spec, path = {}, spec
  title, caption, how = figures_lib.FIGURE_TEXT.get(name, (name.replace("_", " ").capitalize(),
                                                          "", ""))
  title = spec.get("title", title)
  caption = spec.get("caption", caption)
  how = spec.get("how", how)
  uri = png_data_uri(path)
  how_html = f'<span class="how"><b>How to read this:</b> {esc(how)}</span>' if how else ""
  return (f'<figure id="fig-{esc(slug(name))}"><img alt="{esc(title)}" src="{uri}">'
          f"<figcaption><b>{esc(title)}.</b> {esc(caption)}{how_html}</figcaption></figure>")


def _extra_sections(extra_sections) -> list[tuple[str, str]]:
  """[(title, html)] from ``extra_sections``: dicts (title + text / html / table / figure) or
  (title, text) pairs. ``text`` is escaped; ``html`` is inserted as given (trusted)."""
  out = []
  for i, sec in enumerate(extra_sections or ()):
    if isinstance(sec, (tuple, list)) and len(sec) == 2:
      sec = {"title": sec[0], "text": sec[1]}
    if not isinstance(sec, dict) or "title" not in sec:
      raise ValueError(f"extra section {i} must be a dict with a 'title' (and text / html / table "
                       f"/ figure) or a (title, text) pair, got {sec!r:.80}")
    parts = []
    if sec.get("text"):
      parts += [f"<p>{esc(p.strip())}</p>" for p in str(sec["text"]).split("\n\n") if p.strip()]
    if sec.get("html"):
      parts.append(str(sec["html"]))
    if sec.get("table") is not None:
      parts.append(table_html(sec["table"], table_id=f"table-{slug(sec['title'])}",
                              index=bool(sec.get("index", False))))
    if sec.get("figure") is not None:
      parts.append(_figure_html(str(sec.get("figure_name", sec["title"])),
                                {"path": sec["figure"], "title": sec.get("figure_title", sec["title"]),
                                 "caption": sec.get("caption", ""), "how": sec.get("how", "")}))
    out.append((str(sec["title"]), "".join(parts)))
  return out


def _page(title: str, subtitle: str, sections: list[tuple[str, str]]) -> str:
  """The whole document: header, contents with links, sections, footer."""
  ids, seen = [], set()
  for name, _ in sections:
    sid = slug(name)
    while sid in seen:
      sid += "-x"
    seen.add(sid)
    ids.append(sid)
  toc = "".join(f'<li><a href="#{esc(sid)}">{esc(name)}</a></li>'
                for sid, (name, _) in zip(ids, sections))
  body = "".join(f'<section id="{esc(sid)}"><h2>{esc(name)}</h2>{content}</section>'
                 for sid, (name, content) in zip(ids, sections))
  stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
  return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
          f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
          f"<h1>{esc(title)}</h1><p class=\"meta\">{esc(subtitle)}</p>"
          f'<nav class="toc"><b>Contents</b><ol>{toc}</ol></nav>{body}'
          f"<footer>Written by heads_jax.report on {esc(stamp)}. A single self-contained file: "
          "figures are embedded, nothing is loaded from elsewhere.</footer>"
          "</main></body></html>\n")


def _write(out_dir, filename: str, text: str) -> Path:
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  path = out_dir / filename
  path.write_text(text, encoding="utf-8")
  return path


# ---------------------------------------------------------------------------------------------
# analysis report


def _settings_section(settings: dict) -> str:
  items = flatten(settings or {})
  paper = {k: v for k, v in PAPER_SETTINGS.items() if k in dict(items)}
  return (kv_table_html(items, table_id="table-settings", extra_columns={"paper": paper})
          + '<p class="note">Layers and heads are numbered from 0, as in the CSV files.</p>')


def _summary_section(summary: dict, tested: list[str] | None = None) -> str:
  """Headline table (with the paper's values), then the other summary entries: scalars in a
  key/value table, each dict of scalars (e.g. per-role values) as a one-row table."""
  known, rest = match_summary(summary)
  rows = []
  for key, label, kind, _aliases, paper, ref in SUMMARY_FIELDS:
    coarse = key[len("share_"):] if key.startswith("share_") else None
    if (tested is not None and coarse in style.COARSE_ROLES
        and not any(r in tested for r in style.COARSE_ROLES[coarse])):
      value = "not computed"
    elif key in known:
      value = format_value(known[key][1], kind)
    else:
      value = "not reported"
    rows.append(f"<tr><td>{esc(label)}</td><td class=\"num\">{esc(value)}</td>"
                f"<td class=\"ref\">{esc(paper or '-')}</td><td class=\"ref\">{esc(ref or '-')}</td>"
                "</tr>")
  head = ("<tr><th>headline figure</th><th>this run</th><th>paper (BERT-base)</th>"
          "<th>reference (MiniLM-L6, 200 EWT test sentences)</th></tr>")
  out = (f'<div class="scroll"><table id="table-summary"><thead>{head}</thead>'
         f"<tbody>{''.join(rows)}</tbody></table></div>"
         '<p class="note">Shares are of all heads, except "syntactic heads that are also local" '
         "(a share of the syntactic heads); \"not computed\": the run has no defined score for "
         "any role of the group (block needs sentence pairs). The paper (Pande et al. 2021) "
         "reports a mean sieve score of 2.8 and 1.8% of p-values in (0.05, 0.95) for BERT-base; "
         "the reference column is an independent implementation of the same definitions "
         "(DESIGN.md).</p>")
  if rest:
    groups: dict[str, list[tuple[str, object]]] = {}
    scalars = []
    for key, value in rest:
      outer, _, inner = key.partition(".")
      if inner and "." not in inner:
        groups.setdefault(outer, []).append((inner, value))
      else:
        scalars.append((key, value))
    out += "<h3>Other summary values</h3>"
    if scalars:
      out += kv_table_html(scalars, table_id="table-summary-other", headers=("key", "value"))
    for outer, items in groups.items():
      table = pd.DataFrame([[v for _, v in items]], columns=[k for k, _ in items], index=[outer])
      table.index.name = "summary"
      out += table_html(table.astype(object), table_id=f"table-summary-{slug(outer)}", index=True,
                        float_format="{:.4g}")
  return out


def _clusters_section(clusters_df: pd.DataFrame, cluster_info: dict | None) -> str:
  out = ""
  if cluster_info:
    scalars, matrices = [], []
    for key, value in flatten(cluster_info):
      if (isinstance(value, (list, tuple)) and value
          and all(isinstance(v, (list, tuple)) for v in value)):
        matrices.append((key, value))
      else:
        scalars.append((key, value))
    out += "<h3>Clustering</h3>" + kv_table_html(scalars, table_id="table-cluster-info",
                                                 headers=("property", "value"))
    names = cluster_info.get("names") if isinstance(cluster_info.get("names"), list) else None
    feature_names = cluster_info.get("feature_names")
    short = dict(zip(batch_lib.DISTANCE_FEATURES, figures_lib.FEATURE_LABELS))
    for key, rows in matrices:
      width = max(len(r) for r in rows)
      # column names: "<key>_columns" / "<singular key>_columns" (e.g. name_score_columns for
      # name_scores), else the feature names when the width is theirs, else 0, 1, ...
      own = cluster_info.get(f"{key}_columns", cluster_info.get(f"{key[:-1]}_columns"))
      if isinstance(own, list) and len(own) == width:
        columns = [str(c) for c in own]
      elif isinstance(feature_names, list) and len(feature_names) == width:
        columns = [short.get(f, f) for f in feature_names]
      else:
        columns = [str(i) for i in range(width)]
      table = pd.DataFrame([list(r) + [None] * (width - len(r)) for r in rows], columns=columns)
      table.index = names if names and len(names) == len(rows) else range(len(rows))
      table.index.name = "cluster"
      out += (f"<h3>{esc(key)}</h3>"
              + table_html(table, table_id=f"table-cluster-{slug(key)}", index=True,
                           float_format="{:.3f}"))
  features = [f for f in batch_lib.DISTANCE_FEATURES if f in clusters_df.columns]
  short = dict(zip(batch_lib.DISTANCE_FEATURES, figures_lib.FEATURE_LABELS))
  if "cluster_name" in clusters_df.columns:
    names = clusters_df["cluster_name"].astype(str)
    order = style.cluster_order(names)
    summary = clusters_df.assign(cluster_name=names).groupby("cluster_name")
    table = pd.DataFrame({"heads": summary.size()})
    for f in features:
      table[f] = summary[f].mean()
    table = table.reindex(order).rename(columns=short)
    table.index.name = "cluster"
    out += ("<h3>Mean distance features per cluster</h3>"
            + table_html(table, table_id="table-cluster-means", index=True, float_format="{:.2f}"))
  first = [c for c in ("layer", "head", "cluster", "cluster_name") if c in clusters_df.columns]
  shown = first + [c for c in clusters_df.columns if c not in first + ["tsne_x", "tsne_y"]]
  heads = clusters_df[shown].sort_values(["layer", "head"]).rename(columns=short)
  out += ('<h3>Heads</h3><p class="note">Mean attention mass of each head in the 16 distance '
          "windows w0 (nearest) .. w15, to itself, [CLS], [SEP], commas and periods (the 21 features "
          "sum to 1; full precision in clusters.csv).</p>"
          + table_html(heads, table_id="table-clusters", tall=True, float_format="{:.2f}"))
  return out


def write_report(out_dir, *, title: str, settings: dict, summary: dict, tests_df: pd.DataFrame,
                 clusters_df: pd.DataFrame | None = None, cluster_info: dict | None = None,
                 figures: dict | None = None, extra_sections=None,
                 filename: str = "report.html") -> Path:
  """Write the self-contained analysis report ``out_dir/report.html``; returns its path.

  Args:
    settings: the run's settings (tests.json "settings": tau, alpha, test, correction, ...).
    summary: headline statistics (module docstring; any keys are shown).
    tests_df: tests.csv (layer, head, role, mean, n, statistic, p_value, p_adjusted, assigned).
    clusters_df, cluster_info: clusters.csv and the clustering's info dict, or None.
    figures: ``{name: png path}`` or ``{name: {"path", "title", "caption", "how"}}``; standard
      names (``figures.FIGURE_TEXT``) get their caption and "how to read this" line.
    extra_sections: more sections at the end: dicts with ``title`` and any of ``text``
      (escaped), ``html`` (trusted, inserted as is), ``table`` (DataFrame), ``figure`` (PNG path,
      with ``caption`` / ``how``); or ``(title, text)`` pairs.
  """
  tests_df = style.check_tests_df(tests_df)
  sections = [("Settings", _settings_section(settings)),
              ("Headline figures", _summary_section(summary, style.tested_roles(tests_df)))]
  per_layer = style.roles_per_layer(tests_df)
  sections.append(("Roles per layer", (
      '<p class="note">Number of heads in each layer with a role assigned (fine roles, then the '
      "coarse groups; a head counts once per group).</p>"
      + table_html(per_layer, table_id="table-roles-per-layer", index=True))))
  figs = "".join(_figure_html(name, spec) for name, spec in (figures or {}).items())
  sections.append(("Figures", figs or '<p class="empty">(no figures)</p>'))
  sections.append(("Assigned roles per head", (
      '<p class="note">Roles whose test rejected "mean sieve bias <= tau"; the full tests with '
      "means, statistics and p-values are in tests.csv.</p>"
      + table_html(style.roles_per_head(tests_df), table_id="table-roles-per-head", tall=True))))
  if clusters_df is not None:
    sections.append(("Clusters", _clusters_section(clusters_df, cluster_info)))
  sections += _extra_sections(extra_sections)
  subtitle = " | ".join(f"{k}: {format_value(settings[k])}" for k in ("model", "data", "num_sequences")
                        if settings and k in settings)
  return _write(out_dir, filename, _page(title, subtitle, sections))


def short_name(value) -> str:
  """A readable short form of a model / data setting: paths shortened to their last two parts
  (``conllu:../data/ud_ewt/en_ewt-ud-test.conllu`` -> ``conllu:ud_ewt/en_ewt-ud-test.conllu``)."""
  text = str(value)
  prefix = ""
  if ":" in text and "/" not in text.split(":", 1)[0]:
    prefix, text = text.split(":", 1)
    prefix += ":"
  if "/" in text:
    parts = [p for p in text.split("/") if p not in ("", ".", "..")]
    text = "/".join(parts[-2:])
  return prefix + text


def _read_json(path: Path) -> dict:
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e}); re-run the analysis that wrote it") from e


def build_analysis_report(out_dir, *, title: str | None = None,
                          dpi: int = figures_lib.DEFAULT_DPI) -> Path:
  """Draw all figures and write ``report.html`` from the contract files of an analysis directory.

  Reads ``scores.npz``, ``tests.csv``, ``tests.json`` (its "settings", and "summary" when there
  is no ``summary.json``), and when present ``clusters.csv``, ``clusters.json`` (cluster info) and
  ``summary.json``. Figures go to ``out_dir/figures``. Computes no statistics: only means and
  counts for drawing.
  """
  out_dir = Path(out_dir)
  for name in ("scores.npz", "tests.csv", "tests.json"):
    if not (out_dir / name).is_file():
      raise FileNotFoundError(f"{out_dir / name} is missing: point build_analysis_report at the "
                              "output directory of the analysis (it writes scores.npz, tests.csv "
                              "and tests.json)")
  with np.load(out_dir / "scores.npz", allow_pickle=False) as scores:
    if "sieve_bias" not in scores or "roles" not in scores:
      raise ValueError(f"{out_dir / 'scores.npz'} needs arrays 'sieve_bias' and 'roles', has "
                       f"{sorted(scores.files)}")
    sieve_bias = scores["sieve_bias"]
    roles = [str(r) for r in scores["roles"]]
  if sieve_bias.ndim != 4 or sieve_bias.shape[-1] != len(roles):
    raise ValueError(f"scores.npz sieve_bias must be [N, L, H, R] with R = {len(roles)} roles, "
                     f"got shape {sieve_bias.shape}")
  tests_df = pd.read_csv(out_dir / "tests.csv")
  tests_json = _read_json(out_dir / "tests.json")
  settings = tests_json.get("settings") if isinstance(tests_json, dict) else None
  if not isinstance(settings, dict) and (out_dir / "settings.json").is_file():
    settings = _read_json(out_dir / "settings.json")
  if not isinstance(settings, dict) or "tau" not in settings:
    raise ValueError(f"{out_dir / 'tests.json'} must hold a 'settings' dict with at least 'tau' "
                     "(or the directory a settings.json)")
  summary = (_read_json(out_dir / "summary.json") if (out_dir / "summary.json").is_file()
             else tests_json.get("summary", {}))
  clusters_df = (pd.read_csv(out_dir / "clusters.csv") if (out_dir / "clusters.csv").is_file()
                 else None)
  cluster_info = (_read_json(out_dir / "clusters.json") if (out_dir / "clusters.json").is_file()
                  else None)
  mean_score = summary_value(summary, "mean_sieve_score")
  band = summary.get("p_interval") if isinstance(summary, dict) else None
  band = tuple(float(b) for b in band) if isinstance(band, (list, tuple)) and len(band) == 2 \
      else (0.05, 0.95)
  figs = figures_lib.analysis_figures(
      out_dir / "figures", sieve_bias=sieve_bias, roles=roles, tests_df=tests_df,
      tau=float(settings["tau"]), alpha=float(settings["alpha"]) if "alpha" in settings else None,
      clusters_df=clusters_df, mean_score=float(mean_score) if _is_number(mean_score) else None,
      p_band=band, dpi=dpi)
  if title is None:
    parts = [short_name(settings[k]) for k in ("model", "data") if settings.get(k)]
    title = "Attention heads: " + " on ".join(parts) if parts else "Attention-head analysis"
  from heads_jax.report.ablation import analysis_extra_sections  # measures.npz, when present
  return write_report(out_dir, title=title, settings=settings, summary=summary, tests_df=tests_df,
                      clusters_df=clusters_df, cluster_info=cluster_info, figures=figs,
                      extra_sections=analysis_extra_sections(out_dir, dpi=dpi))


# ---------------------------------------------------------------------------------------------
# before / after fine-tuning


def _summary_compare_section(before: dict, after: dict) -> str:
  kb, rb = match_summary(before)
  ka, ra = match_summary(after)
  rows = []
  for key, label, kind, _aliases, _paper, _ref in SUMMARY_FIELDS:
    if key in kb or key in ka:
      b = format_value(kb[key][1], kind) if key in kb else "n/a"
      a = format_value(ka[key][1], kind) if key in ka else "n/a"
      rows.append(f'<tr><td>{esc(label)}</td><td class="num">{esc(b)}</td>'
                  f'<td class="num">{esc(a)}</td></tr>')
  rest_b, rest_a = dict(rb), dict(ra)
  for key in dict.fromkeys(list(rest_b) + list(rest_a)):
    rows.append(f"<tr><td>{esc(key)}</td><td class=\"num\">{esc(format_value(rest_b.get(key)))}</td>"
                f"<td class=\"num\">{esc(format_value(rest_a.get(key)))}</td></tr>")
  return ('<div class="scroll"><table id="table-summary-compare"><thead><tr><th>figure</th>'
          f"<th>before</th><th>after</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _split(text) -> list[str]:
  if _is_missing(text):
    return []
  return [t for t in str(text).split(";") if t.strip()]


def write_compare_report(out_dir, *, compare_df: pd.DataFrame, heads_df: pd.DataFrame | None = None,
                         cluster_changes_df: pd.DataFrame | None = None,
                         title: str = "Attention heads before and after fine-tuning",
                         settings: dict | None = None, summary_before: dict | None = None,
                         summary_after: dict | None = None, figures: dict | None = None,
                         warnings=None, extra_sections=None, filename: str = "report.html",
                         dpi: int = figures_lib.DEFAULT_DPI) -> Path:
  """Write the self-contained before/after fine-tuning report ``out_dir/report.html``.

  Args:
    compare_df: role, layer_group (initial / middle / final), before, after, delta (optional task).
    heads_df: per head: layer, head, roles_before, roles_after, gained, lost (';'-joined roles).
    cluster_changes_df: per head: layer, head, cluster_before, cluster_after, changed.
    settings: the comparison's settings (may nest "before" / "after" dicts).
    summary_before, summary_after: the two runs' summary dicts (shown side by side).
    warnings: reasons to read the comparison with care (e.g. ``Comparison.warnings``), listed
      in a section of their own.
    figures: extra or replacement figures ``{name: path or spec}``; the change-of-sieve-bias and
      cluster-change figures are drawn into ``out_dir/figures`` unless given here.
  """
  figures_lib.require_columns(compare_df, ("role", "layer_group", "before", "after", "delta"),
                               "fine-tuning comparison table")
  fig_dir = Path(out_dir) / "figures"
  figs = {"finetune_delta": figures_lib.plot_finetune_delta(compare_df, fig_dir / "finetune_delta.png",
                                                            dpi=dpi)}
  if cluster_changes_df is not None and len(cluster_changes_df):
    figs["cluster_changes"] = figures_lib.plot_cluster_changes(
        cluster_changes_df, fig_dir / "cluster_changes.png", dpi=dpi)
  figs.update(figures or {})

  sections = []
  if warnings:
    sections.append(("Warnings", '<ul class="warnings">' + "".join(
        f"<li>{esc(w)}</li>" for w in warnings) + "</ul>"))
  sections.append(("Settings", kv_table_html(flatten(settings or {}), table_id="table-settings")))
  if summary_before or summary_after:
    sections.append(("Headline figures before and after",
                     _summary_compare_section(summary_before or {}, summary_after or {})))
  df = compare_df.copy()
  df["role"] = df["role"].astype(str)
  roles = style.role_order(df["role"].unique())
  groups = [g for g in style.LAYER_GROUPS if g in set(df["layer_group"].astype(str))]
  groups += sorted(set(df["layer_group"].astype(str)) - set(groups))
  index = ["task", "role"] if "task" in df.columns else ["role"]
  pivot = df.pivot_table(index=index, columns="layer_group", values="delta", aggfunc="mean")
  pivot = pivot.reindex(columns=groups)
  if index == ["role"]:
    pivot = pivot.reindex(roles)
  pivot.columns = [f"delta {g}" for g in pivot.columns]
  long = df.assign(_r=df["role"].map({r: i for i, r in enumerate(roles)}),
                   _g=df["layer_group"].astype(str).map({g: i for i, g in enumerate(groups)}))
  long = long.sort_values([c for c in ("task",) if c in long.columns] + ["_r", "_g"]).drop(
      columns=["_r", "_g"])
  sections.append(("Change of sieve bias per role and layer group", (
      '<p class="note">Mean sieve bias after minus before fine-tuning, per role and layer group '
      "(initial / middle / final thirds of the layers).</p>"
      + table_html(pivot, table_id="table-delta", index=True)
      + "<h3>Before, after and change</h3>"
      + table_html(long, table_id="table-compare"))))
  sections.append(("Figures", "".join(_figure_html(n, s) for n, s in figs.items())))
  if heads_df is not None:
    figures_lib.require_columns(heads_df, ("layer", "head", "gained", "lost"),
                                 "per-head role change table")
    gained = heads_df["gained"].map(_split)
    lost = heads_df["lost"].map(_split)
    changed = heads_df[(gained.map(len) > 0) | (lost.map(len) > 0)].sort_values(["layer", "head"])
    changed = changed.assign(**{c: changed[c].map(lambda v: ", ".join(_split(v)))
                                for c in ("roles_before", "roles_after", "gained", "lost")
                                if c in changed.columns})
    counts = {}
    for lst, what in ((gained, "gained"), (lost, "lost")):
      for roles_ in lst:
        for r in roles_:
          counts.setdefault(r, {"gained": 0, "lost": 0})[what] += 1
    count_df = pd.DataFrame.from_dict(counts, orient="index", columns=["gained", "lost"])
    count_df = count_df.reindex(style.role_order(count_df.index)) if len(count_df) else count_df
    count_df.index.name = "role"
    sections.append(("Role changes per head", (
        f"<p>{len(changed)} of {len(heads_df)} heads gained or lost at least one role.</p>"
        "<h3>Heads gaining / losing each role</h3>"
        + table_html(count_df, table_id="table-role-change-counts", index=True)
        + "<h3>Heads whose roles changed</h3>"
        + table_html(changed, table_id="table-role-changes", tall=True))))
  if cluster_changes_df is not None:
    figures_lib.require_columns(cluster_changes_df, ("layer", "head", "cluster_before",
                                                      "cluster_after"), "cluster change table")
    ch = cluster_changes_df
    moved = (ch["changed"].pipe(style.as_bool) if "changed" in ch.columns
             else (ch["cluster_before"].astype(str) != ch["cluster_after"].astype(str)).to_numpy())
    sections.append(("Cluster changes", (
        f"<p>{int(np.sum(moved))} of {len(ch)} heads changed attention type.</p>"
        + table_html(ch[moved].sort_values(["layer", "head"]), table_id="table-cluster-changes",
                     tall=True))))
  sections += _extra_sections(extra_sections)
  subtitle = " | ".join(f"{k}: {format_value(v)}" for k, v in flatten(settings or {})
                        if k.split(".")[-1] in ("model", "task", "data"))
  return _write(out_dir, filename, _page(title, subtitle, sections))
