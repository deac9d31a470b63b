"""Figures of Guan et al. 2020 ("How far does BERT look at"): Figs. 1-3 and 5, and the ablations of
Tables 2-3.

* Fig. 1: `plot_cluster_features` (box plots of the distance features of each attention type).
* Fig. 2: `plot_cluster_tsne` (heads by t-SNE of their 21 distance features, by cluster).
* Fig. 3: `plot_cluster_layers` (attention types per layer).
* `plot_type_masses`: the near / far / special masses each type's definition reads, with the
  name's margin (the check of the names).
* `plot_cluster_changes`: attention type before and after fine-tuning.
* Fig. 5: `plot_all_maps` (every head's map of one input, framed by type; from examples.json).
* Table 2: `plot_group_ablation` (a head group removed or given uniform attention); Table 3:
  `plot_segment_ablation` (intra- / inter-sentence attention removed); each against random
  groups of the same layers.

Inputs: ``clusters.csv`` (hoststats.clustering) and the ablation's CSV tables.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import patches as mpatches
from matplotlib.ticker import MaxNLocator

from heads_jax.data import vocabulary
from heads_jax.report import style
from heads_jax.report.figures.common import DEFAULT_DPI, new_figure, save_figure
from heads_jax.report.spec import Registry
from heads_jax.report.tables import require_columns

# The registry of this paper's figures (`heads_jax.report.spec`); registered at the end.
FIGURES = Registry("Guan et al. 2020")



FEATURE_LABELS = tuple(f"w{i}" for i in range(16)) + ("self", "[CLS]", "[SEP]", "comma", "period")


# ---------------------------------------------------------------------------------------------
# Figs. 1-3: clusters


def _check_clusters(clusters_df, extra=()):
  require_columns(clusters_df, ("layer", "head", "cluster_name") + tuple(extra),
                   "clusters table (clusters.csv)")
  if len(clusters_df) == 0:
    raise ValueError("the clusters table is empty: there are no heads to draw")


def plot_cluster_tsne(clusters_df: pd.DataFrame, path, *, label_layers: bool = True,
                      title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Scatter of the heads' t-SNE coordinates, coloured by cluster name, labelled by layer."""
  _check_clusters(clusters_df, ("tsne_x", "tsne_y"))
  xy = clusters_df[["tsne_x", "tsne_y"]].astype(float).to_numpy()
  if not np.isfinite(xy).all():
    raise ValueError("clusters.csv has missing t-SNE coordinates (tsne_x / tsne_y); re-run the "
                     "clustering with t-SNE enabled or leave this figure out")
  names = clusters_df["cluster_name"].astype(str).to_numpy()
  palette = style.cluster_colors(names)
  fig = new_figure(7.2, 6.0)
  ax = fig.add_subplot()
  for name, color in palette.items():
    sel = names == name
    ax.scatter(xy[sel, 0], xy[sel, 1], s=60, color=color, alpha=0.75, edgecolor="white",
               linewidths=0.5, label=f"{name} ({int(sel.sum())} heads)")
  if label_layers:
    for (x, y), layer in zip(xy, clusters_df["layer"].astype(int)):
      ax.text(x, y, str(layer), fontsize=5.5, ha="center", va="center", color="black")
  ax.set_xlabel("t-SNE dimension 1")
  ax.set_ylabel("t-SNE dimension 2")
  ax.set_xticks([])
  ax.set_yticks([])
  ax.legend(title="attention type (cluster)", fontsize=9, title_fontsize=9, loc="best")
  ax.set_title(title or FIGURES["cluster_tsne"].title)
  return save_figure(fig, path, dpi)


