"""Figures of Michel et al. 2019 ("Are sixteen heads really better than one?"): head importance
(a layer x head heatmap) and the pruning curve (metric vs share of heads pruned, by importance
and in random order). Inputs: the ablation's importance and pruning tables. No jax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax.report.ablation import is_percent
from heads_jax.report.figures.common import DEFAULT_DPI, heatmap, new_figure, save_figure
from heads_jax.report.spec import Registry
from heads_jax.report.tables import require_columns

# The registry of this paper's figures (`heads_jax.report.spec`); registered at the end.
FIGURES = Registry('Michel et al. 2019')


def plot_importance(importance, path, *, title: str | None = None, label: str = "importance",
                    dpi: int = DEFAULT_DPI) -> Path:
  """Heatmap ``[l, h]`` of head importance."""
  imp = np.asarray(importance, float)
  if imp.ndim != 2:
    raise ValueError(f"importance must be [layers, heads], got shape {imp.shape}")
  fig = new_figure(max(5.0, 0.55 * imp.shape[1] + 2.2), max(3.0, 0.42 * imp.shape[0] + 1.4))
  ax = fig.add_subplot()
  heatmap(ax, imp, cmap="viridis", fmt="{:.2f}", label=label)
  ax.set_title(title or "Head importance (Michel et al. 2019)")
  return save_figure(fig, path, dpi)


def plot_pruning_curve(curve: pd.DataFrame, path, *, metric: str = "accuracy",
                       title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Metric vs share of heads pruned: importance order (line) and random order (mean of the
  seeds, with a ±1 standard deviation band); accuracy, F1 and exact match in percent."""
  require_columns(curve, ("method", "share_pruned", metric), "pruning table")
  scale = 100.0 if is_percent(metric) else 1.0   # accuracy, F1, exact match in percent
  fig = new_figure(6.8, 4.4)
  ax = fig.add_subplot()
  imp = curve[curve["method"] == "importance"].sort_values("share_pruned")
  if len(imp):
    ax.plot(100 * imp["share_pruned"], scale * imp[metric], "o-", color="#1b7837",
            label="by importance (least important first)")
  rnd = curve[curve["method"] == "random"]
  if len(rnd):
    g = rnd.groupby("share_pruned")[metric]
    x, mean, sd = 100 * g.mean().index.to_numpy(), g.mean().to_numpy(), g.std(ddof=0).to_numpy()
    mean, sd = scale * mean, scale * sd
    n = rnd["seed"].nunique()
    ax.plot(x, mean, "s--", color="#b2182b", label=f"random order (mean of {n} seeds)")
    ax.fill_between(x, mean - sd, mean + sd, color="#b2182b", alpha=0.15)
  base = curve[curve["share_pruned"] == 0][metric]
  if len(base):
    ax.axhline(scale * float(base.iloc[0]), color="#777777", linewidth=0.8, linestyle=":",
               label="unablated")
  ax.set_xlabel("heads pruned (%)")
  ax.set_ylabel(f"{metric} (%)" if is_percent(metric) else metric)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8, loc="lower left")
  ax.set_title(title or f"Pruning heads: {metric} vs share pruned")
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# the registry: how each report draws these figures from its inputs (`heads_jax.report.spec`);
# the drawn title is the plot's own, the report's heading the spec's title


def _draw_importance(i, path, *, title, dpi):
  """Inputs: ``importance`` ``[l, h]``, ``importance_label`` (the colour bar's; default
  "importance")."""
  return plot_importance(i.importance, path, label=i.importance_label or "importance", dpi=dpi)


def _draw_pruning(i, path, *, title, dpi):
  """Inputs: ``pruning_curve`` (pruning.csv), ``metric``."""
  return plot_pruning_curve(i.pruning_curve, path, metric=i.metric or "accuracy", dpi=dpi)


# name, title, caption (what is drawn), how (how to read it), how each report draws it
FIGURES.register_all({
    'importance': {
        "title": 'Head importance',
        "caption": 'Importance of every head (rows: layers, columns: heads).',
        "how": ('Bright heads change the loss most when scaled down; dark heads can be '
                'pruned first.'),
        "draw": _draw_importance,
        "needs": ("importance",),
        "reports": ("ablation",),
        "section": "Head importance",
    },
    'pruning': {
        "title": 'Pruning curve',
        "caption": '{metric} of the classifier vs the share of heads pruned.',
        "how": ('The longer the green line stays flat above the red one, the more heads can '
                'go without loss, and the better importance picks them.'),
        "draw": _draw_pruning,
        "needs": ("pruning_curve",),
        "reports": ("ablation",),
        "section": "Pruning curve",
        "reproduces": "Fig. 3",
    },
})
