"""Pooled figures over several analyses (heads_jax.hoststats.pooled), on hand values."""

import numpy as np
import pytest

from heads_jax.hoststats import pooled


def test_share_p_between_on_hand_values():
  # open interval: 0.05 and 0.95 themselves are outside; NaN is left out
  assert pooled.share_p_between([0.01, 0.05, 0.5, 0.95, 0.96, np.nan]) == pytest.approx(1 / 5)
  assert pooled.share_p_between([0.2, 0.3], (0.25, 1.0)) == 0.5
  assert pooled.share_p_between([np.nan]) is None


def test_pooled_figures_pool_every_analysis():
  a = np.array([[1.0, 2.0], [np.nan, 3.0]])       # mean of both runs' scores: 14 / 5 = 2.8
  b = np.array([4.0, 4.0])
  out = pooled.pooled_figures([a, b], [np.array([0.5, 0.01]), np.array([0.9, np.nan, 1.0])])
  assert out["mean_sieve_score"] == pytest.approx(2.8)
  assert out["auto_tau"] == 3.0                    # smallest integer above the mean
  assert out["share_p_between"] == pytest.approx(2 / 4)
  assert out["num_scores"] == 5 and out["num_p_values"] == 4
  assert sorted(out["scores"]) == [1, 2, 3, 4, 4]
  empty = pooled.pooled_figures([], [])
  assert empty["mean_sieve_score"] is None and empty["auto_tau"] is None
  assert empty["share_p_between"] is None
