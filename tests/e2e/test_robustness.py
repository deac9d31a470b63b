"""Training robustness: SIGTERM saves a checkpoint and stops, a non-finite loss aborts with a
one-line error naming the last good checkpoint, a checkpoint restores onto another device
layout (8 devices -> 1 -> 8), and a resumed fine-tuning run equals an uninterrupted one."""

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from heads_jax.parallel import data_mesh, shard_batch
from heads_jax.training import checkpointing, configlib, finetune, job, loop, optimizer, steps


def _host(tree):
  return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def _flat(tree):
  return {jax.tree_util.keystr(p): np.asarray(jax.device_get(v))
          for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def _counting_step(signal_at=None, nan_at=None):
  """A fake train step (no model): the state counts steps and adds the step number to ``w``;
  at step ``signal_at`` it sends this process SIGTERM, at ``nan_at`` it reports a NaN loss."""
  def train_step(state, batch):
    k = int(state["step"]) + 1
    if k == signal_at:
      os.kill(os.getpid(), signal.SIGTERM)
    loss = float("nan") if k == nan_at else 1.0 / k
    return {"step": np.int32(k), "w": state["w"] + k}, {"loss": loss, "grad_norm": 1.0}
  return train_step


def _batches():
  return iter(lambda: {"x": np.zeros(8, np.float32)}, None)


def test_sigterm_saves_a_checkpoint_and_stops(tmp_path):
  before = signal.getsignal(signal.SIGTERM)
  ckpts = checkpointing.Checkpoints(tmp_path / "ck", save_interval_steps=10, max_to_keep=3,
                                    async_save=False)
  state0 = {"step": np.int32(0), "w": np.zeros(3, np.float32)}
  state, history = loop.train_loop(state=state0, train_step=_counting_step(signal_at=3),
                                   batches=_batches(), mesh=data_mesh(), start_step=0,
                                   total_steps=10, ckpts=ckpts, writer=None, throughput=None,
                                   log_every=5, print_fn=None)
  # stopped right after step 3 with a (forced) checkpoint, though 3 is no save interval
  assert int(state["step"]) == 3 and history[-1]["step"] == 3
  assert history[-1]["loss"] == pytest.approx(np.mean([1, 1 / 2, 1 / 3]))
  assert ckpts.all_steps() == [3]
  restored, _ = ckpts.restore(checkpointing.abstract_like(
      {"step": jnp.zeros((), jnp.int32), "w": jnp.zeros(3, jnp.float32)}))
  assert int(restored["step"]) == 3 and restored["w"].tolist() == [6.0, 6.0, 6.0]
  ckpts.close()
  assert signal.getsignal(signal.SIGTERM) is before            # the handler is given back
  # running on from the checkpoint ends where an uninterrupted run ends
  ckpts = checkpointing.Checkpoints(tmp_path / "ck", save_interval_steps=10, async_save=False)
  state, _ = loop.train_loop(state=restored, train_step=_counting_step(), batches=_batches(),
                             mesh=data_mesh(), start_step=3, total_steps=10, ckpts=ckpts,
                             writer=None, throughput=None, log_every=5, print_fn=None)
  assert int(state["step"]) == 10 and np.asarray(state["w"]).tolist() == [55.0] * 3
  assert ckpts.all_steps() == [3, 10]
  ckpts.close()


def _pretrain_job(tmp_path, **overrides):
  c = configlib.load_config("configs/pretrain.py:tiny")
  c.batch_size, c.num_train_steps, c.log_every, c.tensorboard = 16, 8, 100, False
  c.checkpoint.every_steps, c.checkpoint.keep, c.checkpoint.async_save = 1, 5, False
  c.optimizer.learning_rate = 2e-3
  for k, v in overrides.items():
    configlib.apply_overrides(c, [f"{k}={v}"])
  return c, job.TrainingJob(c, tmp_path / "run")


@pytest.mark.slow
def test_non_finite_loss_stops_the_job_with_one_line(tmp_path):
  """Through TrainingJob.train (the real state, checkpoints, writer): the run stops at the NaN of
  step 4, the state that produced it (step 3) is moved out of the run, the error is a UserError naming the
  last good checkpoint and what to change."""
  c, j = _pretrain_job(tmp_path)
  j.create_dir()
  tok = load_tokenizer()
  state = j.initial_state(j.init_model("pretraining", tok))

  def nan_step(state, batch):
    k = int(state["step"]) + 1
    return dict(state, step=jnp.int32(k)), {"loss": float("nan") if k == 4 else 2.0,
                                            "grad_norm": 1.0}

  with pytest.raises(UserError) as e:
    j.train(state, nan_step, _batches(), seq_len=64, meta={})
  msg = str(e.value)
  assert len(msg.splitlines()) == 1
  assert "the loss is nan at step 4" in msg and "last good checkpoint is step 2" in msg
  assert "--config.optimizer.learning_rate=0.0005" in msg and "warmup_steps" in msg
  ck = checkpointing.Checkpoints(j.dir.checkpoints, async_save=False)
  assert ck.all_steps() == [1, 2]
  ck.close()


# ---------------------------------------------------------------------------------------------
# Restore onto another mesh


class Toy(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(6, 3, rngs=rngs)
    self.drop = nnx.Dropout(0.2, rngs=rngs)


def _toy_loss(model, batch, *, deterministic):
  y = model.lin(model.drop(batch["x"], deterministic=deterministic))
  loss = jnp.mean((y - batch["y"]) ** 2)
  return loss, {"loss": loss}


@pytest.mark.slow
def test_checkpoint_restores_onto_another_mesh(tmp_path):
  """A train state saved from the 8-device mesh restores onto 1 device (the resume path of
  loop.initial_state) with the same values, trains on there like on 8 devices, and a state
  saved from 1 device restores onto all 8."""
  assert jax.device_count() == 8
  mesh8, mesh1 = data_mesh(), data_mesh(jax.devices()[:1])
  tx, sched = optimizer.make_optimizer(learning_rate=0.1, warmup_steps=0, total_steps=10)
  rng = np.random.default_rng(0)
  batch = {"x": rng.normal(size=(8, 6)).astype(np.float32),
           "y": rng.normal(size=(8, 3)).astype(np.float32)}

  def step_on(mesh, parts):
    return steps.make_train_step(parts, tx, _toy_loss, mesh=mesh, schedule=sched, dropout_seed=2,
                                 donate=False)

  def ckpts(name):
    return checkpointing.Checkpoints(tmp_path / name, save_interval_steps=1, async_save=False)

  parts, params = steps.split_model(Toy(nnx.Rngs(0)))
  state8 = steps.place_state(steps.init_train_state(params, tx), mesh8)
  step8 = step_on(mesh8, parts)
  state8, _ = step8(state8, shard_batch(batch, mesh8))       # a state with moments
  ck = ckpts("from8")
  ck.save(1, state8, force=True)
  ck.close()

  # 8 -> 1: another model instance (other seed) resumes from the checkpoint on one device
  ck = ckpts("from8")
  parts1, state1, start, origin = loop.initial_state(model=Toy(nnx.Rngs(9)), tx=tx, mesh=mesh1,
                                                     ckpts=ck)
  ck.close()
  assert start == 1 and origin.startswith("resumed")
  for leaf in jax.tree.leaves(state1):
    assert leaf.sharding.device_set == {jax.devices()[0]}
  want = _flat(state8)
  for name, v in _flat(state1).items():
    np.testing.assert_array_equal(v, want[name], err_msg=name)
  # one more step on each layout: the same update
  next1, m1 = step_on(mesh1, parts1)(state1, shard_batch(batch, mesh1))
  next8, m8 = step8(state8, shard_batch(batch, mesh8))
  assert float(m1["loss"]) == pytest.approx(float(m8["loss"]), rel=1e-6)
  want = _flat(next8)
  for name, v in _flat(next1).items():
    np.testing.assert_allclose(v, want[name], rtol=1e-5, atol=1e-7, err_msg=name)

  # 1 -> 8
  ck = ckpts("from1")
  ck.save(2, next1, force=True)
  ck.close()
  ck = ckpts("from1")
  _, back, start, _ = loop.initial_state(model=Toy(nnx.Rngs(4)), tx=tx, mesh=mesh8, ckpts=ck)
  ck.close()
  assert start == 2
  for leaf in jax.tree.leaves(back):
    assert len(leaf.sharding.device_set) == 8 and leaf.sharding.is_fully_replicated
  want = _flat(next1)
  for name, v in _flat(back).items():
    np.testing.assert_array_equal(v, want[name], err_msg=name)


# ---------------------------------------------------------------------------------------------
# Exact fine-tuning resume


def _finetune_config(**overrides):
  args = ["data.max_examples=60", "data.max_seq_length=16", "batch_size=8", "eval_batch_size=16",
          "num_train_steps=6", "eval_every=2", "log_every=1", "checkpoint.every_steps=2",
          "checkpoint.async_save=False", "optimizer.warmup_steps=1", "export=False",
          "tensorboard=False"]
  return configlib.load_config("configs/finetune.py:tiny",
                               args + [f"{k}={v}" for k, v in overrides.items()])


@pytest.mark.slow  # three runs, each compiling its steps
def test_finetuning_resume_equals_an_uninterrupted_run(tmp_path):
  full = finetune.train_and_evaluate(_finetune_config(), tmp_path / "full")
  part = finetune.train_and_evaluate(_finetune_config(stop_at_step=3), tmp_path / "cut")
  assert part["final_step"] == 3
  rest = finetune.train_and_evaluate(_finetune_config(), tmp_path / "cut")
  assert rest["start_step"] == 3 and rest["origin"].startswith("resumed")
  assert rest["final_step"] == full["final_step"] == 6
  # every step's loss, the evaluations, the best checkpoint and the final state: identical
  losses = {h["step"]: h["loss"] for h in part["history"] + rest["history"]}
  assert [losses[s] for s in range(1, 7)] == [h["loss"] for h in full["history"]]
  assert rest["final_eval"] == full["final_eval"]
  assert rest["best"] == full["best"]
  a, b = _flat(full["state"]), _flat(rest["state"])
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(b[name], a[name], err_msg=name)
  assert max(np.abs(a[n] - b[n]).max() for n in a) == 0
