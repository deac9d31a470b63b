"""The Pallas flash-attention kernel with exact dropout (heads_jax/model/flash_attention.py), in
interpret mode on the CPU: against the plain-JAX oracle and, inside BERT, against the explicit
path with the same dropout masks (forward and gradient), and the masks as a function of the
step's key (what exact resume needs)."""

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from heads_jax.model.bert import (BertModel, attention_keep, attention_path, flash_preferred)
from heads_jax.model.config import config_for
from heads_jax.model.flash_attention import flash_attention, reference_attention
from heads_jax.parallel import data_mesh
from heads_jax.training import steps
from tests.helpers import random_batch

CFG = config_for("tiny", vocab_size=97, max_position_embeddings=32)


def _inputs(b=2, s=20, h=3, e=16, c=16, seed=0):
  ks = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(ks[0], (b, s, h, e))
  k = jax.random.normal(ks[1], (b, s, h, e))
  v = jax.random.normal(ks[2], (b, s, h, c))
  return q, k, v


def _grads(fn, q, k, v, w, *args, **kw):
  return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, *args, **kw) * w),
                          argnums=(0, 1, 2)))(q, k, v)


def _close(a, b, tol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.shape == y.shape
    assert float(jnp.max(jnp.abs(x - y))) <= tol * max(1.0, float(jnp.max(jnp.abs(y))))


@pytest.mark.slow
@pytest.mark.parametrize("dropout", [False, True])
def test_kernel_equals_reference(dropout):
  """Padding keys, a packed row (two segments + padding), an empty query row, lengths that are
  not a multiple of the block (20 with blocks of 16) and a value width (24) unlike e (16)."""
  q, k, v = _inputs(c=24)
  qseg = jnp.array([[1] * 20, [1] * 9 + [2] * 8 + [0] * 3])
  kseg = jnp.array([[1] * 13 + [0] * 7, [1] * 9 + [2] * 8 + [-1] * 3])  # row 1's padding: no key
  keep = jax.random.bernoulli(jax.random.key(5), 0.7, (2, 3, 20, 20)) if dropout else None
  rate = 0.3 if dropout else 0.0
  out = flash_attention(q, k, v, qseg, kseg, keep, rate=rate, block=16)
  ref = reference_attention(q, k, v, qseg, kseg, keep, rate=rate)
  assert out.shape == (2, 20, 3, 24)
  _close(out, ref, 2e-6)
  np.testing.assert_array_equal(out[1, 17:], 0.0)  # queries with no key: context 0
  w = jax.random.normal(jax.random.key(6), out.shape)
  g = _grads(flash_attention, q, k, v, w, qseg, kseg, keep, rate=rate, block=16)
  g_ref = _grads(reference_attention, q, k, v, w, qseg, kseg, keep, rate=rate)
  _close(g, g_ref, 2e-6)
  assert float(jnp.max(jnp.abs(g[0][1, 17:]))) == 0.0  # ... and no gradient


@pytest.mark.slow
def test_tuned_launch_settings_keep_the_gradients():
  """``tuned`` (bench/pretrain_ab.py's A/B of launch settings): other warps, stages and a
  backward inner step of 32 rows instead of 16 (blocks of 32) give the reference's gradients;
  the settings hold inside the context only."""
  from heads_jax.model import flash_attention as fa
  q, k, v = _inputs(s=32)
  qseg, kseg = jnp.ones((2, 32), jnp.int32), jnp.array([[1] * 25 + [0] * 7, [1] * 32])
  keep = jax.random.bernoulli(jax.random.key(5), 0.8, (2, 3, 32, 32))
  w = jax.random.normal(jax.random.key(6), q.shape)
  g_ref = _grads(reference_attention, q, k, v, w, qseg, kseg, keep, rate=0.2)
  with fa.tuned(inner=16):
    g16 = _grads(flash_attention, q, k, v, w, qseg, kseg, keep, rate=0.2, block=32)
  with fa.tuned(inner=32, bwd_warps=8, fwd_warps=8, stages=3) as t:
    assert fa._TUNING[-1] == t and t.inner == 32 and t.stages == 3
    g32 = _grads(flash_attention, q, k, v, w, qseg, kseg, keep, rate=0.2, block=32)
  assert fa._TUNING[-1] == fa.Tuning()
  _close(g16, g_ref, 2e-6)
  _close(g32, g_ref, 2e-6)
  # dQ from the dK/dV kernel where the keys are one block (32 here), the dQ kernel not launched;
  # with two key blocks (16) the setting changes nothing
  grad = functools.partial(_grads, flash_attention, q, k, v, w, qseg, kseg, keep, rate=0.2)
  with fa.tuned(fuse_dq=True):
    g_fused = grad(block=32)
    text = str(jax.make_jaxpr(lambda q: jax.grad(lambda q: jnp.sum(flash_attention(
        q, k, v, qseg, kseg, keep, rate=0.2, block=32) * w))(q))(q))
    g_two = grad(block=16)
  assert "flash_attention_dkdv_dq" in text and "flash_attention_dq" not in text
  _close(g_fused, g_ref, 2e-6)
  _close(g_two, g_ref, 2e-6)


@pytest.mark.slow
def test_kernel_dropout_is_the_mask_it_is_given():
  """Rate 0.5: the output equals the oracle's for this mask and differs from the one without
  dropout and from the one with another mask (the mask is read, not redrawn). 64 positions: one
  block of 64 whose backward loops take two inner steps of 32."""
  q, k, v = _inputs(b=1, s=64, h=2)
  seg = jnp.ones((1, 64), jnp.int32)
  keep_a = jax.random.bernoulli(jax.random.key(1), 0.5, (1, 2, 64, 64))
  keep_b = jax.random.bernoulli(jax.random.key(2), 0.5, (1, 2, 64, 64))
  a = flash_attention(q, k, v, seg, seg, keep_a, rate=0.5)
  b = flash_attention(q, k, v, seg, seg, keep_b, rate=0.5)
  none = flash_attention(q, k, v, seg, seg)
  _close(a, reference_attention(q, k, v, seg, seg, keep_a, rate=0.5), 2e-6)
  assert float(jnp.max(jnp.abs(a - b))) > 0.1 and float(jnp.max(jnp.abs(a - none))) > 0.1
  w = jax.random.normal(jax.random.key(7), a.shape)
  _close(_grads(flash_attention, q, k, v, w, seg, seg, keep_a, rate=0.5),
         _grads(reference_attention, q, k, v, w, seg, seg, keep_a, rate=0.5), 2e-6)


def test_kernel_bfloat16_close_to_reference():
  q, k, v = (x.astype(jnp.bfloat16) for x in _inputs(b=1, s=32, h=2))
  seg = jnp.ones((1, 32), jnp.int32)
  keep = jax.random.bernoulli(jax.random.key(3), 0.9, (1, 2, 32, 32))
  out = flash_attention(q, k, v, seg, seg, keep, rate=0.1)
  ref = reference_attention(q, k, v, seg, seg, keep, rate=0.1)
  assert out.dtype == jnp.bfloat16
  # both round the (dropped) probabilities to bf16 before the product, at different points
  assert float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)))) < 0.03


