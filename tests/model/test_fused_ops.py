"""heads_jax/model/fused_ops.py: the custom gradients equal autodiff of the plain forms, with
fewer residuals."""

import numpy as np

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


def test_pretraining_step_has_no_float32_gemm_for_cuda():
  """configs/pretrain.py's step lowered for CUDA (flash path, as "auto" takes it on a GPU):
  every dot_general takes bfloat16 operands; the step before issue 49 (fused_ops.plain) had the
  MLM decoder's two backward products in float32 (TF32)."""
  import sys
  from pathlib import Path
  sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
  import step_gemms
  now = step_gemms.gemms(step_gemms.lowered_step_text(size="mini", layers=1, batch=2, seq=32,
                                                      preds=4))
  before = step_gemms.gemms(step_gemms.lowered_step_text(size="mini", layers=1, batch=2, seq=32,
                                                         preds=4, plain=True))
  assert sum(r["count"] for r in now) == sum(r["count"] for r in before) >= 20
  assert [r for r in now if r["float32_operand"]] == []
  assert sum(r["count"] for r in before if r["float32_operand"]) == 2
