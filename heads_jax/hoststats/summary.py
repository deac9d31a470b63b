"""The paper's summary figures of one run (DESIGN.md "Coarse roles and the paper's summary
figures").

`summary_figures` returns a JSON-serialisable dict with:

* ``share_local``, ``share_syntactic``, ``share_delimiter``, ``share_block``: the fraction of
  all l x h heads with that coarse role (`heads_jax.hoststats.roles`); None when no fine role of
  that coarse role was computed in the run.
* ``share_unskilled``: the fraction of heads with none of the available coarse roles.
* ``share_syntactic_also_local``: among heads with the coarse role syntactic, the fraction that
  also have the coarse role local; None when there is no syntactic head.
* ``spearman_local_syntactic`` (with ``spearman_p_value`` and ``spearman_num_pairs``): Spearman's
  rank correlation (`scipy.stats.spearmanr`) of the *fine* roles' sieve bias ``local`` and
  ``syntactic`` (the union of the four relations) over all (sequence, layer, head) triples where
  both are non-NaN; None when either role is missing, fewer than 3 pairs exist or a side is
  constant.
* ``mean_sieve_score``: the mean of every non-NaN value of ``sieve_bias`` over all sequences,
  layers, heads and all roles of the run (block -- entropy-weighted -- and block_plain
  included), each value weighted equally; the same number `hypothesis.auto_tau` rounds up.
  ``mean_sieve_score_by_role`` gives the same mean per role.
* ``share_p_between``: the fraction of the run's (unadjusted) non-NaN p-values strictly inside
  ``p_interval`` = (0.05, 0.95) (``num_p_values`` of them).
* counts: ``num_sequences``, ``num_layers``, ``num_heads``, ``num_assigned_by_role`` (heads per
  fine role), ``num_heads_by_coarse_role``.

Host-only module (numpy, scipy, pandas); no jax.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from heads_jax import contract
from heads_jax.hoststats import roles as roles_lib


def mean_sieve_score(sieve_bias) -> float | None:
  """Mean of all non-NaN sieve bias values (all sequences, layers, heads, roles); None if none."""
  values = np.asarray(sieve_bias, np.float64)
  values = values[~np.isnan(values)]
  return float(values.mean()) if values.size else None


def spearman_local_syntactic(sieve_bias, roles: Sequence[str],
                             local: str = "local", syntactic: str = "syntactic") -> dict:
  """Spearman correlation of two roles' sieve bias over the (sequence, layer, head) triples
  where both are defined. Returns {"rho", "p_value", "num_pairs"} (rho, p None if undefined)."""
  roles = tuple(roles)
  out = {"rho": None, "p_value": None, "num_pairs": 0}
  if local not in roles or syntactic not in roles:
    return out
  sieve_bias = np.asarray(sieve_bias, np.float64)
  x = sieve_bias[..., roles.index(local)].reshape(-1)
  y = sieve_bias[..., roles.index(syntactic)].reshape(-1)
  both = ~np.isnan(x) & ~np.isnan(y)
  x, y = x[both], y[both]
  out["num_pairs"] = int(both.sum())
  if x.size < 3 or np.all(x == x[0]) or np.all(y == y[0]):
    return out
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    result = stats.spearmanr(x, y)
  out["rho"] = float(result.statistic)
  out["p_value"] = float(result.pvalue)
  return contract.to_jsonable(out)


def summary_figures(sieve_bias, roles: Sequence[str], tests: pd.DataFrame,
                    p_interval: tuple[float, float] = (0.05, 0.95)) -> dict:
  """The summary figures of a run (see the module docstring for every key).

  Args:
    sieve_bias: float ``[b, l, h, r]``.
    roles: the r role names.
    tests: the run's tests table (columns of `hypothesis.TEST_COLUMNS`).
    p_interval: the open interval for ``share_p_between``.
  """
  contract.validate_scores(sieve_bias, roles)
  sieve_bias = np.asarray(sieve_bias)
  roles = tuple(roles)
  b, l, h, _ = sieve_bias.shape
  assigned, _ = roles_lib.assignment_array(tests, roles, l, h)
  coarse, names = roles_lib.coarse_roles(assigned, roles)
  num_heads = l * h

  out: dict = {"num_sequences": b, "num_layers": l, "num_heads": h}
  for c in roles_lib.COARSE_ROLES:
    out[f"share_{c}"] = (float(coarse[..., names.index(c)].sum() / num_heads)
                         if c in names else None)
  out["share_unskilled"] = float((~coarse.any(-1)).sum() / num_heads)
  if "syntactic" in names and "local" in names:
    syn = coarse[..., names.index("syntactic")]
    both = syn & coarse[..., names.index("local")]
    out["share_syntactic_also_local"] = float(both.sum() / syn.sum()) if syn.any() else None
  else:
    out["share_syntactic_also_local"] = None

  rank = spearman_local_syntactic(sieve_bias, roles)
  out["spearman_local_syntactic"] = rank["rho"]
  out["spearman_p_value"] = rank["p_value"]
  out["spearman_num_pairs"] = rank["num_pairs"]

  out["mean_sieve_score"] = mean_sieve_score(sieve_bias)
  out["mean_sieve_score_by_role"] = {r: mean_sieve_score(sieve_bias[..., i])
                                     for i, r in enumerate(roles)}

  low, high = p_interval
  p = tests["p_value"].to_numpy(np.float64)
  p = p[~np.isnan(p)]
  out["share_p_between"] = float(((p > low) & (p < high)).mean()) if p.size else None
  out["p_interval"] = [float(low), float(high)]
  out["num_p_values"] = int(p.size)

  out["num_assigned_by_role"] = {r: int(assigned[..., i].sum()) for i, r in enumerate(roles)}
  out["num_heads_by_coarse_role"] = {c: int(coarse[..., i].sum()) for i, c in enumerate(names)}
  out["num_heads_by_coarse_role"][roles_lib.UNSKILLED] = int((~coarse.any(-1)).sum())
  return contract.to_jsonable(out)