@pytest.fixture(scope="module")
def batch():
  ids, mask, types = random_batch(np.random.default_rng(1), b=3, k=12, vocab=97)
  assert mask.min() == 0
  return ids, mask, types


def _split(cfg):
  model = BertModel(cfg, rngs=nnx.Rngs(0))
  return steps.split_model(model)


@pytest.mark.slow
def test_flash_path_equals_explicit_with_dropout(batch):
  """Dropout on (attention 0.3, hidden 0.1), the same step key: the flash path draws the same
  masks as the explicit one, so outputs and parameter gradients agree to float32 rounding. The
  masks take 8 bits an element (``dropout_bits=8``, pre-training's: keep 179/256, kept values
  scaled by its inverse on both paths)."""
  ids, mask, types = batch
  cfg = CFG.replace(attention_dropout=0.3, dropout_bits=8)
  parts, params = _split(cfg)
  key = jax.random.key(11)
  w = jax.random.normal(jax.random.key(3), (*ids.shape, cfg.hidden_size))
  maskf = jnp.asarray(mask, jnp.float32)[..., None]

  def loss(params, path):
    model = steps.merge_model(parts, params, key)
    out = model(ids, mask, types, deterministic=False, attention=path)
    return jnp.sum(out["last_hidden_state"] * w * maskf) + jnp.sum(out["pooled"] ** 2)

  value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  (l_ref, g_ref), (l_flash, g_flash) = (value_and_grad(params, p) for p in ("explicit", "flash"))
  np.testing.assert_allclose(l_flash, l_ref, rtol=1e-6)
  ref = dict(jax.tree_util.tree_leaves_with_path(g_ref))
  got = dict(jax.tree_util.tree_leaves_with_path(g_flash))
  assert ref.keys() == got.keys()
  for path, b in ref.items():
    name, size = jax.tree_util.keystr(path), float(jnp.max(jnp.abs(b)))
    if "['key']['bias']" in name:  # exactly 0 on both paths (softmax shift invariance)
      assert size < 1e-6 and float(jnp.max(jnp.abs(got[path]))) < 1e-6, name
      continue
    assert size > 1e-4, name
    assert float(jnp.max(jnp.abs(got[path] - b))) <= 2e-5 * size, name
  # and dropout was on: another key changes the loss
  other = steps.merge_model(parts, params, jax.random.key(12))
  out = other(ids, mask, types, deterministic=False, attention="flash")
  assert abs(float(loss(params, "flash")) - float(
      jnp.sum(out["last_hidden_state"] * w * maskf) + jnp.sum(out["pooled"] ** 2))) > 1e-3