def plot_cluster_layers(clusters_df: pd.DataFrame, path, *, title: str | None = None,
                        dpi: int = DEFAULT_DPI) -> Path:
  """Stacked bars: number of heads of each cluster type per layer."""
  _check_clusters(clusters_df)
  layers = clusters_df["layer"].astype(int)
  names = clusters_df["cluster_name"].astype(str)
  palette = style.cluster_colors(names)
  all_layers = np.arange(layers.max() + 1)
  table = pd.crosstab(layers, names).reindex(index=all_layers, columns=list(palette), fill_value=0)
  fig = new_figure(max(6.5, 0.45 * len(all_layers) + 2.5), 4.4)
  ax = fig.add_subplot()
  bottom = np.zeros(len(all_layers))
  for name, color in palette.items():
    values = table[name].to_numpy()
    ax.bar(all_layers, values, bottom=bottom, color=color, label=name, width=0.8,
           edgecolor="white", linewidth=0.5)
    bottom += values
  ax.set_xticks(all_layers)
  ax.yaxis.set_major_locator(MaxNLocator(integer=True))   # counts of heads: whole numbers
  ax.set_xlabel("layer")
  ax.set_ylabel("number of heads")
  ax.legend(title="attention type", fontsize=9, title_fontsize=9, loc="upper left",
            bbox_to_anchor=(1.01, 1.0))
  ax.set_title(title or FIGURES["cluster_layers"].title)
  return save_figure(fig, path, dpi)


def plot_cluster_features(clusters_df: pd.DataFrame, path, *,
                          features=vocabulary.DISTANCE_FEATURES, title: str | None = None,
                          dpi: int = DEFAULT_DPI) -> Path:
  """One panel per cluster with box plots of the 21 distance features of its heads."""
  _check_clusters(clusters_df, tuple(features))
  names = clusters_df["cluster_name"].astype(str).to_numpy()
  palette = style.cluster_colors(names)
  labels = list(FEATURE_LABELS) if tuple(features) == vocabulary.DISTANCE_FEATURES else list(features)
  values = clusters_df[list(features)].astype(float).to_numpy()  # [heads, d]
  top = min(1.02, float(np.nanmax(values)) * 1.08 + 0.02) if np.isfinite(values).any() else 1.02
  ncols = 2 if len(palette) > 1 else 1
  nrows = int(np.ceil(len(palette) / ncols))
  fig = new_figure(6.2 * ncols, 3.0 * nrows + 0.6)
  axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
  for ax, (name, color) in zip(axes.ravel(), palette.items()):
    sel = values[names == name]
    box = ax.boxplot([sel[:, d] for d in range(sel.shape[1])], patch_artist=True, widths=0.6,
                     showfliers=True, flierprops={"markersize": 2, "alpha": 0.5})
    for patch in box["boxes"]:
      patch.set_facecolor(color)
      patch.set_alpha(0.6)
    for median in box["medians"]:
      median.set_color("black")
    ax.set_xticks(np.arange(1, len(labels) + 1), labels, rotation=90, fontsize=7)
    ax.set_title(f"{name} ({sel.shape[0]} heads)", fontsize=10, color=color, fontweight="bold")
    ax.set_ylim(-0.02, top)
    ax.grid(True, axis="y", alpha=0.3)
  for ax in axes.ravel()[len(palette):]:
    ax.set_visible(False)
  for ax in axes[:, 0]:
    ax.set_ylabel("attention mass")
  for ax in axes[-1, :]:
    ax.set_xlabel("distance window (w0 = nearest) or token kind")
  fig.suptitle(title or FIGURES["cluster_features"].title)
  return save_figure(fig, path, dpi)


