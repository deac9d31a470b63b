"""Fused attention statistics: a Pallas kernel that computes each head's softmax from q . k and
emits the sieve-bias, distance-feature, entropy and token-measure sums of a layer without writing
the probabilities to memory.

Grid ``(b, h, q / tq)``: one program takes ``tq`` queries of one head of one sequence, all keys,
and per-position integers of the sequence (token class and type, word index, dependency head and
relation, realness, n). It computes the scores ``s = q k^T / sqrt(e)`` (float32 accumulation),
the masked softmax ``p`` and, per query t:

* ``T = sum_s p`` and the entropy ``H = ln Z - sum_s p (s - max)`` (one pass, no logarithm per
  element);
* ``p @ E`` with ``E [k, 16]`` key-column indicators ([CLS] position, [SEP], ``,``, ``.``, the two
  block columns, [CLS] class, delimiter): cls/sep/delimiter/block roles, the special-token
  distance features and the [CLS]/[SEP]/punctuation token measures;
* the diagonals ``p[t, t+o]`` for ``o = -2..2`` (local, prev/next local, self, prev/next token);
* the 16 distance windows ``min(15, floor(16 |s - t| / n))`` over keys that are neither special
  nor t, each a masked row sum computed from positions (no table);
* the dependency roles: ``dep2head`` needs one masked row sum (the head word's pieces), shared
  by the four relations and ``syntactic``; ``both`` adds the exact union masks per role.

Each query's values are multiplied by its weights (``U``: the same per-query weights as
``heads_jax.stats.layerwise``) and summed over the program's queries; the output is the partial
sums ``[b, h, q / tq, C]``, added up outside. Roles are divided by ``T`` and ``block`` is
multiplied by ``H`` as the reference definitions (``heads_jax.stats.sieve_bias``).

The kernel is written for the Triton lowering (GPU) and for ``interpret=True`` (any backend;
the tests run it on the CPU). On a GPU it is lowered with Triton (``compiler_params=
pallas.triton.CompilerParams``: without them Pallas picks Mosaic GPU, which has no
``dot_general`` for this kernel). Triton needs power-of-two block sizes, so the sequence axis is
padded to a power of two (``pad_pow2``, on by default on GPUs; padding positions are never real).
On a TPU it does not lower: Mosaic TPU wants the last two block dimensions divisible by 8 and 128
(or whole), and the ``[b, k, h, e]`` queries give ``(1, e)`` blocks; the analysis step never
picks it there (``heads_jax.stats.step``, ``stats_impl``; ``tests/e2e/test_lowering.py`` lowers
it for ``cuda`` and checks the TPU refusal). ``platform`` (``"cpu"``, ``"gpu"``/``"cuda"``,
``"tpu"``; default: ``jax.default_backend()``) is the platform the caller compiles for, so the
kernel can be lowered for a GPU from a CPU host (``jax.export``).
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton
from jax.sharding import PartitionSpec as P

from heads_jax.data import vocabulary as vocab
from heads_jax.data.vocabulary import (
    TOKEN_CLS, TOKEN_COMMA, TOKEN_OTHER, TOKEN_PAD, TOKEN_PERIOD, TOKEN_SEP)
from heads_jax.parallel import DATA_AXIS
from heads_jax.sieves import (
    NUM_WINDOWS, check_direction, check_roles)
from heads_jax.stats.channels import channel_weights, num_channels, split_channels  # noqa: F401
from heads_jax.stats.layerwise import block_columns
from heads_jax.stats.tile import kernel_rows, role_values

# rows of the per-position integer table
_CLASS, _TYPE, _WORD, _HEAD, _REL, _REAL, _N = range(7)
_INFO_ROWS = 8
_PAD_INFO = (TOKEN_PAD, 0, -1, -1, 0, 0, 1, 0)
# columns of E
(_E_POS0, _E_SEP, _E_COMMA, _E_PERIOD, _E_BLOCK0, _E_BLOCK1, _E_CLS, _E_DELIM) = range(8)
_E_COLS = 16
# The role registry's key sets (SIEVE_KEYS roles) -> their column of E.
_KEY_COLUMNS = {frozenset({vocab.KEY_POSITION0}): _E_POS0, frozenset({vocab.KEY_SEP}): _E_SEP,
                frozenset({vocab.KEY_POSITION0, vocab.KEY_SEP}): _E_DELIM}


def kernel_roles(roles: Sequence[str]) -> tuple:
  """The registry rows (`heads_jax.data.vocabulary.Role`) of ``roles``; a clear ValueError for
  a role whose kernel code (or key set) this kernel does not implement (``tile.kernel_rows``)."""
  return kernel_rows(check_roles(roles), _KEY_COLUMNS, "fused Pallas kernel",
                     "heads_jax/stats/fused.py _KEY_COLUMNS")


def _next_pow2(x: int) -> int:
  return 1 << max(0, (int(x) - 1).bit_length())


def target_platform(platform: str | None = None) -> str:
  """``"gpu"``, ``"tpu"`` or ``"cpu"``: ``platform`` (``"cuda"`` and ``"rocm"`` are ``"gpu"``)
  or, by default, JAX's default backend."""
  platform = (platform or jax.default_backend()).lower()
  return "gpu" if platform in ("cuda", "rocm", "gpu") else platform


