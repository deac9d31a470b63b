"""Figures and HTML sections for ablation, head importance, pruning and the survey's measures.

Host side (numpy / pandas / matplotlib, sklearn for the MDS picture), no jax. Every ``plot_*``
draws one PNG from plain arrays or the CSV tables of ``heads-jax ablate``; every ``*_section``
returns a dict ``{"title", "html"}`` that ``heads_jax.report.html.write_report`` /
``write_compare_report`` accept in ``extra_sections`` and that ``write_page`` renders as a small
self-contained page of its own (same CSS, figures embedded as data URIs).

Tables drawn here (written by ``heads_jax.ablation``):

* group ablation (``ablation.csv``): group, kind, num_heads, ablation, accuracy,
  accuracy_change, f1, f1_change, loss, loss_change, random_* (mean over random groups of the same
  size), heads;
* segment ablation (``segment_ablation.csv``): the same with ablation intra / inter and
  renormalised;
* importance (``importance.csv``): layer, head, importance (and importance_raw);
* pruning (``pruning.csv``): method, seed, step, share_pruned, num_pruned, accuracy, f1, loss.

Measures (``measures.npz`` of an analysis): ``entropy`` and ``cls_entropy`` ``[N, l, h]``,
``token_attention`` ``[N, l, h, 5]`` with ``token_measures`` names, and optionally ``js``
``[l*h, l*h]`` (mean Jensen-Shannon distance between heads over the sequences).
"""

from __future__ import annotations

import datetime as _dt
import inspect
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from heads_jax import contract
from heads_jax.report.figures import _new_figure, _save
from heads_jax.report import style
from heads_jax.report.html import CSS, esc, kv_table_html, png_data_uri, slug, table_html

DEFAULT_DPI = 110
TOKEN_MEASURE_LABELS = {"cls": "[CLS]", "sep": "[SEP]", "punct": "punctuation (, .)",
                        "prev": "previous token", "next": "next token"}


# ---------------------------------------------------------------------------------------------
# helpers


def _figure(width: float, height: float) -> Figure:
  return _new_figure(width, height)


def _require(df: pd.DataFrame, columns, what: str):
  missing = [c for c in columns if c not in df.columns]
  if missing:
    raise ValueError(f"{what} lacks columns {missing} (has {list(df.columns)}); pass the table "
                     "written by heads-jax ablate")


def figure_html(path, title: str, caption: str = "", how: str = "") -> str:
  """``<figure>`` with the PNG embedded, a bold title, caption and "how to read this"."""
  how_html = f'<span class="how"><b>How to read this:</b> {esc(how)}</span>' if how else ""
  return (f'<figure id="fig-{esc(slug(title))}"><img alt="{esc(title)}" src="{png_data_uri(path)}">'
          f"<figcaption><b>{esc(title)}.</b> {esc(caption)}{how_html}</figcaption></figure>")


def _metric_columns(df: pd.DataFrame, metrics) -> list[str]:
  return [m for m in metrics if m in df.columns and df[m].notna().any()]


def _heatmap(ax, values, *, cmap="viridis", fmt="{:.2f}", vmin=None, vmax=None, label=""):
  values = np.asarray(values, float)
  im = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
  L, H = values.shape
  ax.set_xticks(np.arange(H))
  ax.set_yticks(np.arange(L))
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  if L * H <= 400:
    lo, hi = np.nanmin(values), np.nanmax(values)
    mid = (lo + hi) / 2
    for i in range(L):
      for j in range(H):
        v = values[i, j]
        if np.isfinite(v):
          ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=6.5,
                  color="white" if (cmap == "viridis" and v < mid) else "black")
  cb = ax.figure.colorbar(im, ax=ax, shrink=0.85)
  cb.set_label(label)
  return im


# ---------------------------------------------------------------------------------------------
# group and segment ablation


