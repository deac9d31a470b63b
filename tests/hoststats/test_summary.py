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
  assert out["share_local"] == 0.25
  assert out["share_syntactic"] == 0.5
  assert out["share_delimiter"] == 0.25
  assert out["share_block"] is None  # block not computed in this run
  assert out["share_unskilled"] == 0.25
  assert out["share_syntactic_also_local"] == 0.5
  assert out["spearman_local_syntactic"] == pytest.approx(0.8, abs=1e-12)
  assert out["spearman_num_pairs"] == 5
  # p-values strictly inside (0.05, 0.95): 0.5, 0.2, 0.3, 0.5, 0.06, 0.94 of 13 non-NaN values
  assert out["share_p_between"] == pytest.approx(6 / 13)
  assert out["num_p_values"] == 13
  values = sb.astype(np.float64)[~np.isnan(sb)]
  assert out["mean_sieve_score"] == pytest.approx(values.mean(), rel=1e-12)
  assert out["mean_sieve_score_by_role"]["syntactic"] == pytest.approx(3.0)
  assert out["num_assigned_by_role"] == {"local": 1, "cls": 1, "nsubj": 1, "syntactic": 1}
  assert out["num_heads_by_coarse_role"] == {"local": 1, "syntactic": 2, "delimiter": 1,
                                             "unskilled": 1}


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
