"""The page toolkit of the reports: CSS (assets/page.css), HTML tables, embedded figures and writing a page.

A report is one self-contained HTML file: CSS inline, every PNG figure embedded as a base64
data URI, no external links or scripts, so it can be mailed or archived as a single file. All
text from the inputs is HTML-escaped; only ``html`` strings a report module builds itself are
inserted as they are. Every report (`heads_jax.report.analysis`, ``compare``, ``ablation``,
``measures``, ``index``) is written with `write_page`.

A section is a ``(title, html)`` pair or a dict ``{"title", "html"}``; `extra_sections` turns
user-facing section specs (text, table, figure) into such pairs.

Host side: numpy / pandas only, no jax, and nothing else of the report package. `format_value` is
the one number formatter of the reports (headline figures included).
"""

from __future__ import annotations

import base64
import datetime as _dt
import html as _html
import math
import re
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax import contract, storage

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def asset(name: str) -> str:
  """The text of a package file ``heads_jax/report/assets/<name>`` (CSS, JavaScript), read with
  `importlib.resources` (so it works from a wheel) and inlined into the page by its caller."""
  return resources.files("heads_jax.report").joinpath("assets", name).read_text(encoding="utf-8")


CSS = asset("page.css")


# ---------------------------------------------------------------------------------------------
# escaping and values


def esc(value) -> str:
  """HTML-escape any value's text (quotes included, safe inside attributes)."""
  return _html.escape(str(value), quote=True)


def slug(text: str) -> str:
  """An id for an anchor: lower-case letters, digits and dashes."""
  s = re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")
  return s or "section"


def is_missing(v) -> bool:
  """True for None, pandas' NA/NaT and float NaN."""
  if v is None or v is pd.NA or v is pd.NaT:
    return True
  try:
    return isinstance(v, (float, np.floating)) and math.isnan(v)
  except TypeError:
    return False


def is_number(v) -> bool:
  """True for ints and floats (numpy's too), False for booleans."""
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def format_value(v, kind: str | None = None) -> str:
  """THE number formatter of the reports: shares as percentages (1 decimal), correlations with 3
  decimals, p-values with 2 significant digits, other floats of a kind ``float`` with 2 decimals,
  any other float with 4 significant digits, integers with thousands separators; None/NaN ->
  "n/a", bools yes/no, lists and dicts item by item."""
  if is_missing(v):
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


# ---------------------------------------------------------------------------------------------
# tables


LONG_TEXT = 40   # characters: a longer text cell of `table_html` may wrap anywhere


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
      if isinstance(v, (float, np.floating)) and not is_missing(v):
        cells.append(f'<td class="num">{esc(float_format.format(float(v)))}</td>')
      elif is_number(v):
        cells.append(f'<td class="num">{esc(format_value(v))}</td>')
      else:  # a long text (a list of heads) wraps inside its cell (page.css td.text)
        text = format_value(v)
        wrap = ' class="text"' if len(text) > LONG_TEXT else ""
        cells.append(f"<td{wrap}>{esc(text)}</td>")
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


# ---------------------------------------------------------------------------------------------
# figures


def png_data_uri(path) -> str:
  """``data:image/png;base64,...`` of a PNG file (checked by its signature)."""
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"figure {str(path)!r} does not exist; draw it first "
                            "(heads_jax.report.figures) or leave it out of the report")
  data = path.read_bytes()
  if not data.startswith(PNG_SIGNATURE):
    raise ValueError(f"figure {str(path)!r} is not a PNG file; figures must be written as PNG")
  return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def figure_html(path, title: str, caption: str = "", how: str = "", *,
                name: str | None = None) -> str:
  """``<figure>`` with the PNG at ``path`` embedded, a bold title, the caption and a "how to read
  this" line; its anchor is ``fig-<slug of name>`` (default: of the title)."""
  how_html = f'<span class="how"><b>How to read this:</b> {esc(how)}</span>' if how else ""
  anchor = slug(title if name is None else name)
  return (f'<figure id="fig-{esc(anchor)}"><img alt="{esc(title)}" src="{png_data_uri(path)}">'
          f"<figcaption><b>{esc(title)}.</b> {esc(caption)}{how_html}</figcaption></figure>")


def figure_spec_html(name: str, spec, texts: dict | None = None) -> str:
  """``<figure>`` of the figure ``name``: ``spec`` is a PNG path or a dict with path and any of
  title, caption, how; what it leaves out comes from ``texts[name]`` = (title, caption, how)
  (e.g. a figures module's ``FIGURE_TEXT``), else the title is the name."""
  if isinstance(spec, dict):
    if "path" not in spec:
      raise ValueError(f"figure {name!r}: a dict spec needs a 'path' key, got {sorted(spec)}")
    path = spec["path"]
  else:
    spec, path = {}, spec
  title, caption, how = (texts or {}).get(name, (name.replace("_", " ").capitalize(),
                                                          "", ""))
  title = spec.get("title", title)
  caption = spec.get("caption", caption)
  how = spec.get("how", how)
  return figure_html(path, title, caption, how, name=name)


# ---------------------------------------------------------------------------------------------
# sections and pages


def sections_from_specs(specs) -> list[tuple[str, str]]:
  """[(title, html)] from section specs: dicts (title + text / html / table / figure) or
  (title, text) pairs. ``text`` is escaped; ``html`` is inserted as given (trusted)."""
  out = []
  for i, sec in enumerate(specs or ()):
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
      parts.append(figure_html(sec["figure"], sec.get("figure_title", sec["title"]),
                               sec.get("caption", ""), sec.get("how", ""),
                               name=str(sec.get("figure_name", sec["title"]))))
    out.append((str(sec["title"]), "".join(parts)))
  return out


def render_page(title: str, subtitle: str, sections: list[tuple[str, str]]) -> str:
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
  with storage.naming(path):  # a full disk names the page, not a bare [Errno 28]
    path.write_text(text, encoding="utf-8")
  return path


def write_page(out_dir, *, title: str, sections, settings: dict | None = None,
               subtitle: str = "", filename: str = contract.REPORT_HTML) -> Path:
  """Writes the self-contained page ``out_dir/filename`` and returns its path.

  Args:
    sections: ``(title, html)`` pairs or dicts with ``title`` and trusted ``html``.
    settings: when given, a "Settings" key/value table is the first section.
    subtitle: the grey line under the title.
  """
  pairs = []
  if settings:
    pairs.append(("Settings", kv_table_html(list(settings.items()), table_id="table-settings")))
  for s in sections:
    pairs.append((s["title"], s["html"]) if isinstance(s, dict) else tuple(s))
  return _write(out_dir, filename, render_page(title, subtitle, pairs))
