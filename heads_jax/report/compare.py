"""The before/after report of a comparison (e.g. a model before and after fine-tuning).

`write_compare_report` draws the figures the registry lists for the compare report
(`heads_jax.report.spec`: the change of mean sieve bias per role and layer group, Pande et al.
Fig. 6, and the cluster changes, Guan et al.), and writes ``report.html`` with the
headline figures side by side, the tables of `heads_jax.hoststats.compare` and the roles and
attention types each head gained or lost. `similarity_section` adds the per-head attention
similarity of the two models (Kovaleva et al. 2019). No jax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax import contract
from heads_jax.hoststats import roles as roles_lib
from heads_jax.report import headline, spec, tables
from heads_jax.report.figures.common import DEFAULT_DPI
from heads_jax.report.page import (esc, sections_from_specs, figure_html, flatten,
                                   format_value, is_missing, kv_table_html, table_html, write_page)
from heads_jax.report.tables import require_columns


def _cell(value) -> str:
  """A table cell: numbers right-aligned on one line, text (e.g. a list of 57 heads) wrapped."""
  text = format_value(value)
  numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
  return f'<td class="num">{esc(text)}</td>' if numeric else f'<td class="text">{esc(text)}</td>'


def _appendix(summary: str, html: str) -> str:
  return f'<details class="appendix"><summary>{esc(summary)}</summary>{html}</details>'


def _summary_compare_section(before: dict, after: dict) -> str:
  """The headline rows before and after; every other summary key (raw, flattened) in a
  collapsed appendix, changed ones first."""
  table = headline.headline_table({"before": before, "after": after}, paper=False,
                                  skip_absent=True)
  rows = [f'<tr><td>{esc(r.figure)}</td><td class="num">{esc(r.before)}</td>'
          f'<td class="num">{esc(r.after)}</td></tr>' for r in table.itertuples(index=False)]
  html = ('<div class="scroll"><table id="table-summary-compare"><thead><tr><th>figure</th>'
          f"<th>before</th><th>after</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>")
  rest_b, rest_a = dict(headline.other_entries(before)), dict(headline.other_entries(after))
  keys = list(dict.fromkeys(list(rest_b) + list(rest_a)))
  if keys:
    changed = [k for k in keys if format_value(rest_b.get(k)) != format_value(rest_a.get(k))]
    keys = changed + [k for k in keys if k not in changed]
    other = [f"<tr><td>{esc(k)}</td>{_cell(rest_b.get(k))}{_cell(rest_a.get(k))}</tr>" for k in keys]
    html += _appendix(
        f"Every other summary value ({len(keys)}; {len(changed)} changed, listed first)",
        '<div class="scroll"><table id="table-summary-other-compare"><thead><tr><th>key</th>'
        f"<th>before</th><th>after</th></tr></thead><tbody>{''.join(other)}</tbody></table></div>")
  return html


def _settings_section(settings: dict) -> str:
  """The comparison's own settings, then only the settings in which the two runs differ
  (``before.X`` vs ``after.X``); every setting in a collapsed appendix."""
  settings = dict(settings or {})
  sides = {side: dict(flatten(settings.pop(side))) for side in ("before", "after")
           if isinstance(settings.get(side), dict)}
  html = kv_table_html(flatten(settings), table_id="table-settings") if settings or not sides else ""
  if sides:
    b, a = sides.get("before", {}), sides.get("after", {})
    keys = list(dict.fromkeys(list(b) + list(a)))
    differ = [k for k in keys if format_value(b.get(k)) != format_value(a.get(k))]
    rows = [f"<tr><td>{esc(k)}</td>{_cell(b.get(k))}{_cell(a.get(k))}</tr>" for k in differ]
    if not rows:
      rows = ['<tr><td class="empty" colspan="3">(the two runs have the same settings)</td></tr>']
    html += (f'<p class="note">The settings in which the two runs differ ({len(differ)} of '
             f"{len(keys)}; the others are equal).</p>"
             '<div class="scroll"><table id="table-settings-differ"><thead><tr><th>setting</th>'
             f"<th>before</th><th>after</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>")
    everything = [f"<tr><td>{esc(k)}</td>{_cell(b.get(k))}{_cell(a.get(k))}</tr>" for k in keys]
    html += _appendix(f"Every setting of the two runs ({len(keys)})",
                      '<div class="scroll"><table id="table-settings-all"><thead><tr><th>setting</th>'
                      f"<th>before</th><th>after</th></tr></thead><tbody>{''.join(everything)}"
                      "</tbody></table></div>")
  return html


def _split(text) -> list[str]:
  if is_missing(text):
    return []
  return [t for t in str(text).split(";") if t.strip()]


def write_compare_report(out_dir, *, compare_df: pd.DataFrame, heads_df: pd.DataFrame | None = None,
                         cluster_changes_df: pd.DataFrame | None = None,
                         title: str = "Attention heads before and after fine-tuning",
                         settings: dict | None = None, summary_before: dict | None = None,
                         summary_after: dict | None = None, figures: dict | None = None,
                         warnings=None, extra_sections=None, filename: str = contract.REPORT_HTML,
                         dpi: int = DEFAULT_DPI) -> Path:
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
  require_columns(compare_df, ("role", "layer_group", "before", "after", "delta"),
                               "fine-tuning comparison table")
  figs = spec.draw("compare", spec.Inputs(compare_df=compare_df,
                                          cluster_changes_df=cluster_changes_df),
                   Path(out_dir) / "figures", dpi=dpi,
                   names=[f.name for f in spec.figures_for("compare")
                          if f.name != "attention_similarity"])  # that one: similarity_section
  figs.update(figures or {})

  sections = []
  if warnings:
    sections.append(("Warnings", '<ul class="warnings">' + "".join(
        f"<li>{esc(w)}</li>" for w in warnings) + "</ul>"))
  if summary_before or summary_after:
    sections.append(("Headline figures before and after",
                     _summary_compare_section(summary_before or {}, summary_after or {})))
  sections.append(("Settings", _settings_section(settings or {})))
  df = compare_df.copy()
  df["role"] = df["role"].astype(str)
  roles = roles_lib.role_order(df["role"].unique())
  groups = [g for g in roles_lib.LAYER_GROUPS if g in set(df["layer_group"].astype(str))]
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
  sections += spec.sections_html("compare", figs)
  if heads_df is not None:
    require_columns(heads_df, ("layer", "head", "gained", "lost"),
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
    count_df = count_df.reindex(roles_lib.role_order(count_df.index)) if len(count_df) else count_df
    count_df.index.name = "role"
    sections.append(("Role changes per head", (
        f"<p>{len(changed)} of {len(heads_df)} heads gained or lost at least one role.</p>"
        "<h3>Heads gaining / losing each role</h3>"
        + table_html(count_df, table_id="table-role-change-counts", index=True)
        + "<h3>Heads whose roles changed</h3>"
        + table_html(changed, table_id="table-role-changes", tall=True))))
  if cluster_changes_df is not None:
    require_columns(cluster_changes_df, ("layer", "head", "cluster_before",
                                                      "cluster_after"), "cluster change table")
    ch = cluster_changes_df
    moved = (ch["changed"].pipe(tables.as_bool) if "changed" in ch.columns
             else (ch["cluster_before"].astype(str) != ch["cluster_after"].astype(str)).to_numpy())
    sections.append(("Cluster changes", (
        f"<p>{int(np.sum(moved))} of {len(ch)} heads changed attention type.</p>"
        + table_html(ch[moved].sort_values(["layer", "head"]), table_id="table-cluster-changes",
                     tall=True))))
  sections += sections_from_specs(extra_sections)
  subtitle = " | ".join(f"{k}: {format_value(v)}" for k, v in flatten(settings or {})
                        if k.split(".")[-1] in ("model", "task", "data"))
  return write_page(out_dir, title=title, subtitle=subtitle, sections=sections, filename=filename)


# ---------------------------------------------------------------------------------------------
# attention similarity (Kovaleva et al. 2019)


def similarity_section(similarity, figure_path=None, *, num_sequences: int | None = None,
                       data: str | None = None, fig_dir=None, dpi: int = DEFAULT_DPI,
                       title: str | None = None) -> dict:
  """The attention-similarity section (Kovaleva et al. 2019): the registered figure
  ``attention_similarity`` (drawn into ``fig_dir`` unless ``figure_path`` is given), the per-layer
  means and the most changed heads. ``similarity``: float ``[l, h]``."""
  fig = spec.figure("attention_similarity")
  title = title or fig.section
  sim = np.asarray(similarity, float)
  if figure_path is None:
    if fig_dir is None:
      raise ValueError("similarity_section needs figure_path or fig_dir")
    figure_path = spec.draw("compare", spec.Inputs(similarity=sim), fig_dir, dpi=dpi,
                            names=(fig.name,))[fig.name]
  per_layer = pd.DataFrame({"layer": np.arange(sim.shape[0]), "mean cosine": sim.mean(1),
                            "min cosine": sim.min(1), "max cosine": sim.max(1)})
  l, h = np.unravel_index(np.argsort(sim, axis=None)[:10], sim.shape)
  changed = pd.DataFrame({"layer": l, "head": h, "cosine": sim[l, h]})
  src = f" on {esc(data)}" if data else ""
  n = f" ({num_sequences} sequences)" if num_sequences else ""
  html = (f"<p>Cosine similarity of each head's attention map (the real query x key block, "
          f"flattened) under the model before and after fine-tuning, on the same inputs{src}{n}, "
          f"averaged over the sequences (Kovaleva et al. 2019).</p>"
          + figure_html(figure_path, title, fig.caption, fig.how)
          + "<h3>Per layer</h3>" + table_html(per_layer, table_id="table-similarity-layers",
                                              float_format="{:.3f}")
          + "<h3>Most changed heads</h3>" + table_html(changed, table_id="table-similarity-heads",
                                                       float_format="{:.3f}"))
  return {"title": title, "html": html}
