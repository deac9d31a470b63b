"""hoststats/intervals: the Wilson score interval against SciPy's."""

import math

import pytest
from scipy import stats

from heads_jax.hoststats.intervals import wilson_interval


@pytest.mark.parametrize("k,n", [(0, 10), (7, 10), (10, 10), (163, 218), (1, 1)])
def test_wilson_interval_matches_scipy(k, n):
  ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
  assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-6)


def test_wilson_interval_of_no_trials_is_nan():
  assert all(math.isnan(v) for v in wilson_interval(0, 0))
