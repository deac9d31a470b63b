"""Roles over training (heads_jax.pipelines.trajectory) on a hand-made run: two Orbax checkpoints
of a tiny encoder, analysed with one compiled step, each row equal to a fresh analysis (the
reference: the encoder with the checkpoint's parameters, its statistics collected here and
tested here with the hypothesis tests and the calibrated rule)."""

from __future__ import annotations

import logging
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from flax import nnx

from heads_jax.data.specs import encode_spec
from heads_jax.errors import UserError
from heads_jax.model.loading import load_model
from heads_jax.contract import TRAJECTORY_CSV
from heads_jax.hoststats.calibration import apply_rule
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.pipelines.trajectory import checkpoint_row, run_trajectory
from heads_jax.stats.collector import collect
from heads_jax.stats.step import make_analysis_step
from heads_jax.training.checkpointing import Checkpoints
from heads_jax.training.rundir import RunDir
from tests.family_models import save_family_dir

ROLES = ("local", "cls", "sep", "delimiter", "nsubj", "syntactic")


def _params(encoder):
  return nnx.to_pure_dict(nnx.state(encoder, nnx.Param))


def _fresh_row(encoder, tokenizer):
  step = make_analysis_step(encoder, roles=ROLES, measures=True)
  parts = []
  for spec, syntax in (("ud-ewt", True), ("mrpc", False)):   # text data: no parser
    _, batches, n = encode_spec(spec, tokenizer, max_length=48, batch_size=4, max_examples=4,
                                syntax=syntax, pad_to_batch_size=True)
    parts.append(collect(step, batches, n, roles=ROLES, progress=False))
  cat = {k: np.concatenate([p[k] for p in parts])
         for k in ("sieve_bias", "token_attention", "lengths", "entropy")}
  return _expected_row(cat, ROLES)


def _expected_row(p, roles):
  """The row of statistics ``p`` (collected here): the default tests (tau 3, alpha 0.05) and
  the calibrated rule with the entropies, as an analysis runs them."""
  tests, settings = hypothesis_tests(p["sieve_bias"], roles, tau=3.0, alpha=0.05)
  tests, _ = apply_rule(tests, settings, p["sieve_bias"], roles, p["lengths"], rule="calibrated",
                        entropy=p["entropy"])
  return checkpoint_row(tests, p["sieve_bias"], p["token_attention"], roles)


@pytest.mark.slow
def test_every_checkpoint_is_analysed_as_a_fresh_model(tmp_path):
  run = tmp_path / "run"
  _, tokenizer = save_family_dir("bert", run / "hf", seed=4)
  encoder, tokenizer = load_model(run / "hf")
  original = _params(encoder)
  # step 20: layer 0's queries zeroed (uniform attention in layer 0)
  changed = jnp.zeros_like(encoder.layers[0].attention.query.kernel.value)
  changed_params = _params(encoder)
  changed_params["layers"][0]["attention"]["query"]["kernel"] = changed
  changed_params["layers"][0]["attention"]["query"]["bias"] = jnp.zeros_like(
      encoder.layers[0].attention.query.bias.value)
  ck = Checkpoints(RunDir(run).checkpoints, save_interval_steps=1, async_save=False)
  for step, params in ((10, original), (20, changed_params)):
    ck.save(step, {"step": jnp.int32(step), "params": {"bert": params}}, {"step": step})
  ck.close()

  logs = []
  table = run_trajectory(run, tmp_path / "out", data=("ud-ewt", "mrpc"), max_examples=4, max_length=48,
                         batch_size=4, roles=ROLES, log=logs.append)
  assert table["step"].tolist() == [10, 20]
  assert pd.read_csv(tmp_path / "out" / TRAJECTORY_CSV)["step"].tolist() == [10, 20]
  assert (tmp_path / "out" / "trajectory.png").is_file() and (tmp_path / "out" / "trajectory.svg").is_file()
  expected_10 = _fresh_row(encoder, tokenizer)
  nnx.update(encoder, _state_with(encoder, changed_params))
  expected_20 = _fresh_row(encoder, tokenizer)
  for expected, row in ((expected_10, table.iloc[0]), (expected_20, table.iloc[1])):
    for k, v in expected.items():
      assert row[k] == pytest.approx(v, rel=1e-5, abs=1e-6, nan_ok=True), k
  # the zeroed queries change the picture (the checkpoints were really swapped)
  cols = [c for c in table.columns if c.startswith("bias_")]
  assert np.nanmax(np.abs(table.iloc[0][cols].to_numpy(float) - table.iloc[1][cols].to_numpy(float))) > 1e-3
  assert any("step 20" in m for m in logs)


def _state_with(encoder, pure):
  params = nnx.state(encoder, nnx.Param)
  nnx.replace_by_pure_dict(params, pure)
  return params


def test_a_folder_without_checkpoints_is_refused(tmp_path):
  with pytest.raises(UserError, match="training run"):
    run_trajectory(tmp_path, tmp_path / "out")


