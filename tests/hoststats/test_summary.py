"""Summary figures on hand-made inputs."""
import json

import numpy as np
import pandas as pd
import pytest

from heads_jax import contract
from heads_jax.hoststats import summary

NAN = np.nan
ROLES = ("local", "cls", "nsubj", "syntactic")


def _inputs():
  """2 layers x 2 heads, 6 sequences; tests table with hand-picked assignments and p-values."""
  sb = np.ones((6, 2, 2, 4), np.float32)
  # Spearman pairs: only head (0, 0) has syntactic values; local there is 1..5 and syntactic
  # ranks [2, 1, 4, 3, 5] -> rho = 1 - 6 * 4 / (5 * 24) = 0.8. Sequence 5 has no syntactic value
  # (its huge local value must not count).
  sb[..., 3] = NAN
  sb[:, 0, 0, 0] = [1, 2, 3, 4, 5, 100]
  sb[:, 0, 0, 3] = [2, 1, 4, 3, 5, NAN]
  sb[:, 1, 1, 2] = NAN
  assigned = {(0, 0): {"local", "nsubj"}, (0, 1): {"syntactic"}, (1, 0): {"cls"}, (1, 1): set()}
  p = iter([0.01, 0.5, 0.96, 0.05, 0.95, 0.2, NAN, 0.3, 0.001, 0.0, 1.0, 0.5,
            NAN, NAN, 0.06, 0.94])
  rows = []
  for (l, h), names in assigned.items():
    for r in ROLES:
      pv = next(p)
      rows.append([l, h, r, 1.0, 6, 0.0, pv, pv, r in names])
  tests = pd.DataFrame(rows, columns=list(contract.TEST_COLUMNS))
  return sb, tests


def test_summary_figures():
  sb, tests = _inputs()
  out = summary.summary_figures(sb, ROLES, tests)
  assert json.loads(json.dumps(out, allow_nan=False)) == out  # JSON-serialisable
  assert (out["num_sequences"], out["num_layers"], out["num_heads"]) == (6, 2, 2)
  # coarse roles are the paper's four tests: (0, 0) has nsubj but not the syntactic test, (1, 0)
  # has cls but this run has no delimiter test
  assert out["coarse_roles"] == "tests"
  assert out["share_local"] == 0.25
  assert out["share_syntactic"] == 0.25
  assert out["share_delimiter"] is None and out["share_block"] is None  # not tested in this run
  assert out["share_unskilled"] == 0.5
  assert out["share_syntactic_also_local"] == 0.0
  # heads_jax's fine-role union, a separately named view
  assert out["fine_union"] == {"share_local": 0.25, "share_syntactic": 0.5, "share_delimiter": 0.25,
                               "share_block": None, "share_unskilled": 0.25,
                               "share_syntactic_also_local": 0.5}
  assert out["spearman_local_syntactic"] == pytest.approx(0.8, abs=1e-12)
  assert out["spearman_num_pairs"] == 5
  # pooled over the paper's roles present (local, syntactic), not cls or nsubj: p-values strictly
  # inside (0.05, 0.95): local 0.01, 0.95, 0.001 -> none; syntactic 0.05, 0.3, 0.5, 0.94 -> 3
  assert out["pool_roles"] == ["local", "syntactic"]
  assert out["share_p_between"] == pytest.approx(3 / 7)
  assert out["num_p_values"] == 7
  pooled = sb[..., [0, 3]].astype(np.float64)
  assert out["mean_sieve_score"] == pytest.approx(pooled[~np.isnan(pooled)].mean(), rel=1e-12)
  assert out["mean_sieve_score"] != pytest.approx(sb[~np.isnan(sb)].mean(), rel=1e-3)
  assert out["mean_sieve_score_by_role"]["syntactic"] == pytest.approx(3.0)
  assert out["num_assigned_by_role"] == {"local": 1, "cls": 1, "nsubj": 1, "syntactic": 1}
  assert out["num_heads_by_coarse_role"] == {"local": 1, "syntactic": 1, "unskilled": 2}


def test_mean_sieve_score_by_hand():
  assert summary.mean_sieve_score(np.array([1.0, 2.0, NAN, 3.0])) == 2.0
  assert summary.mean_sieve_score(np.full(2, NAN)) is None


def test_spearman_undefined_cases():
  sb = np.ones((4, 1, 1, 2))
  assert summary.spearman_local_syntactic(sb, ("local", "syntactic"))["rho"] is None  # constant
  assert summary.spearman_local_syntactic(sb, ("local", "cls"))["num_pairs"] == 0
  sb[:, 0, 0, 0] = [1, 2, 3, 4]
  sb[:, 0, 0, 1] = [4, 3, 2, 1]
  assert summary.spearman_local_syntactic(sb, ("local", "syntactic"))["rho"] == pytest.approx(-1)


def test_no_syntactic_heads():
  sb, tests = _inputs()
  tests.loc[tests["role"].isin(["nsubj", "syntactic"]), "assigned"] = False
  out = summary.summary_figures(sb, ROLES, tests)
  assert out["share_syntactic"] == 0.0 and out["share_syntactic_also_local"] is None


def test_auto_tau_pools_the_paper_roles():
  from heads_jax.hoststats import hypothesis
  sb = np.empty((4, 1, 1, 3))
  sb[..., 0] = 2.5      # local (pooled)
  sb[..., 1] = 10.0     # cls (not one of the paper's four roles)
  sb[..., 2] = 2.7      # block_plain (not pooled either)
  roles = ("local", "cls", "block_plain")
  assert hypothesis.auto_tau(sb) == 6.0                       # every value: mean 5.07
  assert hypothesis.auto_tau(sb, roles) == 3.0                # local only: mean 2.5
  _, settings = hypothesis.hypothesis_tests(sb, roles, tau="auto")
  assert settings["tau"] == 3.0


