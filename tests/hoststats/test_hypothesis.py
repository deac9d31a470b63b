"""Hypothesis tests: scipy equality, hand formulas, corrections, tau auto, degenerate cases."""
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from heads_jax.hoststats import hypothesis


def _data(seed=0, shape=(25, 2, 3, 4), nan_share=0.3):
  rng = np.random.default_rng(seed)
  x = rng.normal(3.3, 1.2, shape)
  x[rng.random(shape) < nan_share] = np.nan
  return x


def test_t_equals_scipy_ttest_1samp():
  x = _data()
  out = hypothesis.one_sample_tests(x, 3.0, "t")
  for idx in np.ndindex(x.shape[1:]):
    v = x[(slice(None),) + idx]
    v = v[~np.isnan(v)]
    ref = stats.ttest_1samp(v, 3.0, alternative="greater")
    assert out["n"][idx] == v.size
    np.testing.assert_allclose(out["mean"][idx], v.mean(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["statistic"][idx], ref.statistic, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["p_value"][idx], ref.pvalue, rtol=1e-12, atol=1e-12)


def test_z_matches_notebook_formula():
  x = _data(seed=1)
  out = hypothesis.one_sample_tests(x, 3.5, "z")
  for idx in np.ndindex(x.shape[1:]):
    v = x[(slice(None),) + idx]
    v = v[~np.isnan(v)]
    n = v.size
    z = (np.mean(v) - 3.5) / (np.std(v) / np.sqrt(n))  # np.std: ddof = 0 as ztest_own
    p = 1 - stats.t(n - 1).cdf(z)
    np.testing.assert_allclose(out["statistic"][idx], z, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["p_value"][idx], p, rtol=1e-9, atol=1e-12)


def test_hand_values_with_one_degree_of_freedom():
  # n = 2: Student's t with 1 df is the Cauchy distribution, sf(t) = 1/2 - arctan(t) / pi.
  x = np.array([4.0, 6.0]).reshape(2, 1)
  t = hypothesis.one_sample_tests(x, 3.0, "t")
  assert t["statistic"][0] == pytest.approx(2.0, abs=1e-14)  # (5 - 3) / (sqrt(2) / sqrt(2))
  assert t["p_value"][0] == pytest.approx(0.5 - math.atan(2.0) / math.pi, abs=1e-14)
  z = hypothesis.one_sample_tests(x, 3.0, "z")
  assert z["statistic"][0] == pytest.approx(2 * math.sqrt(2), abs=1e-14)  # sd0 = 1
  assert z["p_value"][0] == pytest.approx(0.5 - math.atan(2 * math.sqrt(2)) / math.pi, abs=1e-14)


def test_z_is_t_scaled_by_sqrt_n_over_n_minus_1():
  x = np.arange(1.0, 6.0).reshape(5, 1)  # mean 3, ss = 10
  t = hypothesis.one_sample_tests(x, 2.0, "t")["statistic"][0]
  z = hypothesis.one_sample_tests(x, 2.0, "z")["statistic"][0]
  assert t == pytest.approx(math.sqrt(2.0), abs=1e-14)
  assert z == pytest.approx(math.sqrt(2.5), abs=1e-14)


def test_corrections_hand_computed():
  p = np.array([0.01, 0.04, np.nan, 0.03, 0.005])
  np.testing.assert_allclose(hypothesis.adjust_p_values(p, "none"), p)
  np.testing.assert_allclose(hypothesis.adjust_p_values(p, "bonferroni"),
                             [0.04, 0.16, np.nan, 0.12, 0.02])
  np.testing.assert_allclose(hypothesis.adjust_p_values(p, "holm"),
                             [0.03, 0.06, np.nan, 0.06, 0.02])
  np.testing.assert_allclose(hypothesis.adjust_p_values(p, "bh"),
                             [0.02, 0.04, np.nan, 0.04, 0.02])


def test_corrections_step_down_and_step_up_hand_computed():
  """Holm's running max and BH's running min from the top both matter here (R's p.adjust gives
  the same numbers); BH also equals scipy.stats.false_discovery_control."""
  p = np.array([0.05, 0.01, 0.04, 0.02, 0.03])
  # holm, sorted: 5*0.01=0.05, 4*0.02=0.08, 3*0.03=0.09, 2*0.04=0.08 -> 0.09, 1*0.05 -> 0.09
  np.testing.assert_allclose(hypothesis.adjust_p_values(p, "holm"),
                             [0.09, 0.05, 0.09, 0.08, 0.09])
  # bh, sorted: 5*0.01/1, 5*0.02/2, 5*0.03/3, 5*0.04/4, 5*0.05/5: all 0.05
  np.testing.assert_allclose(hypothesis.adjust_p_values(p, "bh"), np.full(5, 0.05))
  q = np.array([0.001, 0.2, 0.011, 0.04, 0.9, 0.03])
  # bh by hand: sorted 0.001, 0.011, 0.03, 0.04, 0.2, 0.9 -> 6p/i = 0.006, 0.033, 0.06, 0.06,
  # 0.24, 0.9 (already non-decreasing)
  np.testing.assert_allclose(hypothesis.adjust_p_values(q, "bh"),
                             [0.006, 0.24, 0.033, 0.06, 0.9, 0.06])
  np.testing.assert_allclose(hypothesis.adjust_p_values(q, "bh"),
                             stats.false_discovery_control(q, method="bh"))


def test_corrections_clip_at_one_and_keep_shape():
  p = np.array([[0.5, 0.9], [0.2, np.nan]])
  np.testing.assert_allclose(hypothesis.adjust_p_values(p, "bonferroni"), [[1, 1], [0.6, np.nan]])
  # holm: sorted 0.2*3=0.6, 0.5*2=1.0, 0.9*1 -> max-accumulated 1.0
  np.testing.assert_allclose(hypothesis.adjust_p_values(p, "holm"), [[1, 1], [0.6, np.nan]])
  # bh: 0.2*3/1=0.6, 0.5*3/2=0.75, 0.9*3/3=0.9 (already increasing)
  np.testing.assert_allclose(hypothesis.adjust_p_values(p, "bh"), [[0.75, 0.9], [0.6, np.nan]])
  with pytest.raises(ValueError, match="correction"):
    hypothesis.adjust_p_values(p, "fdr")


def test_correction_counts_every_test_of_the_run():
  x = _data(seed=2, shape=(30, 2, 2, 3), nan_share=0.1)
  roles = ("local", "cls", "sep")
  plain, _ = hypothesis.hypothesis_tests(x, roles, correction="none")
  bonf, settings = hypothesis.hypothesis_tests(x, roles, correction="bonferroni")
  assert settings["num_tests"] == 12
  np.testing.assert_allclose(bonf["p_adjusted"], np.minimum(plain["p_value"] * 12, 1))
  np.testing.assert_array_equal(bonf["assigned"], bonf["p_adjusted"] < 0.05)


def test_tau_auto():
  x = np.full((4, 1, 1, 2), np.nan)
  x[:, 0, 0, 0] = [1.0, 2.0, 3.0, 4.0]  # mean 2.5 (NaNs ignored) -> tau 3
  df, settings = hypothesis.hypothesis_tests(x, ("local", "cls"), tau="auto")
  assert settings["tau"] == 3.0 and settings["tau_requested"] == "auto"
  assert hypothesis.auto_tau(np.array([2.0, 4.0, np.nan])) == 4.0  # mean exactly 3 -> 4
  assert hypothesis.auto_tau(np.array([-0.5])) == 0.0
  with pytest.raises(ValueError, match="NaN"):
    hypothesis.auto_tau(np.full(3, np.nan))


def test_degenerate_cases():
  nan = np.nan
  x = np.array([
      # n=0, n=1, const>tau, const<tau, const==tau, const 0.1 with rounding-prone mean
      [nan, 5.0, 4.0, 2.0, 3.0, 0.1],
      [nan, nan, 4.0, 2.0, 3.0, 0.1],
      [nan, nan, 4.0, nan, 3.0, 0.1],
  ])
  out = hypothesis.one_sample_tests(x, 3.0)
  np.testing.assert_array_equal(out["n"], [0, 1, 3, 2, 3, 3])
  np.testing.assert_array_equal(out["mean"], [nan, 5.0, 4.0, 2.0, 3.0, 0.1])
  np.testing.assert_array_equal(out["statistic"], [nan, nan, np.inf, -np.inf, nan, -np.inf])
  np.testing.assert_array_equal(out["p_value"], [nan, nan, 0.0, 1.0, 1.0, 1.0])
  sb = x.reshape(3, 1, 1, 6)
  roles = ("local", "prev_local", "next_local", "cls", "sep", "delimiter")
  df, settings = hypothesis.hypothesis_tests(sb, roles, correction="bonferroni")
  assert df["assigned"].tolist() == [False, False, True, False, False, False]
  assert settings["num_tests"] == 4  # n = 0 and n = 1 are not tests
  np.testing.assert_array_equal(df["p_adjusted"], [nan, nan, 0.0, 1.0, 1.0, 1.0])


def test_table_layout_and_settings():
  x = _data(seed=3, shape=(12, 2, 3, 2))
  roles = ("local", "syntactic")
  df, settings = hypothesis.hypothesis_tests(
      x.astype(np.float32), roles, tau=3.0, alpha=0.1,
      settings={"model": "m", "direction": "dependent->head", "tau": 3.0})
  assert list(df.columns) == ["layer", "head", "role", "mean", "n", "statistic", "p_value",
                              "p_adjusted", "assigned"]
  assert len(df) == 2 * 3 * 2
  assert df[["layer", "head", "role"]].iloc[:3].values.tolist() == [
      [0, 0, "local"], [0, 0, "syntactic"], [0, 1, "local"]]
  assert df["assigned"].dtype == bool
  row = df[(df["layer"] == 1) & (df["head"] == 2) & (df["role"] == "syntactic")].iloc[0]
  v = x[:, 1, 2, 1].astype(np.float32).astype(np.float64)
  v = v[~np.isnan(v)]
  assert row["mean"] == pytest.approx(v.mean(), rel=1e-12)
  assert row["assigned"] == (row["p_value"] < 0.1)
  assert settings["model"] == "m" and settings["direction"] == "dependent->head"
  assert settings["alpha"] == 0.1 and settings["test"] == "t" and settings["correction"] == "none"
  assert settings["num_sequences"] == 12 and settings["roles"] == list(roles)
  with pytest.raises(ValueError, match="tau"):
    hypothesis.hypothesis_tests(x, roles, tau=3.0, settings={"tau": 2.0})


def test_bad_arguments():
  x = _data(shape=(5, 1, 1, 2))
  with pytest.raises(ValueError, match="tau"):
    hypothesis.hypothesis_tests(x, ("a", "b"), tau="paper")
  with pytest.raises(ValueError, match="test"):
    hypothesis.hypothesis_tests(x, ("a", "b"), test="wilcoxon")
  with pytest.raises(ValueError, match="alpha"):
    hypothesis.hypothesis_tests(x, ("a", "b"), alpha=5)
  with pytest.raises(ValueError, match="role names"):
    hypothesis.hypothesis_tests(x, ("a",))
  with pytest.raises(ValueError, match=r"\[b, l, h, r\]"):
    hypothesis.hypothesis_tests(x[0], ("a", "b"))


def test_host_statistics_import_no_jax():
  code = ("import sys\n"
          "import heads_jax.hoststats.hypothesis, heads_jax.hoststats.roles, "
          "heads_jax.hoststats.summary, heads_jax.hoststats.clustering, "
          "heads_jax.hoststats.compare, heads_jax.contract\n"
          "bad = [m for m in sys.modules if m == 'jax' or m.startswith('jax.')]\n"
          "assert not bad, bad\n")
  subprocess.run([sys.executable, "-c", code], check=True)
