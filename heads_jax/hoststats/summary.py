"""The paper's summary figures of one run (DESIGN.md "Coarse roles and the paper's summary
figures").

`summary_figures` returns a JSON-serialisable dict with:

* ``coarse_roles``: ``"tests"``: the coarse roles are the paper's four tests (a head is a
  delimiter head when the delimiter test rejects; `heads_jax.hoststats.roles`).
* ``share_local``, ``share_syntactic``, ``share_delimiter``, ``share_block``: the fraction of
  all l x h heads with that coarse role; None (JSON ``null``) when that role was not computed in
  the run: not asked for, or its sieve empty on every sequence of the data (block heads on single
  texts, syntactic roles without dependency arcs). ``not_computed`` maps each such fine or coarse
  role to the reason (``not_computed_reasons``); every count of it is None too, never 0.
* ``share_unskilled``: the fraction of heads with none of the available coarse roles.
* ``share_syntactic_also_local``: among heads with the coarse role syntactic, the fraction that
  also have the coarse role local; None when there is no syntactic head.
* ``spearman_local_syntactic`` (with ``spearman_interval`` and ``spearman_num_pairs``): Spearman's
  rank correlation (`scipy.stats.spearmanr`) of the *fine* roles' sieve bias ``local`` and
  ``syntactic`` (the union of the four relations) over all (sequence, layer, head) triples where
  both are non-NaN (the paper's number), with its 95% cluster-bootstrap interval over sequences
  (the triples are nested: no p-value is taken from them); ``spearman_heads`` (with
  ``spearman_p_value`` and ``spearman_num_heads``): the same over the heads, one value per head
  (its mean sieve bias of each role), and its p-value, the heads being the units
  (`spearman_local_syntactic`). None when either role is missing, fewer than 3 values exist or
  a side is constant.
* ``pool_roles``: the roles the pooled figures below read: the paper's four functional roles
  that the run has (`heads_jax.hoststats.roles.PAPER_ROLES`: local, syntactic, block (entropy
  weighted), delimiter; not block_plain, prev_local, next_local, cls, sep or the single
  relations).
* ``mean_sieve_score``: the mean of every non-NaN value of ``sieve_bias`` of the ``pool_roles``
  over all sequences, layers and heads, each value weighted equally; the same number
  `hypothesis.auto_tau` rounds up. ``mean_sieve_score_by_role`` gives the mean per role (every
  role of the run).
* ``share_p_between``: the fraction of the (unadjusted) non-NaN p-values of the ``pool_roles``'
  tests strictly inside ``p_interval`` = (0.05, 0.95) (``num_p_values`` of them).
* ``fine_union``: heads_jax's fine-role union view (not the paper's; `heads_jax.hoststats.roles`
  ``view="union"``: delimiter = delimiter or cls or sep, ...): its ``share_local`` ...
  ``share_unskilled`` and ``share_syntactic_also_local``.
* counts: ``num_sequences``, ``num_layers``, ``num_heads``, ``num_assigned_by_role`` (heads per
  fine role), ``num_heads_by_coarse_role``.
* ``fine_role_overlaps``: for each pair of fine roles in `FINE_OVERLAPS` (the overlaps Pande et al.
  discuss: a subject's head word mostly follows it, an object's precedes it), ``{"first": a,
  "second": b, "num_first", "num_second", "num_both", "share_of_first"}`` (heads with both roles
  over heads with the first; None when there is none), keyed ``"a+b"``; pairs with a role not in
  the run are left out.
* the role rules (`heads_jax.hoststats.calibration`), when the tests table has their columns:
  ``rule`` (the rule of ``assigned``, i.e. of every share above), ``by_rule`` = ``{"paper": ...,
  "calibrated": ..., "average": ...}`` (average: the mean above tau, no test; only when ``tau``
  is given) with, per rule, the shares (``share_local`` ... ``share_unskilled``,
  ``share_syntactic_also_local``), ``num_assigned_by_role`` and ``num_heads_by_coarse_role``;
  ``num_near_uniform_heads`` and ``share_near_uniform`` (heads whose attention is within the
  near-uniform threshold of uniform; None when the entropy was not computed).

Host-only module (numpy, scipy, pandas); no jax.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from heads_jax import contract
from heads_jax.hoststats import hypothesis
from heads_jax.data import vocabulary
from heads_jax.hoststats import roles as roles_lib


def mean_sieve_score(sieve_bias) -> float | None:
  """Mean of all non-NaN sieve bias values (all sequences, layers, heads, roles); None if none."""
  values = np.asarray(sieve_bias, np.float64)
  values = values[~np.isnan(values)]
  return float(values.mean()) if values.size else None


# The cluster bootstrap of the pairs' rho: resamples of the sequences, and its seed.
SPEARMAN_RESAMPLES = 200
SPEARMAN_SEED = 0


def _rho(x, y) -> float | None:
  if x.size < 3 or np.all(x == x[0]) or np.all(y == y[0]):
    return None
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return float(stats.spearmanr(x, y).statistic)


def spearman_local_syntactic(sieve_bias, roles: Sequence[str],
                             local: str = vocabulary.SPEARMAN_ROLES[0],
                             syntactic: str = vocabulary.SPEARMAN_ROLES[1],
                             resamples: int = SPEARMAN_RESAMPLES,
                             seed: int = SPEARMAN_SEED) -> dict:
  """Spearman correlation of two roles' sieve bias, ``sieve_bias`` float ``[b, l, h, r]``.

  ``rho``: over the (sequence, layer, head) triples where both are defined (the paper's
  number; ``num_pairs`` of them). The triples are nested (a sequence's heads, a head's
  sequences), so no p-value is taken from them: ``interval`` is the 95% cluster bootstrap of
  that rho over sequences (``resamples`` resamples of the b sequences with replacement, each
  sequence with all its heads; percentiles 2.5 and 97.5), and ``heads_rho`` / ``p_value`` are
  Spearman's rho over the heads (one value per head: its mean sieve bias of each role over the
  sequences, ``num_heads`` heads with both defined) and its p-value, the heads being the units.
  None where undefined (a role missing, fewer than 3 values, a constant side)."""
  roles = tuple(roles)
  out = {"rho": None, "p_value": None, "num_pairs": 0, "interval": None, "heads_rho": None,
         "num_heads": 0}
  if local not in roles or syntactic not in roles:
    return out
  sieve_bias = np.asarray(sieve_bias, np.float64)
  x = sieve_bias[..., roles.index(local)].reshape(sieve_bias.shape[0], -1)        # [b, l*h]
  y = sieve_bias[..., roles.index(syntactic)].reshape(sieve_bias.shape[0], -1)
  both = ~np.isnan(x) & ~np.isnan(y)
  out["num_pairs"] = int(both.sum())
  out["rho"] = _rho(x[both], y[both])
  if out["rho"] is not None:
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
      pick = rng.integers(0, x.shape[0], x.shape[0])
      r = _rho(x[pick][both[pick]], y[pick][both[pick]])
      if r is not None:
        draws.append(r)
    if draws:
      out["interval"] = [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    hx = np.nanmean(np.where(both, x, np.nan), 0)                                  # [l*h]
    hy = np.nanmean(np.where(both, y, np.nan), 0)
  heads = ~np.isnan(hx) & ~np.isnan(hy)
  out["num_heads"] = int(heads.sum())
  out["heads_rho"] = _rho(hx[heads], hy[heads])
  if out["heads_rho"] is not None:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      out["p_value"] = float(stats.spearmanr(hx[heads], hy[heads]).pvalue)
  return contract.to_jsonable(out)


FINE_OVERLAPS = vocabulary.FINE_OVERLAPS   # the role registry's (data/vocabulary.py)


def fine_role_overlaps(assigned: np.ndarray, roles: Sequence[str],
                       pairs=FINE_OVERLAPS) -> dict:
  """Heads with both fine roles of each pair (see the module docstring), from bool ``[l, h, r]``."""
  roles = tuple(roles)
  out = {}
  for a, b in pairs:
    if a not in roles or b not in roles:
      continue
    x, y = assigned[..., roles.index(a)], assigned[..., roles.index(b)]
    both = int((x & y).sum())
    out[f"{a}+{b}"] = {"first": a, "second": b, "num_first": int(x.sum()),
                       "num_second": int(y.sum()), "num_both": both,
                       "share_of_first": both / int(x.sum()) if x.any() else None}
  return out


def computed_roles(sieve_bias, roles: Sequence[str]) -> tuple[str, ...]:
  """The roles whose sieve bias is finite for at least one (sequence, layer, head): the roles
  this run computed (a role whose sieve is empty on every sequence was not)."""
  finite = np.isfinite(np.asarray(sieve_bias, np.float64)).reshape(-1, len(roles)).any(0)
  return tuple(r for r, ok in zip(roles, finite) if ok)


def _reason(role: str) -> str:
  """Why a role (fine, or a coarse group of them) has an empty sieve on every sequence."""
  sieve = (vocabulary.role(role).sieve if role in vocabulary.ROLES
           else {vocabulary.COARSE_BLOCK: vocabulary.SIEVE_BLOCK,
                 vocabulary.COARSE_SYNTACTIC: vocabulary.SIEVE_RELATION}.get(role))
  if sieve == vocabulary.SIEVE_BLOCK:
    return "no sequence pairs: block heads need two segments"
  if sieve == vocabulary.SIEVE_RELATION:
    return "no dependency arcs in the data (--parser none, or no parse)"
  return "its sieve is empty on every sequence"


def not_computed_reasons(sieve_bias, roles: Sequence[str],
                         view: str = roles_lib.TESTS) -> dict[str, str]:
  """``{role: why}`` for every fine role of ``roles`` and coarse role of ``view`` this run did
  not compute (a coarse role is computed when any of its fine roles is)."""
  roles = tuple(roles)
  done = computed_roles(sieve_bias, roles)
  out = {r: _reason(r) for r in roles if r not in done}
  for name in roles_lib.COARSE_ROLES:
    if name in roles_lib.available_coarse_roles(roles, view) and \
        name not in roles_lib.available_coarse_roles(done, view):
      out[name] = _reason(name)
  return out


def _role_figures(assigned: np.ndarray, roles: tuple[str, ...],
                  view: str = roles_lib.TESTS, computed: tuple[str, ...] | None = None) -> dict:
  """The shares and counts of one role assignment ``[l, h, r]`` (coarse roles of ``view``);
  roles not in ``computed`` (default: all) count as absent (None, never 0)."""
  if computed is not None and computed != roles:
    full = roles
    keep = [roles.index(r) for r in computed]
    out = _role_figures(assigned[..., keep], computed, view)
    out["num_assigned_by_role"] = {r: out["num_assigned_by_role"].get(r) for r in full}
    return out
  l, h = assigned.shape[:2]
  num_heads = l * h
  coarse, names = roles_lib.coarse_roles(assigned, roles, view)
  out: dict = {}
  for c in roles_lib.COARSE_ROLES:
    out[f"share_{c}"] = (float(coarse[..., names.index(c)].sum() / num_heads)
                         if c in names else None)
  out["share_unskilled"] = float((~coarse.any(-1)).sum() / num_heads)
  first, second = vocabulary.ALSO_COARSE                  # syntactic heads also local
  if first in names and second in names:
    syn = coarse[..., names.index(first)]
    both = syn & coarse[..., names.index(second)]
    out["share_syntactic_also_local"] = float(both.sum() / syn.sum()) if syn.any() else None
  else:
    out["share_syntactic_also_local"] = None
  out["num_assigned_by_role"] = {r: int(assigned[..., i].sum()) for i, r in enumerate(roles)}
  out["num_heads_by_coarse_role"] = {c: int(coarse[..., i].sum()) for i, c in enumerate(names)}
  out["num_heads_by_coarse_role"][roles_lib.UNSKILLED] = int((~coarse.any(-1)).sum())
  out["fine_role_overlaps"] = fine_role_overlaps(assigned, roles)
  return out


def summary_figures(sieve_bias, roles: Sequence[str], tests: pd.DataFrame,
                    p_interval: tuple[float, float] = (0.05, 0.95),
                    rule: str | None = None, near_uniform_computed: bool = True,
                    tau: float | None = None) -> dict:
  """The summary figures of a run (see the module docstring for every key).

  Args:
    sieve_bias: float ``[b, l, h, r]``.
    roles: the r role names.
    tests: the run's tests table (columns of `hypothesis.TEST_COLUMNS`).
    p_interval: the open interval for ``share_p_between``.
    rule: the rule of the table's ``assigned`` column ("calibrated" or "paper"), recorded with
      both rules' figures when the table has the rule columns.
    near_uniform_computed: False when the run has no entropy (no near-uniform figures).
    tau: the run's tau; with it ``by_rule`` also has the average rule (mean above tau, no test).
  """
  contract.validate_scores(sieve_bias, roles)
  sieve_bias = np.asarray(sieve_bias)
  roles = tuple(roles)
  b, l, h, _ = sieve_bias.shape
  assigned, _ = roles_lib.assignment_array(tests, roles, l, h)
  done = computed_roles(sieve_bias, roles)
  figures = _role_figures(assigned, roles, computed=done)
  counts = {k: figures.pop(k) for k in ("num_assigned_by_role", "num_heads_by_coarse_role",
                                        "fine_role_overlaps")}

  out: dict = {"num_sequences": b, "num_layers": l, "num_heads": h,
               "coarse_roles": roles_lib.TESTS, **figures}
  out["not_computed"] = not_computed_reasons(sieve_bias, roles)
  union = _role_figures(assigned, roles, roles_lib.UNION, computed=done)
  out["fine_union"] = {k: v for k, v in union.items() if k.startswith("share_")}

  rank = spearman_local_syntactic(sieve_bias, roles)
  out["spearman_local_syntactic"] = rank["rho"]
  out["spearman_interval"] = rank["interval"]
  out["spearman_num_pairs"] = rank["num_pairs"]
  out["spearman_heads"] = rank["heads_rho"]
  out["spearman_p_value"] = rank["p_value"]
  out["spearman_num_heads"] = rank["num_heads"]

  pool = [roles.index(r) for r in roles_lib.PAPER_ROLES if r in roles]
  out["pool_roles"] = [roles[i] for i in pool]
  out["mean_sieve_score"] = mean_sieve_score(sieve_bias[..., pool])
  out["mean_sieve_score_by_role"] = {r: mean_sieve_score(sieve_bias[..., i])
                                     for i, r in enumerate(roles)}

  low, high = p_interval
  p = tests.loc[tests["role"].astype(str).isin(out["pool_roles"]), "p_value"].to_numpy(np.float64)
  p = p[~np.isnan(p)]
  out["share_p_between"] = float(((p > low) & (p < high)).mean()) if p.size else None
  out["p_interval"] = [float(low), float(high)]
  out["num_p_values"] = int(p.size)

  out.update(counts)

  if set(contract.RULE_COLUMNS) <= set(tests.columns):
    out["rule"] = rule
    out["by_rule"] = {}
    for name in ("paper", "calibrated", "average"):
      if name == "average" and tau is None:
        continue
      table = tests.assign(assigned=roles_lib.rule_assigned(tests, name, tau))
      out["by_rule"][name] = _role_figures(roles_lib.assignment_array(table, roles, l, h)[0], roles,
                                           computed=done)
    flat = tests.drop_duplicates(["layer", "head"])["near_uniform"].to_numpy(bool)
    out["num_near_uniform_heads"] = int(flat.sum()) if near_uniform_computed else None
    out["share_near_uniform"] = float(flat.sum() / (l * h)) if near_uniform_computed else None
  return contract.to_jsonable(out)


# Pande et al. explore tau from 1 to 3.5 in their released notebook; Fig. 2 argues for a test
# over an average. Both views below read the paper's four functional roles (`roles.PAPER_ROLES`).
TAU_SWEEP = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5)


def tau_sweep(sieve_bias, roles: Sequence[str], taus=TAU_SWEEP, *, alpha: float = 0.05,
              test: str = "t") -> pd.DataFrame:
  """Heads per coarse role (the paper's four tests) as tau varies, under the paper's rule (the
  one-sided test at ``alpha``, no correction) and the average rule (mean above tau, no test).

  Args:
    sieve_bias: float ``[b, l, h, r]``; roles: the r names.
  Returns:
    one row per (tau, role, rule): columns tau, role, rule ("paper" / "average"), heads, share
    (of all l x h heads); roles: `roles.PAPER_ROLES` present, then "unskilled" (none of them).
  """
  x = np.asarray(sieve_bias, np.float64)
  roles = tuple(roles)
  idx = [roles.index(r) for r in roles_lib.PAPER_ROLES if r in roles]
  names = [roles[i] for i in idx]
  x = x[..., idx]
  num_heads = x.shape[1] * x.shape[2]
  with np.errstate(invalid="ignore"):
    mean = np.nanmean(x, 0) if x.size else np.zeros(x.shape[1:])
  rows = []
  for tau in taus:
    p = hypothesis.one_sample_tests(x, float(tau), test)["p_value"]
    for rule, assigned in (("paper", np.where(np.isnan(p), False, p < alpha)),
                           ("average", roles_lib.average_rule(mean, tau))):
      for j, name in enumerate(names):
        n = int(assigned[..., j].sum())
        rows.append({"tau": float(tau), "role": name, "rule": rule, "heads": n,
                     "share": n / num_heads})
      n = int((~assigned.any(-1)).sum())
      rows.append({"tau": float(tau), "role": roles_lib.UNSKILLED, "rule": rule, "heads": n,
                   "share": n / num_heads})
  return pd.DataFrame(rows, columns=["tau", "role", "rule", "heads", "share"])


def skewed_example(sieve_bias, roles: Sequence[str], tau: float, *, alpha: float = 0.05,
                   test: str = "t") -> dict | None:
  """The (layer, head, role) of Pande et al.'s Fig. 2: among the paper's four roles, a head
  whose mean sieve bias is above tau while the test of "mean > tau" does not reject (the average
  would assign the role, the test does not), the most skewed one; failing that, the most skewed
  (layer, head, role) whose mean lies within 1 of tau. Returns ``{"layer", "head", "role",
  "values" (its non-NaN scores), "mean", "p_value", "skewness", "average_only" (bool)}``, or None
  when no role has two scores."""
  x = np.asarray(sieve_bias, np.float64)
  roles = tuple(roles)
  idx = [roles.index(r) for r in roles_lib.PAPER_ROLES if r in roles]
  if not idx:
    return None
  x = x[..., idx]
  result = hypothesis.one_sample_tests(x, float(tau), test)
  mean, p, n = result["mean"], result["p_value"], result["n"]
  with warnings.catch_warnings(), np.errstate(invalid="ignore"):
    warnings.simplefilter("ignore")
    skew = stats.skew(x, axis=0, nan_policy="omit")
  skew = np.where(n >= 3, np.asarray(skew, np.float64), np.nan)
  average_only = (np.nan_to_num(mean, nan=-np.inf) > tau) & ~(np.nan_to_num(p, nan=1.0) < alpha)
  near = np.abs(np.nan_to_num(mean, nan=np.inf) - tau) <= 1.0
  for pick, flag in ((average_only, True), (near, False), (n >= 3, False)):
    cand = np.where(pick & np.isfinite(skew), skew, -np.inf)
    if np.isfinite(cand).any():
      l, h, r = np.unravel_index(int(np.argmax(cand)), cand.shape)
      values = x[:, l, h, r]
      return {"layer": int(l), "head": int(h), "role": roles[idx[r]],
              "values": values[~np.isnan(values)], "mean": float(mean[l, h, r]),
              "p_value": float(p[l, h, r]), "skewness": float(skew[l, h, r]),
              "average_only": flag}
  return None
