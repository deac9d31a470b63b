"""Groups of heads to ablate, and the gates that remove them (host side: numpy / pandas, no jax).

A head is ``(layer, head)``, both numbered from 0 as in the analysis CSV files. Groups come from

* the head clusters of an analysis (``clusters.csv``: one group per cluster type, Guan et al.
  2020 Table 2 rows 2-5 and 8-11; the types as `heads_jax.hoststats.clustering` names them by
  Guan et al.'s definitions, outlier heads joined to their nearest type; a cluster that meets
  no definition is "cluster K", never a Guan type): ``cluster_groups``; unions of two types (Table 2 rows 6-7:
  "we further prune two types together with diagonal type always remained",
  guan2020_how_far_does_bert_look_at.txt section 5.1): ``type_union_groups``, ``--by
  cluster-pairs``; every type but one (Table 3 rows 16-19: "ablating all type but remaining one
  type", Table 3 caption): ``all_but_one_type_groups``, ``--by cluster-all-but-one``;
* the assigned roles (``tests.csv``): one group per coarse role (local, syntactic, delimiter,
  block) plus the heads without any (``unskilled``), or one per fine role: ``role_groups``;
* the layers: ``layer_groups``;
* a list ``"L:H,L:H,..."`` (``parse_heads``); ``L:*`` means every head of layer L.

``gate_for`` turns a group into a ``head_gate`` ``[l, h]`` (0 on the group's heads, 1 elsewhere);
``segment_removal_for`` into the model's ``segment_removal`` ``[l, h, 2]`` (1 where the chosen
intra- or inter-segment attention is removed).
"""

from __future__ import annotations

import dataclasses
import re
from itertools import combinations
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from heads_jax import contract
from heads_jax.errors import UserError
from heads_jax.hoststats.clustering import closest_type
from heads_jax.hoststats.claims import CLUSTER_TYPES as CLUSTER_ORDER  # Guan et al.'s four types
from heads_jax.hoststats.roles import COARSE_ROLES, UNSKILLED, assignment_array, coarse_roles, role_order

GROUPINGS = ("cluster", "cluster-pairs", "cluster-all-but-one", "role", "layer", "heads")
SEGMENT_PARTS = ("intra", "inter")


@dataclasses.dataclass(frozen=True)
class HeadGroup:
  """A named set of heads. ``kind``: cluster, role, layer, heads or random."""
  name: str
  kind: str
  heads: tuple[tuple[int, int], ...]

  def __len__(self) -> int:
    return len(self.heads)

  @property
  def label(self) -> str:
    return format_heads(self.heads)


def _sorted_unique(heads: Iterable) -> tuple[tuple[int, int], ...]:
  return tuple(sorted({(int(l), int(h)) for l, h in heads}))


def format_heads(heads) -> str:
  """``"0:1,0:3,2:0"``: the heads of a group in the form ``parse_heads`` reads."""
  return ",".join(f"{l}:{h}" for l, h in heads)


def check_heads(heads, num_layers: int, num_heads: int, source: str = "the head list"):
  """Raises a `UserError` naming the first head outside ``num_layers x num_heads``."""
  for l, h in heads:
    if not (0 <= l < num_layers and 0 <= h < num_heads):
      raise UserError(f"{source} names head {l}:{h}, but the model has {num_layers} layers x "
                      f"{num_heads} heads (numbered from 0); was it made for another model?")


def parse_heads(text: str, num_layers: int | None = None,
                num_heads: int | None = None) -> tuple[tuple[int, int], ...]:
  """Heads from ``"L:H,L:H"`` (spaces allowed; ``L:*`` = all heads of layer L, which needs
  ``num_heads``). Sorted and without duplicates; checked against the model's shape when given."""
  if not isinstance(text, str) or not text.strip():
    raise UserError("empty head list: give heads as LAYER:HEAD,LAYER:HEAD (e.g. 0:3,5:11)")
  heads = []
  for item in re.split(r"[,\s]+", text.strip()):
    if not item:
      continue
    m = re.fullmatch(r"(\d+):(\d+|\*)", item)
    if not m:
      raise UserError(f"bad head {item!r} in {text!r}: write LAYER:HEAD with numbers from 0 "
                      "(or LAYER:* for a whole layer), separated by commas")
    layer = int(m.group(1))
    if m.group(2) == "*":
      if num_heads is None:
        raise UserError(f"{item!r}: a whole layer needs the number of heads per layer")
      heads += [(layer, h) for h in range(num_heads)]
    else:
      heads.append((layer, int(m.group(2))))
  heads = _sorted_unique(heads)
  if num_layers is not None and num_heads is not None:
    check_heads(heads, num_layers, num_heads, f"--heads {text!r}")
  return heads


