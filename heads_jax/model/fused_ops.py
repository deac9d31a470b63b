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
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np

_PLAIN = [False]


@contextlib.contextmanager
def plain():
  """Within this context (at trace time) `gelu`, `bias_gelu` and `bf16_logits` are the plain
  ``jax.numpy`` forms with autodiff's gradients: the step as it was before, for an A/B in one
  process (``bench/pretrain_ab.py``)."""
  _PLAIN.append(True)
  try:
    yield
  finally:
    _PLAIN.pop()


def is_plain() -> bool:
  return _PLAIN[-1]


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
