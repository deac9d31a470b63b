"""Role assignment, coarse roles and per-layer tables on a small hand-made table."""
import numpy as np
import pandas as pd
import pytest

from heads_jax.hoststats import roles as roles_lib

ROLES = ("local", "next_local", "cls", "sep", "delimiter", "nsubj", "syntactic")
# (layer, head) -> assigned fine roles
ASSIGNED = {
    (0, 0): {"local", "nsubj"},                # tests: local; union: local + syntactic
    (0, 1): {"next_local"},                    # tests: unskilled; union: local
    (0, 2): set(),                             # unskilled
    (1, 0): {"cls", "sep"},                    # tests: unskilled; union: delimiter
    (1, 1): {"syntactic", "cls", "delimiter"}, # syntactic + delimiter (both views)
    (1, 2): set(),                             # unskilled
}


def _tests(shuffle=True):
  rows = [{"layer": l, "head": h, "role": r, "assigned": r in ASSIGNED[(l, h)]}
          for (l, h) in ASSIGNED for r in ROLES]
  df = pd.DataFrame(rows)
  return df.sample(frac=1.0, random_state=0) if shuffle else df


def test_assignment_array():
  assigned, roles = roles_lib.assignment_array(_tests())
  assert roles == ROLES  # batch.ROLES order, whatever the row order
  assert assigned.shape == (2, 3, 7)
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


def test_coarse_roles_are_the_four_tests_and_the_union_a_separate_view():
  assigned, roles = roles_lib.assignment_array(_tests())
  expected = {
      "tests": {(0, 0): ("local",), (0, 1): (), (0, 2): (), (1, 0): (),
                (1, 1): ("syntactic", "delimiter"), (1, 2): ()},
      "union": {(0, 0): ("local", "syntactic"), (0, 1): ("local",), (0, 2): (),
                (1, 0): ("delimiter",), (1, 1): ("syntactic", "delimiter"), (1, 2): ()},
  }
  for view, want_by_head in expected.items():
    coarse, names = roles_lib.coarse_roles(assigned, roles, view)
    assert names == ("local", "syntactic", "delimiter")  # no block role computed
    for (l, h), want in want_by_head.items():
      assert tuple(n for n, a in zip(names, coarse[l, h]) if a) == want, (view, l, h)
  # the default is the paper's four tests
  np.testing.assert_array_equal(roles_lib.coarse_roles(assigned, roles)[0],
                                roles_lib.coarse_roles(assigned, roles, "tests")[0])
  np.testing.assert_array_equal(roles_lib.unskilled(assigned, roles),
                                [[False, True, True], [True, False, True]])
  np.testing.assert_array_equal(roles_lib.unskilled(assigned, roles, "union"),
                                [[False, False, True], [False, False, True]])
  # available: the deciding role itself (tests) or any of its roles (union)
  assert roles_lib.available_coarse_roles(("block_plain", "sep")) == ()
  assert roles_lib.available_coarse_roles(("block_plain", "sep"), "union") == ("delimiter",)
  assert roles_lib.available_coarse_roles(("block", "amod", "syntactic")) == ("syntactic", "block")
  assert roles_lib.PAPER_ROLES == ("local", "syntactic", "delimiter", "block")
  with pytest.raises(ValueError, match="view"):
    roles_lib.coarse_roles(assigned, roles, "fine")


def test_head_roles_table():
  assigned, roles = roles_lib.assignment_array(_tests())
  table = roles_lib.head_roles(assigned, roles)
  assert list(table.columns) == ["layer", "head", "roles", "coarse_roles"]
  row = table[(table["layer"] == 1) & (table["head"] == 1)].iloc[0]
  assert row["roles"] == "cls;delimiter;syntactic" and row["coarse_roles"] == "syntactic;delimiter"
  assert table.loc[1, "roles"] == "next_local" and table.loc[1, "coarse_roles"] == ""
  assert roles_lib.head_roles(assigned, roles, "union").loc[1, "coarse_roles"] == "local"


def test_roles_by_layer_and_format():
  assigned, roles = roles_lib.assignment_array(_tests())
  fine = roles_lib.roles_by_layer(assigned, roles)
  assert list(fine.columns) == ["layer"] + list(ROLES)
  assert fine.values.tolist() == [[0, 1, 1, 0, 0, 0, 1, 0], [1, 0, 0, 2, 1, 1, 0, 1]]
  coarse = roles_lib.coarse_roles_by_layer(assigned, roles)
  assert list(coarse.columns) == ["layer", "local", "syntactic", "delimiter", "unskilled"]
  assert coarse.values.tolist() == [[0, 1, 0, 0, 2], [1, 0, 1, 1, 2]]
  union = roles_lib.coarse_roles_by_layer(assigned, roles, "union")
  assert union.values.tolist() == [[0, 2, 1, 0, 1], [1, 0, 1, 2, 1]]
  text = roles_lib.format_roles_by_layer(coarse)
  lines = text.splitlines()
  assert lines[0].split() == ["layer", "local", "syntactic", "delimiter", "unskilled"]
  assert lines[1].split() == ["0", "1", "0", "0", "2"]
  assert lines[-1].split() == ["total", "1", "1", "1", "4"]
  assert len({len(line) for line in lines}) == 1  # fixed width
  assert len(roles_lib.format_roles_by_layer(fine, total=False).splitlines()) == 3