def fused_tables(batch, roles: Sequence[str], direction: str = "dep2head",
                 measures: bool = False, pad_pow2: bool | None = None,
                 platform: str | None = None) -> dict:
  """The kernel's per-batch inputs (built once per batch, on device).

  Returns ``info`` int32 ``[b, 8, kp]`` (class, type, word, head, relation, real, n per
  position), ``cols`` float32 ``[b, kp, 16]`` (``E``), ``weights`` float32 ``[b, cp, kp]``
  (``U``: per-query weight of each output channel, channels padded to a power of two) and
  ``count`` ``[b, r]``; kp is k, or the next power of two with ``pad_pow2`` (default: when
  ``platform``, see ``target_platform``, is a GPU).
  """
  roles = tuple(r.name for r in kernel_roles(roles))   # fails early on a role the kernel lacks
  direction = check_direction(direction)
  if pad_pow2 is None:
    pad_pow2 = target_platform(platform) == "gpu"
  mask = jnp.asarray(batch["attention_mask"])
  b, k = mask.shape
  real = mask > 0
  realf = real.astype(jnp.float32)
  n = jnp.sum(realf, axis=-1)                                              # [b]
  tc = jnp.asarray(batch["token_class"])
  pos = jnp.arange(k)
  info = jnp.stack([tc, batch["token_type_ids"], batch["word_ids"], batch["dep_head"],
                    batch["dep_rel"], real.astype(jnp.int32),
                    jnp.broadcast_to(jnp.maximum(n, 1).astype(jnp.int32)[:, None], (b, k)),
                    jnp.zeros((b, k), jnp.int32)], axis=1).astype(jnp.int32)
  block = block_columns(batch)                                             # [b, k, 2]
  col = lambda x: (x & real).astype(jnp.float32)                           # noqa: E731
  cols = jnp.stack([col(pos[None] == 0), col(tc == TOKEN_SEP), col(tc == TOKEN_COMMA),
                    col(tc == TOKEN_PERIOD), block[..., 0], block[..., 1], col(tc == TOKEN_CLS),
                    col((pos[None] == 0) | (tc == TOKEN_SEP))], axis=-1)
  cols = jnp.pad(cols, ((0, 0), (0, 0), (0, _E_COLS - cols.shape[-1])))

  weights, count = channel_weights(batch, roles, direction, measures)     # [b, c, q]
  c = weights.shape[1]
  cp = _next_pow2(c)
  weights = jnp.pad(weights, ((0, 0), (0, cp - c), (0, 0)))
  kp = _next_pow2(k) if pad_pow2 else k
  if kp != k:
    extra = kp - k
    pad_info = jnp.broadcast_to(jnp.asarray(_PAD_INFO, jnp.int32)[None, :, None], (b, _INFO_ROWS, extra))
    info = jnp.concatenate([info, pad_info], axis=-1)
    cols = jnp.pad(cols, ((0, 0), (0, extra), (0, 0)))
    weights = jnp.pad(weights, ((0, 0), (0, 0), (0, extra)))
  return {"info": info, "cols": cols, "weights": weights, "count": count}


