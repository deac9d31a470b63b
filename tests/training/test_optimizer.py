"""LAMB with BERT conventions against a hand-written numpy LAMB; masks; schedule; accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from heads_jax.training.optimizer import (decay_mask, is_bias_or_norm, lamb, lr_schedule,
                                          make_optimizer)


def _params(rng):
  return {
      "embeddings": {"word": {"embedding": rng.normal(size=(5, 3))},
                     "norm": {"scale": 1 + 0.1 * rng.normal(size=3), "bias": 0.1 * rng.normal(size=3)}},
      "layers": {0: {"query": {"kernel": rng.normal(size=(3, 4)), "bias": 0.1 * rng.normal(size=4)}}},
      "mlm": {"bias": np.zeros(5)},
  }


EXCLUDED = {"embeddings/norm/scale", "embeddings/norm/bias", "layers/0/query/bias", "mlm/bias"}


def _flat(tree):
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v, np.float64)
          for path, v in jax.tree_util.tree_leaves_with_path(tree)}


def test_masks():
  mask = _flat(decay_mask(_params(np.random.default_rng(0))))
  assert {k for k, v in mask.items() if not v} == EXCLUDED
  assert is_bias_or_norm((jax.tree_util.DictKey("encoder"), jax.tree_util.DictKey("LayerNorm"),
                          jax.tree_util.DictKey("gamma")))
  assert not is_bias_or_norm((jax.tree_util.DictKey("dense"), jax.tree_util.DictKey("kernel")))


def numpy_lamb(params, grads_seq, *, lr_fn, wd=0.01, b1=0.9, b2=0.999, eps=1e-6, clip=1.0,
               trust=True):
  """Reference LAMB (You et al. 2019, BERT conventions), one dict of float64 arrays per step;
  ``trust=False`` is AdamW (Loshchilov & Hutter: decoupled decay, no trust ratio)."""
  w = {k: v.copy() for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in w.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  for t, g in enumerate(grads_seq):
    norm = np.sqrt(sum(np.sum(x ** 2) for x in g.values()))
    scale = min(1.0, clip / norm) if clip else 1.0
    lr = lr_fn(t)
    for k in w:
      gk = g[k] * scale
      m[k] = b1 * m[k] + (1 - b1) * gk
      v[k] = b2 * v[k] + (1 - b2) * gk ** 2
      mhat = m[k] / (1 - b1 ** (t + 1))
      vhat = v[k] / (1 - b2 ** (t + 1))
      u = mhat / (np.sqrt(vhat) + eps)
      if k not in EXCLUDED:
        u = u + wd * w[k]
        if trust:
          wn, un = np.linalg.norm(w[k]), np.linalg.norm(u)
          u = u * (wn / un if wn > 0 and un > 0 else 1.0)
      w[k] = w[k] - lr * u
  return w


@pytest.mark.parametrize("clip", [1.0, None])
def test_lamb_matches_numpy(clip):
  rng = np.random.default_rng(1)
  p0 = _params(rng)
  grads = [jax.tree.map(lambda x: 3.0 * rng.normal(size=np.shape(x)), p0) for _ in range(4)]
  sched = lr_schedule(0.1, warmup_steps=2, total_steps=6)
  tx = lamb(sched, clip_norm=clip)
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), p0)
  state = tx.init(params)

  @jax.jit
  def step(g, state, params):
    up, state = tx.update(g, state, params)
    return optax.apply_updates(params, up), state

  for g in grads:
    params, state = step(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g), state, params)
  ref = numpy_lamb(_flat(p0), [_flat(g) for g in grads], lr_fn=lambda t: float(sched(t)), clip=clip)
  got = _flat(params)
  for k in ref:
    np.testing.assert_allclose(got[k], ref[k], rtol=2e-5, atol=2e-6, err_msg=k)
  # and the parameters did move (lr(0) is 0, the later steps are not)
  assert max(np.abs(got[k] - _flat(p0)[k]).max() for k in ref) > 1e-3


@pytest.mark.slow
def test_optax_lamb_differs_on_excluded_leaves():
  """optax.lamb adapts every leaf; the BERT chain must not adapt biases / LayerNorm."""
  rng = np.random.default_rng(2)
  p = jax.tree.map(jnp.asarray, _params(rng))
  g = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape)), p)
  ours, _ = lamb(1.0, clip_norm=None, weight_decay=0.0).update(g, lamb(1.0, clip_norm=None, weight_decay=0.0).init(p), p)
  theirs, _ = optax.lamb(1.0, eps=1e-6, weight_decay=0.0).update(g, optax.lamb(1.0, eps=1e-6, weight_decay=0.0).init(p), p)
  o, t = _flat(ours), _flat(theirs)
  np.testing.assert_allclose(o["layers/0/query/kernel"], t["layers/0/query/kernel"], rtol=1e-5)
  # first Adam step: update = -g/(|g|+eps) elementwise, with no trust ratio on the bias
  gb = _flat(g)["layers/0/query/bias"]
  np.testing.assert_allclose(o["layers/0/query/bias"], -gb / (np.abs(gb) + 1e-6), rtol=1e-5)
  assert not np.allclose(o["layers/0/query/bias"], t["layers/0/query/bias"])


def test_schedule():
  s = lr_schedule(1e-3, warmup_steps=10, total_steps=30)
  vals = np.array([float(s(i)) for i in range(35)])
  np.testing.assert_allclose(vals[:11], np.linspace(0, 1e-3, 11), rtol=1e-6, atol=1e-12)
  np.testing.assert_allclose(vals[10:31], np.linspace(1e-3, 0, 21), rtol=1e-5, atol=1e-10)
  assert (vals[30:] == 0).all()
  no_warm = lr_schedule(2.0, warmup_steps=0, total_steps=4)
  assert [float(no_warm(i)) for i in range(5)] == [2.0, 1.5, 1.0, 0.5, 0.0]
  with pytest.raises(ValueError):
    lr_schedule(1.0, 1, 0)


@pytest.mark.slow
def test_accumulation_equals_mean_gradient():
  rng = np.random.default_rng(3)
  p = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), _params(rng))
  g1 = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), p)
  g2 = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), p)
  kw = dict(learning_rate=0.05, warmup_steps=0, total_steps=10)
  acc, _ = make_optimizer(accumulate_steps=2, **kw)
  one, _ = make_optimizer(**kw)
  s = acc.init(p)
  acc_update = jax.jit(acc.update)
  u1, s = acc_update(g1, s, p)
  assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(u1))  # no update yet
  u2, s = acc_update(g2, s, p)
  mean = jax.tree.map(lambda a, b: (a + b) / 2, g1, g2)
  ref, _ = jax.jit(one.update)(mean, one.init(p), p)
  for a, b in zip(jax.tree.leaves(u2), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("clip", [1.0, None])
def test_adamw_matches_numpy_and_optax(clip):
  """``name="adamw"``: clipping, Adam moments, decoupled decay off biases / LayerNorm, the same
  schedule, no trust ratio; against a numpy AdamW and against optax.adamw itself."""
  rng = np.random.default_rng(4)
  p0 = _params(rng)
  grads = [jax.tree.map(lambda x: 3.0 * rng.normal(size=np.shape(x)), p0) for _ in range(4)]
  kw = dict(learning_rate=0.1, warmup_steps=2, total_steps=6, clip_norm=clip)
  tx, sched = make_optimizer(name="adamw", **kw)
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), p0)
  state = tx.init(params)
  for g in grads:
    up, state = tx.update(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g), state, params)
    params = optax.apply_updates(params, up)
  got = _flat(params)
  ref = numpy_lamb(_flat(p0), [_flat(g) for g in grads], lr_fn=lambda t: float(sched(t)),
                   clip=clip, trust=False)
  for k in ref:
    np.testing.assert_allclose(got[k], ref[k], rtol=2e-5, atol=2e-6, err_msg=k)
  lamb_ref = numpy_lamb(_flat(p0), [_flat(g) for g in grads], lr_fn=lambda t: float(sched(t)),
                        clip=clip)
  assert not np.allclose(got["layers/0/query/kernel"], lamb_ref["layers/0/query/kernel"], atol=1e-4)
  # optax's own AdamW with the same mask (and clipping) takes the same steps
  theirs = optax.adamw(sched, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=decay_mask)
  if clip:
    theirs = optax.chain(optax.clip_by_global_norm(clip), theirs)
  q = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), p0)
  s = theirs.init(q)
  for g in grads:
    up, s = theirs.update(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g), s, q)
    q = optax.apply_updates(q, up)
  for k, v in _flat(q).items():
    np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-7, err_msg=k)


def test_unknown_optimizer_is_refused():
  with pytest.raises(ValueError, match="lamb"):
    make_optimizer(learning_rate=1e-3, warmup_steps=1, total_steps=3, name="sgd")
