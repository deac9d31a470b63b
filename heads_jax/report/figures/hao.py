"""Figures of "which heads carry the prediction" (issue 51): self-attention attribution (Hao et
al. 2021), activation patching and attribution patching per head, beside the heads' roles, and
the pruning curves on held-out rows (attribution, Michel et al.'s importance, role heads first,
random). Inputs: the ablate job's attribution.csv, patching.csv, head_pruning.csv and the roles of
--analysis. No jax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax.report.figures.common import DEFAULT_DPI, heatmap, new_figure, save_figure
from heads_jax.report.spec import Registry

FIGURES = Registry("Hao et al. 2021")
SECTION = "Which heads carry the prediction"


def _grid(table: pd.DataFrame, column: str) -> np.ndarray:
  return table.pivot(index="layer", columns="head", values=column).to_numpy(float)


def plot_head_grid(attribution, patching, roles, path, *, dpi: int = DEFAULT_DPI) -> Path:
  """Side by side ``[l, h]`` grids: attribution (mean largest attribution), patching effect,
  attribution patching's estimate, and the roles (a head's first role; blank none)."""
  panels = []
  if attribution is not None:
    panels.append(("attribution", _grid(attribution, "value")))
  if patching is not None:
    panels += [("patching effect", _grid(patching, "value")),
               ("attribution patching", _grid(patching, "estimated_value"))]
  shape = panels[0][1].shape
  cols = len(panels) + (roles is not None)
  fig = new_figure(max(4.0, 0.42 * shape[1] + 1.8) * cols, max(3.0, 0.42 * shape[0] + 1.4))
  for i, (name, grid) in enumerate(panels):
    ax = fig.add_subplot(1, cols, i + 1)
    heatmap(ax, grid, cmap="viridis", fmt="{:.2f}", label=name)
    ax.set_title(name)
  if roles is not None:
    names = sorted({r.split(",")[0] for r in np.asarray(roles).ravel() if r})
    code = np.vectorize(lambda r: (names.index(r.split(",")[0]) + 1) if r else 0)(roles)
    ax = fig.add_subplot(1, cols, cols)
    ax.imshow(np.ma.masked_equal(code, 0), cmap="tab20", vmin=1, vmax=20, aspect="auto")
    ax.set_facecolor("white")   # heads without a role
    for (l, h), r in np.ndenumerate(np.asarray(roles)):
      if r:
        ax.text(h, l, r.split(",")[0][:6], ha="center", va="center", fontsize=6)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title("roles")
  return save_figure(fig, path, dpi)


def plot_head_pruning(curve: pd.DataFrame, path, *, dpi: int = DEFAULT_DPI) -> Path:
  """Accuracy (%) on the held-out rows vs the share of heads pruned, one line per order with
  its 95% Wilson band (random: the mean of its seeds, the band their mean)."""
  colours = {"attribution": "#1b7837", "importance": "#2166ac", "role": "#762a83",
             "random": "#b2182b"}
  fig = new_figure(6.8, 4.4)
  ax = fig.add_subplot()
  for method, part in curve.groupby("method"):
    g = part.groupby("share_pruned")[["accuracy", "accuracy_low", "accuracy_high"]].mean()
    x = 100 * g.index.to_numpy()
    label = {"importance": "Michel importance", "role": "role heads first",
             "random": f"random (mean of {part['seed'].nunique()})"}.get(method, method)
    ax.plot(x, 100 * g["accuracy"], "o-", color=colours.get(method), label=label, markersize=3)
    ax.fill_between(x, 100 * g["accuracy_low"], 100 * g["accuracy_high"],
                    color=colours.get(method), alpha=0.12)
  ax.set_xlabel("heads pruned (%)")
  ax.set_ylabel("accuracy (%)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8, loc="lower left")
  ax.set_title("Pruning on held-out rows")
  return save_figure(fig, path, dpi)


def _draw_grid(i, path, *, title, dpi):
  """Inputs: ``attribution`` and/or ``patching`` tables, ``roles`` ``[l, h]`` (optional)."""
  if i.attribution is None and i.patching is None:
    return None
  return plot_head_grid(i.attribution, i.patching, i.roles, path, dpi=dpi)


def _draw_pruning(i, path, *, title, dpi):
  """Inputs: ``head_pruning`` (head_pruning.csv)."""
  return plot_head_pruning(i.head_pruning, path, dpi=dpi)


FIGURES.register_all({
    "head_grid": {
        "title": "Attribution, patching and roles per head",
        "caption": ("Each head's mean largest attribution, its patching effect, attribution "
                    "patching's estimate of it, and its role (rows: layers, columns: heads)."),
        "how": ("Heads bright in the first grids carry the prediction; compare their places with "
                "the roles on the right."),
        "draw": _draw_grid,
        "reports": ("ablation",),
        "section": SECTION,
    },
    "head_pruning": {
        "title": "Pruning curves on held-out rows",
        "caption": ("Accuracy on held-out rows vs the share of heads pruned, by attribution, by "
                    "Michel et al.'s importance, role heads first and at random."),
        "how": ("The longer a line stays high, the better its order keeps the heads that "
                "matter (Hao et al.'s Fig. 3 setting as issue 51 states it)."),
        "draw": _draw_pruning,
        "needs": ("head_pruning",),
        "reports": ("ablation",),
        "section": SECTION,
    },
})
