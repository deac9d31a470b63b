"""Statistics kernel v2 (``stats_impl="kernel"``): the tile of ``heads_jax.stats.tile`` run over
every query block of every head of a layer, from the layer's queries and keys; the model keeps
its fast attention (cuDNN on GPUs, XLA on TPUs and CPUs) and no attention map is ever written.

Three thin wrappers around the same tile function (``tile.head_rows``: each head's per-row
results of a query block, ``[T, 64]``):

* ``"triton"`` (GPU): a Pallas call with grid ``(b, q / T, h / g)``, g heads a program; Triton
  compiler parameters (without them Pallas picks Mosaic GPU). Triton wants power-of-two loads:
  the key axis is padded to one. By default (``TRITON_DEFAULTS``, the tile that passes the
  offline sm_90 gate of ``heads_jax.stats.sm90``) one head a program, 16 warps, and the key loop
  over tiles of 32 keys in two passes (``tile.head_rows_blocked``: the row maximum and Z, then
  every sum tile by tile; the key-tile loads are what Triton's pipeliner prefetches). With more
  heads a program, what they share (``tile.block_setup``: the contraction's right-hand side, the
  distances, the window corrections) is built once; with ``block_k`` of at least the length a
  program holds all keys at once (``TRITON_MEASURED``, the tile last timed on a device).
* ``"mosaic"`` (TPU): a Pallas call with grid ``(b,)`` (a TPU grid step costs about 0.35 us, too
  much for one small tile), each program looping over its sequence's query blocks and heads; the
  queries and keys are laid out ``[b, h, k, e]`` so that every block's last two dimensions are
  whole or (8, 128)-aligned (Mosaic's rule), ``n`` comes through SMEM.
* ``"xla"`` (CPU, TPU sequences longer than a Mosaic program holds, and the reference of the
  other two): ``lax.scan`` over groups of query blocks of the tile vectorised over sequences and
  heads: the largest temporary is ``[b, h, G T, k]``, so memory is linear in the sequence length
  (``tests/stats/test_kernel.py`` checks the compiled program's buffers at 8,192 positions).

Every wrapper ends each head's query block in the same epilogue (``tile.head_partials``, issue
50 item 1): the block's per-row results become the weighted sums of the epilogue's parts
(``tile.epilogue_layout``: which lanes each part adds, with one product ``X @ sel``; each part's
per-query weight from ``kernel_tables``, shared by all heads of the block; one sum over the
rows), so a program writes ``[S, C]`` partial sums (C = 64 parts, S = 1 or the slots of a packed
row), not ``[T, 64]`` rows, and XLA only adds the partials over the query blocks and merges the
parts into the channels (``tile.merge_parts``). How a wrapper runs is one ``KernelSettings``.

On a Pallas wrapper the analysis step reduces every layer in one call after the forward
(``stash_reducer``, ``kernel_stacked_stats``: the layers folded into the grid) where the layers'
queries and keys fit ``STASH_BYTES`` a device; else one call a layer (``kernel_reducer``).

Packed rows (several sequences a row, ``segment_ids``; ``slots`` in ``kernel_tables``): every
table is each sequence's own, a query attends only its own sequence's keys (``tile.key_mask``),
each key's windows use its own sequence's length, and the weighted sums come per slot.

``interpret=True`` runs a Pallas wrapper in the Pallas interpreter (on the CPU: the tests); for
``"mosaic"`` ``interpret`` may also be a ``pltpu.InterpretParams()``, which simulates the TPU's
block and memory semantics. ``kernel_layer_stats`` returns what
``heads_jax.stats.layerwise.reduce_layer`` returns, so ``layerwise.finish`` completes the step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from heads_jax.data import vocabulary as vocab
from heads_jax.data.vocabulary import (TOKEN_CLS, TOKEN_COMMA, TOKEN_OTHER, TOKEN_PAD, TOKEN_PERIOD,
                                       TOKEN_SEP)
from heads_jax.parallel import DATA_AXIS
from heads_jax.sieves import check_direction, check_roles, segment_positions, segments_of
from heads_jax.stats import tile
from heads_jax.stats.channels import channel_weights, split_channels
from heads_jax.stats.fused import target_platform
from heads_jax.stats.layerwise import block_columns, slot_onehot

WRAPPERS = ("triton", "mosaic", "xla")
# Query rows per tile (at most tile.MAX_ROWS): 16 is the smallest Triton MMA and keeps J(n) = 2
# window corrections for n > 120 (plan section 2.1).
BLOCK_Q = {"triton": 16, "mosaic": 16, "xla": 16}


def default_wrapper(platform: str | None = None) -> str:
  """The wrapper of a platform: ``"triton"`` on GPUs, ``"mosaic"`` on TPUs, ``"xla"`` else."""
  return {"gpu": "triton", "tpu": "mosaic"}.get(target_platform(platform), "xla")


# The longest key axis a Pallas wrapper takes: a Mosaic program holds its sequence's queries and
# keys in VMEM; longer sequences take the "xla" wrapper (query blocks under lax.scan; memory
# linear in k). A Triton program takes any length: up to ONE_PASS_KEYS keys it holds a [T, k]
# tile and all k keys at once, past that it loops over blocks of KEY_BLOCK keys, two passes
# (tile.head_rows_blocked).
MAX_KEYS = {"mosaic": 2048}
ONE_PASS_KEYS = 1024
KEY_BLOCK = 128
# Measured on an H200 (BENCHMARKS.md, issue 38's fourth run): the key loop's second pass with key
# blocks outside the heads (``keys_outer``) takes one 8,192-position sequence in 100.1 ms against
# 124.1 with the heads outside; 2 window corrections shared by a block's heads (``static``)
# against 4 take the 128 x 128 step from 13.66 to 13.38 ms (the Pallas call alone 4.51 -> 4.25).
TRITON_STATIC = 2
# The Triton program's defaults (issue 50 item 2): the tile that passes the chip gate of the
# offline sm_90 compile (``heads_jax.stats.sm90``, ``tests/stats/test_sm90.py``: at most 128
# registers, no spills, an asynchronous load): one head a program (heads on the grid), the key
# loop over blocks of 32 keys (an explicit key-tile load inside a loop, which Triton's pipeliner
# prefetches with cp.async), 16 warps: 113 registers, 0 spills, cp.async (BERT-base, 128
# positions, bf16, the epilogue in the kernel; at 8 warps its [16, 64] x [64, 64] product, whose
# left operand every warp holds whole, takes the program to 152 registers). The last device-measured setting, ``TRITON_MEASURED`` (all keys at once, the
# 12 heads of a block in one program, 4 warps: 255 registers, 256-454 B spilled, no asynchronous
# copy; 13.38 ms a step on the H200), stays beside it in ``bench/analysis_ab.py`` until a device
# has timed the two.
TRITON_DEFAULTS = {"block_k": 32, "heads_per_program": 1, "num_warps": 16}
TRITON_MEASURED = {"block_k": ONE_PASS_KEYS, "heads_per_program": "all", "num_warps": 4}


@dataclasses.dataclass(frozen=True)
class KernelSettings:
  """How kernel v2 runs (issue 50 item 8: one typed object, one definition of its options; the
  what, roles, direction and measures, are the statistics'). Every field None takes the
  default.

  Fields:
    wrapper: ``"triton"``, ``"mosaic"`` or ``"xla"`` (default ``default_wrapper(platform)``).
    platform: the platform compiled for (``"cpu"``, ``"gpu"``/``"cuda"``, ``"tpu"``; default
      JAX's default backend).
    block_q: query rows per tile (default ``BLOCK_Q[wrapper]``, at most the padded length).
    interpret: run a Pallas wrapper in the interpreter (``True``, or for ``"mosaic"`` a
      ``pltpu.InterpretParams()``); default: when ``platform`` is not the wrapper's.
    contraction: ``"hilo"`` (bf16 halves, the default) or ``"float32"``.
    num_warps, num_stages: the Triton program's warps (default ``TRITON_DEFAULTS``) and pipeline
      stages (default Triton's).
    block_k: the Triton program's keys per step (default ``TRITON_DEFAULTS``: the key loop over
      blocks of 32; ``ONE_PASS_KEYS`` holds all keys at once up to that length, ``key_block``).
    static: the Triton one-pass program's window corrections built once per block for all heads
      (``tile.block_setup``; further ones are built per head where a sequence needs them).
    heads_per_program: heads per Triton program (default ``TRITON_DEFAULTS``: one, heads on the
      grid; ``"all"``: one program a query block, building its setup once for all heads).
    blocks_per_step: query blocks per ``lax.scan`` step of the ``"xla"`` wrapper (default 1 on
      CPUs, 32 elsewhere: fewer, larger steps; memory ``[b, h, 16 G, k]``).
  """
  wrapper: str | None = None
  platform: str | None = None
  block_q: int | None = None
  interpret: Any = None
  contraction: str = "hilo"
  num_warps: int | None = None
  num_stages: int | None = None
  block_k: int | None = None
  static: int = TRITON_STATIC
  heads_per_program: int | str | None = None
  blocks_per_step: int | None = None

  @classmethod
  def of(cls, settings: "KernelSettings | None" = None, **options) -> "KernelSettings":
    """``settings`` (default: the defaults) with ``options`` (its field names) replaced; a clear
    TypeError for a name that is no field."""
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise TypeError(f"unknown kernel setting(s) {unknown}; KernelSettings has "
                      f"{[f.name for f in dataclasses.fields(cls)]}")
    return dataclasses.replace(settings or cls(), **options)


# Short rows (issue 50 item 2): a 32-key row held in one key step has no load for Triton's
# pipeliner to prefetch (no cp.async in the offline sm_90 compile); its key loop takes two blocks
# of 16 instead (108 registers, cp.async). A 16-key row is one block of the smallest product.
SHORT_KEYS = 32


def key_block(kp: int, block_k: int | None = None) -> int:
  """The Triton wrapper's keys per step on a padded key axis ``kp`` (a power of two): all of
  them up to ``ONE_PASS_KEYS``, else ``block_k`` (default ``KEY_BLOCK``; a power of two); a
  ``SHORT_KEYS`` row whose ``block_k`` would hold it whole takes two blocks."""
  if block_k is None:
    return kp if kp <= ONE_PASS_KEYS else KEY_BLOCK
  block_k = int(block_k)
  if block_k < 16 or block_k & (block_k - 1):
    raise ValueError(f"block_k must be a power of two of at least 16, got {block_k}")
  if kp == SHORT_KEYS and block_k >= kp:
    return kp // 2
  return min(block_k, kp)


def wrapper_for(platform: str | None, length: int) -> str:
  """The wrapper of ``platform`` (``default_wrapper``), or ``"xla"`` past its ``MAX_KEYS``."""
  wrapper = default_wrapper(platform)
  return wrapper if length <= MAX_KEYS.get(wrapper, length) else "xla"


def _next_pow2(x: int) -> int:
  return 1 << max(0, (int(x) - 1).bit_length())


def padded_length(k: int, wrapper: str, block_q: int) -> int:
  """The key axis the wrapper runs on: a power of two (Triton), else a multiple of the block."""
  if wrapper == "triton":
    return max(_next_pow2(k), block_q, 16)
  return -(-k // block_q) * block_q


def _count_equal(keys, valid, queries):
  """``#{s : valid[s], keys[s] == queries[t]}`` per row t, int32 ``[b, q]`` from ``[b, k]`` keys
  (sorted and searched: O(k log k), no ``[q, k]`` comparison)."""
  sentinel = jnp.iinfo(jnp.int32).max
  ordered = jnp.sort(jnp.where(valid, keys, sentinel), axis=-1)
  search = jax.vmap(lambda a, v, side: jnp.searchsorted(a, v, side=side), in_axes=(0, 0, None))
  return (search(ordered, queries, "right") - search(ordered, queries, "left")).astype(jnp.int32)


def _fields(batch):
  """The batch's real positions (bool) and its token class, token type, word id, dependency head
  and relation (int32), each ``[b, k]``."""
  i32 = lambda name: jnp.asarray(batch[name]).astype(jnp.int32)             # noqa: E731
  return (jnp.asarray(batch["attention_mask"]) > 0, i32("token_class"), i32("token_type_ids"),
          i32("word_ids"), i32("dep_head"), i32("dep_rel"))


def _slots(batch, slots: int):
  """The sequences of a (packed) batch, linear in the length: ``seg`` int32 ``[b, k]`` (1, 2,
  ... per sequence, 0 on padding; an unpacked batch is one sequence a row), the slot one-hot
  float32 ``[b, k, S]`` (S = max(slots, 1)), each position's index in its sequence ``local``,
  and its sequence's length ``n`` int32 ``[b, k]`` (0 on padding)."""
  if batch.get("segment_ids") is not None and not slots:
    raise ValueError("a packed batch (segment_ids) needs its slots (sequences per row)")
  seg = segments_of(batch)
  onehot = slot_onehot(seg, max(int(slots), 1))
  n = jnp.einsum("bks,bs->bk", onehot, jnp.sum(onehot, axis=1)).astype(jnp.int32)
  return seg, onehot, segment_positions(seg), n


def sieve_sizes(batch, roles: Sequence[str], direction: str = "dep2head", slots: int = 0):
  """``|S(t)|`` of every role's sieve, int32 ``[b, r, q]``, equal to
  ``heads_jax.sieves.build_sieves(batch, roles, direction).sum(-1)`` but in memory linear in the
  length (counts, cumulative sums and sorted searches; no ``[q, k]`` mask), so that the per-query
  weights of a long sequence need no map-sized buffer. With ``slots`` (a packed batch,
  ``segment_ids``) each query's sieve is within its own sequence (its range, its [CLS] position,
  its pair-ness; words and heads told apart by sequence)."""
  real, tc, tt, word, head, rel = _fields(batch)
  b, k = real.shape
  seg, onehot, local, n_q = _slots(batch, slots)
  per_slot = lambda x: jnp.einsum("bks,bk->bs", onehot, x.astype(jnp.float32))  # noqa: E731
  per_query = lambda x: jnp.einsum("bks,bs->bk", onehot, x)                      # noqa: E731
  pos = jnp.arange(k)
  start = pos[None] - local                                   # each position's sequence start
  end = start + n_q                                           # ... and its end (exclusive)
  cum = jnp.concatenate([jnp.zeros((b, 1), jnp.int32),
                         jnp.cumsum(real.astype(jnp.int32), axis=-1)], axis=-1)  # [b, k + 1]
  at = lambda i: jnp.take_along_axis(cum, jnp.clip(i, 0, k), axis=-1)  # noqa: E731
  block = block_columns(batch)                                              # [b, k, 2]
  per_type = jnp.einsum("bks,bkc->bsc", onehot, block)                      # [b, S, 2]
  per_type_q = jnp.einsum("bks,bsc->bkc", onehot, per_type)                 # [b, k, 2]
  is_pair = per_query((per_slot(real & (tt == 1)) > 0).astype(jnp.float32))  # [b, k]
  key_sets = {vocab.KEY_POSITION0: real & (local == 0), vocab.KEY_SEP: real & (tc == TOKEN_SEP)}
  word_real = real & (word >= 0)
  # words and heads of different sequences must never meet: numbered per sequence (seg * (k+1))
  tag = lambda x: seg * (k + 1) + x                                         # noqa: E731
  sizes = []
  for name in roles:
    role = vocab.role(name)
    if role.sieve == vocab.SIEVE_OFFSETS:
      lo, hi = role.offsets
      size = (at(jnp.clip(pos[None] + hi + 1, start, end))
              - at(jnp.clip(pos[None] + lo, start, end)))
    elif role.sieve == vocab.SIEVE_BLOCK:
      size = jnp.where(tt == 0, per_type_q[..., 0], per_type_q[..., 1]) * is_pair
    elif role.sieve == vocab.SIEVE_KEYS:
      union = functools.reduce(jnp.logical_or, [key_sets[kind] for kind in role.keys])
      size = per_query(per_slot(union))
    elif role.sieve == vocab.SIEVE_RELATION:
      has_rel = functools.reduce(jnp.logical_or, [rel == r for r in role.relations])
      dep_of = has_rel & (head >= 0)                              # t's word -> its head word
      size = jnp.where(dep_of, _count_equal(tag(word), word_real, tag(head)), 0)
      if direction == "both":
        head_of = real & has_rel & (head >= 0)                    # s's word depends on another
        dependents = _count_equal(tag(head), head_of, tag(word))  # ... on t's word
        pair_key = lambda w, h: seg * (k + 1) ** 2 + w * (k + 1) + h  # noqa: E731
        both_ways = _count_equal(pair_key(word, head), head_of & (word >= 0),
                                 pair_key(head, word))           # s in t's head word, heading t
        size = size + jnp.where(word >= 0, dependents, 0) - jnp.where(
            dep_of & (word >= 0), both_ways, 0)
    else:  # pragma: no cover - Role validates its kind
      raise ValueError(f"role {name!r} has sieve kind {role.sieve!r}")
    sizes.append(jnp.where(real, size, 0))
  return jnp.round(jnp.stack(sizes, axis=1)).astype(jnp.int32)


def _indicator(indicator, tc, tt, rel):
  """A part's per-query indicator (``tile.IND_*``), float32 ``[b, k]`` (or the scalar 1)."""
  if indicator == tile.IND_ONE:
    return 1.0
  if indicator in (tile.IND_TYPE0, tile.IND_TYPE1):
    return ((tt == 0) == (indicator == tile.IND_TYPE0)).astype(jnp.float32)
  kind, arg = indicator
  if kind == "rel":
    return functools.reduce(jnp.logical_or, [rel == r for r in arg]).astype(jnp.float32)
  return (tc == arg).astype(jnp.float32)                                   # "class"


def kernel_tables(batch, roles: Sequence[str], direction: str = "dep2head", measures: bool = False,
                  keys: int | None = None, slots: int = 0) -> dict:
  """The per-batch inputs of the tile (built once per batch; the analysis step builds them on the
  host with the batch: ``host_tables``).

  Returns ``q_info`` int32 ``[b, kp, Q_COLS]``, ``k_rows`` int32 ``[b, K_ROWS, kp]``,
  ``k_cols`` int32 ``[b, kp, K_ROWS]``, ``e_table`` float32 ``[b, kp, E_COLS]``, ``weights``
  float32 ``[b, kp, C]`` (each epilogue part's per-query weight: its channel's,
  ``channels.channel_weights``, times the part's indicator; ``tile.epilogue_layout``) and
  ``count`` ``[b, r]``; kp = ``keys`` (default k; padding positions are never real). With
  ``slots`` S (a packed batch: ``segment_ids``) every table is of each position's own sequence,
  ``count`` is ``[b, S, r]`` and ``slots`` float32 ``[b, kp, S]`` says which slot each query
  feeds.
  """
  roles = check_roles(roles)
  tile.tile_roles(roles)                          # fails early on a role the tile lacks
  direction = check_direction(direction)
  real, tc, tt, word, head, rel = _fields(batch)
  b, k = real.shape
  kp = k if keys is None else int(keys)
  if kp < k:
    raise ValueError(f"keys {kp} must be at least the batch length {k}")
  seg, onehot, local, n_pos = _slots(batch, slots)
  longest = jnp.max(n_pos, axis=-1)                                        # [b]
  # a query's word / head word (-2 where none) never equals a key's (-3 where none)
  q_word = jnp.where(real & (word >= 0), word, -2)
  q_head = jnp.where(real & (head >= 0), head, -2)
  q_n = jnp.where(real, n_pos, longest[:, None])
  q_info = jnp.stack([tc, tt, q_word, q_head, rel, q_n, jnp.where(real, seg, -1)]
                     + [jnp.zeros_like(tc)] * (tile.Q_COLS - 7), axis=-1)
  k_rows = jnp.stack([real.astype(jnp.int32), (real & (tc == TOKEN_OTHER)).astype(jnp.int32),
                      jnp.where(real & (word >= 0), word, -3),
                      jnp.where(real & (head >= 0), head, -3), rel, jnp.where(real, seg, 0),
                      jnp.maximum(n_pos, 1)]
                     + [jnp.zeros_like(tc)] * (tile.K_ROWS - 7), axis=1)
  block = block_columns(batch)                                             # [b, k, 2]
  col = lambda x: (x & real).astype(jnp.float32)                           # noqa: E731
  first = local == 0                                                       # [CLS] position
  e_table = jnp.stack([real.astype(jnp.float32), col(first), col(tc == TOKEN_SEP),
                       col(tc == TOKEN_COMMA), col(tc == TOKEN_PERIOD), block[..., 0],
                       block[..., 1], col(tc == TOKEN_CLS), col(first | (tc == TOKEN_SEP))],
                      axis=-1)
  e_table = jnp.pad(e_table, ((0, 0), (0, 0), (0, tile.E_COLS - e_table.shape[-1])))
  channel_w, count = channel_weights(batch, roles, direction, measures,
                                     sizes=sieve_sizes(batch, roles, direction, slots),
                                     slots=slots)                          # [b, c, q]
  layout = tile.epilogue_layout(roles, direction, measures)
  weights = jnp.stack([channel_w[:, c] * _indicator(ind, tc, tt, rel) for c, ind in layout.parts],
                      axis=-1)                                             # [b, q, parts]
  weights = jnp.pad(weights, ((0, 0), (0, 0), (0, layout.width - weights.shape[-1])))
  if kp != k:
    extra = kp - k
    pad_q = jnp.asarray([TOKEN_PAD, 0, -2, -2, 0, 0, -1, 0][:tile.Q_COLS], jnp.int32)
    pad_q = jnp.broadcast_to(pad_q, (b, extra, tile.Q_COLS)).at[..., tile.Q_N].set(
        longest[:, None])
    q_info = jnp.concatenate([q_info, pad_q], axis=1)
    pad_k = jnp.asarray([0, 0, -3, -3, 0, 0, 1, 0][:tile.K_ROWS], jnp.int32)
    k_rows = jnp.concatenate([k_rows, jnp.broadcast_to(pad_k[None, :, None],
                                                       (b, tile.K_ROWS, extra))], axis=2)
    e_table = jnp.pad(e_table, ((0, 0), (0, extra), (0, 0)))
    weights = jnp.pad(weights, ((0, 0), (0, extra), (0, 0)))
    onehot = jnp.pad(onehot, ((0, 0), (0, extra), (0, 0)))
  out = {"q_info": q_info, "k_rows": k_rows, "k_cols": jnp.transpose(k_rows, (0, 2, 1)),
         "e_table": e_table, "weights": weights, "count": count}
  if slots:
    out["slots"] = onehot
  return out


def _rows_fn(roles, direction, scale, packed=False):
  """The tile's ``head_rows`` for these settings (``packed``: rows of several sequences,
  ``tile.key_mask``)."""
  return functools.partial(tile.head_rows, roles=tile.tile_roles(roles), direction=direction,
                           scale=scale, packed=bool(packed))


def _epilogue_inputs(layout: tile.Epilogue, contraction: str):
  """The epilogue's static tables as arrays a Pallas call takes (it captures no array
  constants): ``sel`` in the contraction's dtype, ``factors`` float32."""
  dtype = jnp.bfloat16 if contraction == "hilo" else jnp.float32
  return jnp.asarray(layout.sel, dtype), jnp.asarray(layout.factors)


def _factor_rows(f_ref):
  """The factor table's rows ``[1, C]`` each, loaded from its ref (``tile.head_partials``)."""
  return tuple(f_ref[pl.ds(j, 1), :] for j in range(tile.FACTOR_ROWS))


# ------------------------------------------------------------------------------------------------
# The three wrappers: each returns every head's partial sums of the epilogue's parts,
# float32 [b, h, P, S, C] (P groups of query blocks, S = 1 unpacked or the slots, C parts)

def _xla_partials(query, key, tables, rows_fn, layout, block_q, contraction,
                  blocks_per_step: int = 1):
  """``lax.scan`` over groups of query blocks, each block's tile vectorised over sequences and
  heads and its epilogue (``tile.head_partials``) after it, so nothing of size k x k is kept."""
  b, kp, h, e = query.shape
  nq = kp // block_q
  group = max(1, min(int(blocks_per_step), nq))
  while nq % group:
    group -= 1
  q_info, k_rows, k_cols = tables["q_info"], tables["k_rows"], tables["k_cols"]
  e_table, weights, slots = tables["e_table"], tables["weights"], tables.get("slots")
  sel, factors = _epilogue_inputs(layout, contraction)
  factors = tuple(factors[j:j + 1] for j in range(tile.FACTOR_ROWS))
  kr = tuple(k_rows[:, j:j + 1, :] for j in range(tile.K_ROWS))            # [b, 1, kp]
  kc = tuple(k_cols[:, :, j:j + 1] for j in range(tile.K_ROWS))            # [b, kp, 1]
  keys = jnp.transpose(key, (0, 2, 1, 3))                                  # [b, h, kp, e]
  row = jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)

  def one_block(qb, kk, qi, kr_, kc_, et, w, sl, t0):
    setup = tile.block_setup(kr_, kc_, et, qi[tile.Q_N], t0, block_q, contraction)

    def one_head(q_, k_):
      raw = rows_fn(q_, k_, setup, qi, kr_)
      return tile.head_partials(raw, w, sel, factors, row, sl, contraction)
    return jax.vmap(one_head)(qb, kk)                                      # [h, S, C]

  per_seq = jax.vmap(one_block, in_axes=(0, 0, 0, 0, 0, 0, 0, 0 if slots is not None else None,
                                         None))
  per_group = jax.vmap(per_seq, in_axes=(1, None, 1, None, None, None, 1,
                                         1 if slots is not None else None, 0))

  def step(acc, i):
    t0 = i * (group * block_q)
    span = group * block_q
    cut = lambda x: jax.lax.dynamic_slice_in_dim(x, t0, span, axis=1).reshape(  # noqa: E731
        (b, group, block_q) + x.shape[2:])
    qb = jnp.transpose(cut(query), (0, 1, 3, 2, 4))                        # [b, G, h, T, e]
    qi_all = cut(q_info)                                                   # [b, G, T, Q]
    qi = tuple(qi_all[..., j:j + 1] for j in range(tile.Q_COLS))
    sl = None if slots is None else cut(slots)
    starts = t0 + block_q * jnp.arange(group)
    parts = per_group(qb, keys, qi, kr, kc, e_table, cut(weights), sl, starts)  # [G, b, h, S, C]
    return acc + jnp.sum(parts, axis=0), None

  shape = (b, h, 1 if slots is None else slots.shape[-1], layout.width)
  sums, _ = jax.lax.scan(step, jnp.zeros(shape, jnp.float32), jnp.arange(nq // group))
  return sums[:, :, None]


def _slot_width(slots: int) -> int:
  """The slot one-hot's columns in a Triton program: a power of two of at least 16 (the smallest
  Triton product)."""
  return max(16, _next_pow2(slots))


def _triton_partials(query, key, tables, rows_fn, layout, block_q, settings: "KernelSettings",
                     interpret, layers: int = 1):
  """The Triton program: grid ``(b, q / T, h / g)``, each program one query block, looping over
  g heads (``settings.heads_per_program``; with several, the block's setup is built once for
  all); a packed row's block writes its partial sums per slot (P = q / T). All keys at once
  (``tile.head_rows``) when the key block is the key axis, else key blocks in two passes
  (``tile.head_rows_blocked``). Each head's block ends in ``tile.head_partials``."""
  from jax.experimental.pallas import triton as pl_triton
  b, kp, heads, e = query.shape
  per = settings.heads_per_program
  h = heads if per in (None, "all") else int(per)
  if h < 1 or heads % h:
    raise ValueError(f"heads_per_program must divide the {heads} heads, got {per}")
  contraction = settings.contraction
  nq = kp // block_q
  packed = "slots" in tables
  block_k = key_block(kp, settings.block_k)
  blocks = kp // block_k
  scores_settings = rows_fn.keywords
  blocked = functools.partial(tile.head_rows_blocked, contraction=contraction, **scores_settings)
  sel, factors = _epilogue_inputs(layout, contraction)
  width = layout.width
  slots_in = ()
  s_out = 1
  if packed:
    s_out = tables["slots"].shape[-1]
    pad = _slot_width(s_out) - s_out
    slots_in = (jnp.pad(tables["slots"], ((0, 0), (0, 0), (0, pad))),)
  s_width = _slot_width(s_out) if packed else 1
  row = lambda: jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)      # noqa: E731

  def kernel(q_ref, k_ref, qi_ref, kr_ref, kc_ref, e_ref, w_ref, sel_ref, f_ref, *refs):
    st_ref, o_ref = refs if packed else (None, refs[0])
    if blocks == 1:
      kr = tuple(kr_ref[pl.ds(j, 1), :] for j in range(tile.K_ROWS))
      kc = tuple(kc_ref[:, pl.ds(j, 1)] for j in range(tile.K_ROWS))

    def load_keys(hd, i):
      ks = pl.ds(pl.multiple_of(i * block_k, block_k), block_k)
      return (k_ref[ks, hd, :], tuple(kr_ref[pl.ds(j, 1), ks] for j in range(tile.K_ROWS)),
              tuple(kc_ref[ks, pl.ds(j, 1)] for j in range(tile.K_ROWS)), e_ref[ks, :])

    qi = tuple(qi_ref[:, pl.ds(j, 1)] for j in range(tile.Q_COLS))
    n = qi[tile.Q_N]              # the rows' lengths: block_setup takes the shortest (J(n))
    t0 = pl.program_id(1) * block_q
    if blocks == 1:
      setup = tile.block_setup(kr, kc, e_ref[...], n, t0, block_q, contraction,
                               static=settings.static)

    def one_head(hd, carry):
      if blocks == 1:
        raw = rows_fn(q_ref[:, hd, :], k_ref[:, hd, :], setup, qi, kr)
      else:
        raw = blocked(q_ref[:, hd, :], functools.partial(load_keys, hd), blocks, block_k, qi, n,
                      t0)
      # the epilogue's tables loaded after the key loop (not live across it: registers)
      o_ref[hd, :, :] = tile.head_partials(raw, w_ref[...], sel_ref[...], _factor_rows(f_ref),
                                           row(), st_ref[...] if packed else None, contraction)
      return carry

    jax.lax.fori_loop(0, h, one_head, 0)

  grid = (b, nq, heads // h)
  # with ``layers`` > 1 the queries and keys are every layer's, [b * l, ...]: sequence bi // l's
  table = lambda cols: pl.BlockSpec((None, block_q, cols),  # noqa: E731
                                    lambda bi, pi, gi: (bi // layers, pi, 0))
  whole = lambda *shape: pl.BlockSpec(shape, lambda bi, pi, gi: (0,) * len(shape))  # noqa: E731
  out = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((b, heads, nq, s_width, width), jnp.float32),
      grid=grid,
      in_specs=[
          pl.BlockSpec((None, block_q, h, e), lambda bi, pi, gi: (bi, pi, gi, 0)),
          pl.BlockSpec((None, kp, h, e), lambda bi, pi, gi: (bi, 0, gi, 0)),
          table(tile.Q_COLS),
          pl.BlockSpec((None, tile.K_ROWS, kp), lambda bi, pi, gi: (bi // layers, 0, 0)),
          pl.BlockSpec((None, kp, tile.K_ROWS), lambda bi, pi, gi: (bi // layers, 0, 0)),
          pl.BlockSpec((None, kp, tile.E_COLS), lambda bi, pi, gi: (bi // layers, 0, 0)),
          table(width),
          whole(tile.E_COLS, width),
          whole(tile.FACTOR_ROWS, width),
      ] + ([table(s_width)] if packed else []),
      out_specs=pl.BlockSpec((None, h, None, s_width, width),
                             lambda bi, pi, gi: (bi, gi, pi, 0, 0)),
      interpret=interpret,
      compiler_params=None if interpret else pl_triton.CompilerParams(
          num_warps=settings.num_warps, num_stages=settings.num_stages),
      name="heads_jax_statistics_v2",
  )(query, key, tables["q_info"], tables["k_rows"], tables["k_cols"], tables["e_table"],
    tables["weights"], sel, factors, *slots_in)
  return out[:, :, :, :s_out]


def _mosaic_partials(query, key, tables, rows_fn, layout, block_q, contraction, interpret,
                     layers: int = 1):
  """The Mosaic program: grid ``(b,)``, each program looping over its sequence's query blocks and
  heads and adding each head's ``tile.head_partials`` into its output (P = 1)."""
  from jax.experimental.pallas import tpu as pltpu
  b, kp, h, e = query.shape
  nq = kp // block_q
  qt = jnp.transpose(query, (0, 2, 1, 3))                                  # [b, h, kp, e]
  kt = jnp.transpose(key, (0, 2, 1, 3))
  packed = "slots" in tables
  s_out = tables["slots"].shape[-1] if packed else 1
  width = layout.width
  sel, factors = _epilogue_inputs(layout, contraction)

  def kernel(q_ref, k_ref, qi_ref, kr_ref, kc_ref, e_ref, w_ref, sel_ref, f_ref, *refs):
    st_ref, o_ref = refs if packed else (None, refs[0])
    kr = tuple(kr_ref[pl.ds(j, 1), :] for j in range(tile.K_ROWS))
    kc = tuple(kc_ref[:, pl.ds(j, 1)] for j in range(tile.K_ROWS))
    e_tab, sel_, factors_ = e_ref[...], sel_ref[...], _factor_rows(f_ref)
    row = jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
    o_ref[...] = jnp.zeros((h, s_out, width), jnp.float32)

    def one_block(i, carry):
      t0 = pl.multiple_of(i * block_q, block_q)
      rows = pl.ds(t0, block_q)
      qi = tuple(qi_ref[rows, pl.ds(j, 1)] for j in range(tile.Q_COLS))
      w = w_ref[rows, :]
      sl = st_ref[rows, :] if packed else None
      setup = tile.block_setup(kr, kc, e_tab, qi[tile.Q_N], t0, block_q, contraction)

      def one_head(hd, carry):
        raw = rows_fn(q_ref[hd, rows, :], k_ref[hd], setup, qi, kr)
        o_ref[hd] = o_ref[hd] + tile.head_partials(raw, w, sel_, factors_, row, sl, contraction)
        return carry

      return jax.lax.fori_loop(0, h, one_head, carry)

    jax.lax.fori_loop(0, nq, one_block, 0)

  whole = lambda *shape: pl.BlockSpec(shape, lambda bi: (0,) * len(shape))  # noqa: E731
  out = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((b, h, s_out, width), jnp.float32),
      grid=(b,),
      in_specs=[
          pl.BlockSpec((None, h, kp, e), lambda bi: (bi, 0, 0, 0)),
          pl.BlockSpec((None, h, kp, e), lambda bi: (bi, 0, 0, 0)),
          pl.BlockSpec((None, kp, tile.Q_COLS), lambda bi: (bi // layers, 0, 0)),
          pl.BlockSpec((None, tile.K_ROWS, kp), lambda bi: (bi // layers, 0, 0)),
          pl.BlockSpec((None, kp, tile.K_ROWS), lambda bi: (bi // layers, 0, 0)),
          pl.BlockSpec((None, kp, tile.E_COLS), lambda bi: (bi // layers, 0, 0)),
          pl.BlockSpec((None, kp, width), lambda bi: (bi // layers, 0, 0)),
          whole(tile.E_COLS, width),
          whole(tile.FACTOR_ROWS, width),
      ] + ([pl.BlockSpec((None, kp, s_out), lambda bi: (bi // layers, 0, 0))] if packed else []),
      out_specs=pl.BlockSpec((None, h, s_out, width), lambda bi: (bi, 0, 0, 0)),
      interpret=interpret,
      compiler_params=None if interpret else pltpu.CompilerParams(
          dimension_semantics=("parallel",)),
      name="heads_jax_statistics_v2",
  )(qt, kt, tables["q_info"], tables["k_rows"], tables["k_cols"], tables["e_table"],
    tables["weights"], sel, factors, *((tables["slots"],) if packed else ()))
  return out[:, :, None]


def _prepare(query, key, tables, settings: "KernelSettings"):
  """The queries and keys padded to the tables' length, and the settings resolved: the
  wrapper (``default_wrapper``), the block, whether to interpret, the Triton defaults."""
  wrapper = settings.wrapper or default_wrapper(settings.platform)
  if wrapper not in WRAPPERS:
    raise ValueError(f"wrapper must be one of {WRAPPERS}, got {wrapper!r}")
  b, k, h, e = query.shape
  kp = tables["q_info"].shape[1]
  block_q = min(settings.block_q or BLOCK_Q[wrapper], kp)
  if kp % block_q:
    raise ValueError(f"block_q {block_q} must divide the tables' length {kp} "
                     f"(kernel_tables(keys=padded_length(...)))")
  if kp != k:
    pad = ((0, 0), (0, kp - k), (0, 0), (0, 0))
    query, key = jnp.pad(query, pad), jnp.pad(key, pad)
  native = {"triton": "gpu", "mosaic": "tpu"}.get(wrapper)
  interpret = settings.interpret
  if interpret is None:
    interpret = native is not None and target_platform(settings.platform) != native
  triton = {name: getattr(settings, name) for name in TRITON_DEFAULTS}
  triton = {name: TRITON_DEFAULTS[name] if v is None else v for name, v in triton.items()}
  settings = dataclasses.replace(settings, wrapper=wrapper, block_q=block_q, interpret=interpret,
                                 **(triton if wrapper == "triton" else {}))
  return query, key, settings


def kernel_layer_partials(query, key, tables: dict, roles: Sequence[str],
                          direction: str = "dep2head", measures: bool = False,
                          settings: "KernelSettings | None" = None, *, layers: int = 1,
                          **options):
  """The wrapper's program alone: every head's partial sums of the epilogue's parts, float32
  ``[b, h, P, S, C]`` (P groups of query blocks; S = 1 unpacked, the slots of a packed batch;
  C = ``tile.epilogue_layout(...).width``); arguments as ``kernel_layer_stats``. What
  ``kernel_layer_stats`` adds is the sum over P and ``tile.merge_parts`` (a few hundred numbers a
  head). ``layers`` > 1 (a Pallas wrapper): ``query``, ``key`` are ``[b * layers, k, h, e]``,
  every layer of each sequence of ``tables`` (sequence-major), in one call."""
  settings = KernelSettings.of(settings, **options)
  roles, direction = check_roles(roles), check_direction(direction)
  layout = tile.epilogue_layout(roles, direction, measures)
  rows_fn = _rows_fn(roles, direction, float(1.0 / query.shape[-1] ** 0.5), "slots" in tables)
  query, key, s = _prepare(query, key, tables, settings)
  if s.wrapper == "triton":
    return _triton_partials(query, key, tables, rows_fn, layout, s.block_q, s, s.interpret,
                            layers)
  if s.wrapper == "mosaic":
    return _mosaic_partials(query, key, tables, rows_fn, layout, s.block_q, s.contraction,
                            s.interpret, layers)
  if layers != 1:
    raise ValueError("the 'xla' wrapper takes one layer a call (kernel_stacked_stats loops)")
  return _xla_partials(query, key, tables, rows_fn, layout, s.block_q, s.contraction,
                       s.blocks_per_step or (1 if target_platform(s.platform) == "cpu" else 32))


def kernel_layer_stats(query, key, tables: dict, roles: Sequence[str], direction: str = "dep2head",
                       measures: bool = False, settings: "KernelSettings | None" = None,
                       **options) -> dict:
  """One layer's statistics from its queries and keys ``[b, k, h, e]`` (before the ``1/sqrt(e)``
  scaling; any float dtype), with ``tables = kernel_tables(batch, roles, direction, measures,
  keys=kp)`` of the batch (kp: ``padded_length(k, wrapper, block_q)``, or k).

  ``settings``: a ``KernelSettings`` (how to run it; default all defaults), ``options`` its
  fields to replace (``KernelSettings.of``).

  Returns:
    what ``heads_jax.stats.layerwise.reduce_layer`` returns: ``sieve_bias`` ``[b, h, r]`` (0
    where a sieve is empty), ``distance`` ``[b, h, 21]`` and with ``measures`` ``entropy``,
    ``cls_entropy`` ``[b, h]`` and ``token_attention`` ``[b, h, 5]`` (with ``slots`` in the
    tables, each ``[b, h, S, ...]``).
  """
  roles, direction = check_roles(roles), check_direction(direction)
  partials = kernel_layer_partials(query, key, tables, roles, direction, measures, settings,
                                   **options)
  return _stats_of(partials, tables, roles, direction, measures)


def _stats_of(partials, tables, roles, direction, measures) -> dict:
  """``kernel_layer_partials``' ``[..., h, P, S, C]`` -> the statistics (``[..., h, (S,) ...]``):
  the sum over P, the parts merged into the channels, split."""
  sums = tile.merge_parts(jnp.sum(partials, axis=-3),
                          tile.epilogue_layout(roles, direction, measures))  # [..., h, S, c]
  if "slots" not in tables:
    sums = sums[..., 0, :]
  return split_channels(sums, roles, measures)


# One Pallas call for every layer (issue 50 item 3): the model's hook keeps each layer's queries
# and keys (``stash_reducer``) and one call after the forward reduces them all
# (``kernel_stacked_stats``), where the stack of queries and keys takes at most this many bytes a
# device (``stash_fits``: BERT-base in bf16, 128 x 128, 604 MB); else one call a layer.
STASH_BYTES = 1 << 30


def stash_bytes(rows: int, layers: int, length: int, width: int, itemsize: int) -> int:
  """Bytes of every layer's queries and keys ``2 x [rows, l, k, h e]`` (``width`` = h e)."""
  return 2 * int(rows) * int(layers) * int(length) * int(width) * int(itemsize)


def stash_fits(wrapper: str, rows: int, layers: int, length: int, width: int,
               itemsize: int) -> bool:
  """Whether the step takes one call for all layers: a Pallas wrapper (the ``"xla"`` one runs a
  layer at a time anyway) and the stack within ``STASH_BYTES`` a device."""
  return wrapper != "xla" and stash_bytes(rows, layers, length, width, itemsize) <= STASH_BYTES


def stash_reducer():
  """The model's ``attention_reduce`` hook that keeps each layer's queries and keys ``[b, k, h,
  e]`` (the model stacks them: ``[b, l, k, h, e]``), for ``kernel_stacked_stats``."""
  def reduce(layer, probs, query, key, mask):
    del layer, probs, mask
    return {"query": query, "key": key}

  reduce.needs_probs = False
  return reduce


def kernel_stacked_stats(queries, keys, tables: dict, roles: Sequence[str],
                         direction: str = "dep2head", measures: bool = False,
                         settings: "KernelSettings | None" = None, *, mesh=None,
                         **options) -> dict:
  """Every layer's statistics from the stacked queries and keys ``[b, l, k, h, e]``
  (``stash_reducer``) in one Pallas call (the layers folded into the grid's first axis, each
  reading its sequence's tables), outputs ``[b, l, h, ...]`` as the model's stacked
  ``kernel_reducer`` outputs; the ``"xla"`` wrapper a layer at a time. ``mesh``: as
  ``kernel_reducer``."""
  settings = KernelSettings.of(settings, **options)
  roles, direction = check_roles(roles), check_direction(direction)

  def stats(queries, keys, tables):
    b, layers = queries.shape[:2]
    if (settings.wrapper or default_wrapper(settings.platform)) == "xla":
      outs = [kernel_layer_stats(queries[:, i], keys[:, i], tables, roles, direction, measures,
                                 settings) for i in range(layers)]
      return jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *outs)
    fold = lambda x: x.reshape((b * layers,) + x.shape[2:])              # noqa: E731
    partials = kernel_layer_partials(fold(queries), fold(keys), tables, roles, direction,
                                     measures, settings, layers=layers)
    return _stats_of(partials.reshape((b, layers) + partials.shape[1:]), tables, roles,
                     direction, measures)

  if settings.wrapper != "xla" and mesh is not None and mesh.size > 1:
    spec = P(DATA_AXIS)
    stats = jax.shard_map(stats, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                          check_vma=False)
  return stats(queries, keys, tables)


def kernel_program_tables(batch, roles, direction, measures, *, wrapper: str,
                          block_q: int | None = None, slots: int = 0) -> dict:
  """``kernel_tables`` padded for ``wrapper`` (its key axis); ``slots``: a packed batch's
  sequences per row (0: unpacked)."""
  k = jnp.asarray(batch["attention_mask"]).shape[1]
  bq = block_q or BLOCK_Q[wrapper]
  kp = padded_length(k, wrapper, min(bq, k) if wrapper == "xla" else bq)
  return kernel_tables(batch, roles, direction, measures, keys=kp, slots=slots)


# The kernel's tables built on the host with the batch (issue 50 item 3): the analysis step hands
# them to its program as the batch field ``TABLES`` (sharded like the batch: every table's leading
# axis is b), so the program holds no table construction. One definition, ``kernel_program_tables``,
# jitted once per batch shape for the host's CPU (``host_tables``), sent without what the device
# rebuilds in three operations (``sent_tables``, ``device_tables``); ``HOST_TABLES_NAME`` is the
# name its compilations carry in JAX's compile events (``compiling.CompileLog``).
TABLES = "kernel_tables"
HOST_TABLES_NAME = "host_kernel_tables"
# the batch fields the tables read (``kernel_tables``: every field but the token ids)
TABLE_FIELDS = tuple(f for f in vocab.BATCH_FIELDS if f != "input_ids")


def sent_tables(tables: dict, roles: Sequence[str], direction: str, measures: bool) -> dict:
  """What the host sends of ``kernel_tables``: all but ``k_cols`` (``k_rows`` transposed), with
  ``e_table`` and ``weights`` cut to the columns that are not padding (the key features,
  ``[b, kp, E_DELIM + 1]``; the epilogue's parts, ``[b, kp, P]``): 9.6 MB for BERT-base's 256 x
  128 rows against 19.9 MB whole."""
  parts = len(tile.epilogue_layout(roles, direction, measures).parts)
  out = {name: x for name, x in tables.items() if name != "k_cols"}
  out["e_table"] = tables["e_table"][..., :tile.E_DELIM + 1]
  out["weights"] = tables["weights"][..., :parts]
  return out


def device_tables(sent: dict, roles: Sequence[str], direction: str, measures: bool) -> dict:
  """``kernel_tables`` from ``sent_tables``' (on the device: a transpose and two zero pads)."""
  width = tile.epilogue_layout(roles, direction, measures).width
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, 0), (0, n - x.shape[-1])))     # noqa: E731
  return {**sent, "k_cols": jnp.swapaxes(sent["k_rows"], 1, 2),
          "e_table": pad(sent["e_table"], tile.E_COLS), "weights": pad(sent["weights"], width)}


@functools.partial(jax.jit, static_argnames=("roles", "direction", "measures", "wrapper", "slots"))
def host_kernel_tables(fields: dict, roles: tuple, direction: str, measures: bool, wrapper: str,
                       slots: int) -> dict:
  """``sent_tables`` of ``kernel_program_tables`` as its own program (``host_tables`` runs it
  on the CPU)."""
  return sent_tables(kernel_program_tables(fields, roles, direction, measures, wrapper=wrapper,
                                           slots=slots), roles, direction, measures)


def _table_fields(batch, slots: int) -> dict:
  """The batch fields the tables read (``TABLE_FIELDS``, and ``segment_ids`` with ``slots``)."""
  return {f: batch[f] for f in TABLE_FIELDS + (("segment_ids",) if slots else ())}


def _host_device():
  """The host's CPU device (JAX's first device where it runs without a CPU backend)."""
  try:
    return jax.devices("cpu")[0]
  except RuntimeError:
    return jax.local_devices()[0]


def host_tables(batch, roles: Sequence[str], direction: str = "dep2head", measures: bool = False,
                *, wrapper: str, slots: int = 0) -> dict:
  """``kernel_program_tables(batch, ...)`` built on the host's CPU, as numpy arrays in the form
  sent to the device (``sent_tables``; each ``[b, ...]``; ``device_tables`` makes them
  ``kernel_tables``' again). ``batch``: host arrays ``[b, k]``; one compilation per batch shape
  (and roles, direction, measures, wrapper, slots)."""
  cpu = _host_device()
  fields = {f: jax.device_put(np.asarray(x, np.int32), cpu)
            for f, x in _table_fields(batch, slots).items()}
  out = host_kernel_tables(fields, tuple(check_roles(roles)), check_direction(direction),
                           bool(measures), wrapper, int(slots))
  return {name: np.asarray(x) for name, x in out.items()}


@functools.lru_cache(maxsize=64)
def table_specs(rows: int, length: int, roles: tuple, direction: str, measures: bool, *,
                wrapper: str, slots: int = 0) -> dict:
  """The shapes and dtypes of ``host_tables`` for a batch ``[rows, length]``
  (``jax.ShapeDtypeStruct`` each; traced, not compiled)."""
  spec = jax.ShapeDtypeStruct((int(rows), int(length)), jnp.int32)
  fields = {f: spec for f in TABLE_FIELDS + (("segment_ids",) if slots else ())}
  return jax.eval_shape(functools.partial(host_kernel_tables, roles=tuple(roles),
                                          direction=direction, measures=bool(measures),
                                          wrapper=wrapper, slots=int(slots)), fields)


def given_tables(batch: dict, roles: tuple, direction: str, measures: bool, wrapper: str,
                 slots: int) -> dict:
  """In a program: the tables that came with the batch (``TABLES``; built on the host:
  ``host_tables``, through the step's ``with_tables``), checked against the shapes of the
  batch's (``table_specs``: one clear error where they are missing), made whole
  (``device_tables``)."""
  rows, length = batch["input_ids"].shape
  want = table_specs(rows, length, roles, direction, measures, wrapper=wrapper, slots=slots)
  tables = batch.get(TABLES)
  shapes = lambda t: {n: tuple(x.shape) for n, x in t.items()}             # noqa: E731
  if tables is None or shapes(tables) != shapes(want):
    raise ValueError(
        f"the kernel path's program takes the kernel's tables with the batch (field {TABLES!r}: "
        f"{shapes(want)}), got {None if tables is None else shapes(tables)}; pass the batch "
        f"through the step's with_tables (or call the step), which builds them on the host")
  return device_tables(tables, roles, direction, measures)


def kernel_reducer(tables: dict, roles: Sequence[str], direction: str = "dep2head",
                   measures: bool = False, settings: "KernelSettings | None" = None, *,
                   mesh=None, **options):
  """The model's ``attention_reduce`` hook for kernel v2 (needs no probabilities: the model keeps
  its fast attention and the tile recomputes the scores from the queries and keys);
  ``settings``/``options`` as ``kernel_layer_stats``.

  With a ``mesh`` of several devices a Pallas wrapper runs under ``jax.shard_map`` over its
  ``data`` axis (a Pallas call is not partitioned by XLA): every device reduces its own rows.
  """
  settings = KernelSettings.of(settings, **options)
  roles = check_roles(roles)
  stats = functools.partial(kernel_layer_stats, roles=roles, direction=direction,
                            measures=measures, settings=settings)
  if settings.wrapper != "xla" and mesh is not None and mesh.size > 1:
    spec = P(DATA_AXIS)
    stats = jax.shard_map(stats, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                          check_vma=False)

  def reduce(layer, probs, query, key, mask):
    del layer, probs, mask
    return stats(query, key, tables)

  reduce.needs_probs = False
  return reduce


def triton_program(b: int = 4, k: int = 128, h: int = 12, e: int = 64, dtype="bfloat16",
                   roles: Sequence[str] = vocab.ROLES, direction: str = "dep2head",
                   slots: int = 0, measures: bool = True, **options):
  """``(fn, args)``: the Triton program of one layer (``kernel_layer_partials``, GPU settings)
  and abstract arguments of that shape (queries and keys ``[b, k, h, e]`` in ``dtype``, the
  tables of a ``k``-position batch), for ``heads_jax.stats.sm90.compile_kernels(fn, *args)`` (the
  offline sm_90 compile; BERT-base's shape by default; ``slots``: the packed program).
  ``options``: ``KernelSettings`` fields."""
  settings = KernelSettings.of(None, **options)
  kp = padded_length(k, "triton", settings.block_q or BLOCK_Q["triton"])
  width = tile.epilogue_layout(check_roles(roles), direction, measures).width
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)                    # noqa: E731
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)                  # noqa: E731
  qk = jax.ShapeDtypeStruct((b, k, h, e), jnp.dtype(dtype))
  tables = {"q_info": i32(b, kp, tile.Q_COLS), "k_rows": i32(b, tile.K_ROWS, kp),
            "k_cols": i32(b, kp, tile.K_ROWS), "e_table": f32(b, kp, tile.E_COLS),
            "weights": f32(b, kp, width)}
  if slots:
    tables["slots"] = f32(b, kp, slots)

  def fn(query, key, tables):
    return kernel_layer_partials(query, key, tables, roles, direction, measures, settings,
                                 wrapper="triton", platform="gpu", interpret=False)
  return jax.jit(fn), (qk, qk, tables)