def plot_type_masses(clusters_df: pd.DataFrame, path, *, info: dict | None = None,
                     title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """The three masses Guan et al.'s type definitions read, per named type (the check of the
  names, beside Fig. 1): for each cluster, box plots of its heads' near (self and the nearest
  windows), far (the other windows) and special ([CLS], [SEP], comma, period) attention mass;
  the panel title gives the name's margin and its flag from ``info`` (clusters.json:
  ``naming``; the masses ``head_masses``, as the names read them at the data's lengths, or
  for an older file from the mean features with ``near_windows``).
  """
  from heads_jax.hoststats import clustering
  _check_clusters(clusters_df, tuple(vocabulary.DISTANCE_FEATURES))
  info = info or {}
  near_windows = int(info.get("near_windows", 2))
  names = clusters_df["cluster_name"].astype(str).to_numpy()
  palette = style.cluster_colors(names)
  masses = np.asarray(info.get("head_masses") or [], np.float64)
  if masses.shape != (len(clusters_df), 3):   # an older clusters.json: fixed near windows
    masses = clustering.type_masses(
        clusters_df[list(vocabulary.DISTANCE_FEATURES)].astype(float).to_numpy(), near_windows)
  margins = {}
  for name, row in zip(info.get("names") or [], info.get("naming") or []):
    if len(row) >= 5:
      margins[name] = (float(row[3]), str(row[4]))
  fig = new_figure(2.6 * len(palette) + 0.8, 3.6)
  axes = fig.subplots(1, len(palette), squeeze=False, sharey=True)[0]
  for ax, (name, color) in zip(axes, palette.items()):
    sel = masses[names == name]
    box = ax.boxplot([sel[:, j] for j in range(3)], patch_artist=True, widths=0.6,
                     flierprops={"markersize": 2, "alpha": 0.5})
    for patch in box["boxes"]:
      patch.set_facecolor(color)
      patch.set_alpha(0.6)
    for median in box["medians"]:
      median.set_color("black")
    ax.set_xticks([1, 2, 3], list(clustering.MASSES))
    head = f"{name} ({sel.shape[0]} heads)"
    if name in margins:
      m, flag = margins[name]
      head += f"\nmargin {m:+.3f}" + ("" if flag == "ok" else f" ({flag.split(':')[0]})")
    ax.set_title(head, fontsize=9, color=color, fontweight="bold")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, axis="y", alpha=0.3)
  axes[0].set_ylabel("attention mass")
  fig.suptitle(title or "Near, far and special attention mass per named type")
  return save_figure(fig, path, dpi)


def plot_cluster_changes(changes_df: pd.DataFrame, path, *, title: str | None = None,
                         dpi: int = DEFAULT_DPI) -> Path:
  """Matrix of head counts per (cluster before, cluster after fine-tuning).

  Args:
    changes_df: one row per head with columns cluster_before, cluster_after (names or ids).
  """
  require_columns(changes_df, ("cluster_before", "cluster_after"), "cluster change table")
  before = changes_df["cluster_before"].astype(str)
  after = changes_df["cluster_after"].astype(str)
  names = style.cluster_order(list(before) + list(after))
  table = pd.crosstab(before, after).reindex(index=names, columns=names, fill_value=0)
  fig = new_figure(1.6 + 1.1 * len(names), 1.4 + 0.9 * len(names))
  ax = fig.add_subplot()
  image = ax.imshow(table.to_numpy(), cmap="Blues", vmin=0)
  top = table.to_numpy().max() if table.size else 0
  for i in range(len(names)):
    for j in range(len(names)):
      v = int(table.iat[i, j])
      ax.text(j, i, str(v), ha="center", va="center", fontsize=10,
              color="white" if v > top * 0.6 else "black")
  ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
  ax.set_yticks(range(len(names)), names)
  ax.set_xlabel("type after fine-tuning")
  ax.set_ylabel("type before fine-tuning")
  changed = int((before.to_numpy() != after.to_numpy()).sum())
  fig.colorbar(image, ax=ax, shrink=0.8, label="heads")
  ax.set_title(f"{title or FIGURES['cluster_changes'].title}\n"
               f"{changed} of {len(before)} heads changed type", fontsize=11)
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# Table 2: ablation by head group; Table 3: by segment (intra- / inter-sentence attention)