def test_tau_sweep_by_hand():
  # one layer, two heads; local: head 0 always 2.5 (constant: the test rejects for tau < 2.5),
  # head 1 mostly 1 with one outlier (mean 2.8: the average assigns up to tau 2.5, the test never)
  x = np.empty((10, 1, 2, 2))
  x[:, 0, 0, 0] = 2.5
  x[:, 0, 1, 0] = [1.0] * 9 + [19.0]
  x[..., 1] = np.nan                    # cls: not one of the paper's roles, left out
  sweep = summary.tau_sweep(x, ("local", "cls"), taus=(2.0, 2.6)).set_index(["tau", "role", "rule"])
  assert sweep.loc[(2.0, "local", "paper"), "heads"] == 1
  assert sweep.loc[(2.0, "local", "average"), "heads"] == 2
  assert sweep.loc[(2.6, "local", "average"), "heads"] == 1 and sweep.loc[(2.6, "local", "paper"), "heads"] == 0
  assert sweep.loc[(2.6, "unskilled", "paper"), "share"] == 1.0
  assert set(sweep.index.get_level_values("role")) == {"local", "unskilled"}
  ex = summary.skewed_example(x, ("local", "cls"), 2.6)
  assert (ex["layer"], ex["head"], ex["role"], ex["average_only"]) == (0, 1, "local", True)
  assert ex["mean"] == pytest.approx(2.8) and len(ex["values"]) == 10


def test_a_role_whose_sieve_is_empty_everywhere_is_not_computed_not_zero():
  """Block on single texts and syntactic roles without arcs: null with a reason, never 0."""
  roles = ("local", "block", "nsubj", "syntactic", "delimiter")
  sb = np.ones((3, 2, 2, len(roles)), np.float32)
  sb[..., 1:4] = NAN                                      # no pairs, no arcs
  rows = [[l, h, r, 1.0, 3, 0.0, NAN if r in ("block", "nsubj", "syntactic") else 0.01,
           NAN if r in ("block", "nsubj", "syntactic") else 0.01, r in ("local", "delimiter")]
          for l in range(2) for h in range(2) for r in roles]
  tests = pd.DataFrame(rows, columns=list(contract.TEST_COLUMNS))
  out = summary.summary_figures(sb, roles, tests)
  assert json.loads(json.dumps(out, allow_nan=False)) == out
  assert out["share_block"] is None and out["share_syntactic"] is None
  assert out["share_local"] == 1.0 and out["share_delimiter"] == 1.0 and out["share_unskilled"] == 0.0
  assert out["fine_union"]["share_block"] is None and out["fine_union"]["share_syntactic"] is None
  assert out["num_assigned_by_role"] == {"local": 4, "block": None, "nsubj": None,
                                         "syntactic": None, "delimiter": 4}
  assert "block" not in out["num_heads_by_coarse_role"]
  assert out["not_computed"] == {
      "block": "no sequence pairs: block heads need two segments",
      "nsubj": "no dependency arcs in the data (--parser none, or no parse)",
      "syntactic": "no dependency arcs in the data (--parser none, or no parse)"}
  # one computed value is enough for a role to count as computed (and then 0 is a real 0)
  sb[0, 0, 0, 1] = 0.5
  again = summary.summary_figures(sb, roles, tests)
  assert again["share_block"] == 0.0 and "block" not in again["not_computed"]


def test_spearman_p_over_heads_never_over_nested_pairs():
  """Issue 52 item 4: the pairs' rho (the paper's number) has a cluster-bootstrap interval over
  sequences, and the p-value is over heads (one value per head), by hand:
  t = rho sqrt((n - 2) / (1 - rho^2)) on n - 2 degrees of freedom."""
  from scipy import stats as sp_stats
  local = np.array([1.0, 2.0, 3.0, 4.0, 5.0])          # five heads' local sieve bias
  syntactic = np.array([2.0, 1.0, 4.0, 3.0, 5.0])      # ranks differ by two swaps: rho = 0.8
  b = 6
  x = np.zeros((b, 1, 5, 2))
  x[..., 0] = local
  x[..., 1] = syntactic                                # every sequence the same
  out = summary.spearman_local_syntactic(x, ("local", "syntactic"))
  assert out["heads_rho"] == pytest.approx(0.8) and out["num_heads"] == 5
  t = 0.8 * np.sqrt(3 / (1 - 0.64))
  assert out["p_value"] == pytest.approx(2 * sp_stats.t.sf(t, 3))           # 0.104, not 0
  assert out["num_pairs"] == 30 and out["rho"] == pytest.approx(0.8)
  assert out["interval"] == [pytest.approx(0.8), pytest.approx(0.8)]   # identical sequences
  # noisy sequences: the interval holds the pairs' rho; a NaN pair is left out of its head's mean
  rng = np.random.default_rng(1)
  y = x + rng.normal(0, 0.5, x.shape)
  y[0, 0, 0, 1] = np.nan
  out = summary.spearman_local_syntactic(y, ("local", "syntactic"))
  lo, hi = out["interval"]
  assert lo <= out["rho"] <= hi and out["num_pairs"] == 29 and out["num_heads"] == 5
