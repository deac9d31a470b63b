"""Figures pooled over several analyses (Pande et al. Fig. 3 over the four GLUE tasks): the mean of
all sieve bias scores, the paper's tau rule on it and the share of p-values in (0.05, 0.95).

The definitions are those of one run (`heads_jax.hoststats.summary.mean_sieve_score`,
`heads_jax.hoststats.hypothesis.auto_tau`), applied to the scores and p-values of every analysis
together; `share_p_between` is the share ``summary.json`` reports as ``share_p_between``.
Host-only module (numpy); no jax.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from heads_jax.hoststats import hypothesis
from heads_jax.hoststats import summary as summary_lib

P_INTERVAL = (0.05, 0.95)


def share_p_between(p_values, p_interval: tuple[float, float] = P_INTERVAL) -> float | None:
  """The share of the non-NaN ``p_values`` (any shape) strictly inside the open ``p_interval``;
  None when there is none."""
  p = np.asarray(p_values, np.float64).ravel()
  p = p[~np.isnan(p)]
  low, high = p_interval
  return float(((p > low) & (p < high)).mean()) if p.size else None


def pooled_figures(sieve_biases: Iterable, p_values: Iterable,
                   p_interval: tuple[float, float] = P_INTERVAL) -> dict:
  """The pooled figures of several analyses.

  Args:
    sieve_biases: one sieve bias array per analysis (any shape, e.g. ``[b, l, h, r]``).
    p_values: one array of (unadjusted) p-values per analysis (tests.csv ``p_value``).
  Returns ``{"scores", "p_values"}`` (float64 ``[m]``, the non-NaN values pooled, for drawing),
  ``mean_sieve_score``, ``auto_tau`` (None without scores), ``share_p_between``, ``p_interval``,
  ``num_scores`` and ``num_p_values``.
  """
  def pool(arrays):
    parts = [np.asarray(a, np.float64).ravel() for a in arrays]
    v = np.concatenate(parts) if parts else np.zeros(0)
    return v[~np.isnan(v)]
  scores, pvals = pool(sieve_biases), pool(p_values)
  mean = summary_lib.mean_sieve_score(scores)
  return {"scores": scores, "p_values": pvals, "mean_sieve_score": mean,
          "auto_tau": hypothesis.auto_tau(scores) if scores.size else None,
          "share_p_between": share_p_between(pvals, p_interval),
          "p_interval": [float(p_interval[0]), float(p_interval[1])],
          "num_scores": int(scores.size), "num_p_values": int(pvals.size)}
