"""Figures of the analysis report (matplotlib, PNG; host side, no jax).

Every ``plot_xxx(..., path) -> Path`` draws one figure from plain arrays / DataFrames (the
contract files of DESIGN.md section 4) and writes it as a PNG at ``path`` (parent folders are
created). The figures follow Pande et al. 2021 (Figs. 3-6) and Guan et al. 2020 (Figs. 1-3);
``FIGURE_TEXT`` holds the title, caption and a "how to read this" line per standard figure name,
used by :mod:`heads_jax.report.html`.

Nothing statistical is computed here beyond simple means and counts for drawing: tests, role
assignment and clusters come from ``tests.csv`` / ``clusters.csv``.

Axis letters in shapes: b sequence (batch), l layer, h head, r role, d feature.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib import patches as mpatches
from matplotlib import ticker as mticker
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from heads_jax.data import batch as batch_lib
from heads_jax.report import style

DEFAULT_DPI = 110

# name -> (title, caption, how to read). Captions say what is drawn; "how" says how to read it.
FIGURE_TEXT = {
    "score_cdf": (
        "Distribution of all sieve bias scores",
        "Cumulative distribution of every per-sequence sieve bias score (all heads, roles and "
        "sequences), with their mean and the threshold tau (Pande et al. Fig. 3a).",
        "A point (x, y) means a share y of all scores is at most x; 1 = the head attends to the "
        "sieve as much as to an average position; scores right of tau are what a role needs on "
        "average."),
    "pvalue_hist": (
        "Histogram of p-values",
        "p-values of the one-sided tests (mean sieve bias > tau) over all heads and roles, with "
        "the band (0.05, 0.95) shaded (Pande et al. Fig. 3b).",
        "Few p-values inside the band means almost every test is clear-cut (far above or far "
        "below tau), so the role assignment is not sensitive to the choice of alpha."),
    "role_upset": (
        "Overlap of coarse roles (UpSet)",
        "Number of heads for every combination of the coarse roles local, syntactic, block and "
        "delimiter (Pande et al. Fig. 4).",
        "Each column is one combination: the dots below mark which roles it has and the bar "
        "above counts heads with exactly that combination; the bars on the left count all heads "
        "with each role."),
    "role_venn": (
        "Overlap of coarse roles (Venn)",
        "Heads with the coarse roles shown, as a Venn diagram (areas roughly proportional).",
        "Numbers are head counts in each region; a head counted in an overlap has all roles "
        "whose circles contain it; heads with none of these roles are counted in the corner."),
    "role_grid": (
        "Roles of every head",
        "Layer x head grid with one marker per assigned fine role (Pande et al. Fig. 5); within a "
        "layer, heads are sorted by their number of roles.",
        "Each cell is one head (its index in the corner); a coloured marker at a fixed place means "
        "that role is assigned, a grey dot that it is not; read rows to see how roles move "
        "through the layers."),
    "role_heatmaps": (
        "Mean sieve bias per head, one panel per role",
        "Mean sieve bias of every head (rows = layers, columns = heads) for each role, on one "
        "shared logarithmic colour scale centred at tau.",
        "Red cells are above tau, blue below, white near tau; a dot marks heads where the role is "
        "assigned (significant); grey cells have no defined score."),
    "finetune_delta": (
        "Change of sieve bias after fine-tuning",
        "Change in mean sieve bias (after - before fine-tuning) per role, for the initial, middle "
        "and final layers (Pande et al. Fig. 6).",
        "Bars above zero mean the heads of that layer group attend more to the role's sieve "
        "after fine-tuning; below zero, less."),
    "cluster_tsne": (
        "t-SNE of heads by distance features",
        "Every head placed by t-SNE of its 21 distance features, coloured by K-means cluster "
        "(Guan et al. Fig. 1); the number at each point is its layer.",
        "Nearby points attend similarly; t-SNE distances between far-apart groups are not "
        "meaningful, only the grouping is."),
    "cluster_layers": (
        "Attention type per layer",
        "Number of heads of each attention type (cluster) in every layer (Guan et al. Fig. 2).",
        "Read a bar bottom-up to see how many heads of the layer are of each type; compare bars "
        "to see types moving through the depth."),
    "cluster_features": (
        "Distance features per attention type",
        "Box plots of the 21 distance features of the heads in each cluster (Guan et al. Fig. 3): "
        "attention mass in 16 relative-distance windows, to itself, [CLS], [SEP], ',' and '.'.",
        "Boxes span the middle half of the heads, the line is the median; a cluster with high "
        "'self' and 'w0' is diagonal, high [CLS]/[SEP] vertical, spread over windows dense."),
    "cluster_changes": (
        "Attention type before and after fine-tuning",
        "Number of heads with each pair (type before, type after fine-tuning).",
        "The diagonal holds heads that kept their type; every off-diagonal count is heads that "
        "changed type (row: before, column: after)."),
}


# ---------------------------------------------------------------------------------------------
# helpers


_PLAIN = mticker.FuncFormatter(lambda v, _pos: f"{v:g}")


def _new_figure(width: float, height: float, constrained: bool = True) -> Figure:
  return Figure(figsize=(width, height), layout="constrained" if constrained else None)


def _save(fig: Figure, path, dpi: int) -> Path:
  path = Path(path)
  if path.suffix.lower() != ".png":
    raise ValueError(f"figure path must end in .png, got {str(path)!r}")
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=dpi, format="png", facecolor="white")
  return path


def _finite(values) -> np.ndarray:
  """float64 ``[m]``: the finite entries of ``values`` (any shape), flattened."""
  v = np.asarray(values, dtype=np.float64).ravel()
  return v[np.isfinite(v)]


def require_columns(df, columns, what: str):
  if not isinstance(df, pd.DataFrame):
    raise TypeError(f"{what} must be a pandas DataFrame, got {type(df).__name__}")
  missing = [c for c in columns if c not in df.columns]
  if missing:
    raise ValueError(f"{what} lacks columns {missing}; it needs {list(columns)}, "
                     f"has {list(df.columns)}")


def _empty_note(ax, text: str):
  ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=11,
          color="#555555")
  ax.set_xticks([])
  ax.set_yticks([])


def _coarse_flags(flags_or_tests: pd.DataFrame, sets) -> tuple[pd.DataFrame, list[str]]:
  """Per-head bool flags for the coarse ``sets`` and the sets actually computed.

  Accepts a tests table (``role`` column; coarse roles none of whose fine roles were tested are
  dropped) or a per-head table that already holds one bool column per set.
  """
  if "role" in flags_or_tests.columns:
    tested = set(style.tested_roles(flags_or_tests))
    flags = style.coarse_role_flags(flags_or_tests)
    computed = [s for s in sets if any(r in tested for r in style.COARSE_ROLES.get(s, (s,)))]
    if sets and not all(s in style.COARSE_ROLES for s in sets):
      bad = [s for s in sets if s not in style.COARSE_ROLES]
      raise ValueError(f"unknown coarse roles {bad}; choose from {list(style.COARSE_ROLES)}")
    return flags, computed
  require_columns(flags_or_tests, list(sets), "per-head role flags")
  flags = flags_or_tests.copy()
  for s in sets:
    flags[s] = style.as_bool(flags[s])
  return flags, list(sets)


# ---------------------------------------------------------------------------------------------
# Pande et al. Fig. 3: scores and p-values


def plot_score_cdf(scores, path, *, tau: float, mean: float | None = None, title: str | None = None,
                   dpi: int = DEFAULT_DPI) -> Path:
  """CDF of all sieve bias scores with their mean and tau marked (log x axis).

  Args:
    scores: any shape, e.g. ``sieve_bias`` float ``[b, l, h, r]``; NaN entries are ignored.
    tau: the test threshold, drawn as a vertical line.
    mean: the value to mark as "mean of all scores"; default: the mean of the finite scores.
  """
  values = np.sort(_finite(scores))
  fig = _new_figure(7.5, 4.6)
  ax = fig.add_subplot()
  if values.size == 0:
    _empty_note(ax, "no finite sieve bias scores")
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
    ax.xaxis.set_major_formatter(_PLAIN)
    ax.set_xlim(left, max(float(values.max()), tau, mean, 1.0) * 1.3)
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
  ax.set_title(title or FIGURE_TEXT["score_cdf"][0])
  return _save(fig, path, dpi)


def plot_pvalue_hist(p_values, path, *, band=(0.05, 0.95), alpha: float | None = None,
                     bins: int = 20, title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Histogram of the tests' p-values (log count axis) with the ``band`` shaded.

  Args:
    p_values: any shape (e.g. ``tests.csv`` column ``p_value``); NaN entries are ignored.
    band: the interval whose share is annotated (the paper's (0.05, 0.95)).
    alpha: the significance level, drawn as a line when given.
  """
  p = _finite(p_values)
  if p.size and ((p < 0).any() or (p > 1).any()):
    raise ValueError("p-values must lie in [0, 1]; pass the p_value column of tests.csv")
  fig = _new_figure(7.5, 4.6)
  ax = fig.add_subplot()
  if p.size == 0:
    _empty_note(ax, "no p-values (no role had a defined test)")
  else:
    counts, edges = np.histogram(p, bins=bins, range=(0.0, 1.0))
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#4c72b0",
           edgecolor="white", label=f"tests (n = {p.size:,})")
    ax.set_yscale("symlog", linthresh=1)
    ax.yaxis.set_major_formatter(_PLAIN)
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
  ax.set_title(title or FIGURE_TEXT["pvalue_hist"][0])
  return _save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# Pande et al. Fig. 4: role overlap


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