def _stats_kernel(q_ref, k_ref, qi_ref, ki_ref, e_ref, u_ref, o_ref, *, roles, direction,
                  measures, block_q, scale):
  """One (sequence, head, query block): see the module docstring. Refs: q ``[tq, e]``, k
  ``[kp, e]``, query info ``[8, tq]``, key info ``[8, kp]``, E ``[kp, 16]``, U ``[cp, tq]``,
  out ``[cp]``."""
  f32 = jnp.float32
  i = pl.program_id(2)
  kp = k_ref.shape[0]
  cp = o_ref.shape[0]
  s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                          precision=jax.lax.Precision.HIGHEST, preferred_element_type=f32)
  s = s * scale                                                            # [tq, kp]
  krow = lambda j: ki_ref[j, :][None, :]                                   # noqa: E731  [1, kp]
  qvec = lambda j: qi_ref[j, :]                                            # noqa: E731  [tq]
  qcol = lambda j: qvec(j)[:, None]                                        # noqa: E731  [tq, 1]
  kreal = krow(_REAL) > 0
  s = jnp.where(kreal, s, jnp.finfo(f32).min)
  m = jnp.max(s, axis=1, keepdims=True)
  ex = jnp.where(kreal, jnp.exp(s - m), 0.0)
  z = jnp.maximum(jnp.sum(ex, axis=1, keepdims=True), jnp.finfo(f32).tiny)
  p = ex / z                                                               # [tq, kp]
  total = jnp.sum(p, axis=1)                                               # [tq]
  entropy = jnp.log(z[:, 0]) - jnp.sum(p * jnp.where(kreal, s - m, 0.0), axis=1)
  inv_total = 1.0 / jnp.where(total > 0, total, 1.0)
  cols = jax.lax.dot_general(p, e_ref[...], (((1,), (0,)), ((), ())),
                             precision=jax.lax.Precision.HIGHEST, preferred_element_type=f32)
  col = lambda j: jnp.sum(jnp.where(jax.lax.broadcasted_iota(jnp.int32, cols.shape, 1) == j,
                                    cols, 0.0), axis=1)                  # noqa: E731  [tq]
  qpos = i * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
  kpos = jax.lax.broadcasted_iota(jnp.int32, (1, kp), 1)
  off = kpos - qpos                                                        # [tq, kp]
  masked_sum = lambda where: jnp.sum(jnp.where(where, p, 0.0), axis=1)   # noqa: E731
  diag = functools.lru_cache(maxsize=None)(lambda o: masked_sum(off == o))  # p[t, t+o]  [tq]
  qcls, qtype = qvec(_CLASS), qvec(_TYPE)
  c_sep, c_comma, c_period = col(_E_SEP), col(_E_COMMA), col(_E_PERIOD)
  c_cls = col(_E_CLS)
  own_block = jnp.where(qtype == 0, col(_E_BLOCK0), col(_E_BLOCK1))

  # dependency roles (registry kind SIEVE_RELATION: the union of the role's relations)
  qword, qhead, qrel = qcol(_WORD), qcol(_HEAD), qcol(_REL)
  kword, khead, krel = krow(_WORD), krow(_HEAD), krow(_REL)
  is_rel = lambda x, rels: functools.reduce(jnp.logical_or, [x == r for r in rels])  # noqa: E731
  relation_roles = [r for r in roles if r.kernel == vocab.KERNEL_RELATION]
  rel_values = {}
  if relation_roles:
    head_piece = (kword == qhead) & (qhead >= 0)                           # s in t's head word
    if direction == "dep2head":
      m_head = masked_sum(head_piece)
      qrel1 = qvec(_REL)
      rel_values = {r.name: m_head * is_rel(qrel1, r.relations).astype(f32)
                    for r in relation_roles}
    else:
      dependent = (khead == qword) & (qword >= 0) & (khead >= 0)          # s's word depends on t's
      for r in relation_roles:
        fwd, rev = is_rel(qrel, r.relations), is_rel(krel, r.relations)
        rel_values[r.name] = masked_sum((head_piece & fwd) | (dependent & rev))

  values = role_values(roles, diag, own_block, lambda keys: col(_KEY_COLUMNS[keys]), rel_values,
                       entropy, inv_total)
  # distance features: windows 0..15 over keys that are neither special nor t, then self and
  # the special keys other than t (self wins over special)
  other = (krow(_CLASS) == TOKEN_OTHER) & kreal & (off != 0)
  dist = jnp.abs(off).astype(f32)
  n = qcol(_N).astype(f32)
  window = jnp.minimum(jnp.floor((NUM_WINDOWS * dist + 0.25) / n), NUM_WINDOWS - 1)
  values += [masked_sum(other & (window == w)) for w in range(NUM_WINDOWS)]
  d0 = diag(0)
  is_q = lambda c: (qcls == c).astype(f32)                                 # noqa: E731
  values += [d0, c_cls - d0 * is_q(TOKEN_CLS), c_sep - d0 * is_q(TOKEN_SEP),
             c_comma - d0 * is_q(TOKEN_COMMA), c_period - d0 * is_q(TOKEN_PERIOD)]
  if measures:
    values += [entropy, entropy, c_cls, c_sep, c_comma + c_period, diag(-1), diag(1)]

  lane = jax.lax.broadcasted_iota(jnp.int32, (cp,), 0)
  out = jnp.zeros((cp,), f32)
  for c, v in enumerate(values):
    out = out + jnp.sum(u_ref[c, :] * v) * (lane == c).astype(f32)
  o_ref[...] = out