def plot_group_ablation(table: pd.DataFrame, path, *, metric: str = "accuracy",
                        title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Horizontal bars: change of ``metric`` when each group is ablated, with the mean change
  (and standard deviation) over random groups of the group's size and layers (as many heads in
  each layer) as a black marker."""
  require_columns(table, ("group", "kind", "num_heads", "ablation", f"{metric}_change"),
                  "ablation table")
  df = table[table["kind"] != "baseline"].reset_index(drop=True)
  fig = new_figure(7.5, 0.42 * max(len(df), 2) + 1.6)
  ax = fig.add_subplot()
  if len(df) == 0:
    ax.text(0.5, 0.5, "no groups", ha="center", va="center", transform=ax.transAxes)
    return save_figure(fig, path, dpi)
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
                capsize=3, label="random heads of the same layers (mean ± sd)")
  ax.axvline(0, color="#444444", linewidth=0.8)
  ax.set_yticks(y, labels, fontsize=9)
  ax.set_xlabel(f"change of {metric} (percentage points) vs the unablated model")
  ax.grid(True, axis="x", alpha=0.3)
  ax.legend(fontsize=8, loc="best")
  ax.set_title(title or f"Ablation by head group: change of {metric}")
  return save_figure(fig, path, dpi)


def plot_segment_ablation(table: pd.DataFrame, path, *, metric: str = "accuracy",
                          title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Grouped bars: change of ``metric`` when the intra- or inter-sentence attention of each
  group is removed, with the means over random groups of the same layers as markers."""
  require_columns(table, ("group", "ablation", f"{metric}_change"), "segment ablation table")
  df = table[table["kind"] != "baseline"]
  groups = list(dict.fromkeys(df["group"].astype(str)))
  parts = [p for p in ("intra", "inter") if p in set(df["ablation"])]
  fig = new_figure(max(6.0, 1.3 * len(groups) + 2.5), 4.4)
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
              label="random heads of the same layers" if i == 0 else None)
  ax.axhline(0, color="#444444", linewidth=0.8)
  ax.set_xticks(np.arange(len(groups)), groups, rotation=20)
  ax.set_ylabel(f"change of {metric} (percentage points)")
  ax.grid(True, axis="y", alpha=0.3)
  ax.legend(fontsize=8)
  ax.set_title(title or "Removing intra- / inter-sentence attention")
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# the registry: how each report draws these figures from its inputs (`heads_jax.report.spec`)


def _clusters(i):
  return i.clusters_df if i.clusters_df is not None and len(i.clusters_df) else None


def _draw_cluster_tsne(i, path, *, title, dpi):
  df = _clusters(i)
  if df is None or not {"tsne_x", "tsne_y"} <= set(df.columns) or not np.isfinite(
      df[["tsne_x", "tsne_y"]].astype(float).to_numpy()).all():
    return None
  return plot_cluster_tsne(df, path, title=title, dpi=dpi)


def _draw_cluster_layers(i, path, *, title, dpi):
  df = _clusters(i)
  return None if df is None else plot_cluster_layers(df, path, title=title, dpi=dpi)


def _draw_cluster_features(i, path, *, title, dpi):
  df = _clusters(i)
  if df is None or not set(vocabulary.DISTANCE_FEATURES) <= set(df.columns):
    return None
  return plot_cluster_features(df, path, title=title, dpi=dpi)


def _draw_cluster_changes(i, path, *, title, dpi):
  df = i.cluster_changes_df
  if df is None or not len(df):
    return None
  return plot_cluster_changes(df, path, title=title, dpi=dpi)


def _draw_group_ablation(i, path, *, title, dpi):
  # the drawn title names the metric (the plot's own); the report's heading is the spec's
  return plot_group_ablation(i.group_table, path, metric=i.metric or "accuracy", dpi=dpi)


def _draw_segment_ablation(i, path, *, title, dpi):
  return plot_segment_ablation(i.segment_table, path, metric=i.metric or "accuracy", dpi=dpi)


# name, title, caption (what is drawn; {metric}: the ablation's metric), how (how to read it),
# how each report draws it
# ---------------------------------------------------------------------------------------------
# Fig. 5: every head's map of one input, coloured by type


def shared_sequence_maps(examples: dict) -> tuple[int | None, dict[tuple[int, int], np.ndarray]]:
  """From an ``examples.json`` document: the sequence (its position in ``sequences``) whose map
  the most heads hold, and ``{(layer, head): float [n, n] map}`` of that sequence."""
  import base64
  q = float(examples.get("quantization", 255))
  count: dict[int, int] = {}
  for h in examples.get("heads", []):
    for x in h.get("examples", []):
      count[x["sequence"]] = count.get(x["sequence"], 0) + 1
  if not count:
    return None, {}
  seq = max(count, key=lambda k: (count[k], -k))
  n = len(examples["sequences"][seq]["tokens"])
  maps = {}
  for h in examples["heads"]:
    for x in h["examples"]:
      if x["sequence"] == seq:
        raw = np.frombuffer(base64.b64decode(x["map"]), np.uint8)
        maps[(int(h["layer"]), int(h["head"]))] = (raw.astype(np.float32) / q).reshape(n, n)
        break
  return seq, maps