def _upset_with_library(fig: Figure, flags: pd.DataFrame, sets):
  import upsetplot  # optional: broken with pandas >= 3 (copy-on-write) as of upsetplot 0.9
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    data = upsetplot.from_indicators(list(sets), data=flags[list(sets)].astype(bool))
    upsetplot.UpSet(data, subset_size="count", show_counts=True, sort_by="cardinality",
                    sort_categories_by="input").plot(fig=fig)


def _upset_by_hand(fig: Figure, flags: pd.DataFrame, sets):
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
                    sets=("local", "syntactic", "block", "delimiter"), engine: str = "auto",
                    title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """UpSet plot of the heads' coarse roles.

  Args:
    tests_or_flags: a tests table (``tests.csv``: layer, head, role, assigned) or a per-head
      table with one bool column per set.
    sets: coarse roles to intersect; those none of whose fine roles was tested are dropped.
    engine: ``"upsetplot"`` (the library), ``"manual"`` (drawn here), or ``"auto"``: the library,
      falling back to the hand-drawn version when it fails (upsetplot 0.9 breaks on pandas 3).
  """
  if engine not in ("auto", "upsetplot", "manual"):
    raise ValueError(f"engine must be 'auto', 'upsetplot' or 'manual', got {engine!r}")
  flags, sets = _coarse_flags(tests_or_flags, sets)
  heads = len(flags)
  label = title or FIGURE_TEXT["role_upset"][0]
  if not sets or heads == 0:
    fig = _new_figure(7, 3.5)
    _empty_note(fig.add_subplot(), "no coarse role was tested")
    fig.suptitle(label)
    return _save(fig, path, dpi)
  width = 3.2 + 0.55 * max(4, len(upset_counts(flags, sets)))
  fig = _new_figure(min(width, 16), 5.2, constrained=False)
  drawn = False
  if engine in ("auto", "upsetplot"):
    try:
      _upset_with_library(fig, flags, sets)
      drawn = True
    except Exception:  # noqa: BLE001 - any failure of the optional library: draw it by hand
      if engine == "upsetplot":
        raise
      fig.clf()
  if not drawn:
    _upset_by_hand(fig, flags, sets)
  fig.suptitle(f"{label} ({heads} heads)", fontsize=12)
  fig.subplots_adjust(left=0.03, right=0.98, top=0.9, bottom=0.1 if not drawn else 0.05)
  return _save(fig, path, dpi)


