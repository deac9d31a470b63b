"""The flat LAMB (``optimizer.flat_lamb``) against the optax chain (``optimizer.lamb``): the same
updates to float32 rounding, with and without clipping, biases/LayerNorm excluded, under
``optax.MultiSteps``; the layout round-trips."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from heads_jax.training import optimizer as opt


def _params(rng):
  """Leaves of several sizes (one spanning rows, one empty-ish bias), norm and bias leaves."""
  return {
      "embeddings": {"word": {"embedding": rng.normal(size=(70, 40))},
                     "norm": {"scale": 1 + 0.1 * rng.normal(size=40), "bias": 0.1 * rng.normal(size=40)}},
      "layers": {0: {"query": {"kernel": 0.1 * rng.normal(size=(40, 40)),
                               "bias": 0.1 * rng.normal(size=40)}}},
      "mlm": {"bias": np.zeros(70)},
  }


def _f32(tree):
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


def test_layout_round_trip():
  p = _f32(_params(np.random.default_rng(0)))
  lay = opt.flat_layout(p)
  leaves = jax.tree.leaves(p)
  flat = opt.to_flat(leaves, lay)
  assert flat.shape == (lay.rows, opt.FLAT_ROW)
  assert lay.rows == sum(-(-x.size // opt.FLAT_ROW) for x in leaves)
  for a, b in zip(opt.from_flat(flat, lay), leaves):
    np.testing.assert_array_equal(a, b)
  # the excluded leaves (biases, LayerNorm) are the chain's
  assert [bool(x) for x in lay.leaf_adapted] == [bool(x) for x in jax.tree.leaves(opt.decay_mask(p))]
  assert int(np.sum(~lay.leaf_adapted)) == 4


@pytest.mark.slow
@pytest.mark.parametrize("clip", [1.0, None])
def test_flat_lamb_equals_the_chain(clip):
  rng = np.random.default_rng(1)
  p0 = _f32(_params(rng))
  grads = [_f32(jax.tree.map(lambda x: 3.0 * rng.normal(size=np.shape(x)), p0)) for _ in range(5)]
  grads[2]["mlm"]["bias"] = jnp.zeros(70)   # a zero update: its trust ratio falls back to 1
  sched = opt.lr_schedule(0.1, warmup_steps=2, total_steps=8)
  runs = {}
  for name, tx in (("chain", opt.lamb(sched, clip_norm=clip)),
                   ("flat", opt.flat_lamb(sched, clip_norm=clip))):
    @jax.jit
    def step(g, state, params):
      up, state = tx.update(g, state, params)
      return optax.apply_updates(params, up), state, up

    params, state, ups = p0, tx.init(p0), []
    for g in grads:
      params, state, up = step(g, state, params)
      ups.append(up)
    runs[name] = (params, ups)
  np.testing.assert_allclose(state.grad_norm, optax.global_norm(grads[-1]), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(runs["flat"][0]), jax.tree.leaves(runs["chain"][0])):
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
  for ua, ub in zip(runs["flat"][1], runs["chain"][1]):
    for a, b in zip(jax.tree.leaves(ua), jax.tree.leaves(ub)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)   # updates ~0.1
  moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(runs["flat"][0]),
                                                          jax.tree.leaves(p0)))
  assert moved > 1e-3


@pytest.mark.slow
def test_flat_lamb_under_multisteps_and_make_optimizer():
  rng = np.random.default_rng(3)
  p0 = _f32(_params(rng))
  grads = [_f32(jax.tree.map(lambda x: rng.normal(size=np.shape(x)), p0)) for _ in range(4)]
  out = {}
  for flat in (False, True):
    tx, _ = opt.make_optimizer(learning_rate=0.05, warmup_steps=0, total_steps=10,
                               accumulate_steps=2, flat=flat)
    params, state = p0, tx.init(p0)
    for g in grads:
      up, state = tx.update(g, state, params)
      params = optax.apply_updates(params, up)
    out[flat] = params
  for a, b in zip(jax.tree.leaves(out[True]), jax.tree.leaves(out[False])):
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
  with pytest.raises(ValueError, match="lamb"):
    opt.make_optimizer(learning_rate=0.1, warmup_steps=0, total_steps=2, name="adamw", flat=True)


def test_leaf_sums_are_each_leafs_rows_summed():
  """``leaf_sums`` (static slices, no scatter) against numpy, leaf by leaf, on a layout with a
  leaf of one row, one of several and padding."""
  params = {"a": jnp.zeros((3,)), "b": jnp.zeros((5, opt.FLAT_ROW // 2)), "c": jnp.zeros((2,))}
  lay = opt.flat_layout(params, lambda p: jax.tree.map(lambda _: True, p))
  rows = np.random.default_rng(0).normal(size=lay.rows).astype(np.float32)
  got = np.asarray(opt.leaf_sums(jnp.asarray(rows), lay))
  want = [rows[lay.row_leaf == i].sum() for i in range(len(lay.shapes))]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert lay.rows == 1 + 3 + 1 and got.shape == (3,)
