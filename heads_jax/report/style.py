"""Shared look of the report: role groups, colours, labels and small data-shaping helpers.

numpy / pandas / matplotlib only (no jax). The role names are those of
``heads_jax.data.batch.ROLES``; the coarse groups follow DESIGN.md section 3 ("Coarse roles").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from heads_jax.data import batch as batch_lib

# Coarse role -> the fine roles that give it (DESIGN.md section 3).
COARSE_ROLES = {
    "local": ("local", "prev_local", "next_local"),
    "syntactic": ("syntactic", "nsubj", "obj", "amod", "advmod"),
    "delimiter": ("delimiter", "cls", "sep"),
    "block": ("block",),
}

# The nine fine roles of the role grid (Pande et al. Fig. 5), in the order of their markers.
GRID_ROLES = ("cls", "sep", "nsubj", "obj", "amod", "advmod", "prev_local", "next_local", "block")

ROLE_COLORS = {
    "cls": "#1f77b4", "sep": "#17becf", "delimiter": "#2c7fb8",
    "nsubj": "#d62728", "obj": "#ff7f0e", "amod": "#e377c2", "advmod": "#8c564b",
    "syntactic": "#b2182b",
    "prev_local": "#2ca02c", "next_local": "#98df8a", "local": "#1b7837",
    "block": "#9467bd", "block_plain": "#c5b0d5",
}

COARSE_COLORS = {"local": "#1b7837", "syntactic": "#b2182b", "delimiter": "#2c7fb8",
                 "block": "#9467bd"}

# Cluster names of Guan et al. and their colours; unknown names get the fallback cycle.
CLUSTER_ORDER = ("dense", "diagonal", "dense+vertical", "vertical")
CLUSTER_COLORS = {"dense": "#4daf4a", "diagonal": "#e41a1c", "dense+vertical": "#ff7f00",
                  "vertical": "#377eb8"}
FALLBACK_COLORS = ("#984ea3", "#a65628", "#f781bf", "#999999", "#66c2a5", "#fc8d62")

LAYER_GROUPS = ("initial", "middle", "final")
LAYER_GROUP_COLORS = {"initial": "#a6cee3", "middle": "#1f78b4", "final": "#08306b"}

TESTS_COLUMNS = ("layer", "head", "role", "mean", "n", "statistic", "p_value", "p_adjusted",
                 "assigned")


def role_order(roles) -> list[str]:
  """``roles`` sorted as in ``batch.ROLES``; names not in it keep their order at the end."""
  roles = list(dict.fromkeys(roles))
  known = [r for r in batch_lib.ROLES if r in roles]
  return known + [r for r in roles if r not in batch_lib.ROLES]


def cluster_order(names) -> list[str]:
  """Cluster names in the canonical order (dense, diagonal, dense+vertical, vertical), then others."""
  names = list(dict.fromkeys(str(n) for n in names))
  known = [c for c in CLUSTER_ORDER if c in names]
  return known + sorted(n for n in names if n not in CLUSTER_ORDER)


def cluster_colors(names) -> dict[str, str]:
  """A colour per cluster name (canonical colours for Guan et al.'s four types)."""
  out, extra = {}, iter(FALLBACK_COLORS * 10)
  for n in cluster_order(names):
    out[n] = CLUSTER_COLORS.get(n) or next(extra)
  return out


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
  if not isinstance(tests_df, pd.DataFrame):
    raise TypeError(f"tests_df must be a pandas DataFrame (tests.csv), got {type(tests_df).__name__}")
  missing = [c for c in required if c not in tests_df.columns]
  if missing:
    raise ValueError(f"tests table lacks columns {missing}; it needs {list(required)} "
                     f"(tests.csv columns: {list(TESTS_COLUMNS)}), has {list(tests_df.columns)}")
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
  roles = role_order(df["role"].astype(str).unique())
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

  A head has a coarse role when any of its fine roles (``COARSE_ROLES``) is assigned; heads
  present in ``tests_df`` with no assigned role are unskilled.
  """
  df = check_tests_df(tests_df)
  heads = df[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"])
  out = heads.reset_index(drop=True)
  for coarse, fine in COARSE_ROLES.items():
    hit = df[df["role"].isin(fine) & df["assigned"]][["layer", "head"]].drop_duplicates()
    hit = hit.assign(**{coarse: True})
    out = out.merge(hit, on=["layer", "head"], how="left")
    out[coarse] = out[coarse].astype("boolean").fillna(False).astype(bool)
  out["unskilled"] = ~out[list(COARSE_ROLES)].any(axis=1)
  return out


def roles_per_head(tests_df: pd.DataFrame) -> pd.DataFrame:
  """Table of the assigned roles of every head: layer, head, number of roles, roles (in role order)."""
  df = check_tests_df(tests_df)
  rows = []
  order = {r: i for i, r in enumerate(role_order(df["role"].unique()))}
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
  roles = role_order(df["role"].unique())
  counts = (df[df["assigned"]].groupby(["layer", "role"]).size().unstack("role")
            .reindex(columns=roles))
  layers = sorted(df["layer"].unique())
  counts = counts.reindex(layers).fillna(0).astype(int)
  flags = coarse_role_flags(df)
  coarse = flags.groupby("layer")[list(COARSE_ROLES) + ["unskilled"]].sum().astype(int)
  coarse.columns = [f"any {c}" for c in COARSE_ROLES] + ["unskilled"]
  out = counts.join(coarse)
  out["heads"] = flags.groupby("layer").size()
  out.loc["all"] = out.sum(axis=0)
  out.index.name = "layer"
  out.columns.name = None
  return out.astype(int)
