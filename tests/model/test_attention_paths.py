"""The fused attention path (jax.nn.dot_product_attention) against the explicit one: forward,
gradient, path selection and the per-layer reduction hook (heads_jax/model/bert.py)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

from heads_jax.model.bert import BertModel, attention_path, fused_implementation
from heads_jax.model.config import config_for
from tests.helpers import random_batch

CFG = config_for("tiny", vocab_size=97, max_position_embeddings=32)


@pytest.fixture(scope="module")
def model():
  return BertModel(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def batch():
  ids, mask, types = random_batch(np.random.default_rng(1), b=6, k=14, vocab=97)
  assert mask.min() == 0 and mask.sum(-1).min() >= 3  # padding in some rows, no empty row
  return ids, mask, types


def _real(x, mask):
  return np.asarray(x)[np.asarray(mask) > 0]


@pytest.mark.slow
def test_fused_forward_equals_explicit(model, batch):
  ids, mask, types = batch
  ref = model(ids, mask, types, attention="explicit")
  for path in ("auto", "xla"):
    out = model(ids, mask, types, attention=path)
    # real positions: float32 rounding only
    np.testing.assert_allclose(_real(out["last_hidden_state"], mask),
                               _real(ref["last_hidden_state"], mask), atol=2e-5, rtol=0)
    np.testing.assert_allclose(out["pooled"], ref["pooled"], atol=2e-5, rtol=0)
  # padding query rows attend to the real keys on both paths, so they agree too
  np.testing.assert_allclose(out["last_hidden_state"], ref["last_hidden_state"], atol=2e-5)


@pytest.mark.slow
def test_fused_gradient_equals_explicit(model, batch):
  ids, mask, types = batch
  graphdef, state, rest = nnx.split(model, nnx.Param, ...)
  w = jax.random.normal(jax.random.key(3), (*ids.shape, CFG.hidden_size))
  maskf = jnp.asarray(mask, jnp.float32)[..., None]

  def loss(state, path):
    out = nnx.merge(graphdef, state, rest)(ids, mask, types, attention=path)
    return jnp.sum(out["last_hidden_state"] * w * maskf) + jnp.sum(out["pooled"] ** 2)

  g_ref = jax.grad(loss)(state, "explicit")
  g_fused = jax.grad(loss)(state, "xla")
  ref = dict(jax.tree_util.tree_leaves_with_path(g_ref))
  fused = dict(jax.tree_util.tree_leaves_with_path(g_fused))
  assert ref.keys() == fused.keys() and len(ref) > 0
  for path, b in ref.items():
    a, name = fused[path], jax.tree_util.keystr(path)
    size = float(jnp.max(jnp.abs(b)))
    if "['key']['bias']" in name:
      # softmax is invariant to adding q . b_key to a row: the exact gradient is 0 on both paths
      assert size < 1e-7 and float(jnp.max(jnp.abs(a))) < 1e-7, name
      continue
    assert size > 1e-3, name  # a real gradient (query/key ones through the softmax)
    assert float(jnp.max(jnp.abs(a - b))) <= 1e-4 * size, name


def test_fused_bfloat16_close_to_explicit(batch):
  ids, mask, types = batch
  m = BertModel(CFG.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
  ref = m(ids, mask, types, attention="explicit")["last_hidden_state"]
  out = m(ids, mask, types, attention="xla")["last_hidden_state"]
  # both round the probabilities to bfloat16 before the weighted sum; LayerNorm output ~N(0, 1)
  assert float(jnp.max(jnp.abs(_real(out, mask) - _real(ref, mask)))) < 0.05


def test_path_selection():
  kw = dict(dtype=jnp.float32, head_dim=64)
  assert attention_path("auto", needs_probs=False, dropout_active=False, **kw) == "xla"
  assert attention_path("auto", needs_probs=True, dropout_active=False, **kw) == "explicit"
  assert attention_path("auto", needs_probs=False, dropout_active=True, **kw) == "explicit"
  assert attention_path("explicit", needs_probs=False, dropout_active=False, **kw) == "explicit"
  with pytest.raises(ValueError, match="cannot return"):
    attention_path("xla", needs_probs=True, dropout_active=False, **kw)
  with pytest.raises(ValueError, match="attention must be one of"):
    attention_path("bogus", needs_probs=False, dropout_active=False, **kw)
  # cuDNN only on a GPU, and only for half-precision compute
  assert fused_implementation(jnp.float32, 64) == "xla"
  if jax.default_backend() != "gpu":
    assert fused_implementation(jnp.bfloat16, 64) == "xla"


def test_attention_dropout_keeps_the_explicit_path(batch):
  """With attention dropout active "auto" must not drop it silently: the fused path would give
  the same output for two dropout keys at hidden dropout 0."""
  ids, mask, types = batch
  m = BertModel(CFG.replace(hidden_dropout=0.0, attention_dropout=0.5), rngs=nnx.Rngs(0))
  a = m(ids, mask, types, deterministic=False)["last_hidden_state"]
  b = m(ids, mask, types, deterministic=False)["last_hidden_state"]
  assert float(jnp.max(jnp.abs(a - b))) > 1e-3
  with pytest.raises(ValueError, match="attention dropout"):
    m(ids, mask, types, deterministic=False, attention="xla")
  m0 = BertModel(CFG.replace(hidden_dropout=0.0, attention_dropout=0.0), rngs=nnx.Rngs(0))
  a = m0(ids, mask, types, deterministic=False)["last_hidden_state"]
  b = m0(ids, mask, types, deterministic=False, attention="xla")["last_hidden_state"]
  np.testing.assert_array_equal(a, b)  # rate 0: "auto" takes the fused path


def test_reduce_hook_sees_each_layers_attention(model, batch):
  ids, mask, types = batch
  ref = model(ids, mask, types, return_attentions=True)["attentions"]   # [b, l, h, q, k]
  calls = []

  def reduce(layer, probs, query, key, m):
    calls.append(layer)
    assert query.shape == key.shape == (*ids.shape, CFG.num_heads, CFG.head_dim)
    return {"rows": jnp.sum(probs, axis=-1), "map": probs}

  out = model(ids, mask, types, attention_reduce=reduce)
  assert calls == list(range(CFG.num_layers))
  assert "attentions" not in out
  red = out["attention_reduced"]
  assert red["map"].shape == ref.shape
  np.testing.assert_array_equal(red["map"], ref)        # same probabilities, padding queries 0
  np.testing.assert_allclose(red["rows"], np.asarray(mask, np.float32)[:, None, None, :]
                             * np.ones(red["rows"].shape), atol=1e-6)


def test_reduce_hook_without_probs_runs_fused(model, batch):
  ids, mask, types = batch
  ref = model(ids, mask, types, return_attentions=True)["attentions"]

  def reduce(layer, probs, query, key, m):
    assert probs is None  # fused path: the hook recomputes what it needs from query and key
    scores = jnp.einsum("bqhe,bkhe->bhqk", query, key) / np.sqrt(CFG.head_dim)
    scores = jnp.where(m[:, None, None, :] > 0, scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1) * m[:, None, :, None]

  reduce.needs_probs = False
  out = model(ids, mask, types, attention_reduce=reduce)
  np.testing.assert_allclose(out["attention_reduced"], ref, atol=1e-6)
  plain = model(ids, mask, types, attention="explicit")["last_hidden_state"]
  np.testing.assert_allclose(_real(out["last_hidden_state"], mask), _real(plain, mask), atol=2e-5)
