"""Role assignment, coarse roles and per-layer tables on a small hand-made table."""
import numpy as np
import pandas as pd
import pytest

from heads_jax.hoststats import roles as roles_lib

ROLES = ("local", "next_local", "cls", "sep", "nsubj", "syntactic")
# (layer, head) -> assigned fine roles
ASSIGNED = {
    (0, 0): {"local", "nsubj"},      # local + syntactic
    (0, 1): {"next_local"},          # local
    (0, 2): set(),                   # unskilled
    (1, 0): {"cls", "sep"},          # delimiter
    (1, 1): {"syntactic", "cls"},    # syntactic + delimiter
    (1, 2): set(),                   # unskilled
}


def _tests(shuffle=True):
  rows = [{"layer": l, "head": h, "role": r, "assigned": r in ASSIGNED[(l, h)]}
          for (l, h) in ASSIGNED for r in ROLES]
  df = pd.DataFrame(rows)
  return df.sample(frac=1.0, random_state=0) if shuffle else df


def test_assignment_array():
  assigned, roles = roles_lib.assignment_array(_tests())
  assert roles == ROLES  # batch.ROLES order, whatever the row order
  assert assigned.shape == (2, 3, 6)
  for (l, h), names in ASSIGNED.items():
    assert {r for r, a in zip(roles, assigned[l, h]) if a} == names


def test_assignment_array_errors():
  df = _tests(shuffle=False)
  with pytest.raises(ValueError, match="exactly one row"):
    roles_lib.assignment_array(pd.concat([df, df.iloc[:1]]))
  with pytest.raises(ValueError, match="exactly one row"):
    roles_lib.assignment_array(df.iloc[1:])
  with pytest.raises(ValueError, match="not in roles"):
    roles_lib.assignment_array(df, roles=("local",))
  with pytest.raises(ValueError, match="columns"):
    roles_lib.assignment_array(df.drop(columns=["assigned"]))


def test_coarse_roles_and_unskilled():
  assigned, roles = roles_lib.assignment_array(_tests())
  coarse, names = roles_lib.coarse_roles(assigned, roles)
  assert names == ("local", "syntactic", "delimiter")  # no block role computed
  expected = {
      (0, 0): ("local", "syntactic"), (0, 1): ("local",), (0, 2): (),
      (1, 0): ("delimiter",), (1, 1): ("syntactic", "delimiter"), (1, 2): (),
  }
  for (l, h), want in expected.items():
    assert tuple(n for n, a in zip(names, coarse[l, h]) if a) == want
  np.testing.assert_array_equal(roles_lib.unskilled(assigned, roles),
                                [[False, False, True], [False, False, True]])
  assert roles_lib.available_coarse_roles(("block_plain", "sep")) == ("delimiter",)
  assert roles_lib.available_coarse_roles(("block", "amod")) == ("syntactic", "block")


def test_head_roles_table():
  assigned, roles = roles_lib.assignment_array(_tests())
  table = roles_lib.head_roles(assigned, roles)
  assert list(table.columns) == ["layer", "head", "roles", "coarse_roles"]
  row = table[(table["layer"] == 1) & (table["head"] == 1)].iloc[0]
  assert row["roles"] == "cls;syntactic" and row["coarse_roles"] == "syntactic;delimiter"
  assert table.loc[2, "roles"] == "" and table.loc[2, "coarse_roles"] == ""


def test_roles_by_layer_and_format():
  assigned, roles = roles_lib.assignment_array(_tests())
  fine = roles_lib.roles_by_layer(assigned, roles)
  assert list(fine.columns) == ["layer"] + list(ROLES)
  assert fine.values.tolist() == [[0, 1, 1, 0, 0, 1, 0], [1, 0, 0, 2, 1, 0, 1]]
  coarse = roles_lib.coarse_roles_by_layer(assigned, roles)
  assert list(coarse.columns) == ["layer", "local", "syntactic", "delimiter", "unskilled"]
  assert coarse.values.tolist() == [[0, 2, 1, 0, 1], [1, 0, 1, 2, 1]]
  text = roles_lib.format_roles_by_layer(coarse)
  lines = text.splitlines()
  assert lines[0].split() == ["layer", "local", "syntactic", "delimiter", "unskilled"]
  assert lines[1].split() == ["0", "2", "1", "0", "1"]
  assert lines[-1].split() == ["total", "2", "2", "2", "2"]
  assert len({len(line) for line in lines}) == 1  # fixed width
  assert len(roles_lib.format_roles_by_layer(fine, total=False).splitlines()) == 3


def test_layer_groups():
  assert [g.tolist() for g in roles_lib.layer_groups(12).values()] == [
      [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
  assert [g.tolist() for g in roles_lib.layer_groups(4).values()] == [[0, 1], [2], [3]]
  assert list(roles_lib.layer_groups(2)) == ["initial", "middle"]
