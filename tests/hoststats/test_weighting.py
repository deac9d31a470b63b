"""Roles under attention and norm weights (heads_jax.hoststats.weighting)."""

from __future__ import annotations

import numpy as np

from heads_jax.hoststats.calibration import apply_rule
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.hoststats.weighting import norm_tests, role_changes, weighting_summary, with_weighting


def _scores(rng, sep_high):
  """[N, l, h, r] for roles (local, delimiter, cls): head (0, 0) is a delimiter head when
  ``sep_high``."""
  x = rng.normal(1.0, 0.1, size=(40, 1, 2, 3))
  if sep_high:
    x[:, 0, 0, 1] = rng.normal(6.0, 0.3, size=40)
  x[:, 0, 1, 0] = rng.normal(5.0, 0.3, size=40)   # local head under both weightings
  return x


def test_norm_rows_use_the_same_tests_and_show_the_lost_role():
  rng = np.random.default_rng(0)
  roles = ("local", "delimiter", "cls")   # coarse roles are the paper's four tests
  lengths = np.full(40, 20)
  attention = _scores(rng, True)
  norm = _scores(rng, False)
  tests, settings = hypothesis_tests(attention, roles)
  tests, settings = apply_rule(tests, settings, attention, roles, lengths)
  nt = norm_tests(norm, roles, settings, lengths)
  # the norm rows are exactly the tests of the norm scores with the run's settings
  expected, s = hypothesis_tests(norm, roles)
  expected, _ = apply_rule(expected, s, norm, roles, lengths)
  np.testing.assert_array_equal(nt["p_calibrated"].to_numpy(), expected["p_calibrated"].to_numpy())
  assert (nt["weighting"] == "norm").all()
  both = with_weighting(tests, nt)
  assert both["weighting"].tolist() == ["attention"] * 6 + ["norm"] * 6
  changes = role_changes(tests, nt).set_index(["kind", "role"])
  assert changes.loc[("fine", "delimiter"), ["attention", "norm", "lost", "gained"]].tolist() == [1, 0, 1, 0]
  assert changes.loc[("fine", "delimiter"), "lost_heads"] == "0:0"
  assert changes.loc[("coarse", "delimiter"), "lost"] == 1
  assert changes.loc[("coarse", "local"), ["kept", "lost"]].tolist() == [1, 0]
  summary = weighting_summary(tests, nt)
  assert summary["attention"]["delimiter"] == 0.5 and summary["norm"]["delimiter"] == 0.0
  assert summary["attention"]["local"] == summary["norm"]["local"] == 0.5


def test_norm_rows_of_a_windowed_run_use_the_windowed_baseline():
  """A ModernBERT-style run (windowed layers in its settings): the norm-weighted tests judge each
  head against uniform attention over the keys it sees, as the attention-weighted ones do."""
  rng = np.random.default_rng(1)
  roles = ("local", "delimiter", "cls")
  lengths = np.full(40, 20)
  norm = np.stack([_scores(rng, False)[:, 0]] * 2, axis=1)     # [40, 2 layers, 2 heads, 3]
  tests, s = hypothesis_tests(norm, roles)
  windows = (None, 2)
  _, settings = apply_rule(tests, s, norm, roles, lengths, windows=windows)
  assert settings["windowed_layers"] == [1]
  nt = norm_tests(norm, roles, settings, lengths)
  expected, _ = apply_rule(*hypothesis_tests(norm, roles), norm, roles, lengths, windows=windows)
  np.testing.assert_array_equal(nt["uniform"].to_numpy(), expected["uniform"].to_numpy())
  plain, _ = apply_rule(*hypothesis_tests(norm, roles), norm, roles, lengths)
  assert not np.array_equal(nt["uniform"].to_numpy(), plain["uniform"].to_numpy())
