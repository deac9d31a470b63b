"""Figures of Pande et al. 2021 ("The heads hypothesis"), Figs. 2-6, from the contract files.

* Fig. 2: `plot_score_distribution` (one head's scores: skewed and broad, its mean above tau
  while the test fails: the paper's argument for a test over an average); `plot_tau_sweep`
  (heads per coarse role as tau goes from 1 to 3.5, the range the authors' notebook explores,
  under the paper's test and the average rule).
* Fig. 3: `plot_score_cdf` (all sieve bias scores of the paper's four roles, their mean and tau),
  `plot_pvalue_hist`.
* Fig. 4: `plot_role_upset` (drawn here: upsetplot 0.9 breaks on pandas 3) and `plot_role_venn`
  (all four coarse roles as four ellipses; two or three sets with matplotlib-venn). Coarse roles
  are the paper's four tests (`heads_jax.hoststats.roles`).
* Fig. 5: `plot_role_grid` (one marker per assigned fine role in a layer x head grid), and
  `plot_role_heatmaps` (mean sieve bias per head, one panel per role).
* Fig. 6: `plot_finetune_delta` (change of mean sieve bias after fine-tuning per layer group).

Tests and role assignments come from ``tests.csv`` (hoststats); nothing is tested here.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import matplotlib
import matplotlib_venn
import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib import patches as mpatches
from matplotlib import ticker as mticker
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from heads_jax.hoststats import roles as roles_lib
from heads_jax.hoststats import summary as summary_lib
from heads_jax.report import style, tables
from heads_jax.report.figures.common import (DEFAULT_DPI, PLAIN, empty_note, finite, new_figure,
                                             save_figure)
from heads_jax.report.spec import Registry
from heads_jax.report.tables import require_columns

# The registry of this paper's figures (`heads_jax.report.spec`); registered at the end.
FIGURES = Registry("Pande et al. 2021")



# ---------------------------------------------------------------------------------------------
# Fig. 2: one head's scores; the tau sweep


def plot_score_distribution(example: dict, path, *, tau: float, alpha: float = 0.05,
                            title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Histogram of one (head, role)'s per-sequence sieve bias (Pande et al. Fig. 2), with its mean,
  tau and the one-sided lower confidence bound of the mean at level 1 - alpha.

  Args:
    example: `heads_jax.hoststats.summary.skewed_example` (layer, head, role, values, mean,
      p_value, skewness, average_only).
  """
  from scipy import stats as sstats
  v = np.asarray(example["values"], np.float64)
  fig = new_figure(7.5, 4.6)
  ax = fig.add_subplot()
  ax.hist(v, bins=min(40, max(10, v.size // 5)), color="#9ecae1", edgecolor="#3182bd")
  mean = float(v.mean())
  lower = (mean - sstats.t.ppf(1 - alpha, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
           if v.size >= 2 else float("nan"))
  ax.axvline(mean, color="#1f77b4", ls="--", lw=1.6, label=f"mean = {mean:.2f}")
  ax.axvline(tau, color="#d62728", lw=1.6, label=f"tau = {tau:g}")
  if np.isfinite(lower):
    ax.axvline(lower, color="#555555", ls=":", lw=1.4,
               label=f"{100 * (1 - alpha):g}% lower bound of the mean = {lower:.2f}")
  verdict = ("the average rule assigns the role, the test does not" if example["average_only"]
             else ("the test assigns the role" if example["p_value"] < alpha
                   else "neither assigns the role"))
  ax.text(0.98, 0.96, f"{v.size} sequences, skewness {example['skewness']:.2f}\n"
                      f"p = {example['p_value']:.3g}: {verdict}", transform=ax.transAxes,
          ha="right", va="top", fontsize=9)
  ax.set_xlabel(f"sieve bias of head {example['layer']}:{example['head']}, role "
                f"{example['role']}")
  ax.set_ylabel("sequences")
  ax.legend(loc="center right", fontsize=8, frameon=False)
  ax.set_title(title or FIGURES["score_distribution"].title)
  return save_figure(fig, path, dpi)


def plot_tau_sweep(sweep: pd.DataFrame, path, *, tau: float | None = None,
                   title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Share of heads per coarse role (and unskilled) against tau: solid lines the paper's rule
  (the test), dashed the average rule (`heads_jax.hoststats.summary.tau_sweep`)."""
  require_columns(sweep, ("tau", "role", "rule", "share"), "tau sweep")
  fig = new_figure(7.5, 4.6)
  ax = fig.add_subplot()
  for role in dict.fromkeys(sweep["role"]):
    color = style.COARSE_COLORS.get(role, "#777777")
    for rule, ls in (("paper", "-"), ("average", "--")):
      d = sweep[(sweep["role"] == role) & (sweep["rule"] == rule)].sort_values("tau")
      if not d.empty:
        ax.plot(d["tau"], 100 * d["share"], ls=ls, marker="o", ms=3, color=color,
                label=f"{role} ({'test' if rule == 'paper' else 'average'})")
  if tau is not None:
    ax.axvline(float(tau), color="#d62728", lw=1, alpha=0.6)
  ax.set_xlabel("tau")
  ax.set_ylabel("heads with the role (%)")
  ax.set_ylim(0, 101)
  ax.legend(fontsize=7, ncol=2, frameon=False, loc="upper right")
  ax.set_title(title or FIGURES["tau_sweep"].title)
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# Fig. 3: scores and p-values


def plot_score_cdf(scores, path, *, tau: float, mean: float | None = None, title: str | None = None,
                   dpi: int = DEFAULT_DPI) -> Path:
  """CDF of all sieve bias scores with their mean and tau marked (log x axis).

  Args:
    scores: any shape, e.g. ``sieve_bias`` float ``[b, l, h, r]``; NaN entries are ignored.
    tau: the test threshold, drawn as a vertical line.
    mean: the value to mark as "mean of all scores"; default: the mean of the finite scores.
  """
  values = np.sort(finite(scores))
  fig = new_figure(7.5, 4.6)
  ax = fig.add_subplot()
  if values.size == 0:
    empty_note(ax, "no finite sieve bias scores")
  else:
    mean = float(values.mean()) if mean is None else float(mean)
    # Draw at most ~4000 quantiles: the curve looks the same and the PNG stays small.
    if values.size > 4000:
      idx = np.unique(np.linspace(0, values.size - 1, 4000).round().astype(int))
    else:
      idx = np.arange(values.size)
    x = values[idx]
    y = (idx + 1) / values.size
    # Scores can reach ~0 (a head ignoring its sieve); start the log axis at a power of ten
    # at or below min(0.1, 1st percentile) so the bulk of the curve stays readable.
    positive = values[values > 0]
    low = min(0.1, float(np.quantile(positive, 0.01))) if positive.size else 0.1
    left = 10.0 ** np.floor(np.log10(low))
    below = float((values < left).mean())
    ax.step(np.maximum(x, left), y, where="post", color="#333333", lw=1.6,
            label=f"sieve bias scores (n = {values.size:,})")
    ax.set_xscale("log")
    right = max(float(values.max()), tau, mean, 1.0) * 1.3
    # labels at 1, 2, 5 x 10^k over a few decades, at the decades only over more; none at the
    # other minor ticks (their labels overlapped on narrow ranges)
    subs = (1.0, 2.0, 5.0) if np.log10(right / left) <= 3 else (1.0,)
    ax.xaxis.set_major_locator(mticker.LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(PLAIN)
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())
    ax.set_xlim(left, right)
    if below > 0:
      ax.text(0.02, 0.5, f"{below:.1%} of scores\nbelow {left:g}\n(drawn at the edge)",
              transform=ax.transAxes, fontsize=8, color="#555555", va="center")
    ax.axvline(1.0, color="#999999", ls=":", lw=1.2, label="1 = no preference for the sieve")
    ax.axvline(mean, color="#1f77b4", ls="--", lw=1.6, label=f"mean of all scores = {mean:.2f}")
    ax.axvline(tau, color="#d62728", ls="-", lw=1.6, label=f"tau = {tau:g}")
    share_above = float((values > tau).mean())
    ax.text(0.98, 0.04, f"{share_above:.1%} of scores > tau", transform=ax.transAxes,
            ha="right", va="bottom", fontsize=9, color="#d62728")
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("sieve bias score (log scale)")
    ax.set_ylabel("cumulative share of scores")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9, frameon=True)
  ax.set_title(title or FIGURES["score_cdf"].title)
  return save_figure(fig, path, dpi)


def plot_pvalue_hist(p_values, path, *, band=(0.05, 0.95), alpha: float | None = None,
                     bins: int = 20, title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Histogram of the tests' p-values (log count axis) with the ``band`` shaded.

  Args:
    p_values: any shape (e.g. ``tests.csv`` column ``p_value``); NaN entries are ignored.
    band: the interval whose share is annotated (the paper's (0.05, 0.95)).
    alpha: the significance level, drawn as a line when given.
  """
  p = finite(p_values)
  if p.size and ((p < 0).any() or (p > 1).any()):
    raise ValueError("p-values must lie in [0, 1]; pass the p_value column of tests.csv")
  fig = new_figure(7.5, 4.6)
  ax = fig.add_subplot()
  if p.size == 0:
    empty_note(ax, "no p-values (no role had a defined test)")
  else:
    counts, edges = np.histogram(p, bins=bins, range=(0.0, 1.0))
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#4c72b0",
           edgecolor="white", label=f"tests (n = {p.size:,})")
    ax.set_yscale("symlog", linthresh=1)
    ax.yaxis.set_major_formatter(PLAIN)
    ax.set_ylim(0, max(2.0, counts.max() * 2.0))
    lo, hi = band
    inside = float(((p > lo) & (p < hi)).mean())
    ax.axvspan(lo, hi, color="#ffbf00", alpha=0.18, zorder=0,
               label=f"p in ({lo:g}, {hi:g}): {inside:.1%} of tests")
    if alpha is not None:
      ax.axvline(alpha, color="#d62728", lw=1.4, label=f"alpha = {alpha:g} (role assigned left of it)")
    ax.set_xlim(0, 1)
    ax.set_xlabel("p-value of the test 'mean sieve bias > tau'")
    ax.set_ylabel("number of tests (log scale)")
    ax.legend(loc="upper center", fontsize=9)
  ax.set_title(title or FIGURES["pvalue_hist"].title)
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# Fig. 4: role overlap


def upset_counts(flags: pd.DataFrame, sets) -> pd.Series:
  """Heads per exact combination of ``sets``: a Series indexed by bool tuples, largest first.

  ``flags`` has one row per head and a bool column per set. Combinations with no head are left
  out; the all-False combination (none of the sets) is kept when it occurs.
  """
  sets = list(sets)
  keys = [tuple(bool(v) for v in row) for row in flags[sets].to_numpy()]
  counts = pd.Series(keys, dtype=object).value_counts(sort=False)
  order = sorted(counts.index, key=lambda k: (-counts[k], -sum(k), k))
  return pd.Series([int(counts[k]) for k in order], index=pd.Index(order, tupleize_cols=False),
                   dtype=int)


def _draw_upset(fig: Figure, flags: pd.DataFrame, sets):
  """The UpSet chart: intersection sizes (bars), their member sets (dots), set sizes (left)."""
  counts = upset_counts(flags, sets)
  num = len(counts)
  gs = fig.add_gridspec(2, 3, width_ratios=(1.1, 1.0, max(3.0, 0.55 * num)),
                        height_ratios=(2.2, 0.3 + 0.28 * len(sets)), wspace=0.0, hspace=0.04)
  ax_bars = fig.add_subplot(gs[0, 2])
  ax_dots = fig.add_subplot(gs[1, 2], sharex=ax_bars)
  ax_sets = fig.add_subplot(gs[1, 0], sharey=ax_dots)
  ax_names = fig.add_subplot(gs[1, 1], sharey=ax_dots)
  x = np.arange(num)
  bars = ax_bars.bar(x, counts.to_numpy(), color="#333333", width=0.6)
  ax_bars.bar_label(bars, fontsize=8, padding=2)
  ax_bars.set_ylabel("heads with exactly\nthis combination")
  ax_bars.set_ylim(0, counts.max() * 1.18 + 0.5)
  ax_bars.tick_params(axis="x", bottom=False, labelbottom=False)
  for side in ("top", "right"):
    ax_bars.spines[side].set_visible(False)
  y = np.arange(len(sets))[::-1]  # first set on top
  color = [style.COARSE_COLORS.get(s, "#333333") for s in sets]
  for i in range(len(sets)):
    if i % 2 == 0:
      for ax in (ax_dots, ax_names):
        ax.axhspan(y[i] - 0.5, y[i] + 0.5, color="#f2f2f2", zorder=0)
    ax_names.text(0.5, y[i], sets[i], ha="center", va="center", fontsize=10, color=color[i],
                  fontweight="bold")
  for j, combo in enumerate(counts.index):
    on = [i for i, v in enumerate(combo) if v]
    off = [i for i, v in enumerate(combo) if not v]
    ax_dots.scatter([j] * len(off), y[off], s=70, color="#dddddd", zorder=2)
    if on:
      ax_dots.scatter([j] * len(on), y[on], s=70, color=[color[i] for i in on], zorder=3)
      ax_dots.plot([j, j], [y[on].min(), y[on].max()], color="#333333", lw=2, zorder=2)
  ax_dots.set_xlim(-0.6, num - 0.4)
  ax_dots.set_ylim(-0.5, len(sets) - 0.5)
  for ax in (ax_dots, ax_names):
    ax.tick_params(left=False, labelleft=False, bottom=False, labelbottom=False)
    for spine in ax.spines.values():
      spine.set_visible(False)
  ax_names.set_xlim(0, 1)
  totals = [int(flags[s].sum()) for s in sets]
  ax_sets.barh(y, totals, color=color, height=0.55)
  for yi, total in zip(y, totals):
    ax_sets.text(total, yi, f"{total} ", ha="right", va="center", fontsize=8)
  ax_sets.set_xlim(max(totals + [1]) * 1.45, 0)
  ax_sets.tick_params(left=False, labelleft=False)
  ax_sets.set_xlabel("heads with the role", fontsize=9)
  for side in ("top", "left", "right"):
    ax_sets.spines[side].set_visible(False)


def plot_role_upset(tests_or_flags: pd.DataFrame, path, *,
                    sets=("local", "syntactic", "block", "delimiter"), title: str | None = None,
                    dpi: int = DEFAULT_DPI) -> Path:
  """UpSet plot of the heads' coarse roles.

  Args:
    tests_or_flags: a tests table (``tests.csv``: layer, head, role, assigned) or a per-head
      table with one bool column per set.
    sets: coarse roles to intersect; those none of whose fine roles was tested are dropped.
  """
  flags, sets = tables.coarse_flags(tests_or_flags, sets)
  heads = len(flags)
  label = title or FIGURES["role_upset"].title
  if not sets or heads == 0:
    fig = new_figure(7, 3.5)
    empty_note(fig.add_subplot(), "no coarse role was tested")
    fig.suptitle(label)
    return save_figure(fig, path, dpi)
  width = 3.2 + 0.55 * max(4, len(upset_counts(flags, sets)))
  fig = new_figure(min(width, 16), 5.2, constrained=False)
  _draw_upset(fig, flags, sets)
  fig.suptitle(f"{label} ({heads} heads)", fontsize=12)
  fig.subplots_adjust(left=0.03, right=0.98, top=0.9, bottom=0.1)
  return save_figure(fig, path, dpi)


# Four congruent ellipses in the standard arrangement, in which each of the 15 intersections is
# one connected region: (centre x, centre y, angle in degrees), width x height, in axes units.
VENN4_ELLIPSES = ((0.350, 0.400, 140.0), (0.450, 0.500, 140.0), (0.544, 0.500, 40.0),
                  (0.644, 0.400, 40.0))
VENN4_SIZE = (0.72, 0.45)
VENN4_LABELS = ((0.10, 0.80), (0.30, 0.91), (0.70, 0.91), (0.90, 0.80))


def venn4_inside(x, y, k: int) -> np.ndarray:
  """bool: the points (x, y) inside ellipse ``k`` of `VENN4_ELLIPSES` (boundary included)."""
  cx, cy, angle = VENN4_ELLIPSES[k]
  t = np.deg2rad(angle)
  dx, dy = np.asarray(x) - cx, np.asarray(y) - cy
  u = dx * np.cos(t) + dy * np.sin(t)
  v = -dx * np.sin(t) + dy * np.cos(t)
  return (u / (VENN4_SIZE[0] / 2)) ** 2 + (v / (VENN4_SIZE[1] / 2)) ** 2 <= 1.0


def venn4_centres(resolution: int = 400) -> dict[tuple[bool, ...], tuple[float, float]]:
  """The most interior point of every region ``(in set 0, .., in set 3)`` but the outside
  (a grid and a distance transform)."""
  from itertools import product
  from scipy import ndimage
  g = (np.arange(resolution) + 0.5) / resolution
  x, y = np.meshgrid(g, g)
  member = np.stack([venn4_inside(x, y, k) for k in range(4)], -1)
  out = {}
  for combo in product((False, True), repeat=4):
    mask = (member == np.asarray(combo)).all(-1)
    if any(combo) and mask.any():
      depth = ndimage.distance_transform_edt(mask)
      iy, ix = np.unravel_index(np.argmax(depth), depth.shape)
      out[combo] = (float(g[ix]), float(g[iy]))
  return out


def _venn4(ax, flags: pd.DataFrame, sets) -> None:
  m = flags[list(sets)].to_numpy(bool)
  for k, (cx, cy, angle) in enumerate(VENN4_ELLIPSES):
    color = style.COARSE_COLORS.get(sets[k], "#888888")
    ax.add_patch(mpatches.Ellipse((cx, cy), *VENN4_SIZE, angle=angle, facecolor=color, alpha=0.25,
                                  edgecolor=color, lw=1.5))
  for combo, (x, y) in venn4_centres().items():
    ax.text(x, y, str(int((m == np.asarray(combo)).all(-1).sum())), ha="center", va="center",
            fontsize=9)
  for k, (x, y) in enumerate(VENN4_LABELS):
    ax.text(x, y, f"{sets[k]} ({int(m[:, k].sum())})", ha="center", va="center", fontsize=10,
            color=style.COARSE_COLORS.get(sets[k], "#333333"), fontweight="bold")
  ax.set_xlim(0, 1)
  ax.set_ylim(0.05, 1.02)
  ax.set_aspect("equal")
  ax.axis("off")


def plot_role_venn(tests_or_flags: pd.DataFrame, path, *,
                   sets=("local", "syntactic", "block", "delimiter"),
                   title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Venn diagram of the coarse roles: four as ellipses (counts per region; areas not
  proportional), two or three with matplotlib-venn (areas roughly proportional).

  Args:
    tests_or_flags: a tests table or per-head bool flags (as for :func:`plot_role_upset`).
    sets: 2 to 4 coarse roles; those not tested are dropped (fewer than 2 left: a note).
  """
  if not 2 <= len(sets) <= 4:
    raise ValueError(f"a Venn diagram needs 2 to 4 sets, got {list(sets)}; use plot_role_upset "
                     "for more")
  flags, sets = tables.coarse_flags(tests_or_flags, sets)
  fig = new_figure(7.2, 5.6) if len(sets) == 4 else new_figure(6.2, 5.4)
  ax = fig.add_subplot()
  label = title or FIGURES["role_venn"].title
  if len(sets) == 4:
    _venn4(ax, flags, sets)
    none = int((~flags[list(sets)].any(axis=1)).sum())
    ax.text(0.0, 0.0, f"none of these roles: {none} heads", transform=ax.transAxes, fontsize=9,
            color="#555555", ha="left", va="bottom")
    ax.set_title(f"{label} ({len(flags)} heads)")
    return save_figure(fig, path, dpi)
  if len(sets) < 2:
    empty_note(ax, "fewer than two of these roles were tested")
    ax.set_title(label)
    return save_figure(fig, path, dpi)
  members = [set(np.flatnonzero(flags[s].to_numpy())) for s in sets]
  none = int((~flags[list(sets)].any(axis=1)).sum())
  # An empty set has no area: matplotlib-venn would print its name on top of another's, so the
  # empty ones are named in a note instead and the diagram shows the others.
  empty = [s for s, m in zip(sets, members) if not m]
  shown = [(s, m) for s, m in zip(sets, members) if m]
  if len(shown) < 2:
    empty_note(ax, (f"no head has any of the roles {', '.join(sets)}" if not shown else
                    f"{shown[0][0]}: {len(shown[0][1])} heads; no head has "
                    f"{', '.join(empty)}"))
  else:
    colors = [style.COARSE_COLORS.get(s, "#888888") for s, _ in shown]
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      venn = matplotlib_venn.venn2 if len(shown) == 2 else matplotlib_venn.venn3
      venn(subsets=[m for _, m in shown], set_labels=[s for s, _ in shown], set_colors=colors,
           alpha=0.45, ax=ax)
  note = f"none of these roles: {none} heads"
  if empty and len(shown) >= 2:
    note += f"; no head has {', '.join(empty)} (not drawn)"
  fig.supxlabel(note, fontsize=9, color="#555555")  # below the diagram, never on a set's name
  ax.set_title(f"{label} ({len(flags)} heads)")
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# Fig. 5: role grid and mean sieve bias per head


def sorted_heads(assigned: np.ndarray) -> np.ndarray:
  """int ``[l, h]``: per layer, head indices sorted by number of roles (most first, ties by index).

  Args:
    assigned: bool ``[l, h, r]``.
  """
  num = assigned.sum(-1)
  return np.stack([np.lexsort((np.arange(num.shape[1]), -row)) for row in num])


def plot_role_grid(tests_df: pd.DataFrame, path, *, roles=style.GRID_ROLES, title: str | None = None,
                   windowed_layers=(), dpi: int = DEFAULT_DPI) -> Path:
  """Layer x head grid, one cell per head with a marker per assigned fine role.

  Args:
    tests_df: ``tests.csv`` (layer, head, role, assigned).
    roles: the fine roles drawn, each at a fixed place of a 3-column sub-grid in the cell.
    windowed_layers: layers whose heads see only a window of keys (ModernBERT's local layers):
      labelled "L (local)" and shaded, the others "L (global)"; none: plain layer numbers.
  """
  df = tables.check_tests_df(tests_df)
  roles = list(roles)
  windowed = {int(x) for x in windowed_layers or ()}
  tested = set(tables.tested_roles(df))
  num_layers, num_heads = tables.grid_shape(df)
  assigned = tables.assigned_matrix(df, roles)  # [l, h, r]
  order = sorted_heads(assigned)
  ncol = 3
  nrow = int(np.ceil(len(roles) / ncol))
  width = max(4.6, 1.2 + 0.62 * num_heads)  # a toy model's 4 heads still fit the labels
  fig = new_figure(width, 1.9 + 0.58 * num_layers)
  ax = fig.add_subplot()
  offsets = [((i % ncol) - (ncol - 1) / 2) * 0.26 for i in range(len(roles))]
  offsets_y = [((i // ncol) - (nrow - 1) / 2) * 0.24 for i in range(len(roles))]
  on_points = {role: [] for role in roles}
  off_points = []
  for layer in range(num_layers):
    for col in range(num_heads):
      head = order[layer, col]
      ax.add_patch(mpatches.Rectangle((col - 0.46, layer - 0.46), 0.92, 0.92, fill=True,
                                      facecolor="#eef3f8" if layer in windowed else "#fafafa",
                                      edgecolor="#cccccc", lw=0.6))
      ax.text(col - 0.43, layer - 0.43, str(head), fontsize=5.5, color="#777777",
              ha="left", va="top")
      for i, role in enumerate(roles):
        point = (col + offsets[i], layer + offsets_y[i] + 0.05)
        (on_points[role] if assigned[layer, head, i] else off_points).append(point)
  if off_points:
    ax.scatter(*np.array(off_points).T, s=2, color="#d0d0d0", zorder=2)
  for role, points in on_points.items():
    if points:
      ax.scatter(*np.array(points).T, s=22, marker=style.GRID_MARKERS.get(role, "o"),
                 color=style.ROLE_COLORS.get(role, "#333333"), edgecolor="black",
                 linewidths=0.3, zorder=3)
  ax.set_xlim(-0.55, num_heads - 0.45)
  ax.set_ylim(num_layers - 0.5, -0.55)
  ax.set_xticks(np.arange(num_heads), [str(i + 1) for i in range(num_heads)], fontsize=8)
  ax.set_yticks(np.arange(num_layers),
                [f"{i} ({'local' if i in windowed else 'global'})" if windowed else str(i)
                 for i in range(num_layers)], fontsize=8)
  ax.set_xlabel(textwrap.fill("rank of the head within its layer by number of roles "
                              "(small grey number: head index)", width=int(13 * width)))
  ax.set_ylabel("layer")
  for spine in ax.spines.values():
    spine.set_visible(False)
  ax.tick_params(length=0)
  handles = [Line2D([], [], ls="", marker=style.GRID_MARKERS.get(r, "o"), markersize=7,
                    markerfacecolor=style.ROLE_COLORS.get(r, "#333333"), markeredgecolor="black",
                    markeredgewidth=0.4,
                    label=r if r in tested else f"{r} (not computed)") for r in roles]
  fig.legend(handles=handles, loc="outside lower center", ncol=max(1, min(len(roles), 5, int(width / 1.5))), fontsize=8,
             frameon=False, title="role assigned (markers sit at the same place in every cell)",
             title_fontsize=8)
  fig.suptitle(title or FIGURES["role_grid"].title)
  return save_figure(fig, path, dpi)


def plot_role_heatmaps(means, roles, path, *, tau: float, assigned=None, ncols: int = 4,
                       title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Small multiples: one layer x head heatmap of the mean sieve bias per role.

  Args:
    means: float ``[l, h, r]`` mean sieve bias per head and role (NaN: undefined), e.g. from
      :func:`mean_matrix`.
    roles: the r role names.
    tau: the threshold, the centre of the shared (logarithmic, diverging) colour scale.
    assigned: optional bool ``[l, h, r]``; assigned heads get a dot.
  """
  means = np.asarray(means, dtype=np.float64)
  roles = list(roles)
  if means.ndim != 3 or means.shape[-1] != len(roles):
    raise ValueError(f"means must be [layers, heads, roles] with {len(roles)} roles, "
                     f"got shape {means.shape}")
  if assigned is not None:
    assigned = np.asarray(assigned, bool)
    if assigned.shape != means.shape:
      raise ValueError(f"assigned has shape {assigned.shape}, means {means.shape}; they must match")
  if tau <= 0:
    raise ValueError(f"tau must be positive for the logarithmic colour scale, got {tau}")
  num_layers, num_heads, num_roles = means.shape
  ncols = max(1, min(ncols, num_roles))
  nrows = int(np.ceil(num_roles / ncols))
  logs = np.log10(np.where(means > 0, means, np.nan))
  center = np.log10(tau)
  finite = logs[np.isfinite(logs)]
  # colour range: the 99th percentile of the distance to tau (a few extreme heads would
  # otherwise wash out every other cell); values beyond it get the end colours.
  span = max(0.3, float(np.quantile(np.abs(finite - center), 0.99))) if finite.size else 1.0
  norm = mcolors.TwoSlopeNorm(vmin=center - span, vcenter=center, vmax=center + span)
  cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#bdbdbd")
  panel_w = max(2.2, 0.2 * num_heads + 0.6)
  panel_h = max(1.9, 0.17 * num_layers + 0.7)
  fig = new_figure(panel_w * ncols + 1.2, panel_h * nrows + 0.9)
  axes = fig.subplots(nrows, ncols, squeeze=False)
  image = None
  for i, ax in enumerate(axes.ravel()):
    if i >= num_roles:
      ax.set_visible(False)
      continue
    image = ax.imshow(logs[..., i], cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    if assigned is not None:
      yy, xx = np.nonzero(assigned[..., i])
      ax.scatter(xx, yy, s=5, color="black", marker="o", linewidths=0)
    ax.set_title(f"{roles[i]}" + (f" ({int(assigned[..., i].sum())} assigned)"
                                  if assigned is not None else ""), fontsize=9)
    ax.set_xticks(range(0, num_heads, max(1, num_heads // 6)))
    ax.set_yticks(range(0, num_layers, max(1, num_layers // 6)))
    # every panel has the same axes: tick labels on the outer panels only (as the axis titles),
    # which also spares the layout engine most of the figure's text (it measured every label)
    left, bottom = i % ncols == 0, i // ncols == nrows - 1 or i + ncols >= num_roles
    ax.tick_params(labelsize=7, length=2, labelleft=left, labelbottom=bottom)
    if left:
      ax.set_ylabel("layer", fontsize=8)
    if bottom:
      ax.set_xlabel("head", fontsize=8)
  cbar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, pad=0.02, extend="both")
  lo, hi = 10 ** (center - span), 10 ** (center + span)
  ticks = [t for t in (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000) if lo <= t <= hi]
  ticks = sorted(set(ticks + [tau]))
  cbar.set_ticks(np.log10(ticks), labels=[f"{t:g}" for t in ticks])
  cbar.ax.axhline(center, color="black", lw=2)
  cbar.set_label(f"mean sieve bias (log scale; black line: tau = {tau:g})", fontsize=8)
  cbar.ax.tick_params(labelsize=7)
  note = "dots: role assigned" if assigned is not None else ""
  fig.suptitle((title or FIGURES["role_heatmaps"].title) + (f"  ({note}; grey: undefined)"
                                                             if note else "  (grey: undefined)"),
               fontsize=11)
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# Fig. 6: fine-tuning


def plot_finetune_delta(compare_df: pd.DataFrame, path, *, title: str | None = None,
                        dpi: int = DEFAULT_DPI) -> Path:
  """Grouped bars of the change in mean sieve bias per role and layer group.

  Args:
    compare_df: columns role, layer_group (initial / middle / final), before, after, delta; with
      an optional ``task`` column, one panel per task.
  """
  require_columns(compare_df, ("role", "layer_group", "delta"), "fine-tuning comparison table")
  df = compare_df.copy()
  df["role"] = df["role"].astype(str)
  df["layer_group"] = df["layer_group"].astype(str)
  tasks = list(dict.fromkeys(df["task"].astype(str))) if "task" in df.columns else [None]
  roles = roles_lib.role_order(df["role"].unique())
  groups = [g for g in roles_lib.LAYER_GROUPS if g in set(df["layer_group"])]
  groups += sorted(set(df["layer_group"]) - set(groups))
  fig = new_figure(max(7.0, 0.65 * len(roles) + 2.5), 3.6 * len(tasks) + 0.6)
  axes = fig.subplots(len(tasks), 1, squeeze=False)[:, 0]
  width = 0.8 / max(1, len(groups))
  for ax, task in zip(axes, tasks):
    sub = df if task is None else df[df["task"].astype(str) == task]
    table = sub.pivot_table(index="role", columns="layer_group", values="delta", aggfunc="mean")
    table = table.reindex(index=roles, columns=groups)
    x = np.arange(len(roles))
    for j, g in enumerate(groups):
      ax.bar(x + (j - (len(groups) - 1) / 2) * width, table[g].to_numpy(), width=width * 0.95,
             color=style.LAYER_GROUP_COLORS.get(g, style.FALLBACK_COLORS[j % 6]),
             label=f"{g} layers")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, roles, rotation=30, ha="right", fontsize=9)
    ax.set_ylabel("change in mean sieve bias\n(after - before)")
    ax.grid(True, axis="y", alpha=0.3)
    if task is not None:
      ax.set_title(f"task: {task}", fontsize=10, loc="right")
  axes[0].legend(fontsize=9, ncols=len(groups), loc="lower left", bbox_to_anchor=(0.0, 1.0),
                 frameon=False)
  axes[-1].set_xlabel("role")
  fig.suptitle(title or FIGURES["finetune_delta"].title)
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# the registry: how each report draws these figures from its inputs (`heads_jax.report.spec`)


def _paper_scores(i):
  """The sieve bias of the paper's four roles (`roles.PAPER_ROLES`; all when ``roles`` is
  unknown): what the paper pools in Fig. 3."""
  if i.roles is None:
    return i.sieve_bias
  names = list(i.roles)
  return np.asarray(i.sieve_bias)[..., [names.index(r) for r in roles_lib.PAPER_ROLES
                                        if r in names]]


def _draw_score_cdf(i, path, *, title, dpi):
  if i.sieve_bias is None:
    return None
  return plot_score_cdf(_paper_scores(i), path, tau=i.tau, mean=i.mean_score, title=title, dpi=dpi)


def _draw_pvalue_hist(i, path, *, title, dpi):
  if i.tests_df is None or "p_value" not in i.tests_df.columns:
    return None
  tests = i.tests_df[i.tests_df["role"].astype(str).isin(roles_lib.PAPER_ROLES)]
  return plot_pvalue_hist(tests["p_value"], path, band=i.p_band or (0.05, 0.95),
                          alpha=i.alpha, title=title, dpi=dpi)


def _draw_score_distribution(i, path, *, title, dpi):
  if i.sieve_bias is None or i.roles is None or i.tau is None:
    return None
  example = summary_lib.skewed_example(i.sieve_bias, i.roles, float(i.tau),
                                       alpha=float(i.alpha or 0.05))
  if example is None:
    return None
  return plot_score_distribution(example, path, tau=float(i.tau), alpha=float(i.alpha or 0.05),
                                 title=title, dpi=dpi)


def _draw_tau_sweep(i, path, *, title, dpi):
  if i.sieve_bias is None or i.roles is None:
    return None
  sweep = summary_lib.tau_sweep(i.sieve_bias, i.roles, alpha=float(i.alpha or 0.05))
  if sweep.empty:
    return None
  return plot_tau_sweep(sweep, path, tau=i.tau, title=title, dpi=dpi)


def _draw_role_upset(i, path, *, title, dpi):
  return plot_role_upset(i.tests_df, path, title=title, dpi=dpi)


def _draw_role_venn(i, path, *, title, dpi):
  return plot_role_venn(i.tests_df, path, title=title, dpi=dpi)


def _draw_role_grid(i, path, *, title, dpi):
  return plot_role_grid(i.tests_df, path, title=title, dpi=dpi,
                        windowed_layers=i.windowed_layers or ())


def _draw_role_heatmaps(i, path, *, title, dpi):
  """The roles with a defined mean; the others are named in the title."""
  if i.tests_df is None or "mean" not in i.tests_df.columns:
    return None
  order = roles_lib.role_order(i.roles if i.roles is not None else i.tests_df["role"].unique())
  heat_roles = [r for r in order if r in tables.tested_roles(i.tests_df)]
  if not heat_roles:
    return None
  dropped = [r for r in order if r not in heat_roles]
  means, heat_roles = tables.mean_matrix(i.tests_df, heat_roles)
  return plot_role_heatmaps(means, heat_roles, path, tau=i.tau,
                            assigned=tables.assigned_matrix(i.tests_df, heat_roles), dpi=dpi,
                            title=title + (f"; not computed: {', '.join(dropped)}" if dropped else ""))


def _draw_finetune_delta(i, path, *, title, dpi):
  return (None if i.compare_df is None
          else plot_finetune_delta(i.compare_df, path, title=title, dpi=dpi))


# name, title, caption (what is drawn), how (how to read it), how each report draws it
FIGURES.register_all({
    'score_cdf': {
        "title": 'Distribution of all sieve bias scores',
        "caption": ('Cumulative distribution of every per-sequence sieve bias score (all '
                    'heads, roles and sequences), with their mean and the threshold tau '
                    '(Pande et al. Fig. 3a).'),
        "how": ('A point (x, y) means a share y of all scores is at most x; 1 = the head '
                'attends to the sieve as much as to an average position; scores right of tau'
                ' are what a role needs on average.'),
        "draw": _draw_score_cdf,
        "reports": ("analysis",),
        "reproduces": "Fig. 3a",
    },
    'pvalue_hist': {
        "title": 'Histogram of p-values',
        "caption": ('p-values of the one-sided tests (mean sieve bias > tau) over all heads '
                    'and roles, with the band (0.05, 0.95) shaded (Pande et al. Fig. 3b).'),
        "how": ('Few p-values inside the band means almost every test is clear-cut (far '
                'above or far below tau), so the role assignment is not sensitive to the '
                'choice of alpha.'),
        "draw": _draw_pvalue_hist,
        "reports": ("analysis",),
        "reproduces": "Fig. 3b",
    },
    'role_upset': {
        "title": 'Overlap of coarse roles (UpSet)',
        "caption": ('Number of heads for every combination of the coarse roles local, '
                    'syntactic, block and delimiter (Pande et al. Fig. 4).'),
        "how": ('Each column is one combination: the dots below mark which roles it has and '
                'the bar above counts heads with exactly that combination; the bars on the '
                'left count all heads with each role.'),
        "draw": _draw_role_upset,
        "needs": ("tests_df",),
        "reports": ("analysis",),
        "reproduces": "Fig. 4",
        "rule_in_title": True,
    },
    'role_venn': {
        "title": 'Overlap of coarse roles (Venn)',
        "caption": ('Heads with each of the four coarse roles (local, syntactic, block, delimiter: '
                    'the paper\'s four tests), as a Venn diagram of four ellipses (Pande et al. '
                    'Fig. 4); areas are not proportional.'),
        "how": ('Numbers are head counts in each region; a head counted in an overlap has '
                'all roles whose ellipses contain it; heads with none of these roles are '
                'counted in the corner.'),
        "draw": _draw_role_venn,
        "needs": ("tests_df",),
        "reports": ("analysis",),
        "reproduces": "Fig. 4",
        "rule_in_title": True,
    },
    'role_grid': {
        "title": 'Roles of every head',
        "caption": ('Layer x head grid with one marker per assigned fine role (Pande et al. '
                    'Fig. 5); within a layer, heads are sorted by their number of roles.'),
        "how": ('Each cell is one head (its index in the corner); a coloured marker at a '
                'fixed place means that role is assigned, a grey dot that it is not; read '
                'rows to see how roles move through the layers.'),
        "draw": _draw_role_grid,
        "needs": ("tests_df",),
        "reports": ("analysis",),
        "reproduces": "Fig. 5",
        "rule_in_title": True,
    },
    'role_heatmaps': {
        "title": 'Mean sieve bias per head, one panel per role',
        "caption": ('Mean sieve bias of every head (rows = layers, columns = heads) for each'
                    ' role, on one shared logarithmic colour scale centred at tau.'),
        "how": ('Red cells are above tau, blue below, white near tau; a dot marks heads '
                'where the role is assigned (significant); grey cells have no defined score.'),
        "draw": _draw_role_heatmaps,
        "reports": ("analysis",),
        "reproduces": "Fig. 5",
        "rule_in_title": True,
    },
    'finetune_delta': {
        "title": 'Change of sieve bias after fine-tuning',
        "caption": ('Change in mean sieve bias (after - before fine-tuning) per role, for '
                    'the initial, middle and final layers (Pande et al. Fig. 6).'),
        "how": ('Bars above zero mean the heads of that layer group attend more to the '
                "role's sieve after fine-tuning; below zero, less."),
        "draw": _draw_finetune_delta,
        "reports": ("compare",),
        "reproduces": "Fig. 6",
    },
    'score_distribution': {
        "title": 'One head\'s sieve bias across sequences',
        "caption": ('The per-sequence sieve bias of one head and role (of local, syntactic, block, '
                    'delimiter): preferably one whose mean is above tau while the one-sided test of "mean '
                    '> tau" does not reject, else the most skewed one with a mean near tau (Pande et al. '
                    'Fig. 2: "the distributions can be skewed and broad").'),
        "how": ('When the mean (dashed) is right of tau but the lower confidence bound (dotted) is left '
                'of it, an average would assign the role and the test does not: the paper\'s argument '
                'for the test.'),
        "draw": _draw_score_distribution,
        "reports": ("analysis",),
        "reproduces": "Fig. 2",
    },
    'tau_sweep': {
        "title": 'Heads per coarse role as tau varies',
        "caption": ('Share of heads with each coarse role (the four tests) and with none, for tau = 1, '
                    '1.5, ..., 3.5 (the range the authors\' notebook explores), under the paper\'s rule '
                    '(one-sided test at alpha, solid) and the average rule (mean above tau, dashed).'),
        "how": ('The gap between a solid and a dashed line of one colour is the heads an average would '
                'give the role without a significant test; the red line is this run\'s tau.'),
        "draw": _draw_tau_sweep,
        "reports": ("analysis",),
    },
})