def test_masks_are_a_function_of_the_step_key(batch):
  """What exact resume needs: a model rebuilt from the parameters and the step's key (a resumed
  run) draws the same attention masks as one that already ran other steps; the masks equal
  jax.random.bernoulli on that key's stream."""
  ids, mask, types = batch
  cfg = CFG.replace(attention_dropout=0.5, hidden_dropout=0.0)
  parts, params = _split(cfg)
  key = jax.random.fold_in(jax.random.key(0), 7)   # step 7's key, as steps.make_train_step
  fresh = steps.merge_model(parts, params, key)(ids, mask, types, deterministic=False,
                                                attention="flash")
  used = steps.merge_model(parts, params, jax.random.fold_in(jax.random.key(0), 6))
  used(ids, mask, types, deterministic=False, attention="flash")  # step 6 ran before
  again = steps.merge_model(parts, params, key)(ids, mask, types, deterministic=False,
                                                attention="flash")
  np.testing.assert_array_equal(fresh["last_hidden_state"], again["last_hidden_state"])
  model = steps.merge_model(parts, params, key)
  drop = model.layers[0].attention.attention_dropout
  keep = attention_keep(drop, (3, cfg.num_heads, 12, 12))
  twin = steps.merge_model(parts, params, key).layers[0].attention.attention_dropout
  np.testing.assert_array_equal(keep, jax.random.bernoulli(twin.rngs(), 0.5, keep.shape))
  assert 0.4 < float(jnp.mean(keep)) < 0.6


def test_flash_path_without_dropout_equals_fused(batch):
  ids, mask, types = batch
  model = BertModel(CFG, rngs=nnx.Rngs(0))
  ref = model(ids, mask, types, attention="xla")["last_hidden_state"]
  out = model(ids, mask, types, attention="flash")["last_hidden_state"]
  np.testing.assert_allclose(out, ref, atol=2e-5)


def test_path_selection_with_flash():
  kw = dict(dtype=jnp.bfloat16, head_dim=64, supports_flash=True)
  gpu = jax.default_backend() == "gpu"
  assert flash_preferred(jnp.bfloat16, 64) == gpu
  assert not flash_preferred(jnp.float32, 64)
  assert attention_path("auto", needs_probs=False, dropout_active=True, **kw) == (
      "flash" if gpu else "explicit")
  assert attention_path("flash", needs_probs=False, dropout_active=True, **kw) == "flash"
  assert attention_path("auto", needs_probs=True, dropout_active=True, **kw) == "explicit"
  with pytest.raises(ValueError, match="cannot return"):
    attention_path("flash", needs_probs=True, dropout_active=False, **kw)
  # a family without a flash branch: auto keeps the explicit path, "flash" is refused
  assert attention_path("auto", needs_probs=False, dropout_active=True, dtype=jnp.bfloat16,
                        head_dim=64) == "explicit"
  with pytest.raises(ValueError, match="not available"):
    attention_path("flash", needs_probs=False, dropout_active=True, dtype=jnp.bfloat16,
                   head_dim=64)


def test_auto_takes_flash_for_dropout_on_a_gpu(monkeypatch):
  """What a GPU run gets by default (the CPU cannot run Triton, so the backend is faked)."""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  kw = dict(needs_probs=False, head_dim=64, supports_flash=True)
  assert attention_path("auto", dropout_active=True, dtype=jnp.bfloat16, **kw) == "flash"
  assert attention_path("auto", dropout_active=False, dtype=jnp.bfloat16, **kw) == "cudnn"
  assert attention_path("auto", dropout_active=True, dtype=jnp.float32, **kw) == "explicit"


@pytest.mark.slow
def test_resumed_flash_training_equals_uninterrupted(batch):
  """Exact resume on the flash path (``BertConfig.attention="flash"``, attention dropout 0.3):
  three train steps in a row give the same parameters, bit for bit, as two steps, a round trip
  of the state through the host (what a checkpoint does) and the third step."""
  ids, mask, types = batch
  cfg = CFG.replace(attention="flash", attention_dropout=0.3)
  parts, params = _split(cfg)
  target = jax.random.normal(jax.random.key(4), (*ids.shape, cfg.hidden_size))

  def loss_fn(model, b, *, deterministic):
    out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"],
                deterministic=deterministic)
    return jnp.mean((out["last_hidden_state"] - target) ** 2), {}

  tx = optax.sgd(0.5)
  mesh = data_mesh(jax.devices()[:1])
  step = steps.make_train_step(parts, tx, loss_fn, mesh=mesh, dropout_seed=3, donate=False)
  b = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
  state = steps.place_state(steps.init_train_state(params, tx), mesh)
  history = [state]
  assert "flash_attention_forward" in str(jax.make_jaxpr(step)(state, b))  # the config's path
  for _ in range(3):
    history.append(step(history[-1], b)[0])
  resumed = step(steps.place_state(steps.to_host(history[2]), mesh), b)[0]
  for x, y in zip(jax.tree.leaves(resumed["params"]), jax.tree.leaves(history[3]["params"])):
    np.testing.assert_array_equal(x, y)
  # the steps' masks differ (else resume would hold trivially): steps 2 and 3 from one state
  again = step({**history[2], "step": history[1]["step"]}, b)[0]
  assert any(float(jnp.max(jnp.abs(x - y))) > 0 for x, y in
             zip(jax.tree.leaves(again["params"]), jax.tree.leaves(history[3]["params"])))
