"""Figures of "are the roles real?" (issue 26): roles under attention vs norm weights
(Kobayashi et al. 2020), attention sinks and no-op heads (Gu et al. 2025), heads as dependency
parsers (Clark et al. 2019, section 4), the causal test of a role, and roles over training.
Drawn from the tables of ``heads_jax.pipelines.robustness``, ``heads_jax.ablation.causal`` and
``heads_jax.pipelines.trajectory``. No jax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax.report import style
from heads_jax.report.ablation import is_percent
from heads_jax.report.figures.common import DEFAULT_DPI, new_figure, save_figure
from heads_jax.report.spec import Registry

FIGURES = Registry("Robustness of the roles")
SECTION = "Are the roles real?"
FIGURES.section("analysis", SECTION, intro=(
    "<p>Does a role survive when attention is weighted by what it moves (norm weights "
    "||a[q, k] f(x_k)||, Kobayashi et al. 2020)? Which heads are attention sinks (Gu et al. 2025)? "
    "Do heads parse (Clark et al. 2019, section 4)? Computed by a second pass over the same "
    "sequences (heads-jax analyze; --no-robustness skips it).</p>"))
COARSE_ORDER = ("local", "syntactic", "delimiter", "block")


def plot_weighting_roles(by_weighting: dict, path, *, title: str | None = None,
                         dpi: int = DEFAULT_DPI) -> Path:
  """Share of heads with each coarse role under attention weights and under norm weights
  (``by_weighting`` of ``hoststats.weighting.weighting_summary``). A role the run did not
  compute (None) has no bar and reads "n/a", never 0."""
  roles = [r for r in COARSE_ORDER if r in by_weighting.get("attention", {})]
  fig = new_figure(5.8, 3.4)
  ax = fig.subplots()
  x = np.arange(len(roles))
  for i, (name, color) in enumerate((("attention", "#2c7fb8"), ("norm", "#d95f0e"))):
    shares = [by_weighting.get(name, {}).get(r) for r in roles]
    vals = [np.nan if v is None else 100 * v for v in shares]
    bars = ax.bar(x + (i - 0.5) * 0.38, vals, 0.38, color=color, label=f"{name} weights")
    for b, v in zip(bars, vals):
      label, y = (f"{v:.0f}", v + 1) if np.isfinite(v) else ("n/a", 1)
      ax.text(b.get_x() + b.get_width() / 2, y, label, ha="center", fontsize=8)
  ax.set_xticks(x)
  ax.set_xticklabels(roles)
  ax.set_ylabel("% of heads with the role")
  ax.set_ylim(0, 110)
  ax.legend(frameon=False)
  ax.grid(True, axis="y", alpha=0.3)
  fig.suptitle(title or "Roles under attention and norm weights")
  return save_figure(fig, path, dpi)


def plot_sinks(sinks: pd.DataFrame, path, *, threshold: float = 0.3, title: str | None = None,
               dpi: int = DEFAULT_DPI) -> Path:
  """Per head, by layer: mean attention on the first token (with the sink threshold), on the
  [SEP]s, and the norm ratio (``hoststats.sinks.head_sinks``)."""
  L = int(sinks["layer"].max()) + 1
  sep = sinks[["sep1_attention", "sep2_attention"]].sum(axis=1, min_count=1)
  panels = (("first_attention", sinks["first_attention"], "attention on the first token"),
            ("sep", sep, "attention on the [SEP]s"),
            ("norm_ratio", sinks["norm_ratio"], "norm ratio ||sum a f(x)|| / mean ||f(x)||"))
  fig = new_figure(11.5, 3.4)
  axes = fig.subplots(1, 3)
  rng = np.random.default_rng(0)
  for ax, (name, values, label) in zip(axes, panels):
    layer = sinks["layer"].to_numpy()
    ax.scatter(layer + rng.uniform(-0.18, 0.18, len(layer)), values, s=14, alpha=0.7,
               color="#2c7fb8", edgecolor="none")
    means = pd.Series(np.asarray(values, float)).groupby(layer).mean()
    ax.plot(means.index, means.to_numpy(), "-", color="black", linewidth=1, label="layer mean")
    if name == "first_attention":
      ax.axhline(threshold, color="#b2182b", linestyle=":", linewidth=1,
                 label=f"sink threshold {threshold:g}")
      ax.legend(frameon=False, fontsize=8)
    ax.set_xticks(np.arange(L))
    ax.set_xlabel("layer")
    ax.set_title(label, fontsize=9.5)
    ax.grid(True, alpha=0.3)
  rate = 100 * float(sinks["sink"].mean())
  fig.suptitle(title or f"Attention sinks and no-op heads (sink rate {rate:.0f}%)")
  return save_figure(fig, path, dpi)


def plot_parsing(best: pd.DataFrame, path, *, title: str | None = None,
                 dpi: int = DEFAULT_DPI) -> Path:
  """The best head per relation and direction against the best fixed offset, with their
  bootstrap 95% intervals (``hoststats.parsing.best_heads``)."""
  best = best.reset_index(drop=True)
  m = len(best)
  fig = new_figure(7.0, max(2.4, 0.8 + 0.32 * m))
  ax = fig.subplots()
  y = np.arange(m)[::-1]
  for off, acc, low, high, color, label in (
      (0.17, "accuracy", "low", "high", "#2c7fb8", "best head"),
      (-0.17, "baseline_accuracy", "baseline_low", "baseline_high", "#999999", "best fixed offset")):
    a = 100 * best[acc].to_numpy(float)
    err = np.vstack([a - 100 * best[low].to_numpy(float), 100 * best[high].to_numpy(float) - a])
    ax.barh(y + off, a, 0.32, color=color, label=label, xerr=np.nan_to_num(err), capsize=2,
            error_kw={"linewidth": 0.8})
  labels = [f"{r.relation} {'dep→head' if r.direction == 'dep2head' else 'head→dep'} "
            f"({r.layer}-{r.head} vs {r.baseline_offset:+d}, n={r.n})" for r in best.itertuples()]
  ax.set_yticks(y)
  ax.set_yticklabels(labels, fontsize=7.5)
  ax.set_xlabel("accuracy (%)")
  ax.set_xlim(0, 100)
  ax.legend(frameon=False, fontsize=8, loc="lower right")
  ax.grid(True, axis="x", alpha=0.3)
  fig.suptitle(title or "Heads as dependency parsers")
  return save_figure(fig, path, dpi)


def plot_causal(table: pd.DataFrame, random_changes: dict | None, path, *,
                title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Each role group's metric change when ablated (dot) against the random groups of the same
  layers (box of ``random_changes[group]`` when given, else mean +- sd), with the p-value ("no
  test (whole layers)" for a group that holds every head of its layers: no other group has them);
  changes of accuracy, F1 and exact match in percentage points, of the loss as they are."""
  t = table[table["num_heads"] > 0].reset_index(drop=True)
  metric = t["metric"].iloc[0] if len(t) else "metric"
  scale = 100.0 if is_percent(metric) else 1.0   # accuracy, F1, exact match in points
  fig = new_figure(6.5, max(2.4, 0.9 + 0.38 * len(t)))
  ax = fig.subplots()
  y = np.arange(len(t))[::-1]
  for yi, r in zip(y, t.itertuples()):
    rand = (random_changes or {}).get(r.group)
    tested = np.isfinite(r.p_value)  # no test for a group of whole layers (ablation.causal)
    if rand is not None and len(rand):
      ax.boxplot([scale * np.asarray(rand, float)], positions=[yi], vert=False, widths=0.5,
                 showfliers=False)
    elif tested:
      ax.errorbar(scale * r.random_mean_change, yi, xerr=scale * r.random_std_change, fmt="s",
                  color="#999999", markersize=4, capsize=2)
    ax.plot(scale * r.change, yi, "o", color="#d95f0e")
    ax.text(scale * r.change, yi + 0.2, f"p = {r.p_value:.3f}" if tested else "no test (whole layers)",
            fontsize=7, ha="center")
  ax.axvline(0, color="black", linewidth=0.6)
  ax.set_ylim(-0.7, len(t) - 0.3)
  ax.set_yticks(y)
  ax.set_yticklabels([f"{r.group} ({r.num_heads})" for r in t.itertuples()], fontsize=8)
  ablation = f"{t['ablation'].iloc[0] if len(t) else ''} ablation"
  ax.set_xlabel(f"change of {metric} (percentage points; {ablation})" if is_percent(metric)
                else f"{metric} change ({ablation})")
  ax.grid(True, axis="x", alpha=0.3)
  fig.suptitle(title or "Role groups against random groups of the same layers")
  return save_figure(fig, path, dpi)


