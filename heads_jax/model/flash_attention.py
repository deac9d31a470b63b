"""Flash attention with exact attention dropout: a Pallas kernel, forward and backward.

Shape legend: b batch, q query positions, k key positions, h head, e query/key feature,
c value feature (c may differ from e: ``P @ [V | E]`` carries extra columns through the same
probabilities).

``flash_attention(q, k, v, q_segments, kv_segments, keep, rate=...)`` computes, per batch row
and head, ``(dropout(softmax(scale * q k^T + mask))) v`` without ever writing the ``[q, k]``
probabilities to memory (FlashAttention-2's online softmax, Dao 2023), where

* query ``i`` may attend key ``j`` iff ``q_segments[b, i] == kv_segments[b, j]``. An
  unpacked right-padded batch passes ``q_segments = 1`` and ``kv_segments = attention_mask``
  (padding keys 0), a packed batch its sequence ids (block-diagonal attention). A query with no
  key it may attend gets context 0 and zero gradients, as the explicit path's masked softmax
  (its probabilities are all 0 there).
* attention dropout is the boolean ``keep`` ``[b, h, q, k]`` drawn **outside** the kernel
  (with ``jax.random`` from the step's key, ``heads_jax.model.bert.attention_keep``), so the masks
  are a function of (seed, step) and bit-identical to the explicit path's: kept probabilities
  are scaled by ``1 / (1 - rate)``, dropped ones are 0, after the softmax (the normaliser sums
  the undropped probabilities, exactly as ``dropout(softmax(s))``). The kernels read 1 byte per
  element, forward and backward. axlearn's Pallas GPU flash attention does the same (a mask from
  ``jax.random`` outside the kernel; their note: in-kernel RNG once Pallas GPU has it).

Backward: ``delta_i = sum_c dO[i, c] O[i, c]`` (= ``sum_j P~_ij dP~_ij`` with ``P~`` the dropped
probabilities), one kernel for ``dK, dV`` (a grid over key blocks, looping over query blocks)
and one for ``dQ`` (over query blocks, looping over key blocks); each recomputes the
probabilities from the saved log-sum-exp ``[b, h, q]``, so nothing of size ``[q, k]`` is kept
but the 1-byte dropout mask.

Runs as Triton where the program is lowered for CUDA and in Pallas's interpret mode on any
other platform (CPU tests; slow, for checking only). Sequence lengths are padded to the block size and feature sizes to a power of 2
(at least 16, what Triton's ``dot`` takes) inside the wrapper; the padding is masked and sliced
off. The kernels follow the structure of jax's ``jax.experimental.pallas.ops.gpu.attention``
(Apache-2.0), with the key mask, dropout, empty rows and separate value width added.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

LOG2E = math.log2(math.e)
MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: exp2(MASKED - m) is exactly 0
BLOCK = 128  # query and key block of every kernel (BERT's 128 and 512 need no padding)
# The backward kernels' inner loops step through 32 rows (queries for dK/dV, keys for dQ) against
# an outer block of 128, as Triton's fused-attention tutorial (BLOCK_M1, BLOCK_N1, BLOCK_M2,
# BLOCK_N2 = 32, 128, 128, 32); at 8 warps (Tuning) no kernel spills on sm_90.
INNER = 32
PAD_QUERY, PAD_KEY = -2, -1  # segment ids of padded positions: they attend nothing


@dataclasses.dataclass(frozen=True)
class Tuning:
  """Triton launch settings of the kernels (none changes the arithmetic but ``inner``, which
  changes only the order of the backward's sums): ``fwd_warps`` (None: 4 for feature widths up
  to 64, else 8), ``bwd_warps``, ``stages`` (software-pipelining depth of every kernel's loops)
  and ``inner`` (rows a backward inner-loop step takes: queries for dK/dV, keys for dQ).

  The defaults come from the kernels compiled offline for sm_90 (``heads_jax.stats.sm90``; the
  pip ``triton`` wheel and its ``ptxas -v``; ``tests/model/test_flash_sm90.py`` holds them):
  at BERT's head width 64 and sequence 128 the forward takes 255 registers a thread and spills
  24 bytes at 4 warps, 124 and none at 8; dK/dV 255 and 988 bytes of spills at 4 warps, 201 and
  none at 8; dQ 187 at 4, 109 at 8 (no spill either way). At sequence 512: 183, 201 and 109
  registers at 8 warps, no spill. ``inner=64`` spills again in dK/dV at 8 warps (892 bytes),
  ``inner=16`` still spills at 4 (128 bytes), ``stages=3`` changes nothing, and ``fuse_dq``
  spills 1,220 bytes at 4 warps (none at 8, 238 registers). So 8 warps for all three, 32-row
  inner steps, 2 stages.
  ``fuse_dq``: where the keys are one block (BERT's 128), the dK/dV kernel also writes dQ (its
  program holds every key of the row: ``dQ = dS K`` per query step), and the dQ kernel, which
  recomputes the probabilities, is not launched."""
  fwd_warps: int | None = 8
  bwd_warps: int = 8
  stages: int = 2
  inner: int = INNER
  fuse_dq: bool = False


_TUNING = [Tuning()]


@contextlib.contextmanager
def tuned(**changes):
  """Kernels traced inside use ``Tuning(**changes)`` (e.g. ``bench/pretrain_ab.py``'s A/B of
  launch settings); the settings are read when the program is traced, not when it runs, and
  ``jax.jit``'s trace cache does not know them: trace a new function under each setting."""
  _TUNING.append(dataclasses.replace(_TUNING[-1], **changes))
  try:
    yield _TUNING[-1]
  finally:
    _TUNING.pop()


def _block(n: int, block: int) -> int:
  return min(block, max(16, pl.next_power_of_2(n)))


def _width(n: int) -> int:
  return max(16, pl.next_power_of_2(n))


def _pad(x, axis: int, n: int, value=0):
  if x.shape[axis] == n:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, n - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def _params(num_warps: int, num_stages: int = 2):
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _call(kernel, *args, interpret: bool | None, **kw):
  """``pl.pallas_call(kernel, **kw)(*args)``: Triton when lowered for CUDA, interpret mode on
  any other platform (``interpret=None``, chosen per lowering platform by
  ``lax.platform_dependent``, so that one jitted program runs on the CPU and exports for a GPU),
  or as forced."""
  if interpret is not None:
    return pl.pallas_call(kernel, interpret=interpret, **kw)(*args)
  return lax.platform_dependent(
      *args, cuda=pl.pallas_call(kernel, interpret=False, **kw),
      default=pl.pallas_call(kernel, interpret=True, **kw))


def _scores(q, k, qseg, kseg, scale):
  """log2-domain scores [bq, bk] float32 and the allowed mask."""
  s = plgpu.dot(q, k, trans_b=True) * (scale * LOG2E)
  allowed = qseg[:, None] == kseg[None, :]
  return jnp.where(allowed, s, MASKED), allowed


# ------------------------------------------------------------------------------------------------
# Forward

def _forward_kernel(q_ref, k_ref, v_ref, qseg_ref, kseg_ref, *refs, scale, inv_keep, block_k,
                    dropout: bool):
  """One query block of one (batch row, head): q [bq, e], k [k, e], v [k, c], keep [bq, k]."""
  if dropout:
    keep_ref, o_ref, lse_ref = refs
  else:
    keep_ref, (o_ref, lse_ref) = None, refs
  q = q_ref[...]
  qseg = qseg_ref[...]
  bq, c = q.shape[0], v_ref.shape[-1]

  def body(j, carry):
    acc, m, l = carry
    ks = pl.ds(j * block_k, block_k)
    s, allowed = _scores(q, k_ref[ks, :], qseg, kseg_ref[ks], scale)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.where(allowed, jnp.exp2(s - m_new[:, None]), 0.0)
    alpha = jnp.exp2(m - m_new)
    l = alpha * l + jnp.sum(p, axis=-1)
    if dropout:
      p = jnp.where(keep_ref[:, ks] != 0, p, 0.0)
    v = v_ref[ks, :]
    acc = acc * alpha[:, None] + plgpu.dot(p.astype(v.dtype), v)
    return acc, m_new, l

  init = (jnp.zeros((bq, c), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
          jnp.zeros((bq,), jnp.float32))
  acc, m, l = lax.fori_loop(0, k_ref.shape[0] // block_k, body, init)
  live = l > 0
  o_ref[...] = (acc * (inv_keep / jnp.where(live, l, 1.0))[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(live, m + jnp.log2(jnp.where(live, l, 1.0)), 0.0)


def _forward(q, k, v, qseg, kseg, keep, rate, scale, block_q, block_k, interpret):
  """Padded inputs -> (out [b, q, h, c], lse [b, h, q] float32, log2 domain)."""
  b, sq, h, e = q.shape
  sk, c = k.shape[1], v.shape[-1]
  dropout = keep is not None
  kernel = functools.partial(_forward_kernel, scale=scale, inv_keep=_inv_keep(rate),
                             block_k=block_k, dropout=dropout)
  in_specs = [
      pl.BlockSpec((None, block_q, None, e), lambda i, j, n: (j, i, n, 0)),
      pl.BlockSpec((None, sk, None, e), lambda i, j, n: (j, 0, n, 0)),
      pl.BlockSpec((None, sk, None, c), lambda i, j, n: (j, 0, n, 0)),
      pl.BlockSpec((None, block_q), lambda i, j, n: (j, i)),
      pl.BlockSpec((None, sk), lambda i, j, n: (j, 0)),
  ]
  args = [q, k, v, qseg, kseg]
  if dropout:
    in_specs.append(pl.BlockSpec((None, None, block_q, sk), lambda i, j, n: (j, n, i, 0)))
    args.append(keep)
  return _call(
      kernel, *args,
      grid=(sq // block_q, b, h),
      in_specs=in_specs,
      out_specs=[pl.BlockSpec((None, block_q, None, c), lambda i, j, n: (j, i, n, 0)),
                 pl.BlockSpec((None, None, block_q), lambda i, j, n: (j, n, i))],
      out_shape=[jax.ShapeDtypeStruct((b, sq, h, c), v.dtype),
                 jax.ShapeDtypeStruct((b, h, sq), jnp.float32)],
      compiler_params=_params(_TUNING[-1].fwd_warps or (4 if max(e, c) <= 64 else 8),
                              _TUNING[-1].stages),
      interpret=interpret,
      name="flash_attention_forward",
  )


# ------------------------------------------------------------------------------------------------
# Backward

def _probs(q, k, qseg, kseg, lse, scale):
  s, allowed = _scores(q, k, qseg, kseg, scale)
  return jnp.where(allowed, jnp.exp2(s - lse[:, None]), 0.0)


def _dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kseg_ref, *refs,
                 scale, inv_keep, block_q, dropout: bool, with_dq: bool = False):
  """One key block: loops over the query blocks; dk [bk, e], dv [bk, c]; with ``with_dq`` (the
  block is every key) also dq [q, e], one query step at a time."""
  refs = list(refs)
  keep_ref = refs.pop(0) if dropout else None
  dk_ref, dv_ref = refs[0], refs[1]
  dq_ref = refs[2] if with_dq else None
  k, v, kseg = k_ref[...], v_ref[...], kseg_ref[...]

  def body(i, carry):
    dk, dv = carry
    qs = pl.ds(i * block_q, block_q)
    q, do = q_ref[qs, :], do_ref[qs, :]
    p = _probs(q, k, qseg_ref[qs], kseg, lse_ref[qs], scale)         # [bq, bk]
    dp = plgpu.dot(do, v, trans_b=True)                                # dP~ [bq, bk]
    if dropout:
      kept = keep_ref[qs, :] != 0
      pd = jnp.where(kept, p * inv_keep, 0.0)
      dp = jnp.where(kept, dp * inv_keep, 0.0)
    else:
      pd = p
    dv = dv + plgpu.dot(pd.astype(do.dtype), do, trans_a=True)
    ds = p * (dp - delta_ref[qs][:, None])
    dk = dk + plgpu.dot(ds.astype(q.dtype), q, trans_a=True)
    if with_dq:
      dq_ref[qs, :] = (plgpu.dot(ds.astype(k.dtype), k) * scale).astype(dq_ref.dtype)
    return dk, dv

  init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
  dk, dv = lax.fori_loop(0, q_ref.shape[0] // block_q, body, init)
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kseg_ref, *refs,
               scale, inv_keep, block_k, dropout: bool):
  """One query block: loops over the key blocks; dq [bq, e]."""
  if dropout:
    keep_ref, dq_ref = refs
  else:
    keep_ref, (dq_ref,) = None, refs
  q, do, qseg, lse, delta = q_ref[...], do_ref[...], qseg_ref[...], lse_ref[...], delta_ref[...]

  def body(j, dq):
    ks = pl.ds(j * block_k, block_k)
    k = k_ref[ks, :]
    p = _probs(q, k, qseg, kseg_ref[ks], lse, scale)
    dp = plgpu.dot(do, v_ref[ks, :], trans_b=True)
    if dropout:
      dp = jnp.where(keep_ref[:, ks] != 0, dp * inv_keep, 0.0)
    ds = p * (dp - delta[:, None])
    return dq + plgpu.dot(ds.astype(k.dtype), k)

  dq = lax.fori_loop(0, k_ref.shape[0] // block_k, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _backward(q, k, v, qseg, kseg, keep, out, lse, do, rate, scale, block_q, block_k, interpret):
  b, sq, h, e = q.shape
  sk, c = k.shape[1], v.shape[-1]
  dropout = keep is not None
  inv_keep = _inv_keep(rate)
  # [b, h, q] float32: sum_c dO O (one elementwise-and-reduce fusion, not a dot)
  delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1).transpose(0, 2, 1)
  tune = _TUNING[-1]
  warps, inner = tune.bwd_warps, tune.inner
  args = [q, k, v, do, lse, delta, qseg, kseg] + ([keep] if dropout else [])

  # dK, dV: grid over key blocks; full query rows
  specs = [
      pl.BlockSpec((None, sq, None, e), lambda i, j, n: (j, 0, n, 0)),
      pl.BlockSpec((None, block_k, None, e), lambda i, j, n: (j, i, n, 0)),
      pl.BlockSpec((None, block_k, None, c), lambda i, j, n: (j, i, n, 0)),
      pl.BlockSpec((None, sq, None, c), lambda i, j, n: (j, 0, n, 0)),
      pl.BlockSpec((None, None, sq), lambda i, j, n: (j, n, 0)),
      pl.BlockSpec((None, None, sq), lambda i, j, n: (j, n, 0)),
      pl.BlockSpec((None, sq), lambda i, j, n: (j, 0)),
      pl.BlockSpec((None, block_k), lambda i, j, n: (j, i)),
  ] + ([pl.BlockSpec((None, None, sq, block_k), lambda i, j, n: (j, n, 0, i))] if dropout else [])
  fuse = tune.fuse_dq and sk == block_k
  out_specs = [pl.BlockSpec((None, block_k, None, e), lambda i, j, n: (j, i, n, 0)),
               pl.BlockSpec((None, block_k, None, c), lambda i, j, n: (j, i, n, 0))]
  out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
  if fuse:  # one key block: its program writes every query row's dq
    out_specs.append(pl.BlockSpec((None, sq, None, e), lambda i, j, n: (j, 0, n, 0)))
    out_shape.append(jax.ShapeDtypeStruct(q.shape, q.dtype))
  outs = _call(
      functools.partial(_dkdv_kernel, scale=scale, inv_keep=inv_keep,
                        block_q=min(inner, block_q),
                        dropout=dropout, with_dq=fuse), *args,
      grid=(sk // block_k, b, h),
      in_specs=specs,
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=_params(warps, tune.stages),
      interpret=interpret,
      name="flash_attention_dkdv" + ("_dq" if fuse else ""),
  )
  if fuse:
    dk, dv, dq = outs
    return dq, dk, dv
  dk, dv = outs

  # dQ: grid over query blocks; full key rows
  specs = [
      pl.BlockSpec((None, block_q, None, e), lambda i, j, n: (j, i, n, 0)),
      pl.BlockSpec((None, sk, None, e), lambda i, j, n: (j, 0, n, 0)),
      pl.BlockSpec((None, sk, None, c), lambda i, j, n: (j, 0, n, 0)),
      pl.BlockSpec((None, block_q, None, c), lambda i, j, n: (j, i, n, 0)),
      pl.BlockSpec((None, None, block_q), lambda i, j, n: (j, n, i)),
      pl.BlockSpec((None, None, block_q), lambda i, j, n: (j, n, i)),
      pl.BlockSpec((None, block_q), lambda i, j, n: (j, i)),
      pl.BlockSpec((None, sk), lambda i, j, n: (j, 0)),
  ] + ([pl.BlockSpec((None, None, block_q, sk), lambda i, j, n: (j, n, i, 0))] if dropout else [])
  dq = _call(
      functools.partial(_dq_kernel, scale=scale, inv_keep=inv_keep, block_k=min(inner, block_k),
                        dropout=dropout), *args,
      grid=(sq // block_q, b, h),
      in_specs=specs,
      out_specs=pl.BlockSpec((None, block_q, None, e), lambda i, j, n: (j, i, n, 0)),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=_params(warps, tune.stages),
      interpret=interpret,
      name="flash_attention_dq",
  )
  return dq, dk, dv


def _inv_keep(rate: float) -> float:
  return 0.0 if rate >= 1.0 else 1.0 / (1.0 - rate)


# ------------------------------------------------------------------------------------------------
# custom_vjp over padded inputs

@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _flash(q, k, v, qseg, kseg, keep, rate, scale, block_q, block_k, interpret):
  return _forward(q, k, v, qseg, kseg, keep, rate, scale, block_q, block_k, interpret)[0]


def _flash_fwd(q, k, v, qseg, kseg, keep, rate, scale, block_q, block_k, interpret):
  out, lse = _forward(q, k, v, qseg, kseg, keep, rate, scale, block_q, block_k, interpret)
  return out, (q, k, v, qseg, kseg, keep, out, lse)


def _flash_bwd(rate, scale, block_q, block_k, interpret, res, do):
  q, k, v, qseg, kseg, keep, out, lse = res
  dq, dk, dv = _backward(q, k, v, qseg, kseg, keep, out, lse, do, rate, scale, block_q, block_k,
                         interpret)
  return dq, dk, dv, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q, k, v, q_segments, kv_segments, keep=None, *, rate: float = 0.0,
                    scale: float | None = None, block: int = BLOCK,
                    interpret: bool | None = None):
  """Attention context ``[b, q, h, c]`` in ``v``'s dtype (module docstring).

  Args:
    q: ``[b, q, h, e]``; k: ``[b, k, h, e]``; v: ``[b, k, h, c]`` (same dtype).
    q_segments: int ``[b, q]``; kv_segments: int ``[b, k]``: query ``i`` attends key ``j`` iff
      their ids are equal (use non-negative ids).
    keep: optional bool ``[b, h, q, k]``: the dropout mask (True keeps); None: no dropout.
    rate: the dropout rate ``keep`` was drawn with (kept values are scaled by ``1/(1-rate)``).
    scale: the score scale (default ``1/sqrt(e)``).
    block: query and key block size (a power of 2, at least 16).
    interpret: Pallas interpret mode; None (default): Triton where the program is lowered for
      CUDA, interpret mode on any other platform.
  """
  b, sq, h, e = q.shape
  sk, c = k.shape[1], v.shape[-1]
  if k.shape != (b, sk, h, e) or v.shape[:3] != (b, sk, h):
    raise ValueError(f"flash_attention: q {q.shape}, k {k.shape} and v {v.shape} must be "
                     f"[b, q, h, e], [b, k, h, e] and [b, k, h, c]")
  if keep is not None and keep.shape != (b, h, sq, sk):
    raise ValueError(f"flash_attention: keep must be [b, h, q, k] = {(b, h, sq, sk)}, "
                     f"got {keep.shape}")
  scale = float(1.0 / math.sqrt(e) if scale is None else scale)
  block_q, block_k = _block(sq, block), _block(sk, block)
  pq, pk = pl.cdiv(sq, block_q) * block_q, pl.cdiv(sk, block_k) * block_k
  ew, cw = _width(e), _width(c)
  q = _pad(_pad(q, 1, pq), 3, ew)
  k = _pad(_pad(k, 1, pk), 3, ew)
  v = _pad(_pad(v, 1, pk), 3, cw)
  qseg = _pad(jnp.asarray(q_segments, jnp.int32), 1, pq, PAD_QUERY)
  kseg = _pad(jnp.asarray(kv_segments, jnp.int32), 1, pk, PAD_KEY)
  if keep is not None:
    keep = _pad(_pad(keep.astype(jnp.int8), 2, pq), 3, pk)
  else:
    rate = 0.0
  out = _flash(q, k, v, qseg, kseg, keep, float(rate), scale, block_q, block_k, interpret)
  return out[:, :sq, :, :c]


def reference_attention(q, k, v, q_segments, kv_segments, keep=None, *, rate: float = 0.0,
                        scale: float | None = None):
  """The same function in plain JAX (materialises ``[b, h, q, k]``): a test oracle."""
  e = q.shape[-1]
  scale = 1.0 / math.sqrt(e) if scale is None else scale
  s = jnp.einsum("bqhe,bkhe->bhqk", q, k, preferred_element_type=jnp.float32) * scale
  allowed = (q_segments[:, None, :, None] == kv_segments[:, None, None, :])
  s = jnp.where(allowed, s, jnp.finfo(jnp.float32).min)
  p = jnp.where(allowed, jax.nn.softmax(s, axis=-1), 0.0)
  if keep is not None:
    p = jnp.where(keep, p * _inv_keep(rate), 0.0)
  return jnp.einsum("bhqk,bkhc->bqhc", p.astype(v.dtype), v,
                    preferred_element_type=jnp.float32).astype(v.dtype)