def fused_layer_stats(query, key, tables: dict, roles: Sequence[str], direction: str = "dep2head",
                      measures: bool = False, block_q: int | None = None,
                      interpret: bool | None = None, platform: str | None = None) -> dict:
  """One layer's statistics from its queries and keys (the kernel; see the module docstring).

  Args:
    query, key: ``[b, k, h, e]`` (any float dtype; the scores accumulate in float32), before the
      ``1/sqrt(e)`` scaling.
    tables: ``fused_tables(batch, roles, direction, measures)`` of the batch.
    block_q: queries per program (default: min(kp, 64); all of them in interpret mode).
    interpret: run the kernel in the Pallas interpreter (default: unless ``platform`` is a GPU).
    platform: the platform compiled for (``target_platform``; default: JAX's default backend).
      On a GPU the kernel is lowered with Triton; on a TPU it does not lower (module docstring).

  Returns:
    the outputs of ``heads_jax.stats.layerwise.reduce_layer``: ``sieve_bias`` ``[b, h, r]`` (0
    where a sieve is empty), ``distance`` ``[b, h, 21]`` and with ``measures`` ``entropy``,
    ``cls_entropy`` ``[b, h]`` and ``token_attention`` ``[b, h, 5]``.
  """
  roles = check_roles(roles)
  direction = check_direction(direction)
  on_gpu = target_platform(platform) == "gpu"
  if interpret is None:
    interpret = not on_gpu
  b, k, h, e = query.shape
  info, cols, weights = tables["info"], tables["cols"], tables["weights"]
  kp, cp = info.shape[-1], weights.shape[1]
  if kp != k:
    pad = ((0, 0), (0, kp - k), (0, 0), (0, 0))
    query, key = jnp.pad(query, pad), jnp.pad(key, pad)
  if block_q is None:
    block_q = kp if interpret else min(kp, 64)
  if kp % block_q:
    raise ValueError(f"block_q {block_q} must divide the (padded) sequence length {kp}")
  nq = kp // block_q
  kernel = functools.partial(_stats_kernel, roles=kernel_roles(roles), direction=direction,
                             measures=measures, block_q=block_q,
                             scale=float(1.0 / (e ** 0.5)))
  partial_sums = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((b, h, nq, cp), jnp.float32),
      grid=(b, h, nq),
      in_specs=[
          pl.BlockSpec((None, block_q, None, e), lambda bi, hi, qi: (bi, qi, hi, 0)),
          pl.BlockSpec((None, kp, None, e), lambda bi, hi, qi: (bi, 0, hi, 0)),
          pl.BlockSpec((None, _INFO_ROWS, block_q), lambda bi, hi, qi: (bi, 0, qi)),
          pl.BlockSpec((None, _INFO_ROWS, kp), lambda bi, hi, qi: (bi, 0, 0)),
          pl.BlockSpec((None, kp, _E_COLS), lambda bi, hi, qi: (bi, 0, 0)),
          pl.BlockSpec((None, cp, block_q), lambda bi, hi, qi: (bi, 0, qi)),
      ],
      out_specs=pl.BlockSpec((None, None, None, cp), lambda bi, hi, qi: (bi, hi, qi, 0)),
      interpret=interpret,
      compiler_params=None if interpret or not on_gpu else pl_triton.CompilerParams(),
      name="heads_jax_attention_stats",
  )(query, key, info, info, cols, weights)
  return split_channels(jnp.sum(partial_sums, axis=2), roles, measures)      # [b, h, cp] summed


def fused_reducer(tables: dict, roles: Sequence[str], direction: str = "dep2head",
                  measures: bool = False, block_q: int | None = None,
                  interpret: bool | None = None, mesh=None, platform: str | None = None):
  """The model's ``attention_reduce`` hook for the fused path (needs no probabilities: the model
  keeps its fused attention and the kernel recomputes the softmax from the queries and keys).

  With a ``mesh`` of several devices the kernel runs under ``jax.shard_map`` over its ``data``
  axis (a Pallas call is not partitioned by XLA): every device reduces its own sequences.
  """
  roles = check_roles(roles)
  stats = functools.partial(fused_layer_stats, roles=roles, direction=direction,
                            measures=measures, block_q=block_q, interpret=interpret,
                            platform=platform)
  if mesh is not None and mesh.size > 1:
    spec = P(DATA_AXIS)
    stats = jax.shard_map(stats, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                          check_vma=False)

  def reduce(layer, probs, query, key, mask):
    del layer, mask
    if probs is not None:
      raise ValueError("the fused statistics take queries and keys; this layer ran the explicit "
                       "attention path (use the per-layer XLA reduction there)")
    return stats(query, key, tables)

  reduce.needs_probs = False
  return reduce
