"""The analysis's second pass (heads_jax.pipelines.robustness) on a tiny model: the N axis is the
analysis's, and the host statistics come out of it."""

from __future__ import annotations

import numpy as np
import pytest

from heads_jax.hoststats.calibration import apply_rule
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.model.loading import load_model
from heads_jax.pipelines.analyze import AnalysisConfig, compute_scores
from heads_jax.pipelines.robustness import RobustnessSettings, robustness_pass, robustness_statistics
from tests.family_models import save_family_dir


@pytest.mark.slow   # two passes over two data sets (about 30 s on 2 idle cores)
def test_second_pass_follows_the_analysis_order_and_feeds_the_statistics(tmp_path):
  save_family_dir("bert", tmp_path / "m", seed=2)
  model, tokenizer = load_model(tmp_path / "m")
  cfg = AnalysisConfig(model=str(tmp_path / "m"), data=("ud-ewt", "mrpc"), out=str(tmp_path / "o"),
                       max_examples=6, max_length=48, batch_size=4, parser="none", sort_window=8,
                       bucket_step=48)
  scores = compute_scores(cfg, model, tokenizer, progress=False)
  res = robustness_pass(cfg, model, tokenizer)
  n, l, h, r = scores["sieve_bias"].shape
  assert n == 12 and res["norm_sieve_bias"].shape == (n, l, h, r)
  assert res["roles"] == scores["roles"]
  # same sequences in the same order: the first-token attention is the analysis's [CLS] measure
  np.testing.assert_allclose(res["first_attention"], scores["measures"]["token_attention"][..., 0],
                             rtol=1e-4, atol=1e-6)
  # NaN exactly where the attention's sieve is empty (the sieves do not depend on the weighting)
  np.testing.assert_array_equal(np.isnan(res["norm_sieve_bias"]), np.isnan(scores["sieve_bias"]))
  # gold arcs of the 6 UD sentences only (MRPC is analysed without a parser here)
  arcs = res["arcs"]
  assert len(arcs) > 20 and arcs["sequence"].max() < 6
  assert res["parse_pred"].shape == (n, l, h, 48)
  assert np.all(res["sep_attention"][6:, ..., 1] >= 0)          # MRPC pairs: two [SEP]s
  assert np.all(np.isnan(res["sep_attention"][:6, ..., 1]))      # single sentences: one
  tests, settings = hypothesis_tests(scores["sieve_bias"], scores["roles"])
  tests, settings = apply_rule(tests, settings, scores["sieve_bias"], scores["roles"],
                               scores["lengths"])
  st = robustness_statistics(res, tests, settings, scores["lengths"],
                             RobustnessSettings(bootstrap=50, min_arcs=10))
  assert len(st["norm_tests"]) == len(tests) and (st["norm_tests"]["weighting"] == "norm").all()
  assert set(st["summary"]) >= {"by_weighting", "sink_rate", "mean_norm_ratio", "norm_lost_roles"}
  assert len(st["sinks"]) == l * h
  parser = st["parser"]
  assert {"nsubj", "obj", "amod", "advmod"} <= set(parser["relation"])
  assert len(st["best_parsers"]) >= 2


@pytest.mark.slow   # an analysis with its second pass and report (about 40 s on 2 idle cores)
def test_analysis_with_the_second_pass_writes_its_files_and_section(tmp_path):
  from heads_jax import contract
  from heads_jax.pipelines.analyze import run_analysis
  save_family_dir("bert", tmp_path / "m", seed=5)
  cfg = AnalysisConfig(model=str(tmp_path / "m"), data=("ud-ewt",), out=str(tmp_path / "o"),
                       max_examples=8, max_length=48, batch_size=8, parser="none", bucket_step=48,
                       examples=0, robustness=True)
  logs = []
  host = run_analysis(cfg, progress=False, log=logs.append)
  out = tmp_path / "o"
  scores = contract.read_scores(out)
  assert scores.norm_sieve_bias.shape == scores.sieve_bias.shape
  attention, _ = contract.read_tests(out)
  norm, _ = contract.read_tests(out, weighting="norm")
  assert len(norm) == len(attention) == len(host["tests"])
  np.testing.assert_allclose(norm["mean"].to_numpy(), np.nanmean(scores.norm_sieve_bias, axis=0)
                             .reshape(-1), rtol=1e-5)
  assert contract.read_parser(out) is not None
  summary = contract.read_summary(out)
  assert {"by_weighting", "sink_rate", "norm_ratio_by_layer"} <= set(summary)
  html = (out / "report.html").read_text()
  assert "Are the roles real?" in html
  assert any(m.startswith("norm weights:") for m in logs)
  # single sentences: block is not computed, so null / "n/a" in every output of the second
  # pass, never 0 (issue 52); the other coarse roles are numbers
  for weighting in ("attention", "norm"):
    assert summary["by_weighting"][weighting]["block"] is None
    assert isinstance(summary["by_weighting"][weighting]["local"], float)
  assert summary["norm_lost_roles"]["block"] is None
  assert isinstance(summary["norm_lost_roles"]["local"], int)
  line = next(m for m in logs if m.startswith("norm weights:"))
  assert "block n/a -> n/a" in line and "block 0%" not in line
  row = html.split('id="table-norm-roles"')[1].split("</table>")[0].split("<td>block</td>")[1]
  row = row.split("</tr>")[0]
  assert row.count("n/a") == 6 and ">0<" not in row
  # a rerun reuses the second pass (nothing recomputed on the device)
  logs.clear()
  run_analysis(cfg, progress=False, log=logs.append)
  assert not any("second pass" in m for m in logs)