_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "*", "h", "p", "d")


def plot_trajectory(traj: pd.DataFrame, path, *, title: str | None = None,
                    dpi: int = DEFAULT_DPI) -> Path:
  """Role shares, mean sieve bias per role and the sink rate against the training step
  (``pipelines.trajectory``: columns step, share_<coarse role>, bias_<role>, sink_rate)."""
  traj = traj.sort_values("step")
  step = traj["step"].to_numpy()
  fig = new_figure(12.0, 3.5)
  axes = fig.subplots(1, 3)
  for col in [c for c in traj.columns if c.startswith("share_")]:
    role = col[len("share_"):]
    axes[0].plot(step, 100 * traj[col], "o-", markersize=3, label=role,
                 color=style.COARSE_COLORS.get(role, "#777777"))
  axes[0].set_ylabel("% of heads")
  axes[0].set_title("coarse role shares", fontsize=9.5)
  # 13 roles: each its own colour (the reports' role colours) and, as a second cue, a marker
  for i, col in enumerate(c for c in traj.columns if c.startswith("bias_")):
    role = col[len("bias_"):]
    axes[1].plot(step, traj[col], linestyle="-", marker=_MARKERS[i % len(_MARKERS)], markersize=3.5,
                 label=role, color=style.ROLE_COLORS.get(role, "#777777"))
  axes[1].axhline(3, color="#b2182b", linestyle=":", linewidth=1)
  axes[1].set_ylabel("mean sieve bias")
  axes[1].set_title("mean sieve bias per role (dotted: tau = 3)", fontsize=9.5)
  axes[2].plot(step, 100 * traj["sink_rate"], "o-", color="black", markersize=3)
  axes[2].set_ylabel("% of heads")
  axes[2].set_title("sink rate (first-token attention > 0.3)", fontsize=9.5)
  for ax in (axes[0], axes[2]):
    ax.set_ylim(-2, 102)
  for ax in axes:
    ax.set_xlabel("training step")
    ax.grid(True, alpha=0.3)
  for ax, size, ncol in ((axes[0], 7, 1), (axes[1], 6.5, 2)):
    if ax.get_legend_handles_labels()[0]:
      ax.legend(frameon=False, fontsize=size, ncol=ncol)
  fig.suptitle(title or "Roles over training")
  return save_figure(fig, path, dpi)


