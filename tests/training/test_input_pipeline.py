"""The input pipeline at device speed (issue 39 item 5): the worker count from the host's cores,
the stream's own measurements (build time, capacity, waiting), and the training loop's line when
the input starves the device (and none when it does not)."""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np
import pytest

from heads_jax.data import prefetch as pf
from heads_jax.parallel import data_mesh
from heads_jax.training import configlib, loop, metrics


def test_auto_workers_from_cores():
  assert pf.auto_workers(16) == 14 and pf.auto_workers(2) == 0 and pf.auto_workers(3) == 1
  assert pf.auto_workers(200) == 32 and pf.auto_workers(1) == 0
  assert pf.resolve_workers(-1) == pf.auto_workers() and pf.resolve_workers(3) == 3
  c = configlib.load_config("configs/pretrain.py:bert_base")
  assert c.data.num_workers == -1
  big = configlib.load_config("configs/pretrain.py:bert_base_b512")
  assert (big.batch_size, big.num_train_steps, big.optimizer.warmup_steps) == (512, 150_000, 5_000)
  assert big.batch_size * big.num_train_steps == c.batch_size * c.num_train_steps


def _slow(seconds):
  def batch_fn(step):
    time.sleep(seconds)
    return {"x": np.full((8, 2), step, np.float32)}
  return batch_fn


def test_the_stream_measures_itself():
  stream = pf.prefetch(_slow(0.05), 3, num_steps=4)
  got = [int(b["x"][0, 0]) for b in stream]
  assert got == [3, 4, 5, 6] and stream.workers == 0
  s = stream.take_stats()
  assert s["batches"] == 4 and 0.04 < s["batch_build_s"] < 1.0
  assert s["input_capacity_per_s"] == pytest.approx(1 / s["batch_build_s"])
  assert s["input_wait_s"] > 0.1     # nothing else to do: the consumer waited for every batch
  assert stream.take_stats() == {"batches": 0, "input_wait_s": 0.0}


def _run(batch_seconds, capsys):
  mesh = data_mesh()

  def train_step(state, batch):
    return state, {"loss": jnp.sum(batch["x"]) * 0 + 1.0}

  throughput = metrics.Throughput(8, None, 1, "cpu", 6)
  loop.train_loop(state={}, train_step=train_step, batches=pf.prefetch(_slow(batch_seconds), 0),
                  mesh=mesh, start_step=0, total_steps=6, ckpts=None, writer=None,
                  throughput=throughput, log_every=3)
  return capsys.readouterr().out


def test_the_loop_says_when_the_input_starves_the_device(capsys):
  out = _run(0.05, capsys)
  lines = [x for x in out.splitlines() if "starves" in x]
  assert lines and "a batch takes 0.0" in lines[-1] and "one thread make" in lines[-1]
  assert "data.num_workers" in lines[-1]
  assert len(lines) == 1      # once a run (the demo printed it twelve times: issue 52 item 5)
  with loop.no_input_advice():   # a job whose user cannot set data.num_workers: not at all
    assert "starves" not in _run(0.05, capsys)


def test_no_line_when_the_input_keeps_up(capsys):
  out = _run(0.0, capsys)
  assert "step 6/6" in out and "starves" not in out


def test_starving_is_the_wait_with_builders_slower_than_twice_the_steps():
  assert not loop.starving({"input_wait_fraction": 0.05})
  assert loop.starving({"input_wait_fraction": 0.06})   # nothing measured the builders
  assert loop.starving({"input_wait_fraction": 0.5, "input_capacity_per_s": 39.9, "steps_per_s": 20.0})
  # a loaded 2-core CI machine: 6% hand-off wait, builders 8.7x faster than the steps
  assert not loop.starving({"input_wait_fraction": 0.06, "input_capacity_per_s": 3559.6,
                            "steps_per_s": 407.9})


def test_the_new_settings_are_checked_before_device_work():
  from heads_jax.errors import UserError
  from heads_jax.model.heads import MLM_LOGITS
  from heads_jax.training import steps
  assert configlib.DROPOUT_RNGS == steps.DROPOUT_RNGS and configlib.MLM_LOGITS == MLM_LOGITS
  for overrides, message in ((["dropout_rng=philox"], "dropout_rng must be one of"),
                             (["mlm_logits=bf16"], "mlm_logits must be one of"),
                             (["optimizer.flat=true", "optimizer.name=adamw"],
                              "optimizer.flat exists for LAMB only")):
    c = configlib.load_config("configs/pretrain.py:bert_base", overrides)
    with pytest.raises(UserError, match=message):
      configlib.check_training_config(c)
  configlib.check_training_config(configlib.load_config("configs/pretrain.py:bert_base"))
