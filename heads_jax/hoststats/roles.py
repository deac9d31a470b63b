"""Role assignment per head, coarse roles and per-layer role counts (host, numpy/pandas).

A head has a (fine) role when that role's hypothesis test assigned it (``assigned`` column of
the tests table).

**Coarse roles are the paper's four tests** (DESIGN.md section 3, "Coarse roles"): a head has
the coarse role local, syntactic, block or delimiter when the hypothesis test *of that role*
rejects, as Pande et al. do: "Note that we perform this hypothesis test independently for all
heads and the four functional roles" (pande2021_heads_hypothesis.txt, section "Assigning
functional roles to heads"). `COARSE_ROLES` maps each coarse role to the one role whose test
decides it. Every summary, table and figure that is compared with the paper (shares, unskilled
heads, Venn / UpSet, roles per layer, the console summary) uses these.

**The fine-role union** (`FINE_UNION`, ``view="union"``) is a separate, heads_jax view, not
the paper's: a coarse role when any of its finer roles is assigned (delimiter = delimiter or cls
or sep; local = local or prev_local or next_local; syntactic = syntactic or any relation). It
counts more heads: a head with 0.2 of its attention on [CLS] (n = 20) has cls 4.0 but delimiter
1.89 (only the first passes tau = 3); one with 0.3 on the previous token has prev_local 3.37
but local 1.79.

A coarse role is *available* in a run when its deciding role (the union view: any of its roles)
was computed (is in the run's role list); functions here return only the available coarse
roles. A head is "unskilled" when it has none of the available coarse roles.

Also the layer groups (initial, middle and final thirds of the layers) of the before/after
comparison. The report draws with these definitions (it does not copy them).

Host-only module (numpy, pandas); no jax.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from heads_jax.data import vocabulary

# The coarse roles (the role registry's groups, data/vocabulary.py) and the role whose test
# decides each: the paper's four tests.
COARSE_ROLES = {g: (g,) for g in vocabulary.COARSE_GROUPS}
# heads_jax's fine-role union view (not the paper's): the registry's fine roles of each group.
FINE_UNION = vocabulary.COARSE_ROLES
TESTS, UNION = "tests", "union"
# The roles the paper's pooled figures read (mean sieve score, tau = "auto", p-values in
# (0.05, 0.95)): its four functional roles, not block_plain, prev/next_local, cls, sep or the
# single relations (Fig. 3 caption: "144 x |tasks| x |roles| x |num sents| scores").
PAPER_ROLES = vocabulary.COARSE_GROUPS
# The role rules (DESIGN.md section 3, "Role rules"): "calibrated" (heads_jax's addition, the
# default), "paper" (the mean sieve bias significantly above tau: the paper's test) and "average"
# (the mean above tau, no test: the official code's method='avg', the rule the paper argues
# against with its Fig. 2). `rule_assigned` is where a rule's decision is read.
RULES = ("calibrated", "paper", "average")


def average_rule(mean, tau: float) -> np.ndarray:
  """bool: the average rule's decision, ``mean > tau`` (NaN, an empty sieve, is never assigned)."""
  mean = np.asarray(mean, np.float64)
  return np.where(np.isnan(mean), False, mean > float(tau))


def rule_assigned(tests: pd.DataFrame, rule: str, tau: float | None = None) -> np.ndarray:
  """bool per row of a tests table: the decision of ``rule``. ``paper`` / ``calibrated``: the
  table's ``assigned_<rule>`` column (a table without the rule columns holds the paper's rule in
  ``assigned``); ``average``: `average_rule` of the ``mean`` column at ``tau`` (required)."""
  if rule not in RULES:
    raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
  if rule == "average":
    if tau is None:
      raise ValueError("the average rule needs tau (the run's settings 'tau')")
    return average_rule(tests["mean"].to_numpy(np.float64), tau)
  column = f"assigned_{rule}"
  if column in tests.columns:
    return tests[column].to_numpy(bool)
  if rule == "paper":
    return tests["assigned"].to_numpy(bool)
  raise ValueError(f"the tests table has no {column} column (run without the role rules)")
VIEWS = {TESTS: COARSE_ROLES, UNION: FINE_UNION}
UNSKILLED = "unskilled"
# Thirds of the layers (Pande et al. Fig. 6), see `layer_groups`.
LAYER_GROUPS = ("initial", "middle", "final")


role_order = vocabulary.role_order   # known roles in registry order, then unknown ones


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


def _members(view: str) -> dict[str, tuple[str, ...]]:
  if view not in VIEWS:
    raise ValueError(f"view must be one of {tuple(VIEWS)} (the paper's four tests, or heads_jax's "
                     f"fine-role union); got {view!r}")
  return VIEWS[view]


def available_coarse_roles(roles: Sequence[str], view: str = TESTS) -> tuple[str, ...]:
  """The coarse roles whose deciding role (``view="union"``: any of its roles) is in ``roles``."""
  return tuple(c for c, members in _members(view).items() if any(m in roles for m in members))


def coarse_roles(assigned: np.ndarray, roles: Sequence[str],
                 view: str = TESTS) -> tuple[np.ndarray, tuple[str, ...]]:
  """Coarse role assignment: (bool ``[l, h, c]``, the c available coarse role names).

  ``view="tests"`` (default): the paper's four tests (module docstring); ``"union"``: heads_jax's
  fine-role union."""
  assigned = np.asarray(assigned, bool)
  roles = tuple(roles)
  if assigned.ndim != 3 or assigned.shape[2] != len(roles):
    raise ValueError(f"assigned must be bool [l, h, r] with r = {len(roles)}; got {assigned.shape}")
  names = available_coarse_roles(roles, view)
  out = np.zeros(assigned.shape[:2] + (len(names),), bool)
  for c, name in enumerate(names):
    members = [roles.index(m) for m in _members(view)[name] if m in roles]
    out[..., c] = assigned[..., members].any(-1)
  return out, names


def unskilled(assigned: np.ndarray, roles: Sequence[str], view: str = TESTS) -> np.ndarray:
  """bool ``[l, h]``: heads with none of the available coarse roles (of ``view``)."""
  coarse, _ = coarse_roles(assigned, roles, view)
  return ~coarse.any(-1)


def head_roles(assigned: np.ndarray, roles: Sequence[str], view: str = TESTS) -> pd.DataFrame:
  """One row per head: layer, head, roles and coarse_roles (';'-joined names, '' for none)."""
  assigned = np.asarray(assigned, bool)
  roles = tuple(roles)
  coarse, names = coarse_roles(assigned, roles, view)
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


def coarse_roles_by_layer(assigned: np.ndarray, roles: Sequence[str],
                          view: str = TESTS) -> pd.DataFrame:
  """Number of heads per layer with each coarse role (of ``view``: the paper's four tests by
  default), and unskilled heads.

  Columns: layer, the available coarse roles, unskilled. A head can have several coarse
  roles, so a row's counts can add up to more than the number of heads.
  """
  coarse, names = coarse_roles(assigned, roles, view)
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
