"""Custom-gradient forms of the pre-training step's memory-bound operations (issue 49): the same
numbers as the plain ``jax.numpy`` forms, fewer bytes between kernels in the backward pass.

Shape legend: t tokens (any leading axes), f feature width, d hidden, v vocabulary.

* `gelu` / `bias_gelu`: the exact (erf) GELU, ``x Phi(x)``, whose backward keeps only its input.
  ``jax.nn.gelu(approximate=False)``'s autodiff keeps three ``[t, f]`` residuals (``x / 2``,
  ``erfc``'s output and ``exp``'s: ``jax._src.ad_checkpoint.saved_residuals``); here the
  derivative ``Phi(x) + x phi(x)`` is recomputed from ``x`` in float32, and `bias_gelu` returns
  the bias gradient (the sum of ``dx`` over the tokens) from the same expression, which XLA
  fuses into the one reduction pass that produces ``dx``. The tanh form (which cuBLASLt's GELU
  epilogue computes) differs from the erf form by up to 4.7e-4 absolute (at x = +-2.68; 2e-4
  relative there): BERT, and transformers' ``"gelu"``, are the erf form, and the parity
  tests hold the model to float32 rounding, so the erf form stays.
* `bf16_einsum` (`bf16_logits`): a product with bfloat16 operands and float32 accumulation
  whose backward runs in bfloat16 too: the MLM decoder, and the explicit attention path's
  scores ``q k^T`` under bfloat16 compute. Autodiff of a bfloat16 ``dot_general`` with
  ``preferred_element_type=float32`` makes the cotangent float32, so both backward products
  mix a float32 operand with a bfloat16 one: a float32 (TF32 on NVIDIA) GEMM. Here the cotangent
  is rounded to bfloat16 first (exact for the padded logits, which the loss already reads in
  bfloat16) and the two products are bfloat16 x bfloat16 with float32 accumulation. For the
  scores the cotangent is the softmax gradient ``dS``, which the flash kernels also round to
  bfloat16 before their ``dS K`` and ``dS^T Q`` products (``flash_attention.py``).
* `residual_dropout_norm`: post-LN BERT's ``LayerNorm(dropout(h) + x)`` (the attention block's
  and the feed-forward block's ends) as one ``custom_vjp``, forward bit for bit flax's
  ``nnx.LayerNorm`` of ``nnx.Dropout``'s output plus the residual. Autodiff of the composition
  keeps, per site, the keep mask and LayerNorm's float32 centred input ``z - mean`` and its
  bfloat16 input (flax promotes it twice); this form keeps the keep mask, the LayerNorm input
  ``z`` in its own dtype and two float32 numbers a token (mean, ``1/sigma``), and recomputes the
  normalised ``z`` in the backward, which gives ``dz``, ``dh`` (the dropout's select) and
  ``dx`` (the residual) from one expression and the scale's and bias's gradients as its column
  sums. A Pallas kernel was not written: the forward is XLA's one row-reduction fusion either
  way, and what a kernel would add over XLA's fusion of this backward (one pass for the two row
  sums) needs a device's profile to be judged; the bytes kept between forward and backward are
  countable here (``tests/model/test_fused_ops.py``; BENCHMARKS.md issue 49).
* `dropout_keep`: the keep mask of a dropout layer from ``bits`` random bits an element:
  ``jax.random.bernoulli`` (a 32-bit word an element, ``nnx.Dropout``'s own draw) for 32, or 8 or
  16 bits cut from 32-bit words (``jax.random.bits`` of a quarter or half as many words,
  bitcast), kept where the bits are below ``round(keep * 2^bits)``: the keep probability is that
  count over ``2^bits`` (within ``2^-(bits+1)`` of the configured one; 0.8984375 for 0.9 at 8
  bits, 0.89999390 at 16) and kept values are scaled by its exact inverse, so the expectation is
  the input's. Drawing ``uint8`` directly would not help: XLA's ``RngBitGenerator`` and JAX's
  threefry both make a 32-bit word per output element whatever its width.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np

PLAIN_PARTS = ("gelu", "norm")   # gelu: gelu, bias_gelu, bf16_einsum; norm: residual_dropout_norm
_PLAIN = [frozenset()]


@contextlib.contextmanager
def plain(*parts: str):
  """Within this context (at trace time) the named parts (`PLAIN_PARTS`; all when none is
  named) take the plain ``jax.numpy`` forms with autodiff's gradients: ``"gelu"`` the GELU, its
  bias and the bf16 products (`gelu`, `bias_gelu`, `bf16_logits`), ``"norm"`` the block ends
  (`residual_dropout_norm`): the step as it was before, for an A/B in one process
  (``bench/pretrain_ab.py``)."""
  unknown = set(parts) - set(PLAIN_PARTS)
  if unknown:
    raise ValueError(f"fused_ops.plain: no part {sorted(unknown)}; choose from {PLAIN_PARTS}")
  _PLAIN.append(_PLAIN[-1] | frozenset(parts or PLAIN_PARTS))
  try:
    yield
  finally:
    _PLAIN.pop()


def is_plain(part: str = "gelu") -> bool:
  """Whether ``part`` (`PLAIN_PARTS`) takes its plain form here (`plain`)."""
  return part in _PLAIN[-1]


_SQRT_HALF = np.float32(np.sqrt(0.5))
_INV_SQRT_2PI = np.float32(1.0 / np.sqrt(2.0 * np.pi))


def _gelu_grad(z):
  """float32 ``d gelu / dz`` = ``Phi(z) + z phi(z)`` of float32 ``z``."""
  return 0.5 * (1.0 + jax.lax.erf(z * _SQRT_HALF)) + z * (_INV_SQRT_2PI * jnp.exp(-0.5 * z * z))


@jax.custom_vjp
def gelu(x):
  """The exact GELU, ``x Phi(x)``, forward bit for bit ``jax.nn.gelu(x, approximate=False)``;
  the backward keeps only ``x`` (module docstring)."""
  return jax.nn.gelu(x, approximate=False)


def _gelu_fwd(x):
  return gelu(x), x


def _gelu_bwd(x, g):
  return ((g.astype(jnp.float32) * _gelu_grad(x.astype(jnp.float32))).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


@jax.custom_vjp
def bias_gelu(h, bias):
  """``gelu(h + bias)`` for ``h`` ``[..., f]`` and a float32 (parameter) ``bias`` ``[f]``, added
  in ``h``'s dtype as ``nnx.Linear`` adds it; the backward keeps only ``h + bias`` and returns
  the bias gradient in float32 from the same pass (module docstring)."""
  return jax.nn.gelu(h + bias.astype(h.dtype), approximate=False)


def _bias_gelu_fwd(h, bias):
  z = h + bias.astype(h.dtype)
  return jax.nn.gelu(z, approximate=False), (z, bias)


def _bias_gelu_bwd(res, g):
  z, bias = res
  dz = g.astype(jnp.float32) * _gelu_grad(z.astype(jnp.float32))
  dbias = jnp.sum(dz.reshape(-1, dz.shape[-1]), axis=0).astype(bias.dtype)
  return dz.astype(z.dtype), dbias


bias_gelu.defvjp(_bias_gelu_fwd, _bias_gelu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def bf16_einsum(spec: str, a, b):
  """``jnp.einsum(spec, a, b, preferred_element_type=float32)`` for bfloat16 ``a``, ``b`` (a
  two-operand product whose every operand index is in the output or the other operand), whose
  backward rounds the cotangent to bfloat16 and computes both operand gradients as bfloat16
  products with float32 accumulation, returned in the operands' dtype (module docstring)."""
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _bf16_einsum_fwd(spec, a, b):
  return bf16_einsum(spec, a, b), (a, b)