def _run_with_checkpoints(run, steps=(10, 20), seed=4):
  """A hand-made pre-training-like run: an exported encoder (hf/) and a checkpoint of its
  parameters at each of ``steps`` (a layer's query scaled per step, so they differ)."""
  save_family_dir("bert", run / "hf", seed=seed)
  encoder, _ = load_model(run / "hf")
  _save_steps(run, _params(encoder), steps)
  return encoder


def _save_steps(run, params, steps, head=None):
  ck = Checkpoints(RunDir(run).checkpoints, save_interval_steps=1, async_save=False)
  for step in steps:
    p = dict(params)
    layers = dict(p["layers"])
    att = {**layers[0]["attention"], "query": {
        **layers[0]["attention"]["query"],
        "kernel": layers[0]["attention"]["query"]["kernel"] * (step / 10)}}
    layers[0] = {**layers[0], "attention": att}
    p["layers"] = layers
    ck.save(step, {"step": jnp.int32(step), "params": {"bert": p, **(head or {})}}, {"step": step})
  ck.close()


KW = dict(data=("ud-ewt",), max_examples=4, max_length=48, batch_size=4, roles=("local", "cls"))


@pytest.mark.slow
def test_rerun_analyses_only_new_checkpoints_and_sets_a_damaged_one_aside(tmp_path, monkeypatch):
  import heads_jax.pipelines.trajectory as traj
  from tests.pipelines.test_ablate import _stage_states
  run, out = tmp_path / "run", tmp_path / "out"
  encoder = _run_with_checkpoints(run)
  first = run_trajectory(run, out, log=lambda *_: None, **KW)
  assert first["step"].tolist() == [10, 20]
  # a new checkpoint: only it is analysed
  _save_steps(run, _params(encoder), (30,))
  logs = []
  table = run_trajectory(run, out, log=logs.append, **KW)
  assert table["step"].tolist() == [10, 20, 30]
  assert "1 part(s) run, 2 reused" in "\n".join(logs)
  pd.testing.assert_frame_equal(table.iloc[:2], first)
  # the same checkpoints again: nothing analysed, the model not even loaded
  real = traj.load_model
  monkeypatch.setattr(traj, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
  logs = []
  run_trajectory(run, out, log=logs.append, **KW)
  assert set(_stage_states(logs).values()) == {"reused"}
  from heads_jax import runfiles
  assert runfiles.read_job(out)["kind"] == "trajectory"
  # a host-only change (the rule): the analysis and the table rerun, no device pass, no
  # scores.npz rewritten (and still no model loaded)
  npz = sorted(out.rglob("scores.npz"))
  stamps = [p.stat().st_mtime_ns for p in npz]
  logs = []
  run_trajectory(run, out, log=logs.append, rule="paper", **KW)
  assert _stage_states(logs) == {"scores": "reused", "analysis": "run", "table": "run"}
  assert len(npz) == 3 and [p.stat().st_mtime_ns for p in npz] == stamps
  monkeypatch.setattr(traj, "load_model", real)
  # a damaged checkpoint (a data file cut short; issue 34: a raw TensorStore OUT_OF_RANGE line
  # ended the job): one line, the others go on, the run's files untouched
  step_dir = RunDir(run).checkpoints / "20"
  data_file = max((p for p in Path(str(step_dir)).rglob("*") if p.is_file() and "/d/" in str(p)),
                  key=lambda p: p.stat().st_size)
  with open(data_file, "r+b") as f:
    f.truncate(data_file.stat().st_size // 2)
  logs = []
  table = run_trajectory(run, out, log=logs.append, **KW)
  assert table["step"].tolist() == [10, 30]
  damaged = [line for line in logs if "step 20" in line]
  assert len(damaged) == 1 and "cannot be read" in damaged[0] and "set aside" in damaged[0]
  assert "truncated" in damaged[0] and "\n" not in damaged[0]
  assert data_file.is_file()
  # --redo scores: every readable checkpoint analysed again, its statistics and the table too
  logs = []
  run_trajectory(run, out, log=logs.append, redo="scores", **KW)
  assert _stage_states(logs) == {"scores": "run", "analysis": "run", "table": "run"}


def test_out_is_checked_before_the_first_checkpoint(tmp_path, monkeypatch):
  # Before (issue 34): --out a file or a read-only place failed after every checkpoint was analysed.
  import heads_jax.pipelines.trajectory as traj
  monkeypatch.setattr(traj, "checkpoint_steps", lambda run: pytest.fail("read the checkpoints"))
  (tmp_path / "file").write_text("keep")
  with pytest.raises(UserError, match="is a file; give a directory"):
    run_trajectory(tmp_path, tmp_path / "file")
  with pytest.raises(UserError, match="is not a writable directory"):
    run_trajectory(tmp_path, tmp_path / "file" / "sub")
  from heads_jax import runfiles
  runfiles.claim_dir(tmp_path / "analysis", "analysis")
  with pytest.raises(UserError, match="is an analysis directory"):
    run_trajectory(tmp_path, tmp_path / "analysis")
  with pytest.raises(UserError, match="--roles local,bogus: bogus is not a role"):
    run_trajectory(tmp_path, tmp_path / "new", roles=("local", "bogus"))
  with pytest.raises(UserError, match="--max-examples 0: give a whole number of at least 1"):
    run_trajectory(tmp_path, tmp_path / "new", max_examples=0)
  with pytest.raises(UserError, match="data spec 'nope:x'"):
    run_trajectory(tmp_path, tmp_path / "new", data=("nope:x",))
  monkeypatch.setattr(traj.os, "access", lambda path, mode: False)   # a read-only place
  with pytest.raises(UserError, match=f"--out {tmp_path / 'new'}: {tmp_path} is not a writable"):
    run_trajectory(tmp_path, tmp_path / "new")
  assert (tmp_path / "file").read_text() == "keep" and not (tmp_path / "new").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["squad", "classifier", "regression"])
def test_every_run_kind(tmp_path, kind, caplog):
  # Before (issue 33): on a SQuAD run the restore target expected the pooler that the span model
  # lacks, and the advice named --config.model.size, a flag trajectory does not take.
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.checkpoint import save_model
  from heads_jax.model.config import config_for
  from heads_jax.model.heads import BertForQuestionAnswering, BertForSequenceClassification
  tok = load_tokenizer(None)
  cfg = config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                   initializer_range=0.2)
  model = (BertForQuestionAnswering(cfg, rngs=nnx.Rngs(2)) if kind == "squad" else
           BertForSequenceClassification(cfg, 1 if kind == "regression" else 3, rngs=nnx.Rngs(2)))
  run = tmp_path / "run"
  save_model(model, run / "best_model", tok)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  assert ("pooler" in params["bert"]) == (kind != "squad")
  _save_steps(run, params["bert"], (10,), head={k: v for k, v in params.items() if k != "bert"})
  logs = []
  caplog.set_level(logging.WARNING)
  table = run_trajectory(run, tmp_path / "out", log=logs.append, **KW)
  assert table["step"].tolist() == [10]
  # the row is that of the exported encoder with step 10's parameters
  encoder, tokenizer = load_model(run / "best_model")
  restored = _params(encoder)
  restored["layers"][0]["attention"]["query"]["kernel"] = params["bert"]["layers"][0]["attention"]["query"]["kernel"]
  nnx.update(encoder, _state_with(encoder, restored))
  step = make_analysis_step(encoder, roles=KW["roles"], measures=True)
  _, batches, n = encode_spec("ud-ewt", tokenizer, max_length=48, batch_size=4, max_examples=4,
                              syntax=True, pad_to_batch_size=True)
  p = collect(step, batches, n, roles=KW["roles"], progress=False)
  expected = _expected_row(p, KW["roles"])
  for k, v in expected.items():
    assert table.iloc[0][k] == pytest.approx(v, rel=1e-5, abs=1e-6, nan_ok=True), k
  assert sum(line.strip().startswith("step 10:") for line in logs) == 1   # one line per checkpoint
  # no Orbax/absl warnings per checkpoint (issue 33: four of them per checkpoint before)
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.slow   # a real tiny SQuAD fine-tuning run (about 20 CPU-s) and its trajectory
def test_a_real_squad_run(tmp_path):
  from heads_jax.training import configlib, finetune
  from tests.training.test_squad import _squad_file
  f = _squad_file(tmp_path / "squad.json")
  over = [f"squad.train_file={f}", "squad.eval_titles=Article_2", "data.max_examples=0",
          "num_train_steps=2", "eval_every=2", "checkpoint.every_steps=1", "checkpoint.keep=0",
          "tensorboard=False", "data.max_seq_length=32", "squad.doc_stride=16",
          "squad.max_query_length=12"]
  finetune.train_and_evaluate(configlib.load_config("configs/finetune.py:tiny_squad", over),
                              tmp_path / "run")
  logs = []
  table = run_trajectory(tmp_path / "run", tmp_path / "out", log=logs.append,
                         **{**KW, "max_length": 32})
  assert table["step"].tolist() == [1, 2]
  assert [line.strip().split(":")[0] for line in logs if line.strip().startswith("step ")] == [
      "step 1", "step 2"]


@pytest.mark.slow
def test_one_sequence_says_no_test_can_run(tmp_path):
  # Before (issue 43 item 6): 0% roles and 100% sinks without a word.
  run = tmp_path / "run"
  _run_with_checkpoints(run)
  logs = []
  run_trajectory(run, tmp_path / "out", log=logs.append, **dict(KW, max_examples=1))
  assert any("only 1 sequence(s): no test can run" in line for line in logs)
