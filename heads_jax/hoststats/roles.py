"""Role assignment per head, coarse roles and per-layer role counts (host, numpy/pandas).

A head has a (fine) role when that role's hypothesis test assigned it (``assigned`` column of
the tests table). Coarse roles (DESIGN.md "Coarse roles and the paper's summary figures"):

===============  ==================================================
coarse role      the head has any of these fine roles
===============  ==================================================
``local``        local, prev_local, next_local
``syntactic``    syntactic, nsubj, obj, amod, advmod
``delimiter``    delimiter, cls, sep
``block``        block (the entropy-weighted score; block_plain is not part of it)
===============  ==================================================

(each role's ``group`` in the role registry, ``heads_jax.data.vocabulary.REGISTRY``, which this
module reads: `COARSE_ROLES`).

A coarse role is *available* in a run when at least one of its fine roles was computed (is in
the run's role list); functions here return only the available coarse roles. A head is
"unskilled" when it has none of the available coarse roles.

Also the layer groups (initial, middle and final thirds of the layers) of the before/after
comparison. The report draws with these definitions (it does not copy them).

Host-only module (numpy, pandas); no jax.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from heads_jax.data import vocabulary as batch_lib

# The coarse roles and their fine roles: the role registry's groups (data/vocabulary.py).
COARSE_ROLES = batch_lib.COARSE_ROLES
UNSKILLED = "unskilled"
# Thirds of the layers (Pande et al. Fig. 6), see `layer_groups`.
LAYER_GROUPS = ("initial", "middle", "final")


role_order = batch_lib.role_order   # known roles in registry order, then unknown ones


def layer_groups(num_layers: int) -> dict[str, np.ndarray]:
  """The initial, middle and final thirds of the layers (non-empty groups only), by
  ``numpy.array_split(range(num_layers), 3)``: for 12 layers 0-3, 4-7, 8-11."""
  parts = np.array_split(np.arange(num_layers), 3)
  return {name: part for name, part in zip(LAYER_GROUPS, parts) if part.size}


def assignment_array(tests: pd.DataFrame, roles: Sequence[str] | None = None,
                     num_layers: int | None = None,
                     num_heads: int | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
  """The boolean role assignment ``[l, h, r]`` from a tests table.

  Args:
    tests: a table with columns layer, head, role, assigned (e.g. from
      `hypothesis.hypothesis_tests` or `heads_jax.contract.read_tests`), one row per
      (layer, head, role).
    roles: the role axis order; default: the table's roles in `batch.ROLES` order.
    num_layers, num_heads: default: 1 + the largest index in the table.

  Returns:
    (assigned bool ``[l, h, r]``, roles).
  """
  missing = {"layer", "head", "role", "assigned"} - set(tests.columns)
  if missing:
    raise ValueError(f"the tests table lacks the columns {sorted(missing)}; pass the table of "
                     f"hypothesis.hypothesis_tests or contract.read_tests")
  roles = role_order(tests["role"]) if roles is None else tuple(roles)
  layer = tests["layer"].to_numpy(np.int64)
  head = tests["head"].to_numpy(np.int64)
  num_layers = int(layer.max()) + 1 if num_layers is None and len(tests) else (num_layers or 0)
  num_heads = int(head.max()) + 1 if num_heads is None and len(tests) else (num_heads or 0)
  index = {r: i for i, r in enumerate(roles)}
  unknown = sorted(set(tests["role"]) - set(index))
  if unknown:
    raise ValueError(f"the tests table has roles {unknown} that are not in roles={list(roles)}")
  if len(tests) and (layer.min() < 0 or layer.max() >= num_layers or head.min() < 0
                     or head.max() >= num_heads):
    raise ValueError(f"layer/head indices out of range for {num_layers} layers x {num_heads} heads")
  r = np.asarray([index[x] for x in tests["role"]], np.int64)
  count = np.zeros((num_layers, num_heads, len(roles)), np.int64)
  np.add.at(count, (layer, head, r), 1)
  if (count != 1).any():
    l, h, k = np.argwhere(count != 1)[0]
    raise ValueError(f"the tests table must have exactly one row per (layer, head, role); "
                     f"(layer {l}, head {h}, role {roles[k]}) has {count[l, h, k]}")
  assigned = np.zeros((num_layers, num_heads, len(roles)), bool)
  assigned[layer, head, r] = tests["assigned"].to_numpy(bool)
  return assigned, roles


def available_coarse_roles(roles: Sequence[str]) -> tuple[str, ...]:
  """The coarse roles with at least one fine role among ``roles``."""
  return tuple(c for c, members in COARSE_ROLES.items() if any(m in roles for m in members))


def coarse_roles(assigned: np.ndarray, roles: Sequence[str]) -> tuple[np.ndarray, tuple[str, ...]]:
  """Coarse role assignment: (bool ``[l, h, c]``, the c available coarse role names)."""
  assigned = np.asarray(assigned, bool)
  roles = tuple(roles)
  if assigned.ndim != 3 or assigned.shape[2] != len(roles):
    raise ValueError(f"assigned must be bool [l, h, r] with r = {len(roles)}; got {assigned.shape}")
  names = available_coarse_roles(roles)
  out = np.zeros(assigned.shape[:2] + (len(names),), bool)
  for c, name in enumerate(names):
    members = [roles.index(m) for m in COARSE_ROLES[name] if m in roles]
    out[..., c] = assigned[..., members].any(-1)
  return out, names


def unskilled(assigned: np.ndarray, roles: Sequence[str]) -> np.ndarray:
  """bool ``[l, h]``: heads with none of the available coarse roles."""
  coarse, _ = coarse_roles(assigned, roles)
  return ~coarse.any(-1)


def head_roles(assigned: np.ndarray, roles: Sequence[str]) -> pd.DataFrame:
  """One row per head: layer, head, roles and coarse_roles (';'-joined names, '' for none)."""
  assigned = np.asarray(assigned, bool)
  roles = tuple(roles)
  coarse, names = coarse_roles(assigned, roles)
  l, h = assigned.shape[:2]
  rows = []
  for i in range(l):
    for j in range(h):
      rows.append({
          "layer": i, "head": j,
          "roles": ";".join(r for r, a in zip(roles, assigned[i, j]) if a),
          "coarse_roles": ";".join(c for c, a in zip(names, coarse[i, j]) if a),
      })
  return pd.DataFrame(rows, columns=["layer", "head", "roles", "coarse_roles"])


def roles_by_layer(assigned: np.ndarray, roles: Sequence[str]) -> pd.DataFrame:
  """Number of heads per layer with each fine role: columns layer, then one per role."""
  assigned = np.asarray(assigned, bool)
  counts = assigned.sum(1)  # [l, r]
  table = pd.DataFrame(counts, columns=list(roles))
  table.insert(0, "layer", np.arange(assigned.shape[0]))
  return table


def coarse_roles_by_layer(assigned: np.ndarray, roles: Sequence[str]) -> pd.DataFrame:
  """Number of heads per layer with each coarse role, and unskilled heads.

  Columns: layer, the available coarse roles, unskilled. A head can have several coarse
  roles, so a row's counts can add up to more than the number of heads.
  """
  coarse, names = coarse_roles(assigned, roles)
  table = pd.DataFrame(coarse.sum(1), columns=list(names))
  table[UNSKILLED] = (~coarse.any(-1)).sum(1)
  table.insert(0, "layer", np.arange(coarse.shape[0]))
  return table


def format_roles_by_layer(table: pd.DataFrame, total: bool = True) -> str:
  """A fixed-width text table (for the command line) of `roles_by_layer` or
  `coarse_roles_by_layer`, with a final "total" row when ``total``."""
  if "layer" not in table.columns:
    raise ValueError("expected a table with a 'layer' column (from roles_by_layer or "
                     "coarse_roles_by_layer)")
  columns = [c for c in table.columns if c != "layer"]
  rows = [[str(v) for v in table["layer"]]]
  body = [[str(int(v)) for v in table[c]] for c in columns]
  labels = list(rows[0])
  if total:
    labels.append("total")
    body = [col + [str(int(table[c].sum()))] for col, c in zip(body, columns)]
  widths = [max([len("layer")] + [len(x) for x in labels])]
  widths += [max([len(c)] + [len(x) for x in col]) for c, col in zip(columns, body)]
  lines = ["  ".join(name.rjust(w) for name, w in zip(["layer"] + columns, widths))]
  for i, label in enumerate(labels):
    cells = [label] + [col[i] for col in body]
    lines.append("  ".join(cell.rjust(w) for cell, w in zip(cells, widths)))
  return "\n".join(lines)
