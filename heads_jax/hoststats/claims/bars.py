"""How a statement judged on a share meets its bar: three outcomes, never a coin flip.

A share of heads is a sample: 19 of 29 heads is 47% to 80% at 95%, so a bar of 50% cannot be
told from it. Every statement judged on a share therefore says `HOLDS`, `FAILS` or `UNDECIDED`
("undecided at this n"):

* `share_verdict`: a share against a fixed bar, from the 95% Wilson interval of the share over
  its n distinct heads: it holds when the whole interval is on the claim's side of the bar, does
  not hold when the whole interval is on the other side, and is undecided when the bar is
  inside it.
* `overlap_verdict`: an overlap ("nsubj heads are next-local heads") against its base rate, the
  overlap the heads' marginal rates give by chance: of ``n`` heads, ``n_a`` are A heads and
  ``n_b`` B heads; under independence the number of A heads that are also B heads is
  hypergeometric (mean ``n_a * n_b / n``). The enrichment is the observed overlap over that mean;
  the one-sided exact tails (P(X >= k), P(X <= k)) at the paper's alpha decide: the claim's
  direction significant holds, the other direction significant does not hold, neither is
  undecided.
* `multi_verdict`: the number of heads with two or more roles against the number the roles'
  marginal rates give by chance (independent roles: each head is multi-functional with the same
  probability), an exact binomial test each side.

DESIGN.md section 3 ("Verdicts") gives each statement's bar and the sentence it comes from.
"""

from __future__ import annotations

import numpy as np

from heads_jax.hoststats.claims.claim import ALPHA, FAILS, HOLDS, UNDECIDED, pct, wilson_interval


def share_verdict(share: float, n: int, bar: float, above: bool) -> tuple[str, str]:
  """``(verdict, words)`` of a share observed over ``n`` distinct heads against ``bar``;
  ``above``: the claim says the share is above the bar (else at most the bar)."""
  lo, hi = wilson_interval(share, n)
  if lo > bar:
    verdict = HOLDS if above else FAILS
  elif hi < bar:
    verdict = FAILS if above else HOLDS
  else:
    verdict = UNDECIDED
  return verdict, f"95% interval over {int(n)} heads {pct(lo)} to {pct(hi)}, bar {pct(bar)}"


def hypergeometric_tails(k: int, n: int, n_a: int, n_b: int) -> tuple[float, float]:
  """``(P(X >= k), P(X <= k))`` for X the overlap of a random ``n_a``-subset with a fixed
  ``n_b``-subset of ``n`` items."""
  from scipy import stats as sp_stats
  dist = sp_stats.hypergeom(n, n_b, n_a)
  return float(dist.sf(k - 1)), float(dist.cdf(k))


def _decide(p_up: float, p_down: float, enriched: bool) -> str:
  if p_up < ALPHA:
    return HOLDS if enriched else FAILS
  if p_down < ALPHA:
    return FAILS if enriched else HOLDS
  return UNDECIDED


def overlap_verdict(k: int, n_a: int, n_b: int, n: int, enriched: bool = True
                    ) -> tuple[str, float, str]:
  """``(verdict, enrichment, words)``: ``k`` of the ``n_a`` A heads are B heads, with ``n_b`` B
  heads among ``n``; ``enriched``: the claim says the overlap is above chance (else below)."""
  expected = n_a * n_b / n if n else 0.0
  enrichment = k / expected if expected > 0 else float("nan")
  p_up, p_down = hypergeometric_tails(k, n, n_a, n_b)
  words = (f"base rate {n_b} of {n} heads ({pct(n_b / n if n else float('nan'))}): "
           f"{expected:.1f} expected by chance, enrichment {enrichment:.2f}x; one-sided exact "
           f"(hypergeometric) p = {p_up:.2g} above chance, {p_down:.2g} below")
  return _decide(p_up, p_down, enriched), enrichment, words


def multi_rate(rates) -> float:
  """The probability that a head has two or more of independent roles with these rates."""
  rates = [float(r) for r in rates]
  none = float(np.prod([1 - r for r in rates]))
  one = sum(r * float(np.prod([1 - s for j, s in enumerate(rates) if j != i]))
            for i, r in enumerate(rates))
  return max(0.0, 1.0 - none - one)


def multi_verdict(roles: np.ndarray, enriched: bool = True) -> tuple[str, float, str]:
  """``(verdict, enrichment, words)`` of bool ``[n, c]`` (each head's roles): heads with two or
  more roles against the chance rate of independent roles with the observed rates."""
  from scipy import stats as sp_stats
  n = int(roles.shape[0])
  k = int((roles.sum(-1) >= 2).sum())
  p = multi_rate(roles.mean(0))
  expected = n * p
  enrichment = k / expected if expected > 0 else float("nan")
  dist = sp_stats.binom(n, p)
  p_up, p_down = float(dist.sf(k - 1)), float(dist.cdf(k))
  words = (f"{k} of {n} heads; independent roles at their rates give {pct(p)} ({expected:.1f} "
           f"heads): enrichment {enrichment:.2f}x; one-sided exact (binomial) p = {p_up:.2g} "
           f"above chance, {p_down:.2g} below")
  return _decide(p_up, p_down, enriched), enrichment, words


def union(masks) -> np.ndarray:
  """bool ``[l, h]``: the heads that are in some mask (a head is counted once over the tasks:
  the tasks' models are fine-tuned from one model, so their heads are not independent)."""
  return np.logical_or.reduce(list(masks))

