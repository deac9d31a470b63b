"""Head groups: parsing, cluster and role groups from analysis files, gates (host only)."""

import numpy as np
import pandas as pd
import pytest

from heads_jax.ablation import groups
from heads_jax.data.vocabulary import DISTANCE_FEATURES
from heads_jax.errors import UserError


def test_parse_heads():
  assert groups.parse_heads("1:2, 0:3,1:2 0:0") == ((0, 0), (0, 3), (1, 2))
  assert groups.parse_heads("2:*", 3, 4) == ((2, 0), (2, 1), (2, 2), (2, 3))
  assert groups.format_heads(((0, 0), (2, 3))) == "0:0,2:3"
  assert groups.parse_heads(groups.format_heads(((1, 1), (0, 2)))) == ((0, 2), (1, 1))
  for bad in ("", "1-2", "a:b", "1:2:3"):
    with pytest.raises(UserError):
      groups.parse_heads(bad)
  with pytest.raises(UserError, match="model has 2 layers x 4 heads"):
    groups.parse_heads("2:0", 2, 4)
  with pytest.raises(UserError, match="model has 2 layers x 4 heads"):
    groups.parse_heads("0:4", 2, 4)


def _clusters_csv(path, names):
  """A clusters.csv of the analysis contract for len(names) heads (2 layers)."""
  n = len(names)
  h = n // 2
  rows = []
  for i, name in enumerate(names):
    row = {"layer": i // h, "head": i % h}
    row.update({f: 1.0 / 21 for f in DISTANCE_FEATURES})
    row.update(cluster=0, cluster_name=name, tsne_x=0.0, tsne_y=0.0)
    rows.append(row)
  pd.DataFrame(rows).to_csv(path / "clusters.csv", index=False)


def test_cluster_groups_from_clusters_csv(tmp_path):
  _clusters_csv(tmp_path, ["vertical", "diagonal", "dense", "vertical", "dense+vertical", "odd",
                           "diagonal", "vertical"])
  gs = groups.load_groups("cluster", num_layers=2, num_heads=4, analysis=tmp_path)
  assert [g.name for g in gs] == ["dense", "diagonal", "dense+vertical", "vertical", "odd"]
  by = {g.name: g.heads for g in gs}
  assert by["vertical"] == ((0, 0), (0, 3), (1, 3))
  assert by["diagonal"] == ((0, 1), (1, 2))
  assert by["odd"] == ((1, 1),)
  assert all(g.kind == "cluster" for g in gs)
  assert sum(len(g) for g in gs) == 8
  with pytest.raises(UserError, match="model has 1 layers"):
    groups.load_groups("cluster", num_layers=1, num_heads=4, analysis=tmp_path)
  with pytest.raises(UserError, match="needs --analysis"):
    groups.load_groups("cluster", num_layers=2, num_heads=4)
  with pytest.raises(UserError, match="tests.csv does not exist"):
    groups.load_groups("role", num_layers=2, num_heads=4, analysis=tmp_path)


def test_role_groups_from_tests_csv(tmp_path):
  roles = ["local", "prev_local", "cls", "sep", "delimiter", "nsubj", "syntactic"]
  assigned = {(0, 0): {"prev_local"}, (0, 1): {"cls", "nsubj"}, (1, 0): set(),
              (1, 1): {"sep", "delimiter", "local", "syntactic"}}
  rows = [{"layer": l, "head": h, "role": r, "mean": 1.0, "n": 5, "statistic": 0.0,
           "p_value": 0.5, "p_adjusted": 0.5, "assigned": r in a}
          for (l, h), a in assigned.items() for r in roles]
  pd.DataFrame(rows).to_csv(tmp_path / "tests.csv", index=False)
  gs = {g.name: g.heads for g in groups.load_groups("role", num_layers=2, num_heads=2,
                                                    analysis=tmp_path)}
  # coarse roles are the paper's four tests: prev_local, cls and nsubj alone make no coarse role
  assert gs == {"local": ((1, 1),), "syntactic": ((1, 1),), "delimiter": ((1, 1),),
                "unskilled": ((0, 0), (0, 1), (1, 0))}
  fine = {g.name: g.heads for g in groups.load_groups("role", num_layers=2, num_heads=2,
                                                      analysis=tmp_path, role_level="fine")}
  assert fine["cls"] == ((0, 1),) and fine["local"] == ((1, 1),) and set(fine) == set(roles)


def test_layer_and_list_groups():
  gs = groups.load_groups("layer", num_layers=3, num_heads=2)
  assert [g.heads for g in gs] == [((0, 0), (0, 1)), ((1, 0), (1, 1)), ((2, 0), (2, 1))]
  two = groups.load_groups("heads", num_layers=3, num_heads=2, heads="a=0:1,2:0; 1:*")
  assert [(g.name, g.heads) for g in two] == [("a", ((0, 1), (2, 0))), ("heads 2", ((1, 0), (1, 1)))]
  with pytest.raises(UserError, match="--by must be"):
    groups.load_groups("nope", num_layers=3, num_heads=2)


def test_gates_and_random_groups():
  gate = groups.gate_for(((0, 1), (1, 0)), 2, 3)
  assert gate.dtype == np.float32 and gate.sum() == 4 and gate[0, 1] == 0 and gate[1, 0] == 0
  half = groups.gate_for(((0, 0),), 2, 3, value=0.5)
  assert half[0, 0] == 0.5 and half.sum() == 5.5
  rem = groups.segment_removal_for(((1, 2),), 2, 3, "inter")
  assert rem.shape == (2, 3, 2) and rem[1, 2, 1] == 1 and rem.sum() == 1
  both = groups.segment_removal_for(((1, 2),), 2, 3, ("intra", "inter"))
  assert both[1, 2].tolist() == [1, 1] and both.sum() == 2
  with pytest.raises(UserError):
    groups.segment_removal_for(((0, 0),), 2, 3, "across")
  g1 = groups.random_group(4, 2, 3, np.random.default_rng(0))
  g2 = groups.random_group(4, 2, 3, np.random.default_rng(0))
  assert g1 == g2 and len(set(g1.heads)) == 4
  assert all(0 <= l < 2 and 0 <= h < 3 for l, h in g1.heads)
  with pytest.raises(ValueError):
    groups.random_group(7, 2, 3, np.random.default_rng(0))


def test_type_unions_and_all_but_one_type(tmp_path):
  """Guan et al. Table 2 rows 6-7 (two types pruned together) and Table 3 rows 16-19 (all types
  but one), from a clusters.csv."""
  names = {(0, 0): "dense", (0, 1): "diagonal", (1, 0): "dense+vertical", (1, 1): "vertical",
           (2, 0): "vertical", (2, 1): "dense"}
  rows = []
  for (l, h), name in names.items():
    row = {"layer": l, "head": h, **{f: 0.0 for f in DISTANCE_FEATURES}}
    row.update({"cluster": 0, "cluster_name": name, "tsne_x": 0.0, "tsne_y": 0.0})
    rows.append(row)
  pd.DataFrame(rows).to_csv(tmp_path / "clusters.csv", index=False)
  types = groups.load_groups("cluster", num_layers=3, num_heads=2, analysis=tmp_path)
  pairs = {g.name: g.heads for g in groups.load_groups("cluster-pairs", num_layers=3, num_heads=2,
                                                       analysis=tmp_path)}
  assert len(pairs) == 6
  assert pairs["dense and vertical"] == ((0, 0), (1, 1), (2, 0), (2, 1))           # row 6
  assert pairs["dense+vertical and vertical"] == ((1, 0), (1, 1), (2, 0))         # row 7
  rest = {g.name: g.heads for g in groups.load_groups("cluster-all-but-one", num_layers=3,
                                                      num_heads=2, analysis=tmp_path)}
  assert list(rest) == [f"all but {g.name}" for g in types]
  assert rest["all but diagonal"] == ((0, 0), (1, 0), (1, 1), (2, 0), (2, 1))    # rows 16, 18
  for g in types:   # each type and "all but it" partition the heads
    assert set(g.heads) | set(rest[f"all but {g.name}"]) == set(names)
    assert not set(g.heads) & set(rest[f"all but {g.name}"])
  with pytest.raises(UserError, match="at least two"):
    groups.all_but_one_type_groups(types[:1])


def test_an_unnamed_cluster_is_never_ablated_under_a_guan_name(tmp_path):
  """Issue 41 item 2: a cluster whose definition is not met ("unnamed (closest: X, margin m)")
  is the group "cluster K" (K = its id + 1), so Guan et al.'s Tables 2-3 find its type missing."""
  from heads_jax.ablation import guan as guan_ablation
  from heads_jax.hoststats.clustering import unnamed_name
  names = ["dense", "diagonal", unnamed_name("dense+vertical", -0.17), "vertical"] * 2
  _clusters_csv(tmp_path, names)
  table = pd.read_csv(tmp_path / "clusters.csv")
  table["cluster"] = [0, 1, 2, 3] * 2
  table.to_csv(tmp_path / "clusters.csv", index=False)
  gs = groups.load_groups("cluster", num_layers=2, num_heads=4, analysis=tmp_path)
  assert [g.name for g in gs] == ["dense", "diagonal", "vertical", "cluster 3"]
  assert dict((g.name, g.heads) for g in gs)["cluster 3"] == ((0, 2), (1, 2))
  heads = guan_ablation._heads_by_type(gs)
  assert heads["dense+vertical"] == () and heads["dense"] == ((0, 0), (1, 0))
  pairs = groups.load_groups("cluster-pairs", num_layers=2, num_heads=4, analysis=tmp_path)
  assert not any("dense+vertical" in g.name for g in pairs)
