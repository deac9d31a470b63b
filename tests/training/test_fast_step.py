"""The pre-training step's fast forms (issue 39): dropout bits from an ``rbg`` key (still keyed
by the step, so a resumed run draws the same bits), the MLM loss on padded compute-dtype logits
(the previous loss to float32 rounding in float32, within 2e-3 in bfloat16; the padding never
wins), the flat LAMB in the step."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForPreTraining, padded_vocab
from heads_jax.errors import UserError
from heads_jax.parallel import data_mesh, shard_batch
from heads_jax.training import optimizer, steps

V = 100   # not a multiple of 64: the padded decoder adds 28 columns


def _batch(seed, b=4, q=16, p=3):
  rng = np.random.default_rng(seed)
  return {"input_ids": rng.integers(1, V, (b, q)).astype(np.int32),
          "attention_mask": np.ones((b, q), np.int32),
          "token_type_ids": (np.arange(q)[None] >= q // 2).repeat(b, 0).astype(np.int32),
          "masked_positions": np.sort(rng.integers(1, q, (b, p)), axis=1).astype(np.int32),
          "masked_ids": rng.integers(1, V, (b, p)).astype(np.int32),
          "masked_weights": np.ones((b, p), np.float32),
          "next_sentence_label": rng.integers(0, 2, b).astype(np.int32)}


def _setup(dtype="float32", **kw):
  model = BertForPreTraining(config_for("tiny", vocab_size=V, num_layers=1, dtype=dtype, **kw),
                             rngs=nnx.Rngs(0))
  return steps.split_model(model)


def test_padded_vocab():
  assert padded_vocab(30522) == 30528 and padded_vocab(64) == 64 and padded_vocab(100) == 128


@pytest.mark.slow
def test_a_resumed_run_draws_the_same_rbg_bits():
  """Steps 0-3 in one go against steps 0-1, the state to the host and back (a checkpoint's
  round trip), steps 2-3: the same parameters bit for bit, with pre-training's masks (rbg bits,
  8 of them an element: ``dropout_bits=8``); and the rbg bits are keyed by the step (same step,
  same loss; another step, another loss) and are not threefry's; 8-bit masks are not 32-bit
  ones."""
  parts, params = _setup(dropout_bits=8)
  tx, sched = optimizer.make_optimizer(learning_rate=1e-2, warmup_steps=0, total_steps=10)
  mesh = data_mesh(jax.devices()[:1])
  make = functools.partial(steps.make_train_step, parts, tx, steps.pretraining_loss, mesh=mesh,
                           schedule=sched, dropout_seed=5, dropout_rng="rbg")
  batches = [shard_batch(_batch(i), mesh) for i in range(4)]
  step = make()
  state = steps.place_state(steps.init_train_state(params, tx), mesh)
  for b in batches:
    state, _ = step(state, b)
  full = steps.to_host(state)
  state = steps.place_state(steps.init_train_state(params, tx), mesh)
  for b in batches[:2]:
    state, _ = step(state, b)
  state = steps.place_state(steps.to_host(state), mesh)
  for b in batches[2:]:
    state, _ = step(state, b)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(steps.to_host(state))):
    np.testing.assert_array_equal(a, b)

  fresh = lambda k: steps.place_state(dict(steps.init_train_state(params, tx), step=jnp.int32(k)),
                                      mesh)
  loss = lambda st, k: float(st(fresh(k), batches[0])[1]["loss"])
  assert loss(step, 0) == loss(step, 0)
  assert loss(step, 0) != loss(step, 1)
  threefry = make(dropout_rng="threefry2x32")
  assert loss(step, 0) != loss(threefry, 0)
  parts32, _ = _setup()
  assert loss(step, 0) != loss(functools.partial(steps.make_train_step, parts32, tx,
                                                 steps.pretraining_loss, mesh=mesh, schedule=sched,
                                                 dropout_seed=5, dropout_rng="rbg")(), 0)
  with pytest.raises(ValueError, match="dropout_rng"):
    steps.dropout_base_key(0, "philox")


@pytest.mark.slow
@pytest.mark.parametrize("dtype,rtol", [("float32", 2e-6), ("bfloat16", 2e-3)])
def test_padded_logits_loss_equals_the_float32_loss(dtype, rtol):
  parts, params = _setup(dtype)
  batch = _batch(1)

  def run(mode):
    def f(p):
      return steps.pretraining_loss(steps.merge_model(parts, p), batch, deterministic=True,
                                    mlm_logits=mode)
    (loss, m), g = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    return float(loss), float(m["mlm_loss"]), float(m["mlm_accuracy"]), g

  ref, new = run("float32"), run("padded")
  np.testing.assert_allclose(new[:2], ref[:2], rtol=rtol)
  assert new[2] == ref[2]
  # gradients (float32 parameters either way): all but the last bits in float32
  scale = max(float(np.abs(b).max()) for b in jax.tree.leaves(ref[3]))
  for a, b in zip(jax.tree.leaves(new[3]), jax.tree.leaves(ref[3])):
    np.testing.assert_allclose(a, b, rtol=10 * rtol, atol=10 * rtol * scale)


@pytest.mark.slow
def test_padded_logits_are_masked_and_never_win():
  parts, params = _setup()
  params = jax.tree.map(lambda x: x, params)
  params["mlm"]["bias"] = params["mlm"]["bias"] - 1e4     # every real logit very negative
  model = steps.merge_model(parts, params)
  b = _batch(2)
  out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"],
              masked_positions=b["masked_positions"], mlm_logits="padded")
  logits = np.asarray(out["mlm_logits"])
  assert logits.shape == (4, 3, padded_vocab(V))
  assert np.all(logits[..., V:] == -np.inf) and np.all(np.isfinite(logits[..., :V]))
  assert np.all(logits.argmax(-1) < V)
  ref = model(b["input_ids"], b["attention_mask"], b["token_type_ids"],
              masked_positions=b["masked_positions"])["mlm_logits"]
  np.testing.assert_allclose(logits[..., :V], ref, rtol=1e-6)
  nll = steps.cross_entropy(out["mlm_logits"], b["masked_ids"])
  np.testing.assert_allclose(nll, steps.cross_entropy(ref, b["masked_ids"]), rtol=1e-5)


@pytest.mark.slow
def test_the_flat_lamb_step_equals_the_chain_step():
  parts, params = _setup()
  mesh = data_mesh(jax.devices()[:1])
  out, norms = {}, {}
  for flat in (False, True):
    tx, sched = optimizer.make_optimizer(learning_rate=1e-2, warmup_steps=0, total_steps=10,
                                         flat=flat)
    step = steps.make_train_step(parts, tx, steps.pretraining_loss, mesh=mesh, schedule=sched,
                                 dropout_seed=1)
    state = steps.place_state(steps.init_train_state(params, tx), mesh)
    for i in range(3):
      state, m = step(state, shard_batch(_batch(i), mesh))
    out[flat] = steps.to_host(state["params"])
    norms[flat] = float(m["grad_norm"])     # the flat LAMB's own norm, not a second pass
  np.testing.assert_allclose(norms[True], norms[False], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(out[True]), jax.tree.leaves(out[False])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_xla_options_reach_the_train_step():
  """``config.xla_options`` ("name=value,...") parsed and given to the step's compilation: a
  known option compiles to the same loss, an unknown one is refused by XLA; bad text is one line."""
  assert steps.parse_compiler_options("") == {}
  assert steps.parse_compiler_options(
      "xla_gpu_enable_cublaslt=true, a=false,b=3,c=x") == {"xla_gpu_enable_cublaslt": True,
                                                          "a": False, "b": 3, "c": "x"}
  with pytest.raises(UserError, match="is not name=value"):
    steps.parse_compiler_options("xla_gpu_enable_cublaslt")
  # checked before the run starts (issue 52 item 6: a traceback at the step's compile before)
  assert steps.check_compiler_options("xla_gpu_enable_cublaslt=true") == {
      "xla_gpu_enable_cublaslt": True}
  with pytest.raises(UserError, match="No such compile option: 'xla_bogus'"):
    steps.check_compiler_options("xla_bogus=1")

  class Tiny(nnx.Module):
    def __init__(self, rngs):
      self.lin, self.drop = nnx.Linear(4, 1, rngs=rngs), nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x, deterministic=False):
      return self.lin(self.drop(x, deterministic=deterministic))

  def loss_fn(model, batch, *, deterministic):
    loss = jnp.mean((model(batch["x"], deterministic=deterministic)[:, 0] - batch["y"]) ** 2)
    return loss, {"loss": loss}

  parts, params = steps.split_model(Tiny(nnx.Rngs(0)))
  tx, _ = optimizer.make_optimizer(learning_rate=1e-2, warmup_steps=0, total_steps=10)
  mesh = data_mesh(jax.devices()[:1])
  batch = shard_batch({"x": np.ones((8, 4), np.float32), "y": np.zeros(8, np.float32)}, mesh)

  def loss(options):
    step = steps.make_train_step(parts, tx, loss_fn, mesh=mesh, compiler_options=options)
    state = steps.place_state(steps.init_train_state(params, tx), mesh)
    return float(step(state, batch)[1]["loss"])

  assert loss({"xla_gpu_enable_cublaslt": True}) == loss(None)
  with pytest.raises(Exception, match="xla_no_such_option"):
    loss({"xla_no_such_option": True})