def _bf16_einsum_bwd(spec, res, g):
  a, b = res
  ins, out = spec.replace(" ", "").split("->")
  sa, sb = ins.split(",")
  g = g.astype(jnp.bfloat16)
  da = jnp.einsum(f"{out},{sb}->{sa}", g, b, preferred_element_type=jnp.float32)
  db = jnp.einsum(f"{out},{sa}->{sb}", g, a, preferred_element_type=jnp.float32)
  return da.astype(a.dtype), db.astype(b.dtype)


bf16_einsum.defvjp(_bf16_einsum_fwd, _bf16_einsum_bwd)


def bf16_logits(y, w):
  """float32 ``[..., v]`` = ``y @ w^T`` for ``y`` ``[..., d]`` and ``w`` ``[v, d]`` in bfloat16
  (`bf16_einsum`: the MLM decoder)."""
  return bf16_einsum("...d,vd->...v", y, w)


# ------------------------------------------------------------------------------------------------
# Dropout masks from fewer random bits

DROPOUT_BITS = (8, 16, 32)


def keep_probability(rate: float, bits: int = 32) -> float:
  """The probability that `dropout_keep` keeps an element: ``1 - rate`` for 32 bits, else
  ``round((1 - rate) * 2^bits) / 2^bits`` (module docstring)."""
  if bits not in DROPOUT_BITS:
    raise ValueError(f"dropout bits must be one of {DROPOUT_BITS}, got {bits!r}")
  if bits == 32:
    return 1.0 - rate
  return round((1.0 - rate) * 2 ** bits) / 2 ** bits


