"""Roles over training (heads_jax.pipelines.trajectory) on a hand-made run: two Orbax checkpoints
of a tiny encoder, analysed with one compiled step, each row equal to a fresh analysis."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from flax import nnx

from heads_jax.data.specs import encode_spec
from heads_jax.errors import UserError
from heads_jax.model.loading import load_model
from heads_jax.pipelines.trajectory import TRAJECTORY_CSV, checkpoint_row, run_trajectory
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
  return checkpoint_row(cat["sieve_bias"], cat["token_attention"], cat["lengths"], ROLES,
                        entropy=cat["entropy"])


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