def _venn_by_hand(ax, flags: pd.DataFrame, sets):
  """Venn diagram of 2 or 3 sets with equal circles and region counts (no library)."""
  k = len(sets)
  centres = [(-0.5, 0.0), (0.5, 0.0)] if k == 2 else [(-0.5, 0.3), (0.5, 0.3), (0.0, -0.55)]
  for (cx, cy), s in zip(centres, sets):
    ax.add_patch(mpatches.Circle((cx, cy), 0.9, alpha=0.3,
                                 color=style.COARSE_COLORS.get(s, "#888888")))
    ax.add_patch(mpatches.Circle((cx, cy), 0.9, fill=False, lw=1.2,
                                 color=style.COARSE_COLORS.get(s, "#888888")))
  counts = upset_counts(flags, sets)
  for combo in itertools.product([False, True], repeat=k):
    if not any(combo):
      continue
    members = [c for c, on in zip(centres, combo) if on]
    others = [c for c, on in zip(centres, combo) if not on]
    px = np.mean([c[0] for c in members])
    py = np.mean([c[1] for c in members])
    # push the label away from the circles it is not in
    for ox, oy in others:
      px += (px - ox) * 0.35
      py += (py - oy) * 0.35
    ax.text(px, py, str(int(counts.get(combo, 0))), ha="center", va="center", fontsize=12)
  for (cx, cy), s in zip(centres, sets):
    lx, ly = cx * 1.9, cy * 1.9 + (0.1 if cy >= 0 else -0.2)
    if k == 2:
      ly = 1.05
    ax.text(lx, ly, s, ha="center", va="center", fontsize=12, fontweight="bold",
            color=style.COARSE_COLORS.get(s, "#333333"))
  ax.set_xlim(-1.9, 1.9)
  ax.set_ylim(-1.8, 1.6)
  ax.set_aspect("equal")
  ax.axis("off")