def _two_head_model(num_sequences: int = 8):
  """The two heads of issue 23 on pairs of n = 20 positions ([CLS] A(1..8) [SEP] B(10..18)
  [SEP]), one layer: head 0 puts 0.2 of every query's attention on [CLS], head 1 puts 0.3 on the
  previous token; the rest of each row is uniform over the other 19 positions. The weight varies
  by +-0.01 over the sequences (the tests need a variance). Scores by the independent reference
  implementation (tests/reference_impl.py)."""
  from heads_jax.data import vocabulary as vocab
  from tests import reference_impl as ref
  n = 20
  batch = vocab.empty_batch(num_sequences, n)
  batch["attention_mask"][:] = 1
  batch["token_class"][:] = vocab.TOKEN_OTHER
  batch["token_class"][:, 0] = vocab.TOKEN_CLS
  batch["token_class"][:, [9, 19]] = vocab.TOKEN_SEP
  batch["token_type_ids"][:, 10:] = 1
  words = [-1] + list(range(8)) + [-1] + list(range(8, 17)) + [-1]
  batch["word_ids"][:] = words
  attn = np.zeros((num_sequences, 1, 2, n, n))
  for i, e in enumerate(np.linspace(-0.01, 0.01, num_sequences)):
    for head, weight in ((0, 0.2 + e), (1, 0.3 + e)):
      for t in range(n):
        key = 0 if head == 0 else t - 1
        if key < 0:
          attn[i, 0, head, t] = 1.0 / n
          continue
        attn[i, 0, head, t] = (1.0 - weight) / (n - 1)
        attn[i, 0, head, t, key] = weight
  roles = ("local", "prev_local", "cls", "sep", "delimiter")
  return ref.sieve_bias(attn, batch, roles), roles


def test_two_heads_separate_the_union_from_the_four_tests():
  from heads_jax.hoststats import hypothesis, summary
  scores, roles = _two_head_model()
  mean = np.nanmean(scores, 0)[0]                              # [h, r]
  # the numbers: interior queries give cls 4.0 / delimiter 1.89, prev_local 3.37 / local 1.79
  assert mean[0, roles.index("cls")] == pytest.approx(4.0, abs=0.01)
  assert mean[0, roles.index("delimiter")] == pytest.approx(1.895, abs=0.01)
  assert mean[1, roles.index("prev_local")] > 3.0 and mean[1, roles.index("local")] < 2.0
  tests, _ = hypothesis.hypothesis_tests(scores, roles, tau=3.0)
  assigned, _ = roles_lib.assignment_array(tests, roles)
  assert assigned[0, 0, roles.index("cls")] and not assigned[0, 0, roles.index("delimiter")]
  assert assigned[0, 1, roles.index("prev_local")] and not assigned[0, 1, roles.index("local")]
  # counted as the paper does: neither is a delimiter nor a local head, both are unskilled
  coarse, names = roles_lib.coarse_roles(assigned, roles)
  assert names == ("local", "delimiter") and not coarse.any()
  union, _ = roles_lib.coarse_roles(assigned, roles, "union")
  assert union[0, 0].tolist() == [False, True] and union[0, 1].tolist() == [True, False]
  figures = summary.summary_figures(scores.astype(np.float32), roles, tests)
  assert figures["coarse_roles"] == "tests"
  assert figures["share_delimiter"] == 0.0 and figures["share_local"] == 0.0
  assert figures["share_unskilled"] == 1.0
  assert figures["fine_union"]["share_delimiter"] == 0.5
  assert figures["fine_union"]["share_unskilled"] == 0.0
  assert figures["num_heads_by_coarse_role"] == {"local": 0, "delimiter": 0, "unskilled": 2}


def test_layer_groups():
  assert [g.tolist() for g in roles_lib.layer_groups(12).values()] == [
      [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
  assert [g.tolist() for g in roles_lib.layer_groups(4).values()] == [[0, 1], [2], [3]]
  assert list(roles_lib.layer_groups(2)) == ["initial", "middle"]
