"""One-sided tests "a head's mean sieve bias exceeds tau" (DESIGN.md section 3; host, scipy).

Per (layer, head, role), over the x_1..x_n sequences whose sieve bias is not NaN, the test is
H0: mean <= tau against H1: mean > tau. With ``m = sum(x) / n`` and ``ss = sum((x - m)^2)``:

* ``test="t"`` (default): Student's one-sample t-test, exactly
  ``scipy.stats.ttest_1samp(x, tau, alternative="greater")``:
  ``statistic = (m - tau) / (s / sqrt(n))`` with the sample sd ``s = sqrt(ss / (n - 1))``
  (ddof = 1), ``p = T_{n-1}.sf(statistic)`` (upper tail of Student's t with n - 1 df).
* ``test="z"``: the authors' released notebooks (``ztest_own`` in label_heads.ipynb of
  iitmnlp/heads-hypothesis), which the paper calls "z-statistics":
  ``statistic = (m - tau) / (s0 / sqrt(n))`` with the population sd ``s0 = sqrt(ss / n)``
  (``np.std``, ddof = 0), and the p-value still from the *t* tail with n - 1 df:
  ``p = T_{n-1}.sf(statistic)`` (the notebooks write ``1 - cdf``; sf is the same number
  without the cancellation for tiny p). Since s0 < s, this statistic is larger by
  ``sqrt(n / (n - 1))`` than the t statistic, so its p-values are slightly smaller.

Degenerate cases (both tests):

* n = 0 (the role's sieve is empty in every sequence): mean, statistic and p are NaN; never
  assigned; not counted among the run's tests for the corrections.
* n = 1: mean is the single value; statistic and p are NaN (no variance estimate, 0 df);
  never assigned; not counted for the corrections.
* n >= 2 and all values equal (zero variance; detected exactly as max == min, not by a
  rounded variance): the mean is that value; statistic = +inf and p = 0 if it is > tau,
  statistic = -inf and p = 1 if it is < tau, statistic = NaN and p = 1 if it equals tau
  (H0 holds). These p-values take part in the corrections like any other.

All arithmetic is float64 (float32 scores are widened first).

Multiple comparisons (``correction``), over all tests of the run with a non-NaN p-value
(m of them), p sorted ascending as p_(1) <= ... <= p_(m):

* ``none``: p_adjusted = p (the paper's setting).
* ``bonferroni``: min(1, m p).
* ``holm``: step-down, p_adj_(i) = min(1, max_{j <= i} (m - j + 1) p_(j)).
* ``bh`` (Benjamini-Hochberg FDR): step-up, p_adj_(i) = min(1, min_{j >= i} m p_(j) / j),
  computed by ``scipy.stats.false_discovery_control(p, method="bh")``.

A role is assigned to a head when p_adjusted < alpha (NaN is never assigned).

``tau="auto"`` is the paper's rule: the smallest integer strictly larger than the mean of all
sieve scores of the run, i.e. ``floor(mean) + 1`` where the mean is over every non-NaN value of
``sieve_bias`` of the paper's four functional roles (local, syntactic, block, delimiter:
`heads_jax.hoststats.roles.PAPER_ROLES`; all sequences, layers and heads, each value weighted
equally).

Host-only module (numpy, scipy, pandas); no jax.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd
from scipy import stats

from heads_jax import contract
from heads_jax.hoststats import roles as roles_lib

TESTS = ("t", "z")
CORRECTIONS = ("none", "bonferroni", "holm", "bh")
TEST_COLUMNS = contract.TEST_COLUMNS


def auto_tau(sieve_bias, roles=None) -> float:
  """The paper's tau: the smallest integer larger than the mean of all non-NaN sieve scores;
  with ``roles`` (the r names of the last axis) over the paper's four functional roles only
  (`heads_jax.hoststats.roles.PAPER_ROLES`, as `summary.summary_figures`' mean_sieve_score)."""
  values = np.asarray(sieve_bias, np.float64)
  if roles is not None:
    values = values[..., [i for i, r in enumerate(roles) if r in roles_lib.PAPER_ROLES]]
  values = values[~np.isnan(values)]
  if values.size == 0:
    raise ValueError("tau='auto' needs at least one non-NaN sieve bias; every value is NaN "
                     "(every sieve empty?): pass a numeric tau or check the inputs")
  return float(math.floor(values.mean()) + 1)


def one_sample_tests(values, tau: float, test: str = "t") -> dict[str, np.ndarray]:
  """Vectorised one-sided one-sample tests of H0 mean <= tau over the first axis.

  Args:
    values: float ``[b, ...]``; NaN entries are left out of their column's test.
    tau: the threshold (finite number).
    test: "t" (Student, ddof = 1) or "z" (notebooks' variant, ddof = 0, t tail); see the
      module docstring for the exact formulas and the degenerate cases.

  Returns:
    dict of float64 arrays of shape ``values.shape[1:]``: ``mean``, ``statistic``,
    ``p_value``, and int64 ``n`` (number of non-NaN values).
  """
  if test not in TESTS:
    raise ValueError(f"test must be one of {TESTS}; got {test!r}")
  tau = float(tau)
  if not math.isfinite(tau):
    raise ValueError(f"tau must be a finite number; got {tau}")
  x = np.asarray(values, np.float64)
  if x.ndim < 1:
    raise ValueError("values must have a leading sequence axis [b, ...]")
  valid = ~np.isnan(x)
  n = valid.sum(0).astype(np.int64)
  ddof = 1 if test == "t" else 0
  with np.errstate(invalid="ignore", divide="ignore"):
    mean = np.where(valid, x, 0.0).sum(0) / n
    ss = (np.where(valid, x - mean, 0.0) ** 2).sum(0)
    sd = np.sqrt(ss / (n - ddof))
    statistic = (mean - tau) / (sd / np.sqrt(n))
  statistic = np.where(n >= 2, statistic, np.nan)
  p = np.where(n >= 2, stats.t.sf(statistic, np.maximum(n - 1, 1)), np.nan)
  # Zero variance, exactly: every value equal (max == min).
  hi = np.where(valid, x, -np.inf).max(0)
  lo = np.where(valid, x, np.inf).min(0)
  constant = (n >= 2) & (hi == lo)
  mean = np.where(constant, hi, mean)
  statistic = np.where(constant, np.where(hi > tau, np.inf, np.where(hi < tau, -np.inf, np.nan)),
                       statistic)
  p = np.where(constant, np.where(hi > tau, 0.0, 1.0), p)
  return {"mean": mean, "n": n, "statistic": statistic, "p_value": p}


def adjust_p_values(p_values, correction: str = "none") -> np.ndarray:
  """Multiple-comparison adjusted p-values (any shape); NaN stays NaN and is not counted.

  See the module docstring for the formulas of "none", "bonferroni", "holm" and "bh".
  """
  if correction not in CORRECTIONS:
    raise ValueError(f"correction must be one of {CORRECTIONS}; got {correction!r}")
  p = np.asarray(p_values, np.float64)
  out = np.full(p.shape, np.nan)
  ok = ~np.isnan(p)
  q = p[ok]
  m = q.size
  if correction == "none" or m == 0:
    out[ok] = q
    return out
  if correction == "bonferroni":
    out[ok] = np.minimum(q * m, 1.0)
    return out
  if correction == "bh":
    out[ok] = stats.false_discovery_control(q, method="bh")
    return out
  # holm (scipy has no Holm adjustment; statsmodels' multipletests is not a dependency)
  order = np.argsort(q, kind="stable")
  ranked = q[order]
  rank = np.arange(1, m + 1)
  adjusted = np.maximum.accumulate(ranked * (m - rank + 1))
  unsorted = np.empty(m)
  unsorted[order] = np.minimum(adjusted, 1.0)
  out[ok] = unsorted
  return out


def hypothesis_tests(sieve_bias, roles, *, tau: float | str = 3.0, alpha: float = 0.05,
                     test: str = "t", correction: str = "none",
                     settings: Mapping | None = None) -> tuple[pd.DataFrame, dict]:
  """Tests every (layer, head, role) of a run and assigns roles.

  Args:
    sieve_bias: float ``[b, l, h, r]`` per-sequence sieve bias, NaN where the sieve is empty.
    roles: the r role names of the last axis.
    tau: threshold (number) or "auto" (see module docstring). Paper: 3.
    alpha: significance level, assigned when p_adjusted < alpha. Paper: 0.05.
    test: "t" (default) or "z".
    correction: "none" (default), "bonferroni", "holm" or "bh".
    settings: pass-through keys recorded with the results (direction, model, data,
      max_length, ...). A key that this function computes (tau, alpha, ...) may be passed only
      with the same value.

  Returns:
    (df, settings): df has one row per (layer, head, role) in C order of ``[l, h, r]`` with
    exactly the columns ``TEST_COLUMNS`` (layer, head, role, mean, n, statistic, p_value,
    p_adjusted, assigned); settings holds tau (used), tau_requested, alpha, test, correction,
    num_tests (tests with a p-value, the m of the corrections), num_sequences, roles and the
    pass-through keys.
  """
  contract.validate_scores(sieve_bias, roles)
  sieve_bias = np.asarray(sieve_bias)
  roles = tuple(roles)
  if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
    raise ValueError(f"alpha must be a number in (0, 1); got {alpha!r}")
  if isinstance(tau, str):
    if tau != "auto":
      raise ValueError(f"tau must be a number or 'auto'; got {tau!r}")
    tau_used = auto_tau(sieve_bias, roles)
  else:
    tau_used = float(tau)
  result = one_sample_tests(sieve_bias, tau_used, test)
  p_adjusted = adjust_p_values(result["p_value"], correction)
  assigned = np.where(np.isnan(p_adjusted), False, p_adjusted < alpha)

  _, l, h, r = sieve_bias.shape
  layer, head, role = np.indices((l, h, r)).reshape(3, -1)
  df = pd.DataFrame({
      "layer": layer.astype(np.int64), "head": head.astype(np.int64),
      "role": np.asarray(roles, dtype=object)[role],
      "mean": result["mean"].reshape(-1), "n": result["n"].reshape(-1),
      "statistic": result["statistic"].reshape(-1), "p_value": result["p_value"].reshape(-1),
      "p_adjusted": p_adjusted.reshape(-1), "assigned": assigned.reshape(-1).astype(bool),
  }, columns=list(TEST_COLUMNS))

  computed = {
      "tau": tau_used, "tau_requested": tau if isinstance(tau, str) else float(tau),
      "alpha": float(alpha), "test": test, "correction": correction,
      "num_tests": int((~np.isnan(result["p_value"])).sum()),
      "num_sequences": int(sieve_bias.shape[0]), "roles": list(roles),
  }
  out = dict(computed)
  for key, value in dict(settings or {}).items():
    if key in computed and contract.to_jsonable(value) != contract.to_jsonable(computed[key]):
      raise ValueError(f"settings[{key!r}] = {value!r} disagrees with the value this test run uses "
                       f"({computed[key]!r}); pass it as the keyword argument instead")
    out[key] = value
  return df, out
