"""The ablation report's sections (``heads-jax ablate``): ablation by head group and by segment
(Guan et al. 2020, Table 3), head importance and the pruning curve (Michel et al. 2019).

`report_sections(AblationResults, fig_dir)` gives the report's sections in order; each is a dict
``{"title", "html"}`` for `heads_jax.report.page.write_page`. Every figure is a registered one of
the "ablation" report (`heads_jax.report.spec`): ``group_ablation``, ``segment_ablation``
(`heads_jax.report.figures.guan`), ``importance``, ``pruning`` (``michel``) and
``robustness_causal`` (``robustness``), drawn from the tables with `heads_jax.report.spec.draw`
into ``fig_dir/<name>.png``. Tables (written by ``heads_jax.ablation``):

* group ablation (``ablation.csv``): group, kind, num_heads, ablation, accuracy,
  accuracy_change, f1, f1_change, loss, loss_change, random_* (mean over random groups of the same
  layers; empty for a group of whole layers), random_seeds, heads;
* segment ablation (``segment_ablation.csv``): the same with ablation intra / inter and
  renormalised;
* importance (``importance.csv``): layer, head, importance (and importance_raw);
* pruning (``pruning.csv``): method, seed, step, share_pruned, num_pruned, accuracy, f1, loss;
* Guan et al.'s Tables 2 and 3 row by row (``paper_tables.csv``, `heads_jax.ablation.guan`):
  table, id, setting, num_heads, missing_types, exact_match / f1 (SQuAD; accuracy / f1 for a
  classifier) and their change, paper_exact_match, paper_f1.

A SQuAD model's tables have ``exact_match`` and ``f1`` (fractions) where a classifier's have
``accuracy``, ``f1`` and ``loss``.

**One unit for a reader** (issue 43): the files keep fractions (as every file of heads_jax), and
everything a person reads of an ablation, the console, the report's tables and its figures, gives
accuracy, F1 and exact match in percent with 2 decimals and their changes in percentage points
("pts"), the unit of Guan et al.'s tables; the loss stays in nats. `display_table` (column names
with their unit, values scaled), `table_text` (the console's tables) and `value_text` (one value)
are that one formatter. **One random baseline**: every "random" column is the mean over random
groups with the group's number of heads in each of its layers
(``heads_jax.ablation.causal.matched_random_groups``, ``RANDOM_BASELINE``); a group of whole
layers has none ("n/a").

No jax.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from heads_jax.report import spec
from heads_jax.report.figures.common import DEFAULT_DPI
from heads_jax.report.page import (esc, figure_html, format_value, is_missing, kv_table_html,
                                   slug, table_html)


def _figure(name: str, figure_path, title: str, metric: str = "accuracy") -> str:
  """The registered figure ``name`` (`heads_jax.report.spec`) at ``figure_path``, headed
  ``title``; its caption names the ``metric``."""
  if figure_path is None:  # not drawn (the registry's draw found nothing to draw)
    return ""
  fig = spec.figure(name)
  return figure_html(figure_path, title, fig.caption.format(metric=metric), fig.how)


METRICS = ("accuracy", "exact_match", "f1")
PERCENT_METRICS = METRICS   # shown in percent, their changes in points; the loss in nats
UNITS = ("Accuracy, F1 and exact match are in percent and their changes in percentage points "
         "(pts).")
RANDOM_BASELINE = ("random groups with the same number of heads in each layer as the group, drawn "
                   "uniformly from those layers' heads")
RANDOM_SHORT = "the mean over random groups of the same layers, n/a for whole layers"
WHOLE_LAYERS_NOTE = ("n/a: the group holds every head of its layers, so no other group of the "
                     "same layers exists to compare with.")
# (a table column, its name for a percent metric, its name for the loss); "{m}" is the metric's
# name
_COLUMN_FORMS = (("{m}", "{m} (%)", "{m}"), ("{m}_change", "{m} change (pts)", "{m} change"),
                 ("random_{m}", "random {m} (%)", "random {m}"),
                 ("random_{m}_change", "random {m} change (pts)", "random {m} change"),
                 ("random_{m}_std", "random {m} sd (pts)", "random {m} sd"),
                 ("{m}_importance", "{m}, importance order (%)", "{m}, importance order"),
                 ("{m}_random", "{m}, random order (%)", "{m}, random order"),
                 ("{m}_random_std", "{m}, random order sd (pts)", "{m}, random order sd"),
                 ("paper_{m}", "{m}, paper (%)", "{m}, paper"))
# the causal test's value columns, of the metric its "metric" column names
_CAUSAL_FORMS = (("base", "{m} unablated (%)", "{m} unablated"),
                 ("value", "{m} ablated (%)", "{m} ablated"),
                 ("change", "change (pts)", "change"),
                 ("random_mean_change", "random mean change (pts)", "random mean change"),
                 ("random_std_change", "random sd (pts)", "random sd"))


def is_percent(metric: str) -> bool:
  """Whether ``metric`` reads in percent (accuracy, F1, exact match; not the loss)."""
  return metric in PERCENT_METRICS


def value_text(metric: str, value: float, change: bool = False) -> str:
  """One value of ``metric`` as a person reads it: ``"58.33%"`` (``change``: ``"-16.67 pts"``)
  for a percent metric, the loss with 4 decimals (``"+0.0123"``); n/a for NaN."""
  if value is None or not np.isfinite(value):
    return "n/a"
  if is_percent(metric):
    return f"{100 * value:+.2f} pts" if change else f"{100 * value:.2f}%"
  return f"{value:+.4f}" if change else f"{value:.4f}"


def _column_unit(column: str, metric: str | None) -> tuple[str, bool] | None:
  """``(shown name, in percent)`` of a table column that holds a metric, else None."""
  for m in METRICS + ("loss",):
    for raw, pct, plain in _COLUMN_FORMS:
      if column == raw.format(m=m):
        return (pct if is_percent(m) else plain).format(m=m), is_percent(m)
  if metric is not None:
    for raw, pct, plain in _CAUSAL_FORMS:
      if column == raw:
        return (pct if is_percent(metric) else plain).format(m=metric), is_percent(metric)
  if column == "share_pruned":
    return "heads pruned (%)", True
  return None


def display_table(df: pd.DataFrame, columns=None) -> pd.DataFrame:
  """``columns`` of an ablation table (all: None) as a person reads them: every percent metric
  column (a group table's, the causal test's of its ``metric``, the pruning summary's, Guan's
  rows') times 100 and named with its unit ("accuracy (%)", "accuracy change (pts)"), the loss
  as it is."""
  cols = [c for c in (df.columns if columns is None else columns) if c in df.columns]
  metric = str(df["metric"].iloc[0]) if "metric" in df.columns and len(df) else None
  out = df[cols].copy()
  names = {}
  for c in cols:
    unit = _column_unit(c, metric)
    if unit is not None:
      names[c], pct = unit
      if pct:
        out[c] = 100 * pd.to_numeric(out[c], errors="coerce")
  return out.rename(columns=names)


def table_text(df: pd.DataFrame, columns=None) -> str:
  """The console's text of ``columns`` of an ablation table (`display_table`): values in percent
  and points with 2 decimals, other numbers with 4 (p-values 3), n/a for a missing value."""
  shown = display_table(df, columns)
  cells = shown.astype(object)
  for c in shown.columns:
    if not pd.api.types.is_float_dtype(shown[c]):
      continue
    fmt = ("{:.2f}" if c.endswith(("(%)", "(pts)")) else "{:.3f}" if c == "p_value"
           else "{:.0f}" if c == "rank" else "{:.4f}")
    cells[c] = [format_value(v) if is_missing(v) else fmt.format(v) for v in shown[c]]
  return cells.to_string(index=False)


def _metric_columns(df: pd.DataFrame, metrics) -> list[str]:
  return [m for m in metrics if m in df.columns and df[m].notna().any()]


def ablation_section(table: pd.DataFrame, figure_path, *, metric: str | None = None,
                     title: str = "Ablation by head group", note: str = "") -> dict:
  """The group-ablation table in the paper's form (group, heads, metric, change) plus the
  random-group baseline and the figure."""
  metrics = _metric_columns(table, METRICS)
  metric = metric or (metrics[0] if metrics else "accuracy")  # the figure's: the first reported
  cols = ["group", "kind", "num_heads", "ablation"]
  for m in metrics:
    cols += [m, f"{m}_change"]
    cols += [c for c in (f"random_{m}_change", f"random_{m}_std") if c in table.columns]
  text = ("<p>Metric of the fine-tuned model (a classifier; a SQuAD model in exact match and "
          "F1) on its evaluation set with each group of heads ablated, and the change against the "
          "unablated model (first row). " + esc(UNITS) + " The random baseline: <i>random</i> is "
          "the mean change (and standard deviation) over " + esc(RANDOM_BASELINE) + ", ablated "
          "the same way; a random group of the same layers is the fair control for a group that "
          "sits in given layers, since the effect of removing a head depends much on its layer "
          "(Michel et al. 2019).</p>" + _whole_layers_note(table))
  if note:
    text += f'<p class="note">{esc(note)}</p>'
  html = (text + table_html(display_table(table, cols), table_id=f"table-{slug(title)}",
                            float_format="{:.2f}")
          + _figure("group_ablation", figure_path, title, metric))
  return {"title": title, "html": html}


def segment_section(table: pd.DataFrame, figure_path, *, metric: str | None = None,
                    title: str = "Intra- and inter-sentence attention removed") -> dict:
  renorm = bool(table.get("renormalised", pd.Series([False])).astype(bool).any())
  metrics = _metric_columns(table, METRICS)
  metric = metric or (metrics[0] if metrics else "accuracy")  # the figure's: the first reported
  cols = ["group", "kind", "num_heads", "ablation"]
  for m in metrics:
    cols += [m, f"{m}_change"] + [c for c in (f"random_{m}_change", f"random_{m}_std")
                                  if c in table.columns]
  how = ("rows renormalised: each query's remaining attention was rescaled to sum to 1"
         if renorm else "rows NOT renormalised, as Guan et al.: the removed attention mass is "
                        "simply dropped, so the head's output shrinks")
  html = (f"<p>For each group, the attention between tokens of the same sentence (intra; query and "
          f"key have the same token type, [CLS] and the first [SEP] count as sentence A) or of "
          f"different sentences (inter) is set to zero in those heads (Guan et al. 2020, Table 3); "
          f"{esc(how)}. On single-sentence tasks all attention is intra-sentence. {esc(UNITS)} "
          f"<i>random</i>: the mean change over {esc(RANDOM_BASELINE)}, their attention removed "
          f"the same way.</p>" + _whole_layers_note(table)
          + table_html(display_table(table, cols), table_id=f"table-{slug(title)}",
                       float_format="{:.2f}")
          + _figure("segment_ablation", figure_path, title, metric))
  return {"title": title, "html": html}


def _whole_layers_note(table: pd.DataFrame) -> str:
  """The note under a group table one of whose groups holds whole layers (its random columns
  empty), else ""."""
  rand = [c for c in table.columns if c.startswith("random_") and c.endswith("_change")]
  if not rand or "kind" not in table.columns:
    return ""
  groups = table[table["kind"] != "baseline"]
  if not (groups["num_heads"] > 0).any() or not groups[rand[0]][groups["num_heads"] > 0].isna().any():
    return ""
  return f'<p class="note">{esc(WHOLE_LAYERS_NOTE)}</p>'


def importance_table(importance, raw=None) -> pd.DataFrame:
  """Long table: layer, head, importance (and importance_raw)."""
  imp = np.asarray(importance, float)
  l, h = np.meshgrid(np.arange(imp.shape[0]), np.arange(imp.shape[1]), indexing="ij")
  df = pd.DataFrame({"layer": l.ravel(), "head": h.ravel(), "importance": imp.ravel()})
  if raw is not None:
    df["importance_raw"] = np.asarray(raw, float).ravel()
  df["rank"] = df["importance"].rank(ascending=False, method="first").astype(int)
  return df


def importance_section(importance, figure_path, *, raw=None, settings: dict | None = None,
                       title: str = "Head importance") -> dict:
  table = importance_table(importance, raw)
  top = table.sort_values("rank").head(10)
  low = table.sort_values("rank").tail(10)
  html = ("<p>Head importance of Michel et al. (2019): the expected absolute gradient of the "
          "loss with respect to each head's gate, at all gates 1.</p>"
          + (kv_table_html(list(settings.items()), table_id="table-importance-settings")
             if settings else "")
          + _figure("importance", figure_path, title)
          + "<h3>Most important heads</h3>" + table_html(top, table_id="table-importance-top",
                                                          float_format="{:.4g}")
          + "<h3>Least important heads</h3>" + table_html(low, table_id="table-importance-low",
                                                           float_format="{:.4g}"))
  return {"title": title, "html": html}


def pruning_section(curve: pd.DataFrame, summary: pd.DataFrame, figure_path, *,
                    metric: str = "accuracy", settings: dict | None = None,
                    title: str = "Pruning curve") -> dict:
  html = ("<p>Heads removed in steps of a share of all heads, least important first (Michel et "
          "al. 2019, Fig. 3), against removal in a random order; share 0 is the unablated "
          "model.</p>"
          + (kv_table_html(list(settings.items()), table_id="table-pruning-settings")
             if settings else "")
          + _figure("pruning", figure_path, title, metric) + f"<p>{esc(UNITS)}</p>"
          + table_html(display_table(summary), table_id="table-pruning", float_format="{:.2f}"))
  return {"title": title, "html": html}


def paper_tables_section(table: pd.DataFrame, *, model: str = "") -> dict:
  """Guan et al. Tables 2 and 3 row by row: this run's exact match and F1 (percent, as the
  paper prints them) beside the paper's (BERT-large whole-word-masking fine-tuned on SQuAD,
  SQuAD v1.1 dev)."""
  em = "exact_match" if "exact_match" in table.columns else "accuracy"
  df = pd.DataFrame({"table": table["table"], "id": table["id"], "setting": table["setting"],
                     "heads": table["num_heads"],
                     f"{em} (this run)": 100 * table[em], "EM (paper)": 100 * table["paper_exact_match"],
                     "F1 (this run)": 100 * table["f1"], "F1 (paper)": 100 * table["paper_f1"]})
  missing = table["missing_types"].fillna("").astype(str).str.strip()   # "" (or NaN): none
  if missing.ne("").any():
    df["types without heads here"] = missing
  text = ("<p>Guan et al. (2020) Table 2 (ids 1-11: each cluster type kept, pruned = attention "
          "0, or substituted by 1/L = uniform attention over the L real tokens) and Table 3 (ids "
          "12-19: the intra- or inter-sentence attention of one type removed, or of every type "
          "but one; for SQuAD the two sentences are the question and the context; rows not "
          "renormalised, as the paper), scored on this run's data without re-training, beside "
          "the paper's values (\"Acc.\" in the paper is the exact match), in percent. The "
          "paper's model is " + esc("bert-large-uncased-whole-word-masking-finetuned-squad") +
          " on the SQuAD v1.1 development set" +
          (f"; this run's is {esc(model)}" if model else "") + ".</p>")
  return {"title": "Guan et al. Tables 2 and 3",
          "html": text + table_html(df, table_id="table-paper-tables", float_format="{:.2f}")}


def causal_html(table: pd.DataFrame | None, figure_path) -> str:
  """The causal test of the roles (``heads_jax.ablation.causal.causal_tests``): a paragraph,
  the registered figure ``robustness_causal`` at ``figure_path`` (None: not drawn) and the
  table."""
  text = ("<h3>Causal test of the roles</h3><p>" + esc(
      f"Each role's heads ablated together against {RANDOM_BASELINE} (the same random baseline as "
      "the table above, with more groups); rank 1 means no random group hurt more, and the "
      "permutation p-value is rank / (random groups + 1). " + UNITS) + "</p>")
  if table is None or not len(table):
    return text + "<p>No role has heads.</p>"
  if (table["num_heads"] > 0).any() and table["p_value"][table["num_heads"] > 0].isna().any():
    text += f'<p class="note">{esc(WHOLE_LAYERS_NOTE)}</p>'
  shown = display_table(table, ("group", "num_heads", "layers", "ablation", "metric", "base",
                                "value", "change", "random_mean_change", "random_std_change",
                                "random_groups", "rank", "p_value"))
  for c in ("rank", "p_value"):   # a count and a p-value, not points: formatted here
    if c in shown.columns:
      shown[c] = [format_value(v if is_missing(v) or c == "p_value" else int(v),
                               "p" if c == "p_value" else None) for v in shown[c]]
  fig = spec.figures_html({"robustness_causal": figure_path}) if figure_path else ""
  return text + fig + table_html(shown, table_id="table-causal", float_format="{:.2f}")


@dataclasses.dataclass(frozen=True)
class AblationResults:
  """What the ablation report shows; a part not run is None.

  Attributes:
    base: the unablated model's scores (``{metric: value, "loss", "n"}``).
    metrics: the metric names, the first one the figures'.
    groups, grouping, group_note: the group-ablation table, the grouping (``--by``) and how
      the heads were ablated.
    causal: the causal test of the roles (with ``--by role``).
    segments: the intra/inter-sentence ablation table.
    importance, importance_raw: ``[l, h]`` importance (as reported) and its raw values (``[l*h]``
      or ``[l, h]``); importance_settings: how it was estimated; importance_label: the figure's
      colour bar.
    pruning, pruning_summary, pruning_settings: the pruning curve, its summary, its settings.
    paper_tables: Guan et al. Tables 2-3 row by row; model: the model's name.
    attribution, patching: the per-head tables of `heads_jax.ablation.attribution.head_table`
      (patching with attribution patching's ``estimated_*`` columns), their settings; roles:
      ``[l, h]`` object array of each head's roles ("" none); carriers: the roles' causal test
      on both scores; head_pruning: the pruning curves on the held-out rows.
  """
  base: dict
  metrics: tuple
  groups: pd.DataFrame | None = None
  grouping: str = "group"
  group_note: str = ""
  causal: pd.DataFrame | None = None
  segments: pd.DataFrame | None = None
  importance: np.ndarray | None = None
  importance_raw: np.ndarray | None = None
  importance_settings: dict | None = None
  importance_label: str = "importance"
  pruning: pd.DataFrame | None = None
  pruning_summary: pd.DataFrame | None = None
  pruning_settings: dict | None = None
  paper_tables: pd.DataFrame | None = None
  model: str = ""
  attribution: pd.DataFrame | None = None
  attribution_settings: dict | None = None
  patching: pd.DataFrame | None = None
  patching_settings: dict | None = None
  roles: np.ndarray | None = None
  carriers: pd.DataFrame | None = None
  head_pruning: pd.DataFrame | None = None


def report_sections(results: AblationResults, fig_dir, *, dpi: int = DEFAULT_DPI) -> list[dict]:
  """The ablation report's sections in order (the unablated model, then each part run), its
  figures drawn through the registry (`heads_jax.report.spec.draw`, "ablation" report)."""
  r = results
  metric = r.metrics[0] if r.metrics else "accuracy"
  imp = None if r.importance is None else np.asarray(r.importance, float)
  drawn = spec.draw("ablation", spec.Inputs(
      group_table=r.groups, segment_table=r.segments, importance=imp,
      importance_label=r.importance_label, pruning_curve=r.pruning, causal=r.causal,
      metric=metric), fig_dir, dpi=dpi)
  base = pd.DataFrame([{k: r.base[k] for k in (*r.metrics, "loss", "n") if k in r.base}])
  sections = [{"title": "Unablated model",
               "html": table_html(base, table_id="table-baseline", float_format="{:.4f}")}]
  if r.groups is not None:
    by = ablation_section(r.groups, drawn.get("group_ablation"), metric=metric,
                          title=f"Ablation by {r.grouping}", note=r.group_note)
    if r.causal is not None:
      by["html"] += causal_html(r.causal, drawn.get("robustness_causal"))
    sections.append(by)
  if r.segments is not None:
    sections.append(segment_section(r.segments, drawn.get("segment_ablation"), metric=metric))
  if imp is not None:
    raw = None if r.importance_raw is None else np.asarray(r.importance_raw, float).reshape(imp.shape)
    sections.append(importance_section(imp, drawn.get("importance"), raw=raw,
                                       settings=r.importance_settings))
  if r.pruning is not None:
    sections.append(pruning_section(r.pruning, r.pruning_summary, drawn.get("pruning"),
                                    metric=metric, settings=r.pruning_settings))
  if r.paper_tables is not None:
    sections.append(paper_tables_section(r.paper_tables, model=r.model))
  if r.attribution is not None or r.patching is not None:
    sections.append(carriers_section(r, fig_dir, dpi=dpi))
  return sections


def carriers_section(r: AblationResults, fig_dir, *, dpi: int = DEFAULT_DPI) -> dict:
  """"Which heads carry the prediction": the layer x head grids of attribution, patching,
  attribution patching and roles side by side, the roles' test against random heads of the
  same layers, and the pruning curves on held-out rows (figures of
  `heads_jax.report.figures.hao`)."""
  drawn = spec.draw("ablation", spec.Inputs(attribution=r.attribution, patching=r.patching,
                                            roles=r.roles, head_pruning=r.head_pruning),
                    fig_dir, dpi=dpi, section="Which heads carry the prediction")
  html = ("<p>Self-attention attribution (Hao et al. 2021; their text was not available here, "
          "the method as issue 51 states it and as their released code computes it): integrated "
          "gradients of the predicted class's score with respect to one layer's attention maps, "
          "zero baseline, a head's importance its largest attribution, averaged over rows. "
          "Activation patching: each head's output from the corrupted run written into the clean "
          "run, the change of the logit difference divided by the whole corruption's; attribution "
          "patching is its first-order estimate from one backward pass. Intervals: 95% bootstrap "
          "over rows.</p>")
  for name, settings in (("attribution", r.attribution_settings),
                         ("patching", r.patching_settings)):
    if settings:
      html += f"<h3>{esc(name)}</h3>" + kv_table_html(
          [(k, v if not isinstance(v, dict) else ", ".join(f"{a} {b:.3f}" for a, b in v.items()))
           for k, v in settings.items()], table_id=f"table-{name}-settings")
  for name in ("head_grid", "head_pruning"):
    if name in drawn:
      html += _figure(name, drawn[name], name.replace("_", " "))
  for name, t in (("attribution", r.attribution), ("patching", r.patching)):
    if t is not None:
      html += f"<h3>Top heads by {esc(name)}</h3>" + table_html(
          t.sort_values("rank").head(10), table_id=f"table-{name}-top", float_format="{:.4g}")
  if r.carriers is not None:
    html += ("<h3>Which roles carry the prediction</h3><p>Each role's heads' summed score "
             "against random heads of the same layers (the causal test of the group ablation); "
             "p_value = rank / (random groups + 1).</p>"
             + table_html(r.carriers[["group", "ablation", "num_heads", "layers", "change",
                                      "random_mean_change", "random_std_change", "rank",
                                      "p_value"]], table_id="table-carriers",
                          float_format="{:.4g}"))
  if r.head_pruning is not None:
    t = r.head_pruning.groupby(["method", "share_pruned"]).agg(
        accuracy=("accuracy", "mean"), low=("accuracy_low", "mean"),
        high=("accuracy_high", "mean")).reset_index()
    html += ("<h3>Pruning on held-out rows</h3><p>Accuracy with the heads of each order removed "
             "(least important first; role: the role heads first), 95% Wilson intervals over the "
             "held-out rows (random: the mean of its seeds).</p>"
             + table_html(t, table_id="table-head-pruning", float_format="{:.4f}"))
  return {"title": "Which heads carry the prediction", "html": html}