def cluster_groups(clusters: pd.DataFrame, *, name_column: str = "cluster_name") -> list[HeadGroup]:
  """One group per cluster of a ``clusters.csv`` table (columns layer, head, cluster_name and,
  if present, cluster), in the order dense, diagonal, dense+vertical, vertical, then other
  names. A cluster that does not meet its closest type's definition ("unnamed (closest: X,
  margin m)", `heads_jax.hoststats.clustering`) is never ablated under a Guan name: its group is
  "cluster K" (K = its cluster id + 1), so Guan et al.'s Tables 2-3 (`heads_jax.ablation.guan`)
  find that type missing."""
  missing = [c for c in ("layer", "head", name_column) if c not in clusters.columns]
  if missing:
    raise UserError(f"the clusters table lacks the columns {missing}; pass the clusters.csv of "
                    f"`heads-jax analyze` (has {list(clusters.columns)})")
  names = clusters[name_column].astype(str)
  shown = names.copy()
  unnamed = names.map(lambda n: closest_type(n) is not None)
  if unnamed.any():
    if "cluster" in clusters.columns:
      ids = clusters["cluster"].astype(int)
    else:
      ids = names.map({n: i for i, n in enumerate(dict.fromkeys(names))})
    shown[unnamed] = [f"cluster {int(i) + 1}" for i in ids[unnamed]]
  order = ([c for c in CLUSTER_ORDER if c in set(shown)]
           + sorted(set(shown) - set(CLUSTER_ORDER)))
  groups = []
  for name in order:
    rows = clusters[shown == name]
    groups.append(HeadGroup(name, "cluster", _sorted_unique(zip(rows["layer"], rows["head"]))))
  return groups


def type_union_groups(groups: Sequence[HeadGroup], size: int = 2) -> list[HeadGroup]:
  """Every union of ``size`` of ``groups`` (in their order), named "A and B" (kind "cluster"):
  Guan et al. Table 2 rows 6 (dense and vertical) and 7 (dense+vertical and vertical) among
  them."""
  if not 1 <= size <= len(groups):
    raise UserError(f"a union of {size} types needs at least {size} types; got {len(groups)}")
  return [HeadGroup(" and ".join(g.name for g in combo), "cluster",
                    _sorted_unique(h for g in combo for h in g.heads))
          for combo in combinations(groups, size)]


def all_but_one_type_groups(groups: Sequence[HeadGroup]) -> list[HeadGroup]:
  """For each group, the union of all the others, named "all but NAME" (kind "cluster"): the
  heads whose attention Guan et al. Table 3 rows 16-19 remove while one type keeps it."""
  if len(groups) < 2:
    raise UserError(f"'all but one type' needs at least two types; got {len(groups)}")
  return [HeadGroup(f"all but {g.name}", "cluster",
                    _sorted_unique(h for other in groups if other is not g for h in other.heads))
          for g in groups]


def role_groups(tests: pd.DataFrame, *, level: str = "coarse", num_layers: int | None = None,
                num_heads: int | None = None) -> list[HeadGroup]:
  """Groups by assigned role from a ``tests.csv`` table.

  ``level="coarse"``: one group per available coarse role (local, syntactic, delimiter, block;
  a head with several roles is in several groups) and ``unskilled`` (heads with none);
  ``level="fine"``: one group per fine role. Empty groups are kept (0 heads) so the table shows
  that no head had the role.
  """
  if level not in ("coarse", "fine"):
    raise UserError(f"role level must be 'coarse' or 'fine', got {level!r}")
  assigned, roles = assignment_array(tests, role_order(tests["role"].astype(str)),
                                     num_layers, num_heads)
  groups = []
  if level == "fine":
    for r, name in enumerate(roles):
      groups.append(HeadGroup(name, "role", _sorted_unique(np.argwhere(assigned[..., r]))))
    return groups
  coarse, names = coarse_roles(assigned, roles)
  for c, name in enumerate(names):
    groups.append(HeadGroup(name, "role", _sorted_unique(np.argwhere(coarse[..., c]))))
  groups.append(HeadGroup(UNSKILLED, "role", _sorted_unique(np.argwhere(~coarse.any(-1)))))
  return groups


def layer_groups(num_layers: int, num_heads: int) -> list[HeadGroup]:
  """One group per layer holding all its heads."""
  return [HeadGroup(f"layer {l}", "layer", tuple((l, h) for h in range(num_heads)))
          for l in range(num_layers)]


