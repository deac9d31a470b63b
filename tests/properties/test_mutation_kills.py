"""Checks written for mutants that survived the earlier tests (scripts/mutation.py; the list and
the mutants judged equivalent are in docs/TESTING.md). Each test names the wrong code it
catches; all values are derived by hand."""

import numpy as np
import pandas as pd
import pytest

from heads_jax.hoststats import hypothesis, roles


# ---------------------------------------------------------------------------------------------
# hoststats/hypothesis.py


def test_one_sample_tests_accept_a_single_column():
  """values of shape [b] (no head axes) are one test; `x.ndim < 2` would refuse them."""
  out = hypothesis.one_sample_tests(np.array([4.0, 5.0, 6.0]), 3.0)
  assert out["n"] == 3 and out["mean"] == pytest.approx(5.0)
  # t = (5 - 3) / (1 / sqrt 3) = 2 sqrt 3
  assert out["statistic"] == pytest.approx(2 * np.sqrt(3))
  with pytest.raises(ValueError, match="leading sequence axis"):
    hypothesis.one_sample_tests(np.float64(4.0), 3.0)


def test_two_equal_values_at_tau_are_h0():
  """n = 2, both values equal to tau: zero variance, H0 holds: statistic NaN, p = 1 (not the
  NaN of 0 / 0, which a `n >= 3` zero-variance rule would give)."""
  out = hypothesis.one_sample_tests(np.array([[3.0, 5.0], [3.0, 5.0]]), 3.0)
  assert np.isnan(out["statistic"][0]) and out["p_value"][0] == 1.0
  assert out["statistic"][1] == np.inf and out["p_value"][1] == 0.0
  df, _ = hypothesis.hypothesis_tests(np.full((2, 1, 1, 1), 3.0), ["cls"], tau=3.0)
  assert df["p_value"].iloc[0] == 1.0 and not df["assigned"].iloc[0]


def test_holm_is_capped_at_one():
  # sorted 0.6, 0.7 -> 2 * 0.6 = 1.2 -> 1; max(1.2, 0.7) -> 1
  np.testing.assert_array_equal(hypothesis.adjust_p_values([0.7, 0.6], "holm"), [1.0, 1.0])
  np.testing.assert_allclose(hypothesis.adjust_p_values([0.01, 0.04, 0.3], "holm"),
                             [0.03, 0.08, 0.3])


def test_alpha_of_one_is_refused():
  x = np.full((3, 1, 1, 1), 5.0)
  for alpha in (0.0, 1.0, 1.5):
    with pytest.raises(ValueError, match="alpha"):
      hypothesis.hypothesis_tests(x, ["cls"], alpha=alpha)
  assert hypothesis.hypothesis_tests(x, ["cls"], alpha=0.999)[0]["assigned"].all()


# ---------------------------------------------------------------------------------------------
# hoststats/roles.py


def _table(num_layers, num_heads, role_names=("local", "cls")):
  rows = [{"layer": l, "head": h, "role": r, "assigned": (l + h + k) % 2 == 0}
          for l in range(num_layers) for h in range(num_heads) for k, r in enumerate(role_names)]
  return pd.DataFrame(rows)


def test_assignment_array_with_explicit_sizes_and_empty_tables():
  t = _table(2, 3)
  assigned, names = roles.assignment_array(t, num_layers=2, num_heads=3)
  assert names == ("local", "cls") and assigned.shape == (2, 3, 2)
  assert assigned[1, 2, 1] == ((1 + 2 + 1) % 2 == 0) and assigned[0, 1, 0] == False  # noqa: E712
  empty = t.iloc[:0]
  assert roles.assignment_array(empty, roles=["cls"])[0].shape == (0, 0, 1)
  with pytest.raises(ValueError, match="out of range for 2 layers x 2 heads"):
    roles.assignment_array(t, num_layers=2, num_heads=2)


def test_assignment_array_names_the_duplicated_or_missing_cell():
  t = _table(2, 3)
  dup = pd.concat([t, t[(t["layer"] == 1) & (t["head"] == 2) & (t["role"] == "cls")]])
  with pytest.raises(ValueError, match=r"\(layer 1, head 2, role cls\) has 2"):
    roles.assignment_array(dup)
  gap = t[~((t["layer"] == 0) & (t["head"] == 1) & (t["role"] == "local"))]
  with pytest.raises(ValueError, match=r"\(layer 0, head 1, role local\) has 0"):
    roles.assignment_array(gap)


# ---------------------------------------------------------------------------------------------
# stats/distance.py


@pytest.mark.parametrize("attn_shape, class_shape, mask_shape", [
    ((2, 1, 1, 5, 5), (2, 4), (2, 5)),     # token_class of another length
    ((2, 1, 1, 5, 5), (2, 5), (1, 5)),     # attention_mask of another batch
    ((2, 1, 1, 4, 5), (2, 5), (2, 5)),     # q != k
])
def test_distance_features_refuse_each_wrong_shape(attn_shape, class_shape, mask_shape):
  from heads_jax.stats.distance import distance_features
  with pytest.raises(ValueError, match="needs q == k"):
    distance_features(np.zeros(attn_shape, np.float32), np.zeros(class_shape, np.int32),
                      np.ones(mask_shape, np.int32))