def plot_all_maps(examples: dict, clusters_df: pd.DataFrame | None, path, *,
                  title: str | None = None, dpi: int = DEFAULT_DPI) -> Path | None:
  """Guan et al. Fig. 5: the attention map of every head for one input, the frame coloured by the
  head's attention type. The maps come from ``examples.json`` (the report's head view), which
  holds a few chosen sequences per head: the input drawn is the one most heads hold, and heads
  without its map are left grey (the title counts them). Every panel has the same colour scale
  (0 to the largest weight drawn, printed in the title). None when there are no maps."""
  seq, maps = shared_sequence_maps(examples or {})
  if seq is None:
    return None
  layers = 1 + max(int(h["layer"]) for h in examples["heads"])
  heads = 1 + max(int(h["head"]) for h in examples["heads"])
  types = {}
  if clusters_df is not None and len(clusters_df):
    types = {(int(l), int(h)): str(c) for l, h, c in
             zip(clusters_df["layer"], clusters_df["head"], clusters_df["cluster_name"])}
  palette = style.cluster_colors(list(types.values())) if types else {}
  # One colour scale for every panel (0 to the largest weight of any head), so a near-uniform
  # head reads pale instead of showing its small differences as strong stripes.
  top = max(max(float(m.max()) for m in maps.values()), 1e-6)
  fig = new_figure(0.9 * heads + 1.5, 0.9 * layers + 1.2, constrained=False)
  grid = fig.add_gridspec(layers, heads, wspace=0.08, hspace=0.08, left=0.06, right=0.98,
                          top=0.86, bottom=0.1)
  for l in range(layers):
    for h in range(heads):
      ax = fig.add_subplot(grid[l, h])
      m = maps.get((l, h))
      if m is not None:
        ax.imshow(m, cmap="Greys", vmin=0, vmax=top, interpolation="nearest")
      else:
        ax.set_facecolor("#eeeeee")
      ax.set_xticks([])
      ax.set_yticks([])
      color = palette.get(types.get((l, h)), "#bbbbbb")
      for spine in ax.spines.values():
        spine.set_edgecolor(color)
        spine.set_linewidth(2.2)
      if h == 0:
        ax.set_ylabel(str(l), fontsize=7, rotation=0, labelpad=8)
  handles = [mpatches.Patch(color=palette[n], label=n) for n in dict.fromkeys(types.values())]
  if handles:
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
  n = len(examples["sequences"][seq]["tokens"])
  fig.suptitle((title or FIGURES["all_maps"].title)
               + f"\nsequence {examples['sequences'][seq].get('index', seq)}, {n} tokens; "
                 f"{len(maps)} of {layers * heads} heads have its map (grey: none); one colour "
                 f"scale for all, white 0 to black {top:.2f}", fontsize=9)
  return save_figure(fig, path, dpi)


def _draw_type_masses(i, path, *, title, dpi):
  """Inputs: ``clusters_df`` (clusters.csv), ``cluster_info`` (clusters.json: the names' margins)."""
  df = _clusters(i)
  if df is None or "cluster_name" not in df.columns or not set(vocabulary.DISTANCE_FEATURES) <= set(df.columns):
    return None
  return plot_type_masses(df, path, info=i.cluster_info, title=title, dpi=dpi)


def _draw_all_maps(i, path, *, title, dpi):
  if not i.examples:
    return None
  return plot_all_maps(i.examples, i.clusters_df, path, title=title, dpi=dpi)


