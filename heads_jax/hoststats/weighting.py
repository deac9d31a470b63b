"""Roles under attention weights beside roles under norm weights (host, numpy / pandas; no jax).

The tests and the roles of the norm-weighted sieve bias (``norm_sieve_bias`` of ``scores.npz``,
``heads_jax.stats.norms``) are computed by the very functions of the attention-weighted ones
(``hoststats.hypothesis.hypothesis_tests`` and ``hoststats.calibration.apply_rule``, same tau,
alpha, test, correction and rule); their rows join ``tests.csv`` with ``weighting = "norm"``
beside the attention rows (``weighting = "attention"``). The near-uniform screen reads the
attention's row entropy and is not applied to the norm rows (``near_uniform`` False there).

A role the run did not compute (not asked for, or its sieve empty on every sequence:
``hoststats.summary.not_computed_reasons``) is None in every share and count here, never 0
(JSON ``null``, "n/a" in the report's table and figure).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from heads_jax.hoststats.calibration import apply_rule, windows_from_settings
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.hoststats.roles import COARSE_ROLES, assignment_array, coarse_roles

WEIGHTINGS = ("attention", "norm")


def norm_tests(norm_sieve_bias, roles, settings: dict, lengths) -> pd.DataFrame:
  """The tests table of the norm-weighted scores with the run's ``settings`` (tau used, alpha, test,
  correction, rule; the windowed layers of a ModernBERT run) and a ``weighting`` column = "norm"."""
  tests, s = hypothesis_tests(norm_sieve_bias, roles, tau=float(settings["tau"]),
                              alpha=float(settings["alpha"]), test=settings["test"],
                              correction=settings["correction"])
  # windowed layers (ModernBERT): the same uniform baseline over the visible keys as the
  # attention-weighted tests (None for every other model)
  windows = windows_from_settings(settings, np.shape(norm_sieve_bias)[1])
  tests, _ = apply_rule(tests, s, norm_sieve_bias, roles, lengths,
                        rule=settings.get("rule", "calibrated"), windows=windows)
  tests["weighting"] = "norm"
  return tests


def with_weighting(tests: pd.DataFrame, norm: pd.DataFrame | None) -> pd.DataFrame:
  """The attention rows (``weighting`` = "attention") followed by the norm rows."""
  out = tests.copy()
  out["weighting"] = "attention"
  return out if norm is None else pd.concat([out, norm[out.columns]], ignore_index=True)


def role_changes(tests: pd.DataFrame, norm: pd.DataFrame, not_computed=()) -> pd.DataFrame:
  """Per role: heads assigned under attention weights, under norm weights, kept, lost (assigned
  under attention only), gained, and the lost heads as "layer:head" (coarse roles first, then
  fine roles, in the tables' order). A role in ``not_computed`` (fine or coarse names) has None
  in every count and ``lost_heads``."""
  roles = list(dict.fromkeys(tests["role"].astype(str)))
  a, _ = assignment_array(tests, roles)
  n, _ = assignment_array(norm, roles)
  ca, coarse = coarse_roles(a, roles)
  cn, _ = coarse_roles(n, roles)
  skip = set(not_computed)
  rows = []
  for kind, names, x, y in (("coarse", coarse, ca, cn), ("fine", roles, a, n)):
    for j, name in enumerate(names):
      if name in skip:
        rows.append({"kind": kind, "role": name, "attention": None, "norm": None, "kept": None,
                     "lost": None, "gained": None, "lost_heads": None})
        continue
      xa, yn = x[..., j], y[..., j]
      rows.append({"kind": kind, "role": name, "attention": int(xa.sum()), "norm": int(yn.sum()),
                   "kept": int((xa & yn).sum()), "lost": int((xa & ~yn).sum()),
                   "gained": int((~xa & yn).sum()),
                   "lost_heads": ",".join(f"{l}:{h}" for l, h in np.argwhere(xa & ~yn))})
  # object columns: counts stay integers beside the None of a role not computed (not NaN floats)
  return pd.DataFrame(rows, dtype=object).astype({"kind": str, "role": str})


def lost_roles(changes: pd.DataFrame) -> dict:
  """``summary.json`` key ``norm_lost_roles``: per coarse role (every one of ``COARSE_ROLES``)
  the heads that lose it under norm weights; None where the run did not compute it."""
  coarse = changes[changes["kind"] == "coarse"].set_index("role")["lost"]
  return {r: (None if r not in coarse.index or pd.isna(coarse[r]) else int(coarse[r]))
          for r in COARSE_ROLES}


def weighting_summary(tests: pd.DataFrame, norm: pd.DataFrame, not_computed=()) -> dict:
  """``summary.json`` key ``by_weighting``: the share of heads with each coarse role (every one
  of ``COARSE_ROLES``) under each weighting, ``{"attention": {role: share}, "norm": {...}}``;
  None for a role the run did not compute (absent from its roles, or in ``not_computed``)."""
  roles = list(dict.fromkeys(tests["role"].astype(str)))
  skip = set(not_computed)
  out = {}
  for name, t in (("attention", tests), ("norm", norm)):
    assigned, _ = assignment_array(t, roles)
    coarse, names = coarse_roles(assigned, roles)
    out[name] = {c: (float(coarse[..., names.index(c)].mean())
                     if c in names and c not in skip else None) for c in COARSE_ROLES}
  return out
