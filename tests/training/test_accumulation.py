"""Gradient accumulation (optax.MultiSteps) end to end, the pre-training evaluation and unigram
baseline, and fine-tuning from a pre-training run's Orbax checkpoints (encoder only).

One short pre-training run with ``accumulate_steps = 2`` (module fixture) serves several tests:
its checkpoints at every step show when the parameters move, its learning rates are checked
against hand values, a copy of it resumed in the middle of an accumulation window must end
bit-identical, its evaluation is recomputed in numpy, and a fine-tuning run starts from it.
"""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.parallel import data_mesh, shard_batch
from heads_jax.training import checkpointing, configlib, finetune, job, loop, metrics, optimizer, pretrain, steps


def _host(tree):
  return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def _flat(tree):
  return {jax.tree_util.keystr(p): np.asarray(jax.device_get(v))
          for p, v in jax.tree_util.tree_leaves_with_path(tree)}


class Toy(nnx.Module):
  """A linear layer behind dropout: cheap to compile, and its gradient depends on the dropout
  key of the step."""

  def __init__(self, rngs):
    self.lin = nnx.Linear(6, 3, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)


def _toy_loss(model, batch, *, deterministic):
  y = model.lin(model.drop(batch["x"], deterministic=deterministic))
  loss = jnp.mean((y - batch["y"]) ** 2)
  return loss, {"loss": loss}


@pytest.mark.slow
def test_accumulated_train_step_equals_updates_on_mean_gradients():
  """4 micro-steps with accumulate_steps=2 = 2 plain LAMB updates, each on the mean of two
  micro-batch gradients (each taken with its own step's dropout key), at learning rates
  schedule(0) and schedule(1); the step reports schedule(step // 2)."""
  parts, params = steps.split_model(Toy(nnx.Rngs(0)))
  kw = dict(learning_rate=1e-1, warmup_steps=0, total_steps=2)
  acc_tx, sched = optimizer.make_optimizer(accumulate_steps=2, **kw)
  one_tx, _ = optimizer.make_optimizer(**kw)
  mesh = data_mesh()
  step = steps.make_train_step(parts, acc_tx, _toy_loss, mesh=mesh, schedule=sched,
                               accumulate_steps=2, dropout_seed=5, donate=False)
  rng = np.random.default_rng(0)
  batches = [{"x": rng.normal(size=(8, 6)).astype(np.float32),
              "y": rng.normal(size=(8, 3)).astype(np.float32)} for _ in range(4)]
  state = steps.place_state(steps.init_train_state(params, acc_tx), mesh)
  got, lrs = [], []
  for b in batches:
    state, m = step(state, shard_batch(b, mesh))
    got.append(_flat(state["params"]))
    lrs.append(float(m["learning_rate"]))
  assert lrs == pytest.approx([1e-1, 1e-1, 5e-2, 5e-2])   # linear decay over 2 updates

  # the reference: gradients by hand with the dropout key of each micro-step
  base_key = jax.random.key(5)

  def grad(p, batch, k):
    def f(p):
      model = steps.merge_model(parts, p, jax.random.fold_in(base_key, k))
      return _toy_loss(model, batch, deterministic=False)[0]
    return jax.grad(f)(p)

  @jax.jit
  def update(p, s, b1, b2, k):
    g = jax.tree.map(lambda a, b: (a + b) / 2, grad(p, b1, k), grad(p, b2, k + 1))
    up, s = one_tx.update(g, s, p)
    return optax.apply_updates(p, up), s

  p = jax.tree.map(jnp.asarray, _host(params))
  s = one_tx.init(p)
  init = _flat(p)
  for u in range(2):
    p, s = update(p, s, batches[2 * u], batches[2 * u + 1], 2 * u)
    for name, v in _flat(p).items():                # after the window's second micro-step
      np.testing.assert_allclose(got[2 * u + 1][name], v, rtol=1e-5, atol=1e-6, err_msg=name)
  for name, v in init.items():                      # mid-window: nothing applied yet
    np.testing.assert_array_equal(got[0][name], v, err_msg=name)
    np.testing.assert_array_equal(got[2][name], got[1][name], err_msg=name)
  assert max(np.abs(got[3][n] - got[1][n]).max() for n in init) > 1e-3