FIGURES.register_all({
    'all_maps': {
        "title": 'Every head\'s attention map of one input, by type',
        "caption": ('The attention maps of all heads (rows: layers, columns: heads) for one input, the '
                    'frame coloured by the head\'s attention type (Guan et al. Fig. 5: "We visualize all '
                    'attention matrices with a same randomly selected input sample"). The maps are the '
                    'head view\'s (examples.json): the input is the one most heads hold; grey heads lack '
                    'its map.'),
        "how": ('A dark diagonal is a diagonal head, dark columns a vertical head ([CLS], [SEP], '
                'punctuation), an even grey a dense head.'),
        "draw": _draw_all_maps,
        "reports": ("analysis", "reproduce"),
        "reproduces": "Fig. 5",
    },
    'cluster_tsne': {
        "title": 't-SNE of heads by distance features',
        "caption": ('Every head placed by t-SNE of its 21 distance features, coloured by '
                    'K-means cluster (Guan et al. Fig. 2); the number at each point is its '
                    'layer.'),
        "how": ('Nearby points attend similarly; t-SNE distances between far-apart groups '
                'are not meaningful, only the grouping is.'),
        "draw": _draw_cluster_tsne,
        "reports": ("analysis",),
        "reproduces": "Fig. 2",
    },
    'cluster_layers': {
        "title": 'Attention type per layer',
        "caption": ('Number of heads of each attention type (cluster) in every layer (Guan '
                    'et al. Fig. 3).'),
        "how": ('Read a bar bottom-up to see how many heads of the layer are of each type; '
                'compare bars to see types moving through the depth.'),
        "draw": _draw_cluster_layers,
        "reports": ("analysis",),
        "reproduces": "Fig. 3",
    },
    'cluster_features': {
        "title": 'Distance features per attention type',
        "caption": ('Box plots of the 21 distance features of the heads in each cluster '
                    '(Guan et al. Fig. 1): attention mass in 16 relative-distance windows, '
                    "to itself, [CLS], [SEP], ',' and '.'."),
        "how": ('Boxes span the middle half of the heads, the line is the median; a cluster '
                "with high 'self' and 'w0' is diagonal, high [CLS]/[SEP] vertical, spread "
                'over windows dense.'),
        "draw": _draw_cluster_features,
        "reports": ("analysis",),
        "reproduces": "Fig. 1",
    },
    'type_masses': {
        "title": 'The masses each attention type is named by',
        "caption": ("Per named type (cluster), box plots of its heads' near (self and the nearest "
                    "windows), far (the other windows) and special ([CLS], [SEP], comma, period) "
                    "attention mass: the quantities Guan et al.'s definitions of diagonal, dense and "
                    "vertical heads read; each panel's title gives the name's margin (clusters.json)."),
        "how": ('A diagonal type has most of its mass near, a vertical type on the special tokens, a '
                'dense type spread far; a small margin means the name was a close call.'),
        "draw": _draw_type_masses,
        "reports": ("analysis",),
    },
    'cluster_changes': {
        "title": 'Attention type before and after fine-tuning',
        "caption": 'Number of heads with each pair (type before, type after fine-tuning).',
        "how": ('The diagonal holds heads that kept their type; every off-diagonal count is '
                'heads that changed type (row: before, column: after).'),
        "draw": _draw_cluster_changes,
        "reports": ("compare",),
    },
    'group_ablation': {
        "title": 'Ablation by head group',
        "caption": ('Change of {metric} per ablated group (bars) and for random groups with as '
                    'many heads in each layer as the group (black markers).'),
        "how": ('Bars left of 0: the model got worse without the group; a bar far beyond its'
                ' black marker means the group matters more than as many random heads of the same'
                ' layers.'),
        "draw": _draw_group_ablation,
        "needs": ("group_table",),
        "reports": ("ablation",),
        "section": "Ablation by head group",
        "reproduces": "Table 2",
    },
    'segment_ablation': {
        "title": 'Intra- and inter-sentence attention removed',
        "caption": ('Change of {metric} when the intra- or inter-sentence attention of each '
                    'group is removed.'),
        "how": 'Bars below 0: the model needs that kind of attention in those heads.',
        "draw": _draw_segment_ablation,
        "needs": ("segment_table",),
        "reports": ("ablation",),
        "section": "Intra- and inter-sentence attention removed",
        "reproduces": "Table 3",
    },
})
