"""Confidence intervals of proportions (host side, no jax).

`wilson_interval`: the Wilson score interval of a binomial proportion (Wilson 1927), used for the
held-out accuracy the demo reports and, through `heads_jax.hoststats.claims.wilson_interval`, for
every share the paper table judges.
"""

from __future__ import annotations

import math


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
  """The Wilson score interval ``(low, high)`` of ``successes`` out of ``n`` (95% by default,
  ``z`` the normal quantile); ``(nan, nan)`` when ``n <= 0``."""
  if n <= 0:
    return (float("nan"), float("nan"))
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  return (centre - half, centre + half)
