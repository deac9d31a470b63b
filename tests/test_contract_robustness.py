"""The contract's issue-26 files: norm_sieve_bias in scores.npz, tests.csv rows by weighting,
parser.csv and robustness.npz (round trips, and old readers see what they saw before)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from heads_jax import contract
from heads_jax.hoststats.calibration import apply_rule
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.hoststats.weighting import norm_tests, with_weighting


def test_scores_keep_norm_sieve_bias(tmp_path):
  rng = np.random.default_rng(0)
  sb = rng.random((3, 2, 2, 2)).astype(np.float32)
  contract.write_scores(tmp_path, sb, ("local", "cls"), lengths=np.array([4, 5, 6]),
                        norm_sieve_bias=sb / 2)
  s = contract.read_scores(tmp_path)
  np.testing.assert_array_equal(s.norm_sieve_bias, sb / 2)
  contract.write_scores(tmp_path, sb, ("local", "cls"))
  assert contract.read_scores(tmp_path).norm_sieve_bias is None
  with pytest.raises(ValueError, match="shape of sieve_bias"):
    contract.write_scores(tmp_path, sb, ("local", "cls"), norm_sieve_bias=sb[:2])


def test_tests_rows_by_weighting(tmp_path):
  rng = np.random.default_rng(1)
  roles = ("local", "cls")
  sb = rng.normal(3, 1, size=(20, 2, 2, 2))
  lengths = np.full(20, 10)
  tests, settings = hypothesis_tests(sb, roles)
  tests, settings = apply_rule(tests, settings, sb, roles, lengths)
  contract.write_tests(tests, settings, tmp_path)
  assert contract.read_tests(tmp_path, "norm")[0].empty
  nt = norm_tests(sb * 0.5, roles, settings, lengths)
  contract.write_tests(with_weighting(tests, nt), settings, tmp_path)
  attention, _ = contract.read_tests(tmp_path)
  pd.testing.assert_frame_equal(attention, tests, check_dtype=False)
  norm, _ = contract.read_tests(tmp_path, weighting="norm")
  assert len(norm) == len(tests) and "weighting" not in norm.columns
  np.testing.assert_allclose(norm["mean"], nt["mean"])
  assert contract.load_tests(tmp_path).num_heads == 2        # typed reader: attention rows
  with pytest.raises(ValueError, match="weighting"):
    contract.read_tests(tmp_path, "value")


def test_parser_and_robustness_round_trip(tmp_path):
  assert contract.read_parser(tmp_path) is None and contract.read_robustness(tmp_path) is None
  table = pd.DataFrame([("nsubj", "dep2head", "head", 0, 1, np.nan, 0.5, 10, 0.3, 0.7),
                        ("nsubj", "dep2head", "offset", -1, -1, 1.0, 0.4, 10, 0.2, 0.6)],
                       columns=list(contract.PARSER_COLUMNS))
  contract.write_parser(table, tmp_path)
  pd.testing.assert_frame_equal(contract.read_parser(tmp_path), table, check_dtype=False)
  arrays = {"first_attention": np.ones((2, 1, 2)), "norm_ratio": np.zeros((2, 1, 2)),
            "sep_attention": np.full((2, 1, 2, 2), np.nan),
            "parse_pred": np.arange(16).reshape(2, 1, 2, 4)}
  arcs = pd.DataFrame({"sequence": [0, 1], "dependent": [1, 2], "head": [0, 0],
                       "relation": ["nsubj", "obj"]})
  contract.write_robustness(tmp_path, arrays, arcs)
  back = contract.read_robustness(tmp_path)
  np.testing.assert_array_equal(back["parse_pred"], arrays["parse_pred"])
  assert back["parse_pred"].dtype == np.int16
  pd.testing.assert_frame_equal(back["arcs"], arcs, check_dtype=False)
  with pytest.raises(ValueError, match="lack"):
    contract.write_robustness(tmp_path, {"first_attention": arrays["first_attention"]})
