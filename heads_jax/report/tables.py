"""Shaping the contract's tables for drawing: the tests table (tests.csv) read leniently, per-head
role flags, role counts per layer and per head, matrices ``[l, h, r]``.

Role definitions (coarse roles, role order) come from `heads_jax.hoststats.roles`; the tests
table's columns from `heads_jax.contract.TEST_COLUMNS`. Only counts, means and reshaping here:
the tests and role assignments themselves are the host statistics' (hoststats).

numpy / pandas, no jax.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from heads_jax import contract
from heads_jax.hoststats import roles as roles_lib

def require_columns(df, columns, what: str, file_columns=()):
  """Refuses a ``df`` that is not a DataFrame (TypeError) or lacks one of ``columns``
  (ValueError naming ``what``, the missing and the present columns, and ``file_columns``, the
  columns of the file such a table is read from, when given)."""
  if not isinstance(df, pd.DataFrame):
    raise TypeError(f"{what} must be a pandas DataFrame, got {type(df).__name__}")
  missing = [c for c in columns if c not in df.columns]
  if missing:
    written = f" (its file's columns: {list(file_columns)})" if file_columns else ""
    raise ValueError(f"{what} lacks columns {missing}; it needs {list(columns)}{written}, "
                     f"has {list(df.columns)}")


def as_bool(values) -> np.ndarray:
  """A column read from CSV as booleans: accepts bool, 0/1 and "True"/"False" strings; missing
  values (NaN, None, "") count as False (e.g. a role that could not be tested)."""
  s = pd.Series(values)
  if s.dtype == bool:
    return s.to_numpy()
  if s.dtype == object or pd.api.types.is_string_dtype(s):
    lowered = s.map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v))
                    else str(v).strip().lower())
    bad = ~lowered.isin(["true", "false", "1", "0", "1.0", "0.0", "", "nan", "none"])
    if bad.any():
      raise ValueError(f"a boolean column (e.g. 'assigned') holds {s[bad].iloc[0]!r}; "
                       "write it as True/False or 1/0")
    return lowered.isin(["true", "1", "1.0"]).to_numpy()
  v = s.astype(float).to_numpy()
  return np.nan_to_num(v, nan=0.0) != 0


def check_tests_df(tests_df: pd.DataFrame, required=("layer", "head", "role", "assigned")
                   ) -> pd.DataFrame:
  """Validate a tests table (one row per layer, head, role) and normalise its dtypes.

  Returns a copy with int ``layer``/``head``, str ``role`` and bool ``assigned``.
  """
  require_columns(tests_df, required, "tests table (tests.csv)", contract.TEST_COLUMNS)
  df = tests_df.copy()
  df["layer"] = df["layer"].astype(int)
  df["head"] = df["head"].astype(int)
  df["role"] = df["role"].astype(str)
  if "assigned" in df.columns:
    df["assigned"] = as_bool(df["assigned"])
  return df


def tested_roles(tests_df: pd.DataFrame) -> list[str]:
  """Roles (in role order) with at least one defined test: n > 0, a finite p-value or mean.

  A role listed in tests.csv only with NaN rows (e.g. block on single sentences) was not
  computable for the data and counts as not computed. Without n / p_value / mean columns,
  every listed role counts.
  """
  df = tests_df
  roles = list(roles_lib.role_order(df["role"].astype(str).unique()))
  checks = []
  if "n" in df.columns:
    checks.append(pd.to_numeric(df["n"], errors="coerce").fillna(0).to_numpy() > 0)
  for col in ("p_value", "mean"):
    if col in df.columns:
      checks.append(np.isfinite(pd.to_numeric(df[col], errors="coerce").to_numpy(float)))
  if not checks:
    return roles
  ok = np.logical_or.reduce(checks)
  defined = set(df.loc[ok, "role"].astype(str))
  return [r for r in roles if r in defined]


def grid_shape(tests_df: pd.DataFrame) -> tuple[int, int]:
  """(L, H): number of layers and heads, from the largest indices in a tests / clusters table."""
  if len(tests_df) == 0:
    raise ValueError("the table is empty: there are no heads to draw")
  return int(tests_df["layer"].max()) + 1, int(tests_df["head"].max()) + 1


def assigned_matrix(tests_df: pd.DataFrame, roles) -> np.ndarray:
  """bool ``[l, h, r]``: whether role r was assigned to head (l, h); False where not tested."""
  df = check_tests_df(tests_df)
  num_layers, num_heads = grid_shape(df)
  roles = list(roles)
  out = np.zeros((num_layers, num_heads, len(roles)), bool)
  index = {r: i for i, r in enumerate(roles)}
  sel = df[df["role"].isin(roles) & df["assigned"]]
  out[sel["layer"].to_numpy(), sel["head"].to_numpy(),
      sel["role"].map(index).to_numpy(dtype=int)] = True
  return out


def coarse_role_flags(tests_df: pd.DataFrame) -> pd.DataFrame:
  """One row per head (layer, head) with a bool column per coarse role and ``unskilled``.

  A head has a coarse role when the role deciding it (``hoststats.roles.COARSE_ROLES``: the
  paper's four tests) is assigned; heads present in ``tests_df`` with none are unskilled.
  """
  df = check_tests_df(tests_df)
  heads = df[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"])
  out = heads.reset_index(drop=True)
  for coarse, fine in roles_lib.COARSE_ROLES.items():
    hit = df[df["role"].isin(fine) & df["assigned"]][["layer", "head"]].drop_duplicates()
    hit = hit.assign(**{coarse: True})
    out = out.merge(hit, on=["layer", "head"], how="left")
    out[coarse] = out[coarse].astype("boolean").fillna(False).astype(bool)
  out["unskilled"] = ~out[list(roles_lib.COARSE_ROLES)].any(axis=1)
  return out


def coarse_flags(flags_or_tests: pd.DataFrame, sets) -> tuple[pd.DataFrame, list[str]]:
  """Per-head bool flags for the coarse ``sets`` and the sets actually computed.

  Accepts a tests table (``role`` column; coarse roles none of whose fine roles were tested are
  dropped) or a per-head table that already holds one bool column per set.
  """
  if "role" in flags_or_tests.columns:
    tested = set(tested_roles(flags_or_tests))
    flags = coarse_role_flags(flags_or_tests)
    computed = [s for s in sets if any(r in tested for r in roles_lib.COARSE_ROLES.get(s, (s,)))]
    if sets and not all(s in roles_lib.COARSE_ROLES for s in sets):
      bad = [s for s in sets if s not in roles_lib.COARSE_ROLES]
      raise ValueError(f"unknown coarse roles {bad}; choose from {list(roles_lib.COARSE_ROLES)}")
    return flags, computed
  require_columns(flags_or_tests, list(sets), "per-head role flags")
  flags = flags_or_tests.copy()
  for s in sets:
    flags[s] = as_bool(flags[s])
  return flags, list(sets)


def roles_per_head(tests_df: pd.DataFrame) -> pd.DataFrame:
  """Table of the assigned roles of every head: layer, head, number of roles, roles (in role order)."""
  df = check_tests_df(tests_df)
  rows = []
  order = {r: i for i, r in enumerate(roles_lib.role_order(df["role"].unique()))}
  for (layer, head), g in df.groupby(["layer", "head"], sort=True):
    roles = sorted(g.loc[g["assigned"], "role"], key=order.__getitem__)
    rows.append({"layer": layer, "head": head, "num_roles": len(roles),
                 "roles": ", ".join(roles) if roles else "(none)"})
  return pd.DataFrame(rows, columns=["layer", "head", "num_roles", "roles"])


def roles_per_layer(tests_df: pd.DataFrame) -> pd.DataFrame:
  """Number of heads per layer with each role assigned: fine roles, then coarse roles and unskilled.

  Index: layer (plus a final ``all`` row with the totals); columns: roles in role order, then
  ``any local``, ``any syntactic``, ``any delimiter``, ``any block``, ``unskilled``, ``heads``.
  """
  df = check_tests_df(tests_df)
  roles = list(roles_lib.role_order(df["role"].unique()))
  counts = (df[df["assigned"]].groupby(["layer", "role"]).size().unstack("role")
            .reindex(columns=roles))
  layers = sorted(df["layer"].unique())
  counts = counts.reindex(layers).fillna(0).astype(int)
  flags = coarse_role_flags(df)
  coarse = flags.groupby("layer")[list(roles_lib.COARSE_ROLES) + ["unskilled"]].sum().astype(int)
  coarse.columns = [f"any {c}" for c in roles_lib.COARSE_ROLES] + ["unskilled"]
  out = counts.join(coarse)
  out["heads"] = flags.groupby("layer").size()
  out.loc["all"] = out.sum(axis=0)
  out.index.name = "layer"
  out.columns.name = None
  return out.astype(int)


def mean_matrix(tests_df: pd.DataFrame, roles=None) -> tuple[np.ndarray, list[str]]:
  """float ``[l, h, r]`` of the ``mean`` column of a tests table (NaN where absent), and the roles."""
  df = check_tests_df(tests_df, required=("layer", "head", "role", "mean"))
  roles = list(roles_lib.role_order(df["role"].unique()) if roles is None else roles)
  num_layers, num_heads = grid_shape(df)
  out = np.full((num_layers, num_heads, len(roles)), np.nan)
  index = {r: i for i, r in enumerate(roles)}
  sel = df[df["role"].isin(roles)]
  out[sel["layer"].to_numpy(), sel["head"].to_numpy(), sel["role"].map(index).to_numpy(dtype=int)
      ] = sel["mean"].astype(float).to_numpy()
  return out, roles
