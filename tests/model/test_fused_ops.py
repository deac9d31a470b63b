"""heads_jax/model/fused_ops.py: the custom gradients equal autodiff of the plain forms, with
fewer residuals."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax._src.ad_checkpoint import saved_residuals

from heads_jax.model import fused_ops


def _inputs(dtype=jnp.float32):
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.normal(scale=2.0, size=(3, 5, 48)), dtype)
  b = jnp.asarray(rng.normal(size=(48,)), jnp.float32)
  w = jnp.asarray(rng.normal(size=h.shape), jnp.float32)
  return h, b, w


@pytest.mark.slow
def test_gelu_and_bias_gelu_equal_jax_nn_gelu_forward_and_gradient():
  h, b, w = _inputs()
  ref = lambda h, b: jnp.sum(w * jax.nn.gelu(h + b, approximate=False))  # noqa: E731
  ours = lambda h, b: jnp.sum(w * fused_ops.bias_gelu(h, b))  # noqa: E731
  np.testing.assert_array_equal(fused_ops.gelu(h), jax.nn.gelu(h, approximate=False))
  np.testing.assert_array_equal(fused_ops.bias_gelu(h, b), jax.nn.gelu(h + b, approximate=False))
  for got, want in zip(jax.grad(ours, (0, 1))(h, b), jax.grad(ref, (0, 1))(h, b)):
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
  g = jax.grad(lambda h: jnp.sum(w * fused_ops.gelu(h)))(h)
  np.testing.assert_allclose(g, jax.grad(lambda h: ref(h, 0.0))(h), rtol=2e-6, atol=2e-6)
  # bfloat16: the derivative in float32, rounded once
  h16 = h.astype(jnp.bfloat16)
  g16 = jax.grad(lambda h: jnp.sum(w * fused_ops.gelu(h).astype(jnp.float32)))(h16)
  assert g16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(g16, np.float32),
                             jax.grad(lambda h: ref(h, 0.0))(h16.astype(jnp.float32)),
                             rtol=1e-2, atol=1e-2)


def test_gelu_backward_keeps_one_residual():
  h, b, w = _inputs()
  big = lambda res: [r for r, _ in res if r.shape == h.shape]  # noqa: E731
  plain = saved_residuals(lambda h: jnp.sum(w * jax.nn.gelu(h, approximate=False)), h)
  assert len(big(plain)) >= 3   # what autodiff keeps (x/2, erfc, exp; w's product aside)
  assert len(big(saved_residuals(lambda h: jnp.sum(fused_ops.gelu(h) * 2.0), h))) == 1
  assert len(big(saved_residuals(lambda h, b: jnp.sum(fused_ops.bias_gelu(h, b) * 2.0), h, b))) == 1


def test_bf16_logits_backward_in_bfloat16_within_tolerance():
  rng = np.random.default_rng(1)
  y = jnp.asarray(rng.normal(size=(2, 7, 32)), jnp.bfloat16)
  emb = jnp.asarray(rng.normal(size=(40, 32)) * 0.1, jnp.bfloat16)
  g = jnp.asarray(rng.normal(size=(2, 7, 40)), jnp.float32)
  plain = lambda y, e: jnp.einsum("bpd,vd->bpv", y, e, preferred_element_type=jnp.float32)  # noqa: E731
  np.testing.assert_array_equal(fused_ops.bf16_logits(y, emb), plain(y, emb))
  # the loss reads bfloat16 logits (the padded form): the cotangent is bfloat16-exact
  loss = lambda f: lambda y, e: jnp.sum(f(y, e).astype(jnp.bfloat16).astype(jnp.float32) * g)  # noqa: E731
  got = jax.grad(loss(fused_ops.bf16_logits), (0, 1))(y, emb)
  want = jax.grad(loss(plain), (0, 1))(y, emb)
  for a, b in zip(got, want):
    assert a.dtype == b.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=1e-2, atol=1e-2)
  # the backward's products take bfloat16 operands only
  text = jax.jit(jax.grad(loss(fused_ops.bf16_logits), (0, 1))).lower(y, emb).as_text()
  operands = [line.rsplit(": (", 1)[1].split(") ->")[0] for line in text.splitlines()
              if "dot_general" in line]
  assert len(operands) == 2 and all("f32" not in o for o in operands), operands
  plain_text = jax.jit(jax.grad(loss(plain), (0, 1))).lower(y, emb).as_text()
  assert plain_text.count("xf32>, tensor<") >= 2   # what autodiff did: float32 operands


def test_bf16_einsum_scores_gradient_within_tolerance():
  """The explicit path's scores under bfloat16 compute: gradients as autodiff's to bf16 rounding."""
  rng = np.random.default_rng(3)
  q, k = (jnp.asarray(rng.normal(size=(2, 9, 3, 8)), jnp.bfloat16) for _ in range(2))
  g = jnp.asarray(rng.normal(size=(2, 3, 9, 9)), jnp.float32)
  plain = lambda a, b: jnp.einsum("bqhe,bkhe->bhqk", a, b, preferred_element_type=jnp.float32)  # noqa: E731
  ours = lambda a, b: fused_ops.bf16_einsum("bqhe,bkhe->bhqk", a, b)  # noqa: E731
  np.testing.assert_array_equal(ours(q, k), plain(q, k))
  loss = lambda f: lambda a, b: jnp.sum(jax.nn.softmax(f(a, b)) * g)  # noqa: E731
  for a, b in zip(jax.grad(loss(ours), (0, 1))(q, k), jax.grad(loss(plain), (0, 1))(q, k)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.slow
def test_pretraining_step_has_no_float32_gemm_for_cuda():
  """configs/pretrain.py's step lowered for CUDA (flash path, as "auto" takes it on a GPU):
  every dot_general takes bfloat16 operands; the step before issue 49 (fused_ops.plain) had the
  MLM decoder's two backward products in float32 (TF32). Its dropout draws a quarter of the
  random bytes (8 bits an element, ``model.dropout_bits``) of the 32-bit masks."""
  import sys
  from pathlib import Path
  sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
  import step_gemms
  now_text = step_gemms.lowered_step_text(size="mini", layers=1, batch=2, seq=32, preds=4)
  now = step_gemms.gemms(now_text)
  before_text = step_gemms.lowered_step_text(size="mini", layers=1, batch=2, seq=32, preds=4,
                                             plain=True, dropout_bits=32)
  before = step_gemms.gemms(before_text)
  assert sum(r["count"] for r in now) == sum(r["count"] for r in before) >= 20
  assert [r for r in now if r["float32_operand"]] == []
  assert sum(r["count"] for r in before if r["float32_operand"]) == 2
  # the random bits drawn (rbg): 8 bits an element now, a 32-bit word before; one draw for the
  # embeddings, three a layer (attention [b, h, q, k], two block ends [b, q, d])
  bits_now = step_gemms.random_bits(now_text)
  bits_before = step_gemms.random_bits(before_text)
  elements = 2 * 32 * 256 * 3 + 2 * 4 * 32 * 32     # mini: d 256, 4 heads
  assert bits_before["rng_bit_generator_bytes"] == 4 * elements
  assert bits_now["rng_bit_generator_bytes"] == elements
  assert bits_now["rng_bit_generator_calls"] == bits_before["rng_bit_generator_calls"] == 4


def _norm_inputs(ln_dtype, h_dtype, d=48):
  from flax import nnx
  rng = np.random.default_rng(4)
  norm = nnx.LayerNorm(d, epsilon=1e-12, dtype=ln_dtype, param_dtype=jnp.float32,
                       rngs=nnx.Rngs(0))
  norm.scale[...] = jnp.asarray(1 + 0.1 * rng.normal(size=d), jnp.float32)
  norm.bias[...] = jnp.asarray(0.1 * rng.normal(size=d), jnp.float32)
  h = jnp.asarray(rng.normal(size=(3, 5, d)), h_dtype)
  x = jnp.asarray(rng.normal(size=(3, 5, d)) * 2 + 1, ln_dtype)
  return norm, h, x


def _compositions(norm, keep, p, ln_dtype):
  """(unfused, fused) functions of (h, x, scale, bias)."""
  from flax import nnx

  def unfused(h, x, s, b):
    n = nnx.LayerNorm(s.shape[0], epsilon=1e-12, dtype=ln_dtype, param_dtype=jnp.float32,
                      rngs=nnx.Rngs(0))
    n.scale[...], n.bias[...] = s, b
    return n(fused_ops.dropped(h, keep, p) + x)

  def fused(h, x, s, b):
    return fused_ops.residual_dropout_norm(h, x, keep, s, b, keep_prob=p, eps=1e-12,
                                           dtype=ln_dtype)
  return unfused, fused


@pytest.mark.slow
def test_residual_dropout_norm_equals_the_unfused_composition():
  """Forward bit for bit nnx.LayerNorm(nnx.Dropout(h) + x); gradients of h, x, scale and bias
  as autodiff's: to float32 rounding in float32, to bfloat16 rounding with bfloat16 activations
  (autodiff rounds the scale's and bias's gradients to bfloat16, the custom form keeps them
  float32)."""
  from flax import nnx
  cases = ((jnp.float32, jnp.float32, 32, 2e-6), (jnp.float32, jnp.bfloat16, None, 2e-2),
           (jnp.bfloat16, jnp.bfloat16, 8, 2e-2))
  for ln_dtype, h_dtype, bits, tol in cases:
    norm, h, x = _norm_inputs(ln_dtype, h_dtype)
    keep, p = (None, 1.0) if bits is None else fused_ops.dropout_keep(jax.random.key(1), 0.1,
                                                                      h.shape, bits)
    if bits == 32:   # nnx.Dropout's own mask and output
      drop = nnx.Dropout(0.1)
      np.testing.assert_array_equal(drop(h, deterministic=False, rngs=jax.random.key(1)),
                                    fused_ops.dropped(h, keep, p))
    unfused, fused = _compositions(norm, keep, p, ln_dtype)
    args = (h, x, norm.scale[...], norm.bias[...])
    # the same program either way (XLA's order of the row sums is the program's: compare jitted)
    np.testing.assert_array_equal(jax.jit(fused)(*args), jax.jit(unfused)(*args))
    w = jnp.asarray(np.random.default_rng(5).normal(size=h.shape), jnp.float32)
    loss = lambda f: lambda *a: jnp.sum(w * f(*a).astype(jnp.float32))  # noqa: E731
    got = jax.jit(jax.grad(loss(fused), (0, 1, 2, 3)))(*args)
    want = jax.jit(jax.grad(loss(unfused), (0, 1, 2, 3)))(*args)
    for a, b in zip(got, want):
      assert a.dtype == b.dtype
      a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
      np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())
    if keep is not None:   # dropped elements get no gradient
      assert np.all(np.asarray(got[0], np.float32)[~np.asarray(keep)] == 0)


def test_residual_dropout_norm_keeps_three_bytes_an_element():
  """What the backward keeps at one block end with bf16 activations (BERT-base: [t, 768]):
  autodiff of the composition keeps the mask (1 byte an element), LayerNorm's bf16 input and
  three float32 arrays of [t, d] (15 bytes); the custom form the mask and the bf16 input (3)."""
  norm, h, x = _norm_inputs(jnp.bfloat16, jnp.bfloat16)
  keep, p = fused_ops.dropout_keep(jax.random.key(1), 0.1, h.shape, 8)
  unfused, fused = _compositions(norm, keep, p, jnp.bfloat16)
  args = (h, x, norm.scale[...], norm.bias[...])

  def per_element(f):
    res = saved_residuals(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * 2.0), *args)
    return sum(r.size * r.dtype.itemsize for r, _ in res if r.shape == h.shape) / h.size
  assert per_element(unfused) == 15 and per_element(fused) == 3


@pytest.mark.slow
def test_dropout_keep_bits_and_probability():
  """8 and 16 bits: a quarter and a half of the 32-bit words, the keep probability
  round(keep * 2^bits) / 2^bits, the mask a function of the key; 32 bits is bernoulli's."""
  key = jax.random.key(7, impl="rbg")
  shape = (4, 64, 256)
  assert fused_ops.keep_probability(0.1, 8) == 230 / 256
  assert fused_ops.keep_probability(0.1, 16) == 58982 / 65536
  assert fused_ops.keep_probability(0.1, 32) == 1.0 - 0.1
  np.testing.assert_array_equal(fused_ops.dropout_keep(key, 0.1, shape, 32)[0],
                                jax.random.bernoulli(key, 0.9, shape))
  for bits in (8, 16):
    keep, p = fused_ops.dropout_keep(key, 0.1, shape, bits)
    again, _ = fused_ops.dropout_keep(key, 0.1, shape, bits)
    np.testing.assert_array_equal(keep, again)
    words = jax.random.bits(key, shape[:-1] + (shape[-1] * bits // 32,), jnp.uint32)
    small = np.asarray(words).view(np.uint8 if bits == 8 else np.uint16).reshape(shape)
    np.testing.assert_array_equal(keep, small < round(p * 2 ** bits))   # little-endian bitcast
    assert abs(float(np.mean(keep)) - p) < 4 * np.sqrt(p * (1 - p) / keep.size)
    text = jax.jit(lambda k: fused_ops.dropout_keep(k, 0.1, shape, bits)[0]).lower(key).as_text()
    assert f"tensor<4x64x{256 * bits // 32}xui32>" in text     # the words drawn
    odd, _ = fused_ops.dropout_keep(key, 0.1, (3, 5), bits)    # a last axis of no whole word
    assert odd.shape == (3, 5) and odd.dtype == bool
  assert not np.asarray(fused_ops.dropout_keep(key, 1.0, (8,), 8)[0]).any()
  assert np.asarray(fused_ops.dropout_keep(key, 0.001, (8,), 8)[0]).all()   # rounds to keep 1