def plot_group_ablation(table: pd.DataFrame, path, *, metric: str = "accuracy",
                        title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Horizontal bars: change of ``metric`` when each group is ablated, with the mean change
  (and standard deviation) over random groups of the same size as a black marker."""
  _require(table, ("group", "kind", "num_heads", "ablation", f"{metric}_change"), "ablation table")
  df = table[table["kind"] != "baseline"].reset_index(drop=True)
  fig = _figure(7.5, 0.42 * max(len(df), 2) + 1.6)
  ax = fig.add_subplot()
  if len(df) == 0:
    ax.text(0.5, 0.5, "no groups", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, path, dpi)
  labels = [f"{g} ({n} heads)" + (f", {a}" if a not in ("remove",) else "")
            for g, n, a in zip(df["group"], df["num_heads"], df["ablation"])]
  y = np.arange(len(df))[::-1]
  colors = style.cluster_colors(df["group"].astype(str))
  bar_colors = [colors.get(str(g), "#888888") if k == "cluster" else "#6a8caf"
                for g, k in zip(df["group"], df["kind"])]
  ax.barh(y, 100 * df[f"{metric}_change"].to_numpy(float), color=bar_colors, height=0.6,
          label="group ablated")
  if f"random_{metric}_change" in df.columns:
    r = 100 * df[f"random_{metric}_change"].to_numpy(float)
    e = 100 * df.get(f"random_{metric}_std", pd.Series(np.zeros(len(df)))).to_numpy(float)
    ok = np.isfinite(r)
    ax.errorbar(r[ok], y[ok], xerr=np.nan_to_num(e[ok]), fmt="D", color="black", markersize=5,
                capsize=3, label="random heads, same number (mean ± sd)")
  ax.axvline(0, color="#444444", linewidth=0.8)
  ax.set_yticks(y, labels, fontsize=9)
  ax.set_xlabel(f"change of {metric} (percentage points) vs the unablated model")
  ax.grid(True, axis="x", alpha=0.3)
  ax.legend(fontsize=8, loc="best")
  ax.set_title(title or f"Ablation by head group: change of {metric}")
  return _save(fig, path, dpi)


def ablation_section(table: pd.DataFrame, figure_path, *, metric: str = "accuracy",
                     title: str = "Ablation by head group", note: str = "") -> dict:
  """The group-ablation table in the paper's form (group, heads, metric, change) plus the
  random-group baseline and the figure."""
  metrics = _metric_columns(table, ("accuracy", "f1"))
  cols = ["group", "kind", "num_heads", "ablation"]
  for m in metrics:
    cols += [m, f"{m}_change"]
    cols += [c for c in (f"random_{m}_change", f"random_{m}_std") if c in table.columns]
  shown = table[[c for c in cols if c in table.columns]]
  text = ("<p>Metric of the fine-tuned classifier on its evaluation set with each group of heads "
          "ablated, and the change against the unablated model (first row). For fairness, "
          "<i>random_*</i> is the mean change (and standard deviation) when the same number of "
          "heads, drawn at random from all heads, is ablated the same way.</p>")
  if note:
    text += f'<p class="note">{esc(note)}</p>'
  html = (text + table_html(shown, table_id=f"table-{slug(title)}", float_format="{:.4f}")
          + figure_html(figure_path, title,
                        f"Change of {metric} per ablated group (bars) and for random groups of the "
                        "same size (black markers).",
                        "Bars left of 0: the model got worse without the group; a bar far beyond "
                        "its black marker means the group matters more than as many random heads."))
  return {"title": title, "html": html}


def plot_segment_ablation(table: pd.DataFrame, path, *, metric: str = "accuracy",
                          title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Grouped bars: change of ``metric`` when the intra- or inter-sentence attention of each
  group is removed, with the random-group means as markers."""
  _require(table, ("group", "ablation", f"{metric}_change"), "segment ablation table")
  df = table[table["kind"] != "baseline"]
  groups = list(dict.fromkeys(df["group"].astype(str)))
  parts = [p for p in ("intra", "inter") if p in set(df["ablation"])]
  fig = _figure(max(6.0, 1.3 * len(groups) + 2.5), 4.4)
  ax = fig.add_subplot()
  width = 0.8 / max(len(parts), 1)
  colors = {"intra": "#d95f02", "inter": "#7570b3"}
  for i, part in enumerate(parts):
    sub = df[df["ablation"] == part].set_index(df[df["ablation"] == part]["group"].astype(str))
    x = np.arange(len(groups)) + (i - (len(parts) - 1) / 2) * width
    vals = 100 * sub.reindex(groups)[f"{metric}_change"].to_numpy(float)
    ax.bar(x, vals, width=width * 0.95, color=colors[part], label=f"{part}-sentence removed")
    if f"random_{metric}_change" in sub.columns:
      r = 100 * sub.reindex(groups)[f"random_{metric}_change"].to_numpy(float)
      ax.plot(x, r, "D", color="black", markersize=4,
              label="random heads, same number" if i == 0 else None)
  ax.axhline(0, color="#444444", linewidth=0.8)
  ax.set_xticks(np.arange(len(groups)), groups, rotation=20)
  ax.set_ylabel(f"change of {metric} (percentage points)")
  ax.grid(True, axis="y", alpha=0.3)
  ax.legend(fontsize=8)
  ax.set_title(title or "Removing intra- / inter-sentence attention")
  return _save(fig, path, dpi)


def segment_section(table: pd.DataFrame, figure_path, *, metric: str = "accuracy",
                    title: str = "Intra- and inter-sentence attention removed") -> dict:
  renorm = bool(table.get("renormalised", pd.Series([False])).astype(bool).any())
  metrics = _metric_columns(table, ("accuracy", "f1"))
  cols = ["group", "kind", "num_heads", "ablation"]
  for m in metrics:
    cols += [m, f"{m}_change"] + [c for c in (f"random_{m}_change",) if c in table.columns]
  how = ("rows renormalised: each query's remaining attention was rescaled to sum to 1"
         if renorm else "rows NOT renormalised, as Guan et al.: the removed attention mass is "
                        "simply dropped, so the head's output shrinks")
  html = (f"<p>For each group, the attention between tokens of the same sentence (intra; query and "
          f"key have the same token type, [CLS] and the first [SEP] count as sentence A) or of "
          f"different sentences (inter) is set to zero in those heads (Guan et al. 2020, Table 3); "
          f"{esc(how)}. On single-sentence tasks all attention is intra-sentence.</p>"
          + table_html(table[[c for c in cols if c in table.columns]],
                       table_id=f"table-{slug(title)}", float_format="{:.4f}")
          + figure_html(figure_path, title, f"Change of {metric} when the intra- or inter-sentence "
                        "attention of each group is removed.",
                        "Bars below 0: the model needs that kind of attention in those heads."))
  return {"title": title, "html": html}


# ---------------------------------------------------------------------------------------------
# importance and pruning


def importance_table(importance, raw=None) -> pd.DataFrame:
  """Long table: layer, head, importance (and importance_raw)."""
  imp = np.asarray(importance, float)
  l, h = np.meshgrid(np.arange(imp.shape[0]), np.arange(imp.shape[1]), indexing="ij")
  df = pd.DataFrame({"layer": l.ravel(), "head": h.ravel(), "importance": imp.ravel()})
  if raw is not None:
    df["importance_raw"] = np.asarray(raw, float).ravel()
  df["rank"] = df["importance"].rank(ascending=False, method="first").astype(int)
  return df


def plot_importance(importance, path, *, title: str | None = None, label: str = "importance",
                    dpi: int = DEFAULT_DPI) -> Path:
  """Heatmap ``[l, h]`` of head importance."""
  imp = np.asarray(importance, float)
  if imp.ndim != 2:
    raise ValueError(f"importance must be [layers, heads], got shape {imp.shape}")
  fig = _figure(max(5.0, 0.55 * imp.shape[1] + 2.2), max(3.0, 0.42 * imp.shape[0] + 1.4))
  ax = fig.add_subplot()
  _heatmap(ax, imp, cmap="viridis", fmt="{:.2f}", label=label)
  ax.set_title(title or "Head importance (Michel et al. 2019)")
  return _save(fig, path, dpi)


def plot_pruning_curve(curve: pd.DataFrame, path, *, metric: str = "accuracy",
                       title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Metric vs share of heads pruned: importance order (line) and random order (mean of the
  seeds, with a ±1 standard deviation band)."""
  _require(curve, ("method", "share_pruned", metric), "pruning table")
  fig = _figure(6.8, 4.4)
  ax = fig.add_subplot()
  imp = curve[curve["method"] == "importance"].sort_values("share_pruned")
  if len(imp):
    ax.plot(100 * imp["share_pruned"], imp[metric], "o-", color="#1b7837",
            label="by importance (least important first)")
  rnd = curve[curve["method"] == "random"]
  if len(rnd):
    g = rnd.groupby("share_pruned")[metric]
    x, mean, sd = 100 * g.mean().index.to_numpy(), g.mean().to_numpy(), g.std(ddof=0).to_numpy()
    n = rnd["seed"].nunique()
    ax.plot(x, mean, "s--", color="#b2182b", label=f"random order (mean of {n} seeds)")
    ax.fill_between(x, mean - sd, mean + sd, color="#b2182b", alpha=0.15)
  base = curve[curve["share_pruned"] == 0][metric]
  if len(base):
    ax.axhline(float(base.iloc[0]), color="#777777", linewidth=0.8, linestyle=":",
               label="unablated")
  ax.set_xlabel("heads pruned (%)")
  ax.set_ylabel(metric)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8, loc="lower left")
  ax.set_title(title or f"Pruning heads: {metric} vs share pruned")
  return _save(fig, path, dpi)


def importance_section(importance, figure_path, *, raw=None, settings: dict | None = None,
                       title: str = "Head importance") -> dict:
  table = importance_table(importance, raw)
  top = table.sort_values("rank").head(10)
  low = table.sort_values("rank").tail(10)
  html = ("<p>Head importance of Michel et al. (2019): the expected absolute gradient of the "
          "loss with respect to each head's gate, at all gates 1.</p>"
          + (kv_table_html(list(settings.items()), table_id="table-importance-settings")
             if settings else "")
          + figure_html(figure_path, title, "Importance of every head (rows: layers, columns: "
                        "heads).", "Bright heads change the loss most when scaled down; dark "
                        "heads can be pruned first.")
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
          + figure_html(figure_path, title, f"{metric} of the classifier vs the share of heads "
                        "pruned.", "The longer the green line stays flat above the red one, the "
                        "more heads can go without loss, and the better importance picks them.")
          + table_html(summary, table_id="table-pruning", float_format="{:.4f}"))
  return {"title": title, "html": html}


# ---------------------------------------------------------------------------------------------
# measures (Clark et al. 2019) and similarity (Kovaleva et al. 2019)


def _per_layer_scatter(ax, values, *, ylabel: str, reference=None, color="#2c7fb8"):
  """Scatter of each head's value by layer (jittered), the layer mean as a line."""
  values = np.asarray(values, float)
  L, H = values.shape
  rng = np.random.default_rng(0)
  for l in range(L):
    ax.scatter(l + rng.uniform(-0.18, 0.18, H), values[l], s=14, color=color, alpha=0.7,
               edgecolor="none")
  ax.plot(np.arange(L), np.nanmean(values, axis=1), "-", color="black", linewidth=1, label="layer mean")
  if reference is not None:
    ax.axhline(reference, color="#b2182b", linestyle=":", linewidth=1, label="uniform attention")
  ax.set_xticks(np.arange(L))
  ax.set_xlabel("layer")
  ax.set_ylabel(ylabel)
  ax.grid(True, alpha=0.3)


def plot_token_attention(token_attention, path, *, names=tuple(TOKEN_MEASURE_LABELS),
                         title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """One panel per measure (``[CLS]``, ``[SEP]``, punctuation, previous, next token): the mean
  attention of each head by layer (Clark et al. 2019, Figs. 1-2). ``token_attention``:
  ``[l, h, 5]`` (already averaged over sequences)."""
  ta = np.asarray(token_attention, float)
  if ta.ndim != 3 or ta.shape[-1] != len(names):
    raise ValueError(f"token_attention must be [layers, heads, {len(names)}], got {ta.shape}")
  fig = _figure(3.1 * len(names), 3.4)
  axes = fig.subplots(1, len(names), sharey=True)
  for i, (ax, name) in enumerate(zip(np.atleast_1d(axes), names)):
    _per_layer_scatter(ax, ta[..., i], ylabel="mean attention" if i == 0 else "")
    ax.set_title(TOKEN_MEASURE_LABELS.get(name, name), fontsize=10)
  fig.suptitle(title or "Where heads attend (Clark et al. 2019)")
  return _save(fig, path, dpi)


def plot_entropy(entropy, cls_entropy, path, *, mean_length: float | None = None,
                 title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Per-layer scatter of each head's mean attention entropy and of its ``[CLS]`` row's entropy
  (Clark et al. 2019, Fig. 4); the entropy of uniform attention over the mean length is marked."""
  fig = _figure(9.0, 3.6)
  a, b = fig.subplots(1, 2, sharey=True)
  ref = None if not mean_length else float(np.log(mean_length))
  _per_layer_scatter(a, entropy, ylabel="entropy (nats)", reference=ref)
  a.set_title("mean over all queries", fontsize=10)
  _per_layer_scatter(b, cls_entropy, ylabel="", reference=ref, color="#d95f02")
  b.set_title("[CLS] query", fontsize=10)
  a.legend(fontsize=8, loc="best")
  fig.suptitle(title or "Attention entropy per head")
  return _save(fig, path, dpi)


def mds_embedding(distances, seed: int = 0) -> np.ndarray:
  """2-D metric MDS of a precomputed, symmetric distance matrix ``[n, n]`` -> ``[n, 2]``."""
  from sklearn.manifold import MDS
  d = np.asarray(distances, np.float64)
  if d.ndim != 2 or d.shape[0] != d.shape[1]:
    raise ValueError(f"distances must be a square matrix, got shape {d.shape}")
  d = (d + d.T) / 2
  np.fill_diagonal(d, 0.0)
  params = inspect.signature(MDS).parameters
  kw = {"n_components": 2, "random_state": seed, "n_init": 4}
  if "metric_mds" in params:            # scikit-learn >= 1.8
    kw.update(metric="precomputed", metric_mds=True)
  else:
    kw.update(dissimilarity="precomputed")
  if "init" in params and "n_init" in params:
    kw["init"] = "random"
  if "normalized_stress" in params:
    kw["normalized_stress"] = "auto"
  return MDS(**kw).fit_transform(d)


def plot_js_mds(js, num_layers: int, num_heads: int, path, *, seed: int = 0,
                title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """2-D MDS of the heads from their mean Jensen-Shannon distances, coloured by layer and
  labelled ``layer-head`` (Clark et al. 2019, Fig. 6)."""
  js = np.asarray(js, float)
  if js.shape != (num_layers * num_heads,) * 2:
    raise ValueError(f"js must be [{num_layers * num_heads}, {num_layers * num_heads}], got {js.shape}")
  xy = mds_embedding(js, seed)
  fig = _figure(7.2, 6.0)
  ax = fig.add_subplot()
  layers = np.repeat(np.arange(num_layers), num_heads)
  sc = ax.scatter(xy[:, 0], xy[:, 1], c=layers, cmap="viridis", s=46, edgecolor="white",
                  linewidths=0.4)
  if num_layers * num_heads <= 200:
    for i, (x, y) in enumerate(xy):
      ax.text(x, y, f"{i // num_heads}-{i % num_heads}", fontsize=5.5, ha="center",
              va="bottom", color="#333333")
  cb = fig.colorbar(sc, ax=ax)
  cb.set_label("layer")
  ax.set_xticks([])
  ax.set_yticks([])
  ax.set_title(title or "Heads embedded by Jensen-Shannon distance (MDS)")
  return _save(fig, path, dpi)


def plot_similarity(similarity, path, *, title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Heatmap ``[l, h]`` of the cosine similarity of each head's attention before and after
  fine-tuning (Kovaleva et al. 2019, Fig. 5)."""
  sim = np.asarray(similarity, float)
  fig = _figure(max(5.0, 0.55 * sim.shape[1] + 2.2), max(3.0, 0.42 * sim.shape[0] + 1.4))
  ax = fig.add_subplot()
  _heatmap(ax, sim, cmap="magma", fmt="{:.2f}", vmin=min(0.0, float(np.nanmin(sim))), vmax=1.0,
           label="cosine similarity")
  ax.set_title(title or "Attention before vs after fine-tuning (cosine)")
  return _save(fig, path, dpi)


def similarity_section(similarity, figure_path, *, num_sequences: int | None = None,
                       data: str | None = None,
                       title: str = "Attention similarity before and after fine-tuning") -> dict:
  sim = np.asarray(similarity, float)
  per_layer = pd.DataFrame({"layer": np.arange(sim.shape[0]), "mean cosine": sim.mean(1),
                            "min cosine": sim.min(1), "max cosine": sim.max(1)})
  l, h = np.unravel_index(np.argsort(sim, axis=None)[:10], sim.shape)
  changed = pd.DataFrame({"layer": l, "head": h, "cosine": sim[l, h]})
  src = f" on {esc(data)}" if data else ""
  n = f" ({num_sequences} sequences)" if num_sequences else ""
  html = (f"<p>Cosine similarity of each head's attention map (the real query x key block, "
          f"flattened) under the model before and after fine-tuning, on the same inputs{src}{n}, "
          f"averaged over the sequences (Kovaleva et al. 2019).</p>"
          + figure_html(figure_path, title, "Per-head cosine similarity (rows: layers, columns: "
                        "heads).", "1 = fine-tuning left the head's attention as it was; lower "
                        "values mark the heads fine-tuning changed most (usually the last layers).")
          + "<h3>Per layer</h3>" + table_html(per_layer, table_id="table-similarity-layers",
                                              float_format="{:.3f}")
          + "<h3>Most changed heads</h3>" + table_html(changed, table_id="table-similarity-heads",
                                                       float_format="{:.3f}"))
  return {"title": title, "html": html}


def measures_sections(measures: dict | str | Path, fig_dir, *, num_layers: int | None = None,
                      num_heads: int | None = None, dpi: int = DEFAULT_DPI) -> list[dict]:
  """Report sections of the measures: attention entropy, attention to special tokens and
  neighbours, and (when present) the MDS picture of the Jensen-Shannon distances."""
  m = contract.read_measures(measures) if not isinstance(measures, dict) else measures
  fig_dir = Path(fig_dir)
  entropy = np.nanmean(np.asarray(m["entropy"], float), axis=0)            # [l, h]
  cls_ent = np.nanmean(np.asarray(m["cls_entropy"], float), axis=0)
  token = np.nanmean(np.asarray(m["token_attention"], float), axis=0)      # [l, h, 5]
  L, H = entropy.shape
  names = tuple(m.get("token_measures", TOKEN_MEASURE_LABELS))
  mean_len = float(np.mean(m["lengths"])) if "lengths" in m and len(m["lengths"]) else None
  sections = []
  p_ent = plot_entropy(entropy, cls_ent, fig_dir / "measures_entropy.png", mean_length=mean_len,
                       dpi=dpi)
  per_layer = pd.DataFrame({"layer": np.arange(L), "entropy (mean over heads)": entropy.mean(1),
                            "[CLS] entropy": cls_ent.mean(1)})
  for i, n in enumerate(names):
    per_layer[f"to {TOKEN_MEASURE_LABELS.get(n, n)}"] = token[..., i].mean(1)
  sections.append({"title": "Attention entropy (Clark et al. 2019)", "html": (
      "<p>The entropy (natural log) of each head's attention rows over the real tokens, averaged "
      "over the queries and the sequences; and the entropy of the [CLS] query's row alone. Low "
      "entropy: focused attention; the dotted line is uniform attention over a sequence of mean "
      "length.</p>"
      + figure_html(p_ent, "Attention entropy per head", "Each dot is one head; the line is "
                    "the layer mean.", "Heads near the dotted line attend broadly (a bag of "
                    "words); heads near 0 attend to one token.")
      + table_html(per_layer, table_id="table-measures-layers", float_format="{:.3f}"))})
  p_tok = plot_token_attention(token, fig_dir / "measures_tokens.png", names=names, dpi=dpi)
  sections.append({"title": "Attention to special tokens and neighbours", "html": (
      "<p>Mean attention mass each head puts on [CLS], on [SEP], on commas and periods, and on "
      "the previous and the next token (Clark et al. 2019, Figs. 1-2), averaged over the real "
      "queries (for previous / next: those that have one) and the sequences.</p>"
      + figure_html(p_tok, "Where heads attend", "One panel per target; each dot is one head.",
                    "Middle layers attending heavily to [SEP] is the 'no-op' pattern Clark et al. "
                    "describe; heads near 1 on previous / next are positional heads."))})
  if "js" in m and np.asarray(m["js"]).size:
    js = np.asarray(m["js"], float)
    p_mds = plot_js_mds(js, num_layers or L, num_heads or H, fig_dir / "measures_js_mds.png",
                        dpi=dpi)
    sections.append({"title": "Heads by Jensen-Shannon distance", "html": (
        "<p>The mean Jensen-Shannon distance between the attention rows of every pair of heads "
        "(averaged over the real queries and the sequences), embedded in two dimensions by "
        "multidimensional scaling (Clark et al. 2019, Fig. 6).</p>"
        + figure_html(p_mds, "Heads embedded by Jensen-Shannon distance", "Each dot is one "
                      "head, coloured by layer and labelled layer-head.",
                      "Heads close together attend alike; Clark et al. find heads of the same "
                      "layer tend to cluster."))})
  return sections


# ---------------------------------------------------------------------------------------------
# a small self-contained page


def write_page(out_dir, *, title: str, sections: list[dict], settings: dict | None = None,
               subtitle: str = "", filename: str = "report.html") -> Path:
  """Writes a self-contained HTML page (the analysis report's CSS, embedded figures) with a
  settings table and ``sections`` (dicts with ``title`` and trusted ``html``)."""
  all_sections = []
  if settings:
    all_sections.append({"title": "Settings", "html": kv_table_html(
        [(k, v) for k, v in settings.items()], table_id="table-settings")})
  all_sections += list(sections)
  ids, seen = [], set()
  for s in all_sections:
    sid = slug(s["title"])
    while sid in seen:
      sid += "-x"
    seen.add(sid)
    ids.append(sid)
  toc = "".join(f'<li><a href="#{esc(i)}">{esc(s["title"])}</a></li>'
                for i, s in zip(ids, all_sections))
  body = "".join(f'<section id="{esc(i)}"><h2>{esc(s["title"])}</h2>{s["html"]}</section>'
                 for i, s in zip(ids, all_sections))
  stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
  text = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
          f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
          f"<h1>{esc(title)}</h1><p class=\"meta\">{esc(subtitle)}</p>"
          f'<nav class="toc"><b>Contents</b><ol>{toc}</ol></nav>{body}'
          f"<footer>Written by heads_jax.report on {esc(stamp)}. A single self-contained file: "
          "figures are embedded, nothing is loaded from elsewhere.</footer>"
          "</main></body></html>\n")
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  path = out / filename
  path.write_text(text, encoding="utf-8")
  return path


def analysis_extra_sections(out_dir, *, dpi: int = DEFAULT_DPI) -> list[dict]:
  """The measures sections for an analysis report: ``[]`` when ``out_dir`` holds no
  ``measures.npz``; figures go to ``out_dir/figures``. For
  ``heads_jax.report.html.write_report(..., extra_sections=...)``."""
  out_dir = Path(out_dir)
  if not (out_dir / contract.MEASURES_FILE).is_file():
    return []
  return measures_sections(out_dir / contract.MEASURES_FILE, out_dir / "figures", dpi=dpi)
