"""A Venn diagram of four sets of heads (Pande et al. Fig. 4 has the four coarse roles local,
syntactic, block and delimiter; matplotlib-venn draws at most three sets).

Four congruent ellipses in the standard arrangement, in which every one of the 15 intersections
is a connected region; each region's count is written at its most interior point (found on a
grid with a distance transform). Areas are not proportional to the counts. Two or three sets go
to `heads_jax.report.figures.pande.plot_role_venn` (matplotlib-venn).

No jax.
"""

from __future__ import annotations

from itertools import product
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import patches as mpatches
from scipy import ndimage

from heads_jax.report import style
from heads_jax.report.figures import pande as pande_figures
from heads_jax.report.figures.common import DEFAULT_DPI, empty_note, new_figure, save_figure

# (centre x, centre y, angle in degrees) of the four ellipses, in axes units; width x height.
ELLIPSES = ((0.350, 0.400, 140.0), (0.450, 0.500, 140.0), (0.544, 0.500, 40.0),
            (0.644, 0.400, 40.0))
WIDTH, HEIGHT = 0.72, 0.45
# Where each set's name goes (outside its ellipse's free end).
LABELS = ((0.10, 0.80), (0.30, 0.91), (0.70, 0.91), (0.90, 0.80))


def inside(x, y, k: int) -> np.ndarray:
  """bool: the points (x, y) inside ellipse ``k`` (boundary included)."""
  cx, cy, angle = ELLIPSES[k]
  t = np.deg2rad(angle)
  dx, dy = np.asarray(x) - cx, np.asarray(y) - cy
  u = dx * np.cos(t) + dy * np.sin(t)
  v = -dx * np.sin(t) + dy * np.cos(t)
  return (u / (WIDTH / 2)) ** 2 + (v / (HEIGHT / 2)) ** 2 <= 1.0


def region_centres(resolution: int = 400) -> dict[tuple[bool, ...], tuple[float, float]]:
  """The most interior point of every non-empty region ``(in set 0, .., in set 3)`` (not the
  all-False outside)."""
  g = (np.arange(resolution) + 0.5) / resolution
  x, y = np.meshgrid(g, g)
  member = np.stack([inside(x, y, k) for k in range(4)], -1)  # [y, x, 4]
  out = {}
  for combo in product((False, True), repeat=4):
    if not any(combo):
      continue
    mask = (member == np.asarray(combo)).all(-1)
    if not mask.any():
      continue
    depth = ndimage.distance_transform_edt(mask)
    iy, ix = np.unravel_index(np.argmax(depth), depth.shape)
    out[combo] = (float(g[ix]), float(g[iy]))
  return out


def region_counts(flags: pd.DataFrame, sets) -> dict[tuple[bool, ...], int]:
  """Heads in each exact combination of ``sets`` (bool columns of ``flags``), all-False included."""
  m = flags[list(sets)].to_numpy(bool)
  out = {}
  for combo in product((False, True), repeat=len(sets)):
    out[combo] = int((m == np.asarray(combo)).all(-1).sum())
  return out


def plot_venn4(flags: pd.DataFrame, path, *, sets=("local", "syntactic", "block", "delimiter"),
               title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Venn diagram of the heads' coarse roles.

  Args:
    flags: one row per head with a bool column per set (e.g.
      `heads_jax.report.reproduce.coarse_flags`).
    sets: four column names (two or three: matplotlib-venn's diagram).
  """
  sets = [s for s in sets if s in flags.columns]
  if len(sets) in (2, 3):
    return pande_figures.plot_role_venn(flags, path, sets=tuple(sets), title=title, dpi=dpi)
  fig = new_figure(7.2, 5.6)
  ax = fig.add_subplot()
  label = title or "Overlap of the coarse roles"
  if len(sets) != 4:
    empty_note(ax, "fewer than two coarse roles were tested")
    ax.set_title(label)
    return save_figure(fig, path, dpi)
  for k, (cx, cy, angle) in enumerate(ELLIPSES):
    color = style.COARSE_COLORS.get(sets[k], "#888888")
    ax.add_patch(mpatches.Ellipse((cx, cy), WIDTH, HEIGHT, angle=angle, facecolor=color,
                                  alpha=0.25, edgecolor=color, lw=1.5))
  counts = region_counts(flags, sets)
  for combo, (x, y) in region_centres().items():
    ax.text(x, y, str(counts[combo]), ha="center", va="center", fontsize=9)
  m = flags[sets].to_numpy(bool)
  for k, (x, y) in enumerate(LABELS):
    ax.text(x, y, f"{sets[k]} ({int(m[:, k].sum())})", ha="center", va="center", fontsize=10,
            color=style.COARSE_COLORS.get(sets[k], "#333333"), fontweight="bold")
  ax.text(0.0, 0.0, f"none of these roles: {counts[(False,) * 4]} heads", transform=ax.transAxes,
          fontsize=9, color="#555555", ha="left", va="bottom")
  ax.set_xlim(0, 1)
  ax.set_ylim(0.05, 1.02)
  ax.set_aspect("equal")
  ax.axis("off")
  ax.set_title(f"{label} ({len(flags)} heads)")
  return save_figure(fig, path, dpi)