# --- registry: draw functions read the analysis report's inputs ---------------------------------

def _draw_weighting(inputs, path, *, title, dpi):
  by = (inputs.summary or {}).get("by_weighting")
  return plot_weighting_roles(by, path, title=title, dpi=dpi) if by else None


def _draw_sinks(inputs, path, *, title, dpi):
  sinks = inputs.sinks
  if sinks is None or not len(sinks):
    return None
  threshold = (inputs.summary or {}).get("sink_threshold", 0.3)
  return plot_sinks(sinks, path, threshold=threshold, title=title, dpi=dpi)


def _draw_parsing(inputs, path, *, title, dpi):
  best = inputs.best_parsers
  return plot_parsing(best, path, title=title, dpi=dpi) if best is not None and len(best) else None


def _draw_causal(inputs, path, *, title, dpi):
  t = inputs.causal
  if t is None or not len(t) or "p_value" not in t:
    return None
  return plot_causal(t, inputs.causal_random, path, title=title, dpi=dpi)


FIGURES.register_all({
    "robustness_weighting": {
        "title": "Roles under attention and norm weights",
        "caption": ("Share of heads with each coarse role when the sieve bias is computed on the "
                    "attention a[q, k] and on the norm weights ||a[q, k] f(x_k)|| (Kobayashi et al. 2020)."),
        "how": ("A role that drops under norm weights is carried by attention to tokens whose "
                "transformed values are small: the head attends there but moves little from there."),
        "draw": _draw_weighting,
        "reports": ("analysis",),
        "section": SECTION,
        "rule_in_title": True,
    },
    "robustness_sinks": {
        "title": "Attention sinks and no-op heads",
        "caption": ("Each dot is one head: its mean attention on the first token and on the [SEP]s, and "
                    "its norm ratio; the line is the layer mean."),
        "how": ("Heads above the dotted line are sink heads (Gu et al. 2025). A small norm ratio means "
                "the head's output is small next to what it could move: a no-op."),
        "draw": _draw_sinks,
        "reports": ("analysis",),
        "section": SECTION,
    },
    "robustness_parsing": {
        "title": "Heads as dependency parsers",
        "caption": ("Per relation and direction: the most accurate head (layer-head) and the best fixed "
                    "offset, with bootstrap 95% intervals over sentences (Clark et al. 2019, section 4)."),
        "how": ("A head parses a relation when its interval lies above the offset's bar; the offset "
                "alone already gets many amod and advmod arcs."),
        "draw": _draw_parsing,
        "reports": ("analysis",),
        "section": SECTION,
        "reproduces": "Table 1 (per relation)",
    },
    "robustness_causal": {
        "title": "Causal test of the roles",
        "caption": ("Each role group's metric change when its heads are ablated (dot) and the changes of "
                    "random groups with the same number of heads per layer, with the permutation p-value."),
        "how": "A role matters when its dot lies beyond the random groups (small p).",
        "draw": _draw_causal,
        "reports": ("ablation",),
        "section": "Causal test of the roles",
    },
})