def dropout_keep(key, rate: float, shape, bits: int = 32):
  """``(keep, keep_probability)``: bool ``shape`` (True keeps) drawn from ``key`` with ``bits``
  random bits an element, and the probability each element is kept (`keep_probability`;
  module docstring). 32 bits is ``nnx.Dropout``'s own mask, bit for bit."""
  p = keep_probability(rate, bits)
  if bits == 32:
    return jax.random.bernoulli(key, p, shape), p
  shape, per = tuple(shape), 32 // bits
  small_dtype = jnp.uint8 if bits == 8 else jnp.uint16
  if shape and shape[-1] % per == 0:
    # words [..., last / per]: the leading axes (the batch's) stay those of the mask, so the
    # draw is partitioned as the mask is
    words = jax.random.bits(key, shape[:-1] + (shape[-1] // per,), jnp.uint32)
    small = jax.lax.bitcast_convert_type(words, small_dtype).reshape(shape)
  else:
    n = int(np.prod(shape, dtype=np.int64))
    words = jax.random.bits(key, (-(-n // per),), jnp.uint32)
    small = jax.lax.bitcast_convert_type(words, small_dtype).reshape(-1)[:n].reshape(shape)
  threshold = int(round(p * 2 ** bits))          # 0 .. 2^bits: compared in int32, no overflow
  return small.astype(jnp.int32) < threshold, p


# ------------------------------------------------------------------------------------------------
# Residual + dropout + LayerNorm


def _norm_stats(z, dtype):
  """flax ``nnx.LayerNorm``'s statistics of ``z`` (``dtype``: its dtype): ``(z in dtype, mean,
  var)``, mean and var float32 ``[..., 1]`` (``E[z^2] - E[z]^2``, clipped at 0)."""
  z = jnp.asarray(z, dtype)
  zf = jnp.asarray(z, jnp.promote_types(dtype, jnp.float32))
  mean, mean2 = zf.mean(-1), jax.lax.square(zf).mean(-1)
  var = jnp.maximum(0.0, mean2 - jax.lax.square(mean))
  return z, mean[..., None], var[..., None]


def dropped(h, keep, keep_prob):
  """``nnx.Dropout``'s output for the mask ``keep`` (None: no dropout)."""
  if keep is None:
    return h
  if keep_prob == 0.0:
    return jnp.zeros_like(h)
  return jax.lax.select(keep, h / keep_prob, jnp.zeros_like(h))


def residual_dropout_norm(h, x, keep, scale, bias, *, keep_prob: float, eps: float, dtype):
  """``LayerNorm(dropout(h) + x)`` for ``h``, ``x`` ``[..., d]`` (the sublayer's output and the
  residual), the bool ``keep`` mask of ``h``'s shape (or None: no dropout) drawn with
  probability ``keep_prob`` (kept values scaled by its inverse, `dropout_keep`), the float32
  LayerNorm parameters ``scale``, ``bias`` ``[d]``, its ``eps`` and output ``dtype``. The
  forward is ``nnx.LayerNorm(dtype=dtype)(nnx.Dropout's output + x)`` bit for bit; the backward
  keeps the LayerNorm input, its mean and ``1/sigma`` and the mask (module docstring)."""
  return _rdn(h, x, keep, scale, bias, float(keep_prob), float(eps), jnp.dtype(dtype),
              jnp.dtype(h.dtype), jnp.dtype(x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _rdn(h, x, keep, scale, bias, keep_prob, eps, dtype, h_dtype, x_dtype):
  return _rdn_fwd(h, x, keep, scale, bias, keep_prob, eps, dtype, h_dtype, x_dtype)[0]


def _rdn_fwd(h, x, keep, scale, bias, keep_prob, eps, dtype, h_dtype, x_dtype):
  z, mean, var = _norm_stats(dropped(h, keep, keep_prob) + x, dtype)
  rstd = jax.lax.rsqrt(var + eps)
  # flax's _normalize: (z - mean) * (rsqrt(var + eps) * scale) + bias, parameters in dtype
  y = (z - mean) * (rstd * jnp.asarray(scale, dtype)) + jnp.asarray(bias, dtype)
  return jnp.asarray(y, dtype), (z, mean, rstd, keep, scale)


def _rdn_bwd(keep_prob, eps, dtype, h_dtype, x_dtype, res, dy):
  z, mean, rstd, keep, scale = res
  d = z.shape[-1]
  xhat = (z.astype(jnp.float32) - mean) * rstd
  dyf = dy.astype(jnp.float32)
  g = dyf * jnp.asarray(scale, dtype).astype(jnp.float32)
  # d/dz of (z - mean) / sigma with the row's mean and sigma: both row sums in one expression
  dz = rstd * (g - (jnp.sum(g, -1, keepdims=True)
                    + xhat * jnp.sum(g * xhat, -1, keepdims=True)) / d)
  rows = dyf.reshape(-1, d)
  dscale = jnp.sum(rows * xhat.reshape(-1, d), axis=0).astype(scale.dtype)
  dbias = jnp.sum(rows, axis=0).astype(scale.dtype)
  if keep is None:
    dh = dz
  elif keep_prob == 0.0:
    dh = jnp.zeros_like(dz)
  else:
    dh = jnp.where(keep, dz / keep_prob, 0.0)
  return dh.astype(h_dtype), dz.astype(x_dtype), None, dscale, dbias


_rdn.defvjp(_rdn_fwd, _rdn_bwd)
