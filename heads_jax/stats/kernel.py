"""Statistics kernel v2 (``stats_impl="kernel"``): the tile of ``heads_jax.stats.tile`` run over
every query block of every head of a layer, from the layer's queries and keys; the model keeps
its fast attention (cuDNN on GPUs, XLA on TPUs and CPUs) and no attention map is ever written.

Three thin wrappers around the same tile function (``tile.head_rows``: each head's per-row
results of a query block, ``[T, 64]``):

* ``"triton"`` (GPU): a Pallas call with grid ``(b, q / T, h / g)``, g heads a program; Triton
  compiler parameters (without them Pallas picks Mosaic GPU). Triton wants power-of-two loads:
  the key axis is padded to one. By default (``TRITON_DEFAULTS``, the tile that passes the
  offline sm_90 gate of ``heads_jax.stats.sm90``) one head a program, 8 warps, and the key loop
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

The Pallas programs write the per-row results ``[b, h, k, 64]`` (linear in the length: 50 MB a
layer for BERT-base at 128 x 128) and XLA turns them into the channels and their per-query
weighted sums (``tile.channel_values``); in-kernel per-channel reductions cost more (the first
device run: 47 column splits and cross-thread sums per head).

Packed rows (several sequences a row, ``segment_ids``; ``slots`` in ``kernel_tables``): every
table is each sequence's own, a query attends only its own sequence's keys (``tile.key_mask``),
each key's windows use its own sequence's length, and the weighted sums come per slot.

``interpret=True`` runs a Pallas wrapper in the Pallas interpreter (on the CPU: the tests); for
``"mosaic"`` ``interpret`` may also be a ``pltpu.InterpretParams()``, which simulates the TPU's
block and memory semantics. ``kernel_layer_stats`` returns what
``heads_jax.stats.layerwise.reduce_layer`` returns, so ``layerwise.finish`` completes the step.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from heads_jax.data import vocabulary as vocab
from heads_jax.data.vocabulary import (TOKEN_CLS, TOKEN_COMMA, TOKEN_OTHER, TOKEN_PAD, TOKEN_PERIOD,
                                       TOKEN_SEP)
from heads_jax.parallel import DATA_AXIS
from heads_jax.sieves import check_direction, check_roles, segment_positions, segments_of
from heads_jax.stats import tile
from heads_jax.stats.channels import channel_weights, num_channels, split_channels
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
# prefetches with cp.async), 8 warps: 128 registers, 0 spills, cp.async (BERT-base, 128
# positions, bf16). The last device-measured setting, ``TRITON_MEASURED`` (all keys at once, the
# 12 heads of a block in one program, 4 warps: 255 registers, 256-454 B spilled, no asynchronous
# copy; 13.38 ms a step on the H200), stays beside it in ``bench/analysis_ab.py`` until a device
# has timed the two.
TRITON_DEFAULTS = {"block_k": 32, "heads_per_program": 1, "num_warps": 8}
TRITON_MEASURED = {"block_k": ONE_PASS_KEYS, "heads_per_program": "all", "num_warps": 4}


def key_block(kp: int, block_k: int | None = None) -> int:
  """The Triton wrapper's keys per step on a padded key axis ``kp`` (a power of two): all of
  them up to ``ONE_PASS_KEYS``, else ``block_k`` (default ``KEY_BLOCK``; a power of two)."""
  if block_k is None:
    return kp if kp <= ONE_PASS_KEYS else KEY_BLOCK
  block_k = int(block_k)
  if block_k < 16 or block_k & (block_k - 1):
    raise ValueError(f"block_k must be a power of two of at least 16, got {block_k}")
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


def kernel_tables(batch, roles: Sequence[str], direction: str = "dep2head", measures: bool = False,
                  keys: int | None = None, channels: int | None = None, slots: int = 0) -> dict:
  """The per-batch inputs of the tile (built once per batch, on the device).

  Returns ``q_info`` int32 ``[b, kp, Q_COLS]``, ``k_rows`` int32 ``[b, K_ROWS, kp]``,
  ``k_cols`` int32 ``[b, kp, K_ROWS]``, ``e_table`` float32 ``[b, kp, E_COLS]``, ``weights``
  float32 ``[b, kp, cp]`` (each channel's per-query weight, ``fused.channel_weights``) and
  ``count`` ``[b, r]``; kp = ``keys`` (default k; padding positions are never real), cp =
  ``channels`` (default: the next power of two of the channel count). With ``slots`` S (a packed
  batch: ``segment_ids``) every table is of each position's own sequence, ``count`` is
  ``[b, S, r]`` and ``slots`` float32 ``[b, kp, S]`` says which slot each query feeds.
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
  weights, count = channel_weights(batch, roles, direction, measures,
                                   sizes=sieve_sizes(batch, roles, direction, slots),
                                   slots=slots)                            # [b, c, q]
  weights = jnp.transpose(weights, (0, 2, 1))                              # [b, q, c]
  c = weights.shape[-1]
  cp = _next_pow2(c) if channels is None else int(channels)
  if cp < c:
    raise ValueError(f"channels {cp} must be at least the channel count {c}")
  weights = jnp.pad(weights, ((0, 0), (0, 0), (0, cp - c)))
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


def _row_fns(roles, direction, measures, scale, packed=False):
  """The tile's ``head_rows`` and ``channel_values`` for these settings (``packed``: rows of
  several sequences, ``tile.key_mask``)."""
  roles = tile.tile_roles(roles)
  rows = functools.partial(tile.head_rows, roles=roles, direction=direction, scale=scale,
                           packed=bool(packed))
  channels = functools.partial(tile.channel_values, roles=roles, direction=direction,
                               measures=measures)
  return rows, channels


SUMS = ("einsum", "reduce")


def _weighted(raw, q_info, weights, channels_fn, block_q, channels, sums: str = "einsum",
              slots=None):
  """``sum_t weights[t, c] * channel_c(raw)[t]``: raw ``[b, h, t, E_COLS]``, q_info
  ``[b, t, Q_COLS]``, weights ``[b, t, cp]`` -> ``[b, h, c]`` (XLA, on the kernel's rows), or
  with ``slots`` (a packed batch's slot one-hot ``[b, t, S]``) per sequence slot ``[b, h, S, c]``.
  ``sums``: ``"einsum"`` (a float32 contraction over t of the channels), ``"reduce"`` (a product
  and a sum over t, which XLA may fuse with the channels' arithmetic: one pass over ``raw``)."""
  if sums not in SUMS:
    raise ValueError(f"sums must be one of {SUMS}, got {sums!r}")
  t = raw.shape[2]
  qi = tuple(q_info[:, None, :, j:j + 1] for j in range(tile.Q_COLS))      # [b, 1, t, 1]
  row = (jnp.arange(t, dtype=jnp.int32) % block_q)[None, None, :, None]
  vals = jnp.concatenate(channels_fn(raw, qi, row), axis=-1)               # [b, h, t, c]
  if slots is not None:
    return jnp.einsum("bhtc,btc,bts->bhsc", vals, weights[..., :channels], slots,
                      precision=jax.lax.Precision.HIGHEST)
  if sums == "reduce":
    return jnp.sum(vals * weights[:, None, :, :channels], axis=2)
  return jnp.einsum("bhtc,btc->bhc", vals, weights[..., :channels],
                    precision=jax.lax.Precision.HIGHEST)


# ------------------------------------------------------------------------------------------------
# The three wrappers: each returns the per-row results [b, h, kp, E_COLS] of every head (the
# Pallas ones), or directly the weighted sums [b, h, c] (XLA, block by block)

def _xla_sums(query, key, tables, rows_fn, channels_fn, block_q, contraction, channels,
              blocks_per_step: int = 1):
  """``lax.scan`` over groups of query blocks, each block's tile vectorised over sequences and
  heads; the channels and their weighted sums per group, so nothing of size k x k is kept."""
  b, kp, h, e = query.shape
  nq = kp // block_q
  group = max(1, min(int(blocks_per_step), nq))
  while nq % group:
    group -= 1
  q_info, k_rows, k_cols = tables["q_info"], tables["k_rows"], tables["k_cols"]
  e_table, weights, slots = tables["e_table"], tables["weights"], tables.get("slots")
  kr = tuple(k_rows[:, j:j + 1, :] for j in range(tile.K_ROWS))            # [b, 1, kp]
  kc = tuple(k_cols[:, :, j:j + 1] for j in range(tile.K_ROWS))            # [b, kp, 1]
  keys = jnp.transpose(key, (0, 2, 1, 3))                                  # [b, h, kp, e]

  def one_block(qb, kk, qi, kr_, kc_, et, t0):
    setup = tile.block_setup(kr_, kc_, et, qi[tile.Q_N], t0, block_q, contraction)
    return jax.vmap(lambda q_, k_: rows_fn(q_, k_, setup, qi, kr_))(qb, kk)  # [h, T, E]

  per_seq = jax.vmap(one_block, in_axes=(0, 0, 0, 0, 0, 0, None))
  per_group = jax.vmap(per_seq, in_axes=(1, None, 1, None, None, None, 0), out_axes=2)

  def step(acc, i):
    t0 = i * (group * block_q)
    span = group * block_q
    qb = jax.lax.dynamic_slice_in_dim(query, t0, span, axis=1)              # [b, G T, h, e]
    qb = jnp.transpose(qb.reshape(b, group, block_q, h, e), (0, 1, 3, 2, 4))  # [b, G, h, T, e]
    qi_all = jax.lax.dynamic_slice_in_dim(q_info, t0, span, axis=1)         # [b, G T, Q]
    qi = tuple(qi_all.reshape(b, group, block_q, tile.Q_COLS)[..., j:j + 1]
               for j in range(tile.Q_COLS))                                 # [b, G, T, 1]
    starts = t0 + block_q * jnp.arange(group)
    raw = per_group(qb, keys, qi, kr, kc, e_table, starts)                  # [b, h, G, T, E]
    raw = raw.reshape(b, h, span, tile.E_COLS)
    w = jax.lax.dynamic_slice_in_dim(weights, t0, span, axis=1)
    sl = None if slots is None else jax.lax.dynamic_slice_in_dim(slots, t0, span, axis=1)
    return acc + _weighted(raw, qi_all, w, channels_fn, block_q, channels, slots=sl), None

  shape = (b, h, channels) if slots is None else (b, h, slots.shape[-1], channels)
  sums, _ = jax.lax.scan(step, jnp.zeros(shape, jnp.float32), jnp.arange(nq // group))
  return sums


def _triton_rows(query, key, tables, rows_fn, block_q, contraction, interpret, num_warps,
                num_stages=None, block_k=None, keys_outer=True, static=TRITON_STATIC,
                heads_per_program=None):
  """The Triton program: grid ``(b, q / T, h / g)``, each program looping over g heads
  (``heads_per_program``, default all: the block's setup is then built once for all); all keys
  at once (``tile.head_rows``) when ``block_k`` is the key axis, else key blocks of ``block_k``
  in two passes (``tile.head_rows_blocked``, the same ``rows_fn`` settings). ``keys_outer``:
  the second pass loops over key blocks outside the heads, so each block's ``block_setup`` is
  built once for all heads; each head's sums then wait in its output rows (the log-sum-exp in
  column ``tile.R_LSE``)."""
  from jax.experimental.pallas import triton as pl_triton
  b, kp, heads, e = query.shape
  h = heads if heads_per_program in (None, "all") else int(heads_per_program)
  if h < 1 or heads % h:
    raise ValueError(f"heads_per_program must divide the {heads} heads, got {heads_per_program}")
  nq = kp // block_q
  block_k = kp if block_k is None else block_k
  blocks = kp // block_k
  settings = rows_fn.keywords
  blocked = functools.partial(tile.head_rows_blocked, contraction=contraction, **settings)

  def kernel(q_ref, k_ref, qi_ref, kr_ref, kc_ref, e_ref, o_ref):
    qi = tuple(qi_ref[:, pl.ds(j, 1)] for j in range(tile.Q_COLS))
    n = qi[tile.Q_N]              # the rows' lengths: block_setup takes the shortest (J(n))
    t0 = pl.program_id(1) * block_q
    if blocks == 1:
      kr = tuple(kr_ref[pl.ds(j, 1), :] for j in range(tile.K_ROWS))
      kc = tuple(kc_ref[:, pl.ds(j, 1)] for j in range(tile.K_ROWS))
      setup = tile.block_setup(kr, kc, e_ref[...], n, t0, block_q, contraction, static=static)

      def one_head(hd, carry):
        o_ref[hd, :, :] = rows_fn(q_ref[:, hd, :], k_ref[:, hd, :], setup, qi, kr)
        return carry
    else:
      def load_keys(hd, i):
        ks = pl.ds(pl.multiple_of(i * block_k, block_k), block_k)
        return (k_ref[ks, hd, :], tuple(kr_ref[pl.ds(j, 1), ks] for j in range(tile.K_ROWS)),
                tuple(kc_ref[ks, pl.ds(j, 1)] for j in range(tile.K_ROWS)), e_ref[ks, :])

      if keys_outer:
        tile.check_blocked(settings["roles"])
        _keys_outer(q_ref, o_ref, load_keys, h, blocks, block_k, block_q, qi, n, t0,
                    contraction, settings)
        return

      def one_head(hd, carry):
        o_ref[hd, :, :] = blocked(q_ref[:, hd, :], functools.partial(load_keys, hd), blocks,
                                  block_k, qi, n, t0)
        return carry

    jax.lax.fori_loop(0, h, one_head, 0)

  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((b, heads, kp, tile.E_COLS), jnp.float32),
      grid=(b, nq, heads // h),
      in_specs=[
          pl.BlockSpec((None, block_q, h, e), lambda bi, qi, gi: (bi, qi, gi, 0)),
          pl.BlockSpec((None, kp, h, e), lambda bi, qi, gi: (bi, 0, gi, 0)),
          pl.BlockSpec((None, block_q, tile.Q_COLS), lambda bi, qi, gi: (bi, qi, 0)),
          pl.BlockSpec((None, tile.K_ROWS, kp), lambda bi, qi, gi: (bi, 0, 0)),
          pl.BlockSpec((None, kp, tile.K_ROWS), lambda bi, qi, gi: (bi, 0, 0)),
          pl.BlockSpec((None, kp, tile.E_COLS), lambda bi, qi, gi: (bi, 0, 0)),
      ],
      out_specs=pl.BlockSpec((None, h, block_q, tile.E_COLS),
                             lambda bi, qi, gi: (bi, gi, qi, 0)),
      interpret=interpret,
      compiler_params=None if interpret else pl_triton.CompilerParams(num_warps=num_warps,
                                                                       num_stages=num_stages),
      name="heads_jax_statistics_v2",
  )(query, key, tables["q_info"], tables["k_rows"], tables["k_cols"], tables["e_table"])


def _keys_outer(q_ref, o_ref, load_keys, h, blocks, block_k, rows, qi, n, t0, contraction,
                settings):
  """The Triton key loop with key blocks outside the heads (``_triton_rows``' ``keys_outer``):
  every head's log-sum-exp (``tile.key_block_lse``) into its output rows, then per key block one
  ``block_setup`` and every head's ``tile.key_block_sums`` added to its rows, then
  ``tile.finish_blocked``."""
  lane = jax.lax.broadcasted_iota(jnp.int32, (rows, tile.E_COLS), 1)

  def first(hd, carry):
    lse = tile.key_block_lse(q_ref[:, hd, :], functools.partial(load_keys, hd), blocks, qi,
                             scale=settings["scale"], packed=settings["packed"])
    o_ref[hd, :, :] = jnp.where(lane == tile.R_LSE, lse, 0.0)
    return carry

  def second(i, carry):
    _, kr, kc, et = load_keys(0, i)
    setup = tile.block_setup(kr, kc, et, n, t0, rows, contraction, s0=i * block_k, static=0)

    def one_head(hd, carry):
      acc = o_ref[hd, :, :]
      lse = jnp.sum(jnp.where(lane == tile.R_LSE, acc, 0.0), axis=1, keepdims=True)
      o_ref[hd, :, :] = acc + tile.key_block_sums(q_ref[:, hd, :], load_keys(hd, i)[0], setup,
                                                  lse, qi, kr, **settings)
      return carry

    return jax.lax.fori_loop(0, h, one_head, carry)

  def last(hd, carry):
    o_ref[hd, :, :] = tile.finish_blocked(o_ref[hd, :, :])
    return carry

  jax.lax.fori_loop(0, h, first, 0)
  jax.lax.fori_loop(0, blocks, second, 0)
  jax.lax.fori_loop(0, h, last, 0)


def _mosaic_rows(query, key, tables, rows_fn, block_q, contraction, interpret):
  from jax.experimental.pallas import tpu as pltpu
  b, kp, h, e = query.shape
  nq = kp // block_q
  qt = jnp.transpose(query, (0, 2, 1, 3))                                  # [b, h, kp, e]
  kt = jnp.transpose(key, (0, 2, 1, 3))

  def kernel(q_ref, k_ref, qi_ref, kr_ref, kc_ref, e_ref, o_ref):
    kr = tuple(kr_ref[pl.ds(j, 1), :] for j in range(tile.K_ROWS))
    kc = tuple(kc_ref[:, pl.ds(j, 1)] for j in range(tile.K_ROWS))
    e_tab = e_ref[...]

    def one_block(i, carry):
      t0 = pl.multiple_of(i * block_q, block_q)
      rows = pl.ds(t0, block_q)
      qi = tuple(qi_ref[rows, pl.ds(j, 1)] for j in range(tile.Q_COLS))
      setup = tile.block_setup(kr, kc, e_tab, qi[tile.Q_N], t0, block_q, contraction)

      def one_head(hd, carry):
        o_ref[hd, rows, :] = rows_fn(q_ref[hd, rows, :], k_ref[hd], setup, qi, kr)
        return carry

      return jax.lax.fori_loop(0, h, one_head, carry)

    jax.lax.fori_loop(0, nq, one_block, 0)

  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((b, h, kp, tile.E_COLS), jnp.float32),
      grid=(b,),
      in_specs=[
          pl.BlockSpec((None, h, kp, e), lambda bi: (bi, 0, 0, 0)),
          pl.BlockSpec((None, h, kp, e), lambda bi: (bi, 0, 0, 0)),
          pl.BlockSpec((None, kp, tile.Q_COLS), lambda bi: (bi, 0, 0)),
          pl.BlockSpec((None, tile.K_ROWS, kp), lambda bi: (bi, 0, 0)),
          pl.BlockSpec((None, kp, tile.K_ROWS), lambda bi: (bi, 0, 0)),
          pl.BlockSpec((None, kp, tile.E_COLS), lambda bi: (bi, 0, 0)),
      ],
      out_specs=pl.BlockSpec((None, h, kp, tile.E_COLS), lambda bi: (bi, 0, 0, 0)),
      interpret=interpret,
      compiler_params=None if interpret else pltpu.CompilerParams(
          dimension_semantics=("parallel",)),
      name="heads_jax_statistics_v2",
  )(qt, kt, tables["q_info"], tables["k_rows"], tables["k_cols"], tables["e_table"])


def _prepare(query, key, tables, wrapper, block_q, platform, interpret):
  """The checked settings of ``kernel_layer_stats`` / ``kernel_layer_rows``: the queries and keys
  padded to the tables' length, the wrapper, the block, whether to interpret."""
  wrapper = wrapper or default_wrapper(platform)
  if wrapper not in WRAPPERS:
    raise ValueError(f"wrapper must be one of {WRAPPERS}, got {wrapper!r}")
  b, k, h, e = query.shape
  kp = tables["q_info"].shape[1]
  block_q = min(block_q or BLOCK_Q[wrapper], kp)
  if kp % block_q:
    raise ValueError(f"block_q {block_q} must divide the tables' length {kp} "
                     f"(kernel_tables(keys=padded_length(...)))")
  if kp != k:
    pad = ((0, 0), (0, kp - k), (0, 0), (0, 0))
    query, key = jnp.pad(query, pad), jnp.pad(key, pad)
  native = {"triton": "gpu", "mosaic": "tpu"}.get(wrapper)
  if interpret is None:
    interpret = native is not None and target_platform(platform) != native
  return query, key, wrapper, block_q, interpret


def kernel_layer_rows(query, key, tables: dict, roles: Sequence[str], direction: str = "dep2head",
                      *, wrapper: str | None = None, block_q: int | None = None, interpret=None,
                      contraction: str = "hilo", platform: str | None = None,
                      num_warps: int | None = None,
                      num_stages: int | None = None, block_k: int | None = None,
                      keys_outer: bool = True, static: int = TRITON_STATIC,
                      heads_per_program: int | str | None = None):
  """The Pallas program alone: every head's per-row results ``[b, h, kp, E_COLS]``
  (``tile.head_rows``) of one layer; arguments as ``kernel_layer_stats`` (``"triton"`` or
  ``"mosaic"``). What
  ``kernel_layer_stats`` adds is XLA's channel sums over these rows (``bench/analysis_ab.py``
  times the two apart)."""
  rows_fn, _ = _row_fns(check_roles(roles), check_direction(direction), False,
                        float(1.0 / query.shape[-1] ** 0.5), "slots" in tables)
  query, key, wrapper, block_q, interpret = _prepare(query, key, tables, wrapper, block_q,
                                                     platform, interpret)
  if wrapper == "triton":
    given = {"block_k": block_k, "heads_per_program": heads_per_program, "num_warps": num_warps}
    t = {**TRITON_DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
    return _triton_rows(query, key, tables, rows_fn, block_q, contraction, interpret,
                        t["num_warps"], num_stages, key_block(query.shape[1], t["block_k"]),
                        keys_outer, static, t["heads_per_program"])
  if wrapper == "mosaic":
    return _mosaic_rows(query, key, tables, rows_fn, block_q, contraction, interpret)
  raise ValueError(f"kernel_layer_rows runs a Pallas wrapper ('triton', 'mosaic'), got {wrapper!r}")


def kernel_layer_stats(query, key, tables: dict, roles: Sequence[str], direction: str = "dep2head",
                       measures: bool = False, *, wrapper: str | None = None,
                       block_q: int | None = None, interpret=None, contraction: str = "hilo",
                       platform: str | None = None, num_warps: int | None = None,
                       num_stages: int | None = None, block_k: int | None = None,
                       keys_outer: bool = True, static: int = TRITON_STATIC,
                       heads_per_program: int | str | None = None, sums: str = "einsum",
                       blocks_per_step: int | None = None) -> dict:
  """One layer's statistics from its queries and keys ``[b, k, h, e]`` (before the ``1/sqrt(e)``
  scaling; any float dtype), with ``tables = kernel_tables(batch, roles, direction, measures,
  keys=kp)`` of the batch (kp: ``padded_length(k, wrapper, block_q)``, or k).

  Args:
    wrapper: ``"triton"``, ``"mosaic"`` or ``"xla"`` (default: ``default_wrapper(platform)``).
    block_q: query rows per tile (default ``BLOCK_Q[wrapper]``, at most the padded length).
    interpret: run a Pallas wrapper in the interpreter (``True``, or for ``"mosaic"`` a
      ``pltpu.InterpretParams()``); default: when ``platform`` is not the wrapper's.
    contraction: ``"hilo"`` (bf16 halves, the default) or ``"float32"`` (``tile.tile_values``).
    num_warps, num_stages: the Triton programs' warps (default ``TRITON_DEFAULTS``) and pipeline
      stages (default Triton's).
    block_k: the Triton program's keys per step (default ``TRITON_DEFAULTS``: the key loop over
      blocks of 32; ``ONE_PASS_KEYS`` holds all keys at once up to that length, ``key_block``).
    keys_outer: the key loop's second pass with key blocks outside the heads (each block's
      setup built once for all heads; ``_triton_rows``; the default), else heads outside.
    static: the Triton one-pass program's window corrections built once per block for all
      heads (``tile.block_setup``, default ``TRITON_STATIC``; further ones are built per head
      where a sequence needs them).
    heads_per_program: heads per Triton program (default ``TRITON_DEFAULTS``: one, heads on the
      grid; ``"all"``: one program a query block, building its setup once for all heads).
    sums: how XLA adds the Pallas rows' channels over the queries (``_weighted``).
    blocks_per_step: query blocks per ``lax.scan`` step of the ``"xla"`` wrapper (default 1 on
      CPUs, 32 elsewhere: fewer, larger steps; memory ``[b, h, 16 G, k]``).

  Returns:
    what ``heads_jax.stats.layerwise.reduce_layer`` returns: ``sieve_bias`` ``[b, h, r]`` (0
    where a sieve is empty), ``distance`` ``[b, h, 21]`` and with ``measures`` ``entropy``,
    ``cls_entropy`` ``[b, h]`` and ``token_attention`` ``[b, h, 5]``.
  """
  roles = check_roles(roles)
  direction = check_direction(direction)
  channels = num_channels(roles, measures)
  rows_fn, channels_fn = _row_fns(roles, direction, measures, float(1.0 / query.shape[-1] ** 0.5),
                                  "slots" in tables)
  query, key, wrapper, block_q, _ = _prepare(query, key, tables, wrapper, block_q, platform,
                                             interpret)
  if wrapper == "xla":
    sums = _xla_sums(query, key, tables, rows_fn, channels_fn, block_q, contraction, channels,
                     blocks_per_step or (1 if target_platform(platform) == "cpu" else 32))
  else:
    raw = kernel_layer_rows(query, key, tables, roles, direction, wrapper=wrapper,
                            block_q=block_q, interpret=interpret, contraction=contraction,
                            platform=platform, num_warps=num_warps, num_stages=num_stages,
                            block_k=block_k, keys_outer=keys_outer, static=static,
                            heads_per_program=heads_per_program)
    sums = _weighted(raw, tables["q_info"], tables["weights"], channels_fn, block_q, channels,
                     sums, slots=tables.get("slots"))
  return split_channels(sums, roles, measures)


def kernel_program_tables(batch, roles, direction, measures, *, wrapper: str,
                          block_q: int | None = None, slots: int = 0) -> dict:
  """``kernel_tables`` padded for ``wrapper`` (its key axis and channel width); ``slots``: a
  packed batch's sequences per row (0: unpacked)."""
  k = jnp.asarray(batch["attention_mask"]).shape[1]
  bq = block_q or BLOCK_Q[wrapper]
  kp = padded_length(k, wrapper, min(bq, k) if wrapper == "xla" else bq)
  return kernel_tables(batch, roles, direction, measures, keys=kp, slots=slots)


def kernel_reducer(tables: dict, roles: Sequence[str], direction: str = "dep2head",
                   measures: bool = False, *, wrapper: str, block_q: int | None = None,
                   interpret=None, mesh=None, platform: str | None = None,
                   contraction: str = "hilo", num_warps: int | None = None,
                   num_stages: int | None = None, block_k: int | None = None,
                   keys_outer: bool = True, static: int = TRITON_STATIC,
                   heads_per_program: int | str | None = None, sums: str = "einsum",
                   blocks_per_step: int | None = None):
  """The model's ``attention_reduce`` hook for kernel v2 (needs no probabilities: the model keeps
  its fast attention and the tile recomputes the scores from the queries and keys).

  With a ``mesh`` of several devices a Pallas wrapper runs under ``jax.shard_map`` over its
  ``data`` axis (a Pallas call is not partitioned by XLA): every device reduces its own rows.
  """
  roles = check_roles(roles)
  stats = functools.partial(kernel_layer_stats, roles=roles, direction=direction,
                            measures=measures, wrapper=wrapper, block_q=block_q,
                            interpret=interpret, contraction=contraction, platform=platform,
                            num_warps=num_warps, num_stages=num_stages, block_k=block_k,
                            keys_outer=keys_outer, static=static,
                            heads_per_program=heads_per_program, sums=sums,
                            blocks_per_step=blocks_per_step)
  if wrapper != "xla" and mesh is not None and mesh.size > 1:
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
                   slots: int = 0, **settings):
  """``(fn, args)``: the Triton program of one layer (``kernel_layer_rows``, GPU settings) and
  abstract arguments of that shape (queries and keys ``[b, k, h, e]`` in ``dtype``, the tables of
  a ``k``-position batch), for ``heads_jax.stats.sm90.compile_kernels(fn, *args)`` (the offline
  sm_90 compile; BERT-base's shape by default; ``slots``: the packed program). ``settings``:
  ``kernel_layer_rows``' keywords."""
  kp = padded_length(k, "triton", settings.get("block_q") or BLOCK_Q["triton"])
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)                    # noqa: E731
  qk = jax.ShapeDtypeStruct((b, k, h, e), jnp.dtype(dtype))
  tables = {"q_info": i32(b, kp, tile.Q_COLS), "k_rows": i32(b, tile.K_ROWS, kp),
            "k_cols": i32(b, kp, tile.K_ROWS),
            "e_table": jax.ShapeDtypeStruct((b, kp, tile.E_COLS), jnp.float32)}
  if slots:
    tables["slots"] = jax.ShapeDtypeStruct((b, kp, slots), jnp.float32)

  def fn(query, key, tables):
    return kernel_layer_rows(query, key, tables, roles, direction, wrapper="triton",
                             platform="gpu", interpret=False, **settings)
  return jax.jit(fn), (qk, qk, tables)