def test_make_tx_counts_updates():
  """The schedule of a job with accumulate_steps k spans num_train_steps // k updates."""
  c = configlib.load_config("configs/pretrain.py:tiny")
  c.num_train_steps, c.optimizer.warmup_steps, c.optimizer.learning_rate = 12, 2, 1.0
  c.optimizer.accumulate_steps = 3
  tx, sched = job.make_tx(c)
  assert [float(sched(i)) for i in range(5)] == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])
  assert isinstance(tx, optax.MultiSteps)
  c.optimizer.accumulate_steps = 1
  _, sched1 = job.make_tx(c)
  assert float(sched1(4)) == pytest.approx(0.8)


# ---------------------------------------------------------------------------------------------
# One real pre-training run with accumulation


def _pretrain_config(**kw):
  c = configlib.load_config("configs/pretrain.py:tiny")
  c.data.max_seq_length, c.data.max_predictions = 32, 5
  c.batch_size = 16
  c.num_train_steps = 4
  c.optimizer.warmup_steps = 0
  c.optimizer.accumulate_steps = 2
  c.checkpoint.every_steps = 1
  c.checkpoint.keep = 10
  c.checkpoint.async_save = False
  c.log_every = 1
  c.eval_every = 2
  c.eval_batches = 2
  c.data.unigram_examples = 64
  c.export = False
  c.tensorboard = False
  for k, v in kw.items():
    configlib.apply_overrides(c, [f"{k}={v}"])
  return c


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  work = tmp_path_factory.mktemp("accumulated") / "run"
  c = _pretrain_config()
  return c, pretrain.train_and_evaluate(c, work), work


def _checkpoint_params(config, work, tokenizer, step):
  j = job.TrainingJob(config, work)
  _, params = steps.split_model(j.init_model("pretraining", tokenizer))
  ck = checkpointing.Checkpoints(work / "checkpoints", async_save=False)
  state, meta = ck.restore(loop.abstract_state(params, j.tx, j.mesh), step=step)
  ck.close()
  return _flat(params), _flat(state["params"]), meta


@pytest.mark.slow
def test_accumulation_in_a_pretraining_run(run, tokenizer, tmp_path):
  c, summary, work = run
  assert [h["step"] for h in summary["history"]] == [1, 2, 3, 4]
  # schedule over 4 // 2 = 2 updates, reported per micro-step: lr, lr, lr / 2, lr / 2
  lr = c.optimizer.learning_rate
  assert [h["learning_rate"] for h in summary["history"]] == pytest.approx([lr, lr, lr / 2, lr / 2])
  ck = checkpointing.Checkpoints(work / "checkpoints", async_save=False)
  assert ck.all_steps() == [1, 2, 3, 4]
  ck.close()
  init, p1, meta = _checkpoint_params(c, work, tokenizer, 1)
  assert meta["step"] == 1
  _, p2, _ = _checkpoint_params(c, work, tokenizer, 2)
  _, p3, _ = _checkpoint_params(c, work, tokenizer, 3)
  _, p4, _ = _checkpoint_params(c, work, tokenizer, 4)
  for name in init:  # the parameters move only at the end of each window of 2 micro-steps
    np.testing.assert_array_equal(p1[name], init[name], err_msg=name)
    np.testing.assert_array_equal(p3[name], p2[name], err_msg=name)
  assert max(np.abs(p2[n] - p1[n]).max() for n in init) > 1e-4
  assert max(np.abs(p4[n] - p3[n]).max() for n in init) > 1e-4
  final = _flat(summary["state"]["params"])
  for name in init:
    np.testing.assert_array_equal(final[name], p4[name], err_msg=name)

  # resume in the middle of a window: a copy of the run stopped after step 3 (the gradient of
  # step 3 is accumulated, not applied) ends bit-identical to the uninterrupted run
  other = tmp_path / "resumed"
  shutil.copytree(work / "checkpoints", other / "checkpoints")
  shutil.rmtree(other / "checkpoints" / "4")
  again = pretrain.train_and_evaluate(c, other)
  assert again["start_step"] == 3 and again["origin"].startswith("resumed")
  assert again["history"][-1]["loss"] == summary["history"][-1]["loss"]
  for a, b in zip(jax.tree.leaves(_host(again["state"])), jax.tree.leaves(_host(summary["state"]))):
    np.testing.assert_array_equal(a, b)
  assert again["eval"] == summary["eval"]