def plot_role_venn(tests_or_flags: pd.DataFrame, path, *, sets=("local", "syntactic", "delimiter"),
                   title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Venn diagram of 2 or 3 coarse roles (matplotlib-venn when installed, else drawn here).

  Args:
    tests_or_flags: a tests table or per-head bool flags (as for :func:`plot_role_upset`).
    sets: 2 or 3 coarse roles; those not tested at all are dropped (fewer than 2 left: a note).
  """
  if not 2 <= len(sets) <= 3:
    raise ValueError(f"a Venn diagram needs 2 or 3 sets, got {list(sets)}; use plot_role_upset "
                     "for more")
  flags, sets = _coarse_flags(tests_or_flags, sets)
  fig = _new_figure(6.2, 5.4)
  ax = fig.add_subplot()
  label = title or FIGURE_TEXT["role_venn"][0]
  if len(sets) < 2:
    _empty_note(ax, "fewer than two of these roles were tested")
    ax.set_title(label)
    return _save(fig, path, dpi)
  members = [set(np.flatnonzero(flags[s].to_numpy())) for s in sets]
  none = int((~flags[list(sets)].any(axis=1)).sum())
  if not any(members):
    _empty_note(ax, f"no head has any of the roles {', '.join(sets)}")
  else:
    try:
      import matplotlib_venn as mv
      colors = [style.COARSE_COLORS.get(s, "#888888") for s in sets]
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = mv.venn2 if len(sets) == 2 else mv.venn3
        fn(subsets=members, set_labels=list(sets), set_colors=colors, alpha=0.45, ax=ax)
    except ImportError:
      _venn_by_hand(ax, flags, sets)
  ax.text(0.0, 0.0, f"none of these roles: {none} heads", transform=ax.transAxes, fontsize=9,
          color="#555555", ha="left", va="bottom")
  ax.set_title(f"{label} ({len(flags)} heads)")
  return _save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# Pande et al. Fig. 5: role grid


_GRID_MARKERS = {"cls": "s", "sep": "s", "nsubj": "^", "obj": "^", "amod": "^", "advmod": "^",
                 "prev_local": "o", "next_local": "o", "block": "D"}


def sorted_heads(assigned: np.ndarray) -> np.ndarray:
  """int ``[l, h]``: per layer, head indices sorted by number of roles (most first, ties by index).

  Args:
    assigned: bool ``[l, h, r]``.
  """
  num = assigned.sum(-1)
  return np.stack([np.lexsort((np.arange(num.shape[1]), -row)) for row in num])


def plot_role_grid(tests_df: pd.DataFrame, path, *, roles=style.GRID_ROLES, title: str | None = None,
                   dpi: int = DEFAULT_DPI) -> Path:
  """Layer x head grid, one cell per head with a marker per assigned fine role.

  Args:
    tests_df: ``tests.csv`` (layer, head, role, assigned).
    roles: the fine roles drawn, each at a fixed place of a 3-column sub-grid in the cell.
  """
  df = style.check_tests_df(tests_df)
  roles = list(roles)
  tested = set(style.tested_roles(df))
  num_layers, num_heads = style.grid_shape(df)
  assigned = style.assigned_matrix(df, roles)  # [l, h, r]
  order = sorted_heads(assigned)
  ncol = 3
  nrow = int(np.ceil(len(roles) / ncol))
  fig = _new_figure(1.2 + 0.62 * num_heads, 1.9 + 0.58 * num_layers)
  ax = fig.add_subplot()
  offsets = [((i % ncol) - (ncol - 1) / 2) * 0.26 for i in range(len(roles))]
  offsets_y = [((i // ncol) - (nrow - 1) / 2) * 0.24 for i in range(len(roles))]
  on_points = {role: [] for role in roles}
  off_points = []
  for layer in range(num_layers):
    for col in range(num_heads):
      head = order[layer, col]
      ax.add_patch(mpatches.Rectangle((col - 0.46, layer - 0.46), 0.92, 0.92, fill=True,
                                      facecolor="#fafafa", edgecolor="#cccccc", lw=0.6))
      ax.text(col - 0.43, layer - 0.43, str(head), fontsize=5.5, color="#777777",
              ha="left", va="top")
      for i, role in enumerate(roles):
        point = (col + offsets[i], layer + offsets_y[i] + 0.05)
        (on_points[role] if assigned[layer, head, i] else off_points).append(point)
  if off_points:
    ax.scatter(*np.array(off_points).T, s=2, color="#d0d0d0", zorder=2)
  for role, points in on_points.items():
    if points:
      ax.scatter(*np.array(points).T, s=22, marker=_GRID_MARKERS.get(role, "o"),
                 color=style.ROLE_COLORS.get(role, "#333333"), edgecolor="black",
                 linewidths=0.3, zorder=3)
  ax.set_xlim(-0.55, num_heads - 0.45)
  ax.set_ylim(num_layers - 0.5, -0.55)
  ax.set_xticks(np.arange(num_heads), [str(i + 1) for i in range(num_heads)], fontsize=8)
  ax.set_yticks(np.arange(num_layers), [str(i) for i in range(num_layers)], fontsize=8)
  ax.set_xlabel("rank of the head within its layer by number of roles "
                "(small grey number: head index)")
  ax.set_ylabel("layer")
  for spine in ax.spines.values():
    spine.set_visible(False)
  ax.tick_params(length=0)
  handles = [Line2D([], [], ls="", marker=_GRID_MARKERS.get(r, "o"), markersize=7,
                    markerfacecolor=style.ROLE_COLORS.get(r, "#333333"), markeredgecolor="black",
                    markeredgewidth=0.4,
                    label=r if r in tested else f"{r} (not computed)") for r in roles]
  fig.legend(handles=handles, loc="outside lower center", ncol=min(len(roles), 5), fontsize=8,
             frameon=False, title="role assigned (markers sit at the same place in every cell)",
             title_fontsize=8)
  fig.suptitle(title or FIGURE_TEXT["role_grid"][0])
  return _save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# heatmaps of the mean sieve bias


def mean_matrix(tests_df: pd.DataFrame, roles=None) -> tuple[np.ndarray, list[str]]:
  """float ``[l, h, r]`` of the ``mean`` column of a tests table (NaN where absent), and the roles."""
  df = style.check_tests_df(tests_df, required=("layer", "head", "role", "mean"))
  roles = style.role_order(df["role"].unique()) if roles is None else list(roles)
  num_layers, num_heads = style.grid_shape(df)
  out = np.full((num_layers, num_heads, len(roles)), np.nan)
  index = {r: i for i, r in enumerate(roles)}
  sel = df[df["role"].isin(roles)]
  out[sel["layer"].to_numpy(), sel["head"].to_numpy(), sel["role"].map(index).to_numpy(dtype=int)
      ] = sel["mean"].astype(float).to_numpy()
  return out, roles


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
  fig = _new_figure(panel_w * ncols + 1.2, panel_h * nrows + 0.9)
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
    ax.tick_params(labelsize=7, length=2)
    if i % ncols == 0:
      ax.set_ylabel("layer", fontsize=8)
    if i // ncols == nrows - 1 or i + ncols >= num_roles:
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
  fig.suptitle((title or FIGURE_TEXT["role_heatmaps"][0]) + (f"  ({note}; grey: undefined)"
                                                             if note else "  (grey: undefined)"),
               fontsize=11)
  return _save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# Pande et al. Fig. 6: fine-tuning


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
  roles = style.role_order(df["role"].unique())
  groups = [g for g in style.LAYER_GROUPS if g in set(df["layer_group"])]
  groups += sorted(set(df["layer_group"]) - set(groups))
  fig = _new_figure(max(7.0, 0.65 * len(roles) + 2.5), 3.6 * len(tasks) + 0.6)
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
  fig.suptitle(title or FIGURE_TEXT["finetune_delta"][0])
  return _save(fig, path, dpi)


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
  fig = _new_figure(1.6 + 1.1 * len(names), 1.4 + 0.9 * len(names))
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
  ax.set_title(f"{title or FIGURE_TEXT['cluster_changes'][0]}\n"
               f"{changed} of {len(before)} heads changed type", fontsize=11)
  return _save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# Guan et al. Figs. 1-3: clusters


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
  fig = _new_figure(7.2, 6.0)
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
  ax.set_title(title or FIGURE_TEXT["cluster_tsne"][0])
  return _save(fig, path, dpi)


def plot_cluster_layers(clusters_df: pd.DataFrame, path, *, title: str | None = None,
                        dpi: int = DEFAULT_DPI) -> Path:
  """Stacked bars: number of heads of each cluster type per layer."""
  _check_clusters(clusters_df)
  layers = clusters_df["layer"].astype(int)
  names = clusters_df["cluster_name"].astype(str)
  palette = style.cluster_colors(names)
  all_layers = np.arange(layers.max() + 1)
  table = pd.crosstab(layers, names).reindex(index=all_layers, columns=list(palette), fill_value=0)
  fig = _new_figure(max(6.5, 0.45 * len(all_layers) + 2.5), 4.4)
  ax = fig.add_subplot()
  bottom = np.zeros(len(all_layers))
  for name, color in palette.items():
    values = table[name].to_numpy()
    ax.bar(all_layers, values, bottom=bottom, color=color, label=name, width=0.8,
           edgecolor="white", linewidth=0.5)
    bottom += values
  ax.set_xticks(all_layers)
  ax.set_xlabel("layer")
  ax.set_ylabel("number of heads")
  ax.legend(title="attention type", fontsize=9, title_fontsize=9, loc="upper left",
            bbox_to_anchor=(1.01, 1.0))
  ax.set_title(title or FIGURE_TEXT["cluster_layers"][0])
  return _save(fig, path, dpi)


FEATURE_LABELS = tuple(f"w{i}" for i in range(16)) + ("self", "[CLS]", "[SEP]", "comma", "period")


def plot_cluster_features(clusters_df: pd.DataFrame, path, *,
                          features=batch_lib.DISTANCE_FEATURES, title: str | None = None,
                          dpi: int = DEFAULT_DPI) -> Path:
  """One panel per cluster with box plots of the 21 distance features of its heads."""
  _check_clusters(clusters_df, tuple(features))
  names = clusters_df["cluster_name"].astype(str).to_numpy()
  palette = style.cluster_colors(names)
  labels = list(FEATURE_LABELS) if tuple(features) == batch_lib.DISTANCE_FEATURES else list(features)
  values = clusters_df[list(features)].astype(float).to_numpy()  # [heads, d]
  top = min(1.02, float(np.nanmax(values)) * 1.08 + 0.02) if np.isfinite(values).any() else 1.02
  ncols = 2 if len(palette) > 1 else 1
  nrows = int(np.ceil(len(palette) / ncols))
  fig = _new_figure(6.2 * ncols, 3.0 * nrows + 0.6)
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
  fig.suptitle(title or FIGURE_TEXT["cluster_features"][0])
  return _save(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# all figures of one analysis


def analysis_figures(fig_dir, *, sieve_bias, roles, tests_df: pd.DataFrame, tau: float,
                     alpha: float | None = None, clusters_df: pd.DataFrame | None = None,
                     mean_score: float | None = None, p_band=(0.05, 0.95),
                     dpi: int = DEFAULT_DPI) -> dict[str, Path]:
  """Draw every figure of an analysis run into ``fig_dir``; returns ``{name: png path}``.

  Args:
    sieve_bias: float ``[b, l, h, r]`` (scores.npz); only used for the score CDF.
    roles: the r role names of ``sieve_bias``.
    tests_df: tests.csv; clusters_df: clusters.csv or None (cluster figures left out).
    mean_score: the summary's mean of all sieve scores, marked on the CDF (default: computed).
    p_band: the p-value interval shaded in the histogram.
  """
  fig_dir = Path(fig_dir)
  tests_df = style.check_tests_df(tests_df)
  out = {}
  out["score_cdf"] = plot_score_cdf(sieve_bias, fig_dir / "score_cdf.png", tau=tau,
                                    mean=mean_score, dpi=dpi)
  if "p_value" in tests_df.columns:
    out["pvalue_hist"] = plot_pvalue_hist(tests_df["p_value"], fig_dir / "pvalue_hist.png",
                                          band=p_band, alpha=alpha, dpi=dpi)
  out["role_upset"] = plot_role_upset(tests_df, fig_dir / "role_upset.png", dpi=dpi)
  out["role_venn"] = plot_role_venn(tests_df, fig_dir / "role_venn.png", dpi=dpi)
  out["role_grid"] = plot_role_grid(tests_df, fig_dir / "role_grid.png", dpi=dpi)
  heat_roles = [r for r in style.role_order(roles) if r in style.tested_roles(tests_df)]
  if "mean" in tests_df.columns and heat_roles:
    dropped = [r for r in style.role_order(roles) if r not in heat_roles]
    means, heat_roles = mean_matrix(tests_df, heat_roles)
    out["role_heatmaps"] = plot_role_heatmaps(
        means, heat_roles, fig_dir / "role_heatmaps.png", tau=tau,
        assigned=style.assigned_matrix(tests_df, heat_roles), dpi=dpi,
        title=FIGURE_TEXT["role_heatmaps"][0]
        + (f"; not computed: {', '.join(dropped)}" if dropped else ""))
  if clusters_df is not None and len(clusters_df):
    if {"tsne_x", "tsne_y"} <= set(clusters_df.columns) and np.isfinite(
        clusters_df[["tsne_x", "tsne_y"]].astype(float).to_numpy()).all():
      out["cluster_tsne"] = plot_cluster_tsne(clusters_df, fig_dir / "cluster_tsne.png", dpi=dpi)
    out["cluster_layers"] = plot_cluster_layers(clusters_df, fig_dir / "cluster_layers.png", dpi=dpi)
    if set(batch_lib.DISTANCE_FEATURES) <= set(clusters_df.columns):
      out["cluster_features"] = plot_cluster_features(clusters_df, fig_dir / "cluster_features.png",
                                                      dpi=dpi)
  return out