def load_groups(by: str, *, num_layers: int, num_heads: int, analysis: str | Path | None = None,
                heads: str | None = None, role_level: str = "coarse") -> list[HeadGroup]:
  """The groups of one grouping (``GROUPINGS``), checked against the model's shape.

  ``cluster`` reads ``analysis/clusters.csv`` (``cluster-pairs``: every union of two types;
  ``cluster-all-but-one``: every type but one), ``role`` ``analysis/tests.csv``; ``heads`` parses
  ``heads`` (several groups separated by ``;``, each optionally ``NAME=L:H,...``).
  """
  if by not in GROUPINGS:
    raise UserError(f"--by must be one of {', '.join(GROUPINGS)}, got {by!r}")
  if by == "layer":
    return layer_groups(num_layers, num_heads)
  if by == "heads":
    if not heads:
      raise UserError("--by heads needs --heads L:H,L:H (several groups separated by ';')")
    groups = []
    for i, part in enumerate(p for p in heads.split(";") if p.strip()):
      name, sep, body = part.partition("=")
      if not sep:
        name, body = f"heads {i + 1}" if ";" in heads else "heads", part
      groups.append(HeadGroup(name.strip(), "heads", parse_heads(body, num_layers, num_heads)))
    return groups
  if analysis is None:
    raise UserError(f"--by {by} needs --analysis DIR (the output directory of `heads-jax analyze` "
                    "on this model)")
  folder = Path(analysis)
  by_cluster = by.startswith("cluster")
  file = folder / (contract.CLUSTERS_CSV if by_cluster else contract.TESTS_CSV)
  if not file.is_file():
    raise UserError(f"{file} does not exist: --analysis must be the output directory of "
                    f"`heads-jax analyze` (it writes {contract.CLUSTERS_CSV} and "
                    f"{contract.TESTS_CSV})")
  try:
    if by_cluster:
      groups = cluster_groups(contract.load_clusters(folder).table)
      if by == "cluster-pairs":
        groups = type_union_groups(groups, 2)
      elif by == "cluster-all-but-one":
        groups = all_but_one_type_groups(groups)
    else:
      groups = role_groups(contract.load_tests(folder).table, level=role_level)
  except ValueError as e:   # a file that does not follow the contract
    raise UserError(f"{file}: {e}") from None
  for g in groups:
    check_heads(g.heads, num_layers, num_heads, str(file))
  return groups


def all_heads(num_layers: int, num_heads: int) -> tuple[tuple[int, int], ...]:
  return tuple((l, h) for l in range(num_layers) for h in range(num_heads))


def random_group(size: int, num_layers: int, num_heads: int, rng: np.random.Generator,
                 name: str = "random") -> HeadGroup:
  """``size`` heads drawn uniformly without replacement from all heads."""
  total = num_layers * num_heads
  if not 0 <= size <= total:
    raise ValueError(f"a random group of {size} heads does not fit in {total} heads")
  pick = rng.choice(total, size=size, replace=False)
  return HeadGroup(name, "random", _sorted_unique((i // num_heads, i % num_heads) for i in pick))


def gate_for(heads, num_layers: int, num_heads: int, value: float = 0.0) -> np.ndarray:
  """float32 ``[l, h]``: ``value`` on ``heads``, 1 elsewhere (``head_gate`` of the model)."""
  gate = np.ones((num_layers, num_heads), np.float32)
  heads = list(heads)
  check_heads(heads, num_layers, num_heads)
  for l, h in heads:
    gate[l, h] = value
  return gate


def segment_removal_for(heads, num_layers: int, num_heads: int,
                        parts: str | Sequence[str]) -> np.ndarray:
  """float32 ``[l, h, 2]``: 1 where the ``parts`` (``"intra"``, ``"inter"`` or both) of a head's
  attention are removed (the model's ``segment_removal``)."""
  parts = (parts,) if isinstance(parts, str) else tuple(parts)
  bad = [p for p in parts if p not in SEGMENT_PARTS]
  if bad:
    raise UserError(f"segment part must be one of {SEGMENT_PARTS}, got {bad}")
  out = np.zeros((num_layers, num_heads, 2), np.float32)
  heads = list(heads)
  check_heads(heads, num_layers, num_heads)
  for l, h in heads:
    for p in parts:
      out[l, h, SEGMENT_PARTS.index(p)] = 1.0
  return out


__all__ = ["HeadGroup", "GROUPINGS", "COARSE_ROLES", "SEGMENT_PARTS", "parse_heads", "format_heads",
           "check_heads", "cluster_groups", "type_union_groups", "all_but_one_type_groups",
           "role_groups", "layer_groups", "load_groups",
           "all_heads", "random_group", "gate_for", "segment_removal_for"]