@pytest.mark.slow
def test_pretraining_evaluation_and_unigram_baseline(run, tokenizer):
  """The evaluation at the end is the MLM/NSP loss of the final parameters on the held-out
  stream (recomputed here in numpy), and the unigram baseline that of its examples."""
  c, summary, work = run
  ev = summary["eval"]
  held_out = pretrain.build_examples(c, tokenizer, eval_split=True)
  assert ev["unigram_baseline"] == summary["unigram_baseline"] == pytest.approx(
      held_out.unigram_entropy(64), rel=1e-12)
  assert 4.0 < ev["unigram_baseline"] < 9.0     # nats per wordpiece of English text
  parts, _ = steps.split_model(job.TrainingJob(c, work).init_model("pretraining", tokenizer))

  @jax.jit
  def forward(params, b):
    return steps.merge_model(parts, params)(b["input_ids"], b["attention_mask"], b["token_type_ids"],
                                            masked_positions=b["masked_positions"], deterministic=True)

  params = _host(summary["state"]["params"])
  mlm, nsp, mlm_acc, nsp_acc = [], [], [], []
  for i in range(c.eval_batches):
    b = held_out.batch(i, c.batch_size, 0, 1)
    out = forward(params, {k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids",
                                             "masked_positions")})
    lp = np.asarray(jax.nn.log_softmax(out["mlm_logits"]), np.float64)
    w = np.asarray(b["masked_weights"], np.float64)
    ids = np.asarray(b["masked_ids"])
    nll = -np.take_along_axis(lp, ids[..., None], -1)[..., 0]
    mlm.append((nll * w).sum() / (w.sum() + 1e-5))
    mlm_acc.append(((lp.argmax(-1) == ids) * w).sum() / (w.sum() + 1e-5))
    nlp = np.asarray(jax.nn.log_softmax(out["nsp_logits"]), np.float64)
    y = np.asarray(b["next_sentence_label"])
    nsp.append(-nlp[np.arange(len(y)), y].mean())
    nsp_acc.append((nlp.argmax(-1) == y).mean())
  assert ev["mlm_loss"] == pytest.approx(np.mean(mlm), rel=1e-4)
  assert ev["nsp_loss"] == pytest.approx(np.mean(nsp), rel=1e-4)
  assert ev["loss"] == pytest.approx(np.mean(mlm) + np.mean(nsp), rel=1e-4)
  assert ev["mlm_accuracy"] == pytest.approx(np.mean(mlm_acc), abs=1e-6)
  assert ev["nsp_accuracy"] == pytest.approx(np.mean(nsp_acc), abs=1e-6)
  # evaluated every 2 steps and at the end, written beside the training metrics
  rows = metrics.read_metrics(work, "eval")
  assert [r["step"] for r in rows] == [2, 4]
  assert rows[-1]["mlm_loss"] == pytest.approx(ev["mlm_loss"])
  assert rows[-1]["unigram_baseline"] == pytest.approx(ev["unigram_baseline"])
  # held-out text, not the last training batch: another loss than training's at step 4
  assert ev["loss"] != pytest.approx(summary["history"][-1]["loss"], rel=1e-3)


@pytest.mark.slow
def test_finetuning_takes_the_encoder_of_a_pretraining_checkpoint(run, tokenizer, tmp_path):
  """init_checkpoint = a pre-training run's checkpoints: every encoder parameter is the run's,
  the classifier is the fresh initialisation of the fine-tuning seed (learning rate 0, so the
  state after one step is the state the run started from)."""
  _, pre, pre_work = run
  c = configlib.load_config("configs/finetune.py:tiny", [
      f"init_checkpoint={pre_work / 'checkpoints'}", "optimizer.learning_rate=0.0",
      "num_train_steps=1", "data.max_examples=40", "data.max_seq_length=16", "batch_size=8",
      "eval_batch_size=8", "export=False", "tensorboard=False", "seed=7"])
  s = finetune.train_and_evaluate(c, tmp_path / "ft")
  assert s["origin"] == f"params:{pre_work / 'checkpoints'}@4" and s["start_step"] == 0
  got = _flat(s["state"]["params"])
  encoder = _flat({"bert": pre["state"]["params"]["bert"]})
  fresh = _flat(steps.split_model(job.TrainingJob(c, tmp_path / "x").init_model(
      "classification", tokenizer, num_labels=2))[1])
  assert set(encoder) | {n for n in fresh if n.startswith("['classifier']")} == set(got)
  for name, v in encoder.items():
    np.testing.assert_array_equal(got[name], v, err_msg=name)
  moved = [n for n in encoder if not np.array_equal(fresh[n], encoder[n])]
  assert len(moved) == len(encoder)           # a fresh encoder would differ in every tensor
  for name in fresh:
    if name.startswith("['classifier']"):
      np.testing.assert_array_equal(got[name], fresh[name], err_msg=name)
