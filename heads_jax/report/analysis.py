"""The analysis report: all figures and ``report.html`` of one analysis output directory.

`build_analysis_report(out_dir)` reads the contract files (`heads_jax.contract`: scores.npz,
tests.csv and settings, and when present clusters.csv/json, summary.json, measures.npz), draws
the figures of Pande et al. and Guan et al. into ``out_dir/figures`` (`analysis_figures`) and
writes the page with `write_report`: settings beside the paper's, headline figures
(`heads_jax.report.headline`), roles per layer, figures, assigned roles per head, clusters, and
the measures of Clark et al. (`heads_jax.report.measures`). Computes no statistics: only means
and counts for drawing. No jax.

Summary dictionary (``summary.json``, written by ``heads_jax.hoststats.summary``). Any keys
are rendered (nested dicts flattened to ``outer.inner``, None shown as "n/a"). The rows of
``headline.ROWS`` (these keys and a few more) are shown as the paper's headline figures
next to the published reference values:

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

from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax import contract
from heads_jax.data import vocabulary
from heads_jax.hoststats.calibration import shares_by_layer_kind
from heads_jax.report import spec, style, tables, views
from heads_jax.report.figures import guan
from heads_jax.report.figures.common import DEFAULT_DPI
from heads_jax.report import headline
from heads_jax.report.measures import analysis_measures_sections
from heads_jax.report.robustness import robustness_sections
from heads_jax.report.page import (esc, flatten, format_value, is_number,
                                   kv_table_html, sections_from_specs, slug, table_html,
                                   write_page)

PAPER_SETTINGS = {"tau": "3", "alpha": "0.05", "test": "z-statistic (one-sided)",
                  "correction": "none", "direction": "dependent -> head"}



def analysis_figures(fig_dir, *, sieve_bias, roles, tests_df: pd.DataFrame, tau: float,
                     alpha: float | None = None, clusters_df: pd.DataFrame | None = None,
                     mean_score: float | None = None, p_band=(0.05, 0.95),
                     rule: str | None = None, examples: dict | None = None,
                     cluster_info: dict | None = None, windowed_layers=(),
                     dpi: int = DEFAULT_DPI) -> dict[str, Path]:
  """Draw every figure the registry lists for the analysis report (`heads_jax.report.spec`:
  Pande et al. and Guan et al.) into ``fig_dir``; returns ``{name: png path}``.

  Args:
    sieve_bias: float ``[b, l, h, r]`` (scores.npz); only used for the score CDF.
    roles: the r role names of ``sieve_bias``.
    tests_df: tests.csv; clusters_df: clusters.csv or None (cluster figures left out).
    mean_score: the summary's mean of all sieve scores, marked on the CDF (default: computed).
    p_band: the p-value interval shaded in the histogram.
    rule: the role rule of ``assigned`` (settings "rule"), named in the title of every figure
      drawn from the role decisions.
    examples: examples.json (the head view's maps) or None; Guan et al. Fig. 5 is drawn from it.
    cluster_info: clusters.json (the type names' margins, drawn in the type-mass figure) or None.
    windowed_layers: the layers whose heads see only a window of keys (ModernBERT's local
      layers; settings "windowed_layers"), marked in the role grid (Fig. 5).
  Figures whose inputs are absent (Fig. 5 without examples; the second pass's figures, drawn by
  `heads_jax.report.robustness`) are left out.
  """
  inputs = spec.Inputs(sieve_bias=sieve_bias, roles=roles, tests_df=tables.check_tests_df(tests_df),
                       tau=tau, alpha=alpha, clusters_df=clusters_df, mean_score=mean_score,
                       p_band=p_band, rule=rule, examples=examples, cluster_info=cluster_info,
                       windowed_layers=tuple(windowed_layers or ()))
  return spec.draw("analysis", inputs, fig_dir, dpi=dpi)


# ---------------------------------------------------------------------------------------------
# the page


def _settings_section(settings: dict) -> str:
  items = flatten(settings or {})
  paper = {k: v for k, v in PAPER_SETTINGS.items() if k in dict(items)}
  return (kv_table_html(items, table_id="table-settings", extra_columns={"paper": paper})
          + '<p class="note">Layers and heads are numbered from 0, as in the CSV files.</p>')


def _summary_section(summary: dict, tested: list[str] | None = None) -> str:
  """Headline table (with the paper's values), then the other summary entries: scalars in a
  key/value table, each dict of scalars (e.g. per-role values) as a one-row table."""
  rest = headline.other_entries(summary)
  # shown in their own sections ("Role rules", "Fine-role overlaps")
  rest = [(k, v) for k, v in rest if not k.startswith(("by_rule.", "fine_role_overlaps."))]
  table = headline.headline_html({"this run": summary}, reference=True,
                                 tested={"this run": tested}, label_header="headline figure")
  out = (table
         + '<p class="note">Shares are of all heads, except "syntactic heads that are also local" '
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
    short = dict(zip(vocabulary.DISTANCE_FEATURES, guan.FEATURE_LABELS))
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
  features = [f for f in vocabulary.DISTANCE_FEATURES if f in clusters_df.columns]
  short = dict(zip(vocabulary.DISTANCE_FEATURES, guan.FEATURE_LABELS))
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


def _rules_section(tests_df: pd.DataFrame, settings: dict, summary: dict) -> str:
  """Both rules' shares side by side, the near-uniform heads, and the block heads of either rule
  with the scores that decide them (tests.csv columns, DESIGN.md section 3)."""
  rule = settings.get("rule", "calibrated")
  by_rule = (summary or {}).get("by_rule") or {}
  rows = []
  labels = [("share_delimiter", "delimiter"), ("share_local", "local"),
            ("share_syntactic", "syntactic"), ("share_block", "block"),
            ("share_unskilled", "no role")]
  for key, label in labels:
    rows.append({"heads with the role": label,
                 **{f"{name} rule{' (shown)' if name == rule else ''}":
                    format_value((by_rule.get(name) or {}).get(key), "share")
                    for name in ("paper", "calibrated")}})
  flat = settings.get("near_uniform_heads") or []
  if settings.get("near_uniform_computed", True):
    near = (f"{len(flat)} near-uniform heads (mean KL divergence of their rows from uniform "
            f"attention below {format_value(settings.get('near_uniform_nats'))} nats; no role "
            f"under the calibrated rule){': ' + ', '.join(flat) if flat else ''}.")
  else:
    near = "Near-uniform heads were not determined (no measures.npz: the row entropy is needed)."
  body = ('<p class="note">The paper\'s rule assigns a role when the mean sieve bias is '
          "significantly above tau. The calibrated rule (the default; a heads_jax addition, not "
          "the paper's: the paper's values are compared with the paper's rule; DESIGN.md section "
          "3) also "
          "needs it significantly above what uniform attention scores on the same sequences (1 "
          "for the bare roles, ln n for block, and for block also block_plain above 1), and "
          f"gives near-uniform heads no role. The headline figures and the role figures of this "
          f"report show the <b>{esc(rule)}</b> rule; tests.csv holds both decisions "
          "(assigned_paper, assigned_calibrated).</p>"
          + table_html(pd.DataFrame(rows), table_id="table-rules")
          + f'<p class="note">{esc(near)}</p>'
          + _layer_kinds_html(tests_df, settings))
  df = tests_df[tests_df["role"] == vocabulary.COARSE_BLOCK]
  if len(df) and (df["assigned_paper"].astype(bool) | df["assigned_calibrated"].astype(bool)).any():
    sel = df[df["assigned_paper"].astype(bool) | df["assigned_calibrated"].astype(bool)]
    plain = tests_df[tests_df["role"] == vocabulary.PLAIN_TWINS[vocabulary.COARSE_BLOCK]].set_index(["layer", "head"])["mean"]
    table = pd.DataFrame({
        "head": [f"{l}:{h}" for l, h in zip(sel["layer"], sel["head"])],
        "block mean": sel["mean"].to_numpy(),
        "mean of block - ln n": sel["mean_minus_uniform"].to_numpy(),
        "block_plain mean": [plain.get((l, h), np.nan) for l, h in zip(sel["layer"], sel["head"])],
        "paper rule": sel["assigned_paper"].astype(bool).map({True: "block", False: "-"}).to_numpy(),
        "calibrated rule": sel["assigned_calibrated"].astype(bool).map(
            {True: "block", False: "-"}).to_numpy()})
    body += ("<h3>Block heads under either rule</h3>"
             '<p class="note">Uniform attention scores ln n on block (about 3.9 on MRPC pairs) '
             "and 1 on block_plain.</p>"
             + table_html(table, table_id="table-block-rules", float_format="{:.3f}"))
  return body


def _layer_kinds_html(tests_df: pd.DataFrame, settings: dict) -> str:
  """For a model with windowed layers (ModernBERT): the role shares of its local (windowed) and
  global layers apart, by the run's rule; "" for every other model."""
  kinds = shares_by_layer_kind(tests_df, settings)
  if kinds is None:
    return ""
  labels = [("share_delimiter", "delimiter"), ("share_local", "local"),
            ("share_syntactic", "syntactic"), ("share_block", "block"),
            ("share_unskilled", "no role"), ("share_near_uniform", "near-uniform")]
  rows = [{"heads with the role": label,
           **{f"{kind} layers ({len(part['layers'])} x {part['num_heads'] // max(1, len(part['layers']))}"
              " heads)": format_value(part.get(key), "share") for kind, part in kinds.items()}}
          for key, label in labels]
  window = settings.get("window")
  return ("<h3>Local (windowed) and global layers apart</h3>"
          f'<p class="note">In the windowed layers ({esc(", ".join(map(str, kinds["local"]["layers"])))}) '
          f"a head sees only the keys within {esc(window)} positions of its query; its uniform "
          "baseline is uniform attention over those keys (DESIGN.md, ModernBERT). Shares by the "
          f"run's rule ({esc(settings.get('rule', 'calibrated'))}).</p>"
          + table_html(pd.DataFrame(rows), table_id="table-layer-kinds"))


def _overlaps_section(overlaps: dict, settings: dict) -> str:
  rows = [{"fine roles": f"{v['first']} + {v['second']}",
           "heads with the first": v["num_first"], "heads with the second": v["num_second"],
           "heads with both": v["num_both"],
           "share of the first that also have the second": format_value(v["share_of_first"],
                                                                         "share")}
          for v in overlaps.values()]
  return ('<p class="note">Pande et al. discuss these overlaps: a subject\'s head word mostly '
          "follows it (nsubj with next_local) and an object's head word precedes it (obj with "
          f"prev_local). Counts under the {esc(settings.get('rule', 'paper'))} rule.</p>"
          + table_html(pd.DataFrame(rows), table_id="table-fine-overlaps"))


def write_report(out_dir, *, title: str, settings: dict, summary: dict, tests_df: pd.DataFrame,
                 clusters_df: pd.DataFrame | None = None, cluster_info: dict | None = None,
                 figures: dict | None = None, extra_sections=None,
                 filename: str = contract.REPORT_HTML) -> Path:
  """Write the self-contained analysis report ``out_dir/report.html``; returns its path.

  Args:
    settings: the run's settings (tests.json "settings": tau, alpha, test, correction, ...).
    summary: headline statistics (module docstring; any keys are shown).
    tests_df: tests.csv (layer, head, role, mean, n, statistic, p_value, p_adjusted, assigned).
    clusters_df, cluster_info: clusters.csv and the clustering's info dict, or None.
    figures: ``{name: png path}`` or ``{name: {"path", "title", "caption", "how"}}``; standard
      names (registered figures, `heads_jax.report.spec`) get their caption and "how to read this" line.
    extra_sections: more sections at the end: dicts with ``title`` and any of ``text``
      (escaped), ``html`` (trusted, inserted as is), ``table`` (DataFrame), ``figure`` (PNG path,
      with ``caption`` / ``how``); or ``(title, text)`` pairs.
  """
  tests_df = tables.check_tests_df(tests_df)
  sections = [("Settings", _settings_section(settings)),
              ("Headline figures", _summary_section(summary, tables.tested_roles(tests_df)))]
  if set(contract.RULE_COLUMNS) <= set(tests_df.columns):
    sections.append(("Role rules: the paper's and the calibrated", _rules_section(
        tests_df, settings, summary)))
  overlaps = (summary or {}).get("fine_role_overlaps")
  if overlaps:
    sections.append(("Fine-role overlaps", _overlaps_section(overlaps, settings)))
  per_layer = tables.roles_per_layer(tests_df)
  sections.append(("Roles per layer", (
      '<p class="note">Number of heads in each layer with a role assigned (fine roles, then the '
      "coarse groups; a head counts once per group).</p>"
      + table_html(per_layer, table_id="table-roles-per-layer", index=True))))
  # the figures by their registered section (`heads_jax.report.spec`): "Figures" here, any other
  # registered section of the analysis report after the per-head roles
  figure_sections = dict(spec.sections_html("analysis", figures or {}))
  sections.append(("Figures", figure_sections.pop("Figures", "")
                   or '<p class="empty">(no figures)</p>'))
  sections.append(("Assigned roles per head", (
      '<p class="note">Roles whose test rejected "mean sieve bias <= tau"; the full tests with '
      "means, statistics and p-values are in tests.csv.</p>"
      + table_html(tables.roles_per_head(tests_df), table_id="table-roles-per-head", tall=True))))
  if clusters_df is not None:
    sections.append(("Clusters", _clusters_section(clusters_df, cluster_info)))
  sections += list(figure_sections.items())
  sections += sections_from_specs(extra_sections)
  subtitle = " | ".join(f"{k}: {format_value(settings[k])}" for k in ("model", "data", "num_sequences")
                        if settings and k in settings)
  return write_page(out_dir, title=title, subtitle=subtitle, sections=sections, filename=filename)


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


def build_analysis_report(out_dir, *, title: str | None = None,
                          dpi: int = DEFAULT_DPI) -> Path:
  """Draw all figures and write ``report.html`` from the contract files of an analysis directory.

  Reads (with `heads_jax.contract`) ``scores.npz``, ``tests.csv`` and the settings, and when
  present ``clusters.csv`` with ``clusters.json`` (cluster info), ``summary.json`` and
  ``measures.npz``. Figures go to ``out_dir/figures``. Computes no statistics: only means and
  counts for drawing.
  """
  out_dir = Path(out_dir)
  scores = contract.read_scores(out_dir)
  tests_df, settings = contract.read_tests(out_dir)
  if "tau" not in settings:
    raise ValueError(f"the settings of {out_dir} (settings.json or tests.json) must hold at least "
                     "'tau'; re-run the analysis that wrote them")
  summary = (contract.read_summary(out_dir) if (out_dir / contract.SUMMARY_JSON).is_file()
             else {})
  clusters_df, cluster_info = (contract.read_clusters(out_dir)
                               if (out_dir / contract.CLUSTERS_CSV).is_file() else (None, None))
  mean_score = headline.summary_value(summary, "mean_sieve_score")
  examples = contract.read_examples(out_dir)  # the interactive head view (report/views.py)
  band = summary.get("p_interval") if isinstance(summary, dict) else None
  band = tuple(float(b) for b in band) if isinstance(band, (list, tuple)) and len(band) == 2 \
      else (0.05, 0.95)
  figs = analysis_figures(
      out_dir / "figures", sieve_bias=scores.sieve_bias, roles=scores.roles, tests_df=tests_df,
      tau=float(settings["tau"]), alpha=float(settings["alpha"]) if "alpha" in settings else None,
      clusters_df=clusters_df, mean_score=float(mean_score) if is_number(mean_score) else None,
      p_band=band, rule=settings.get("rule"), examples=examples, cluster_info=cluster_info,
      windowed_layers=settings.get("windowed_layers") or (), dpi=dpi)
  if title is None:
    parts = [short_name(settings[k]) for k in ("model", "data") if settings.get(k)]
    title = "Attention heads: " + " on ".join(parts) if parts else "Attention-head analysis"
  extra = list(analysis_measures_sections(out_dir, dpi=dpi) or [])
  extra += robustness_sections(out_dir, dpi=dpi)   # issue 26: the second pass, when present
  if examples and examples.get("heads"):
    extra.insert(0, views.head_view_section(examples, tests_df, clusters_df))
  return write_report(out_dir, title=title, settings=settings, summary=summary, tests_df=tests_df,
                      clusters_df=clusters_df, cluster_info=cluster_info, figures=figs,
                      extra_sections=extra)
