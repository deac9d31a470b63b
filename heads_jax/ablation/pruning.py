"""Iterative head pruning by importance (Michel et al. 2019, sec. 5), against random pruning.

Heads are removed (gate 0, ``gate_mode="remove"``; or replaced by uniform attention with
``gate_mode="uniform"``) in steps of ``step`` of all heads (10% by default, 5% as an option):
at step i the ``round(i * step * L * H)`` least important heads are pruned and the classifier
is evaluated on its data. With ``reestimate=True`` (Michel et al.) the importance is computed
again, on the pruned model, before each step and the least important of the remaining heads
are added to the pruned set; with ``reestimate=False`` the heads are pruned in the order of
the importance of the full model. Random pruning removes the heads in a random order (the same
nested sets along the curve), for a few seeds; its curve is their mean.

The curve at share 0 is the unablated model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from heads_jax.errors import UserError
from heads_jax.report.ablation import value_text

CURVE_COLUMNS = ("method", "seed", "step", "share_pruned", "num_pruned", "accuracy", "f1",
                 "loss", "pruned")


def pruning_counts(total: int, step: float = 0.1, max_share: float = 1.0) -> list[int]:
  """Numbers of pruned heads along the curve: ``round(i * step * total)`` for i = 0, 1, ...
  while ``i * step <= max_share`` (duplicates dropped; 0 first)."""
  if not 0 < step <= 1:
    raise UserError(f"the pruning step must be a share in (0, 1], e.g. 0.1 or 0.05; got {step}")
  if not 0 < max_share <= 1:
    raise UserError(f"the largest pruned share must be in (0, 1], got {max_share}")
  counts, i = [], 0
  while i * step <= max_share + 1e-9:
    counts.append(min(total, int(round(i * step * total))))
    i += 1
  return list(dict.fromkeys(counts))


def _row(method, seed, i, count, total, metrics, pruned):
  return {"method": method, "seed": seed, "step": i, "share_pruned": count / total,
          "num_pruned": count, "accuracy": metrics["accuracy"], "f1": metrics["f1"],
          "loss": metrics["loss"], "pruned": ",".join(f"{l}:{h}" for l, h in pruned)}


def importance_order(importance, pruned_mask) -> list[tuple[int, int]]:
  """Heads not yet pruned, least important first (ties broken by layer, then head)."""
  imp = np.asarray(importance, np.float64)
  num_heads = imp.shape[1]
  flat = np.where(np.asarray(pruned_mask, bool).ravel(), np.inf, imp.ravel())
  order = np.lexsort((np.arange(flat.size), flat))
  return [(int(i // num_heads), int(i % num_heads)) for i in order if np.isfinite(flat[i])]


def pruning_curve(evaluator, estimator=None, *, step: float = 0.1, max_share: float = 1.0,
                  reestimate: bool = True, random_seeds: int = 3, seed: int = 0,
                  gate_mode: str = "remove", log=None) -> pd.DataFrame:
  """The metric along importance-ordered and random pruning.

  Args:
    evaluator: an ``Evaluator`` (its data is where the metric is measured).
    estimator: an ``ImportanceEstimator`` (importance-ordered curve), or None to draw only the
      random curves.
    step, max_share: the shares pruned (``pruning_counts``).
    reestimate: recompute the importance after each step (Michel et al.) or once.
    random_seeds: number of random orders (seeds ``seed, seed + 1, ...``).
    gate_mode: how pruned heads are removed (``"remove"``: gate 0; ``"uniform"``).

  Returns:
    a DataFrame with ``CURVE_COLUMNS``: one row per (method, seed, step); ``method`` is
    ``importance`` or ``random`` (``seed`` -1 for importance); ``pruned`` lists the pruned heads.
  """
  L, H = evaluator.num_layers, evaluator.num_heads
  total = L * H
  counts = pruning_counts(total, step, max_share)
  log = log or (lambda *_: None)
  rows = []
  base = evaluator.evaluate(gate_mode=gate_mode)
  if estimator is not None:
    mask = np.zeros((L, H), bool)
    pruned: list[tuple[int, int]] = []
    order = None if reestimate else importance_order(estimator(), mask)
    for i, count in enumerate(counts):
      if count > len(pruned):
        if reestimate:
          gate = (~mask).astype(np.float32)
          order = importance_order(estimator(gate), mask)
          new = order[:count - len(pruned)]
        else:
          new = order[len(pruned):count]
        for l, h in new:
          mask[l, h] = True
        pruned += new
      metrics = base if count == 0 else evaluator.evaluate((~mask).astype(np.float32),
                                                           gate_mode=gate_mode)
      rows.append(_row("importance", -1, i, count, total, metrics, pruned))
      log(f"importance pruning: {count}/{total} heads pruned, accuracy "
          f"{value_text('accuracy', metrics['accuracy'])}")
  for s in range(random_seeds):
    perm = np.random.default_rng(seed + s).permutation(total)
    order = [(int(j // H), int(j % H)) for j in perm]
    for i, count in enumerate(counts):
      gate = np.ones((L, H), np.float32)
      for l, h in order[:count]:
        gate[l, h] = 0.0
      metrics = base if count == 0 else evaluator.evaluate(gate, gate_mode=gate_mode)
      rows.append(_row("random", seed + s, i, count, total, metrics, sorted(order[:count])))
    log(f"random pruning, seed {seed + s}: done")
  return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))


def curve_summary(curve: pd.DataFrame, metrics=("accuracy", "f1")) -> pd.DataFrame:
  """One row per share pruned: the importance curve's metrics and the random curves' mean and
  standard deviation (columns ``<metric>_importance``, ``<metric>_random``,
  ``<metric>_random_std``)."""
  metrics = [m for m in metrics if m in curve.columns]
  keys = ["step", "share_pruned", "num_pruned"]
  out = curve[keys].drop_duplicates().sort_values("step").reset_index(drop=True)
  imp = curve[curve["method"] == "importance"]
  rnd = curve[curve["method"] == "random"]
  for m in metrics:
    if len(imp):
      out = out.merge(imp[keys + [m]].rename(columns={m: f"{m}_importance"}), on=keys, how="left")
    if len(rnd):
      g = rnd.groupby("step")[m]
      out[f"{m}_random"] = out["step"].map(g.mean())
      out[f"{m}_random_std"] = out["step"].map(g.std(ddof=0))
  return out


def wilson(k: float, n: int, z: float = 1.959964) -> tuple[float, float]:
  """The 95% Wilson score interval of a proportion ``k / n`` (accuracy over ``n`` rows)."""
  if n <= 0:
    return float("nan"), float("nan")
  p = k / n
  mid = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return float(mid - half), float(mid + half)


def order_curves(evaluator, orders: dict, *, step: float = 0.1, max_share: float = 1.0,
                 gate_mode: str = "remove", log=None) -> pd.DataFrame:
  """The metric along fixed pruning orders, all on ``evaluator``'s rows (the same held-out
  rows for every method: Hao et al.'s Fig. 3 setting as issue 51 states it).

  ``orders``: ``{(method, seed): [(layer, head), ...]}``, each a full order of the heads,
  pruned first first. Returns ``CURVE_COLUMNS`` plus ``accuracy_low``, ``accuracy_high`` (95%
  Wilson interval over the rows) and ``n``."""
  L, H = evaluator.num_layers, evaluator.num_heads
  total = L * H
  counts = pruning_counts(total, step, max_share)
  log = log or (lambda *_: None)
  base = evaluator.evaluate(gate_mode=gate_mode)
  rows = []
  for (method, seed), order in orders.items():
    if sorted(order) != [(l, h) for l in range(L) for h in range(H)]:
      raise ValueError(f"the {method} order must hold every head once")
    for i, count in enumerate(counts):
      gate = np.ones((L, H), np.float32)
      for l, h in order[:count]:
        gate[l, h] = 0.0
      metrics = base if count == 0 else evaluator.evaluate(gate, gate_mode=gate_mode)
      row = _row(method, seed, i, count, total, metrics, sorted(order[:count]))
      low, high = wilson(metrics["accuracy"] * metrics["n"], int(metrics["n"]))
      rows.append({**row, "accuracy_low": low, "accuracy_high": high, "n": int(metrics["n"])})
    log(f"pruning by {method}" + (f" (seed {seed})" if seed >= 0 else "") + ": done")
  return pd.DataFrame(rows, columns=[*CURVE_COLUMNS, "accuracy_low", "accuracy_high", "n"])
