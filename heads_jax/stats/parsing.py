"""Heads as dependency parsers (Clark et al. 2019, section 4), reduced on the device (jnp).

Each head's token-to-token attention ``alpha[q, k]`` becomes a word-to-word map: attention *to*
a word is the sum over its pieces, attention *from* a word the mean over its pieces
(Clark et al.: "For attention to a split-up word, we sum up the attention weights over its
tokens. For attention from a split-up word, we take the mean of the attention weights over its
tokens."). ``[CLS]``, ``[SEP]`` and padding belong to no word (``word_ids == -1``) and are
neither predicted nor predicting. A head's prediction for word ``i`` is the other word ``j != i``
it attends to most: ``argmax_j word_attention[i, j]``.

``predicted_heads`` computes this from a whole map (the definition; ``word_attention`` is
``[b, h, w, w]``); the analysis's second pass takes the same predictions from a loop over key
blocks instead (``key_block_loop``: a streaming arg-max, memory linear in the length;
``tests/stats/test_norms_mapfree.py`` checks it equals ``predicted_heads``), on tiles sliced from
a layer's map or recomputed from its queries and keys (``heads_jax.stats.norms``).

One prediction array serves both directions of an arc (``heads_jax.hoststats.parsing`` scores
them): dependent -> head is right when ``pred[dependent] == head``, head -> dependent when
``pred[head] == dependent``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


def word_onehot(word_ids, num_words: int) -> jnp.ndarray:
  """float32 ``[b, k, w]``: 1 where piece k belongs to word w (``word_ids`` ``[b, k]``, -1 for
  no word); words at or beyond ``num_words`` are dropped."""
  word_ids = jnp.asarray(word_ids)
  return (word_ids[:, :, None] == jnp.arange(num_words)[None, None, :]).astype(jnp.float32)


def word_attention(probs, word_ids, num_words: int) -> jnp.ndarray:
  """Word-to-word attention ``[b, h, w, w]`` (from word i, row, to word j, column) from
  ``probs`` ``[b, h, q, k]``: the sum over j's pieces of the mean over i's pieces. Rows of
  words with no piece are 0."""
  onehot = word_onehot(word_ids, num_words)                          # [b, k, w]
  count = jnp.sum(onehot, axis=1)                                    # [b, w]
  to_word = jnp.einsum("bhqk,bkw->bhqw", probs.astype(jnp.float32), onehot, precision=_HIGHEST)
  mean_from = onehot / jnp.maximum(count, 1.0)[:, None, :]           # [b, q, w]
  return jnp.einsum("bqi,bhqj->bhij", mean_from, to_word, precision=_HIGHEST)


def predicted_heads(probs, word_ids, num_words: int | None = None) -> jnp.ndarray:
  """Each head's predicted word per word: int32 ``[b, h, w]``, the index of the other word with
  the most word-level attention, -1 for a word with no piece or no other word
  (``num_words`` defaults to the padded length k, an upper bound on the words)."""
  k = probs.shape[-1]
  w = k if num_words is None else int(num_words)
  att = word_attention(probs, word_ids, w)                           # [b, h, w, w]
  present = jnp.sum(word_onehot(word_ids, w), axis=1) > 0            # [b, w]
  other = ~jnp.eye(w, dtype=bool)
  allowed = present[:, None, None, :] & other[None, None]            # [b, 1, w, w]
  scores = jnp.where(allowed, att, -jnp.inf)
  pred = jnp.argmax(scores, axis=-1).astype(jnp.int32)
  ok = present[:, None, :] & jnp.any(allowed, axis=-1)
  return jnp.where(ok, pred, -1)


# ------------------------------------------------------------------------------------------------
# The same predictions without a map: a streaming arg-max over key blocks

KEY_BLOCK = 128   # keys per step of the key-block loop (``key_block_loop``)


def word_layout(word_ids, segment_ids) -> dict:
  """The words of each row as runs (host-free, int32, every array linear in the length):

  A word is a maximal run of positions with the same word id >= 0 and the same segment (word
  pieces are contiguous; a packed row restarts word ids per sequence). Word ``g`` of a row
  (``g = 0..``, in position order) is its ``g``-th run. Returns ``word`` ``[b, k]`` (the run of
  each position, -1 off words), ``last`` ``[b, k]`` (the run most recently begun at or before
  each position, -1 before the first), ``word_id`` / ``word_segment`` ``[b, k]`` (per run g < the
  row's run count: its word id and segment; -1 beyond) and ``count`` float32 ``[b, k]`` (pieces
  per run)."""
  wid = jnp.asarray(word_ids).astype(jnp.int32)
  seg = jnp.asarray(segment_ids).astype(jnp.int32)
  b, k = wid.shape
  piece = wid >= 0
  prev_w = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), wid[:, :-1]], axis=1)
  prev_s = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), seg[:, :-1]], axis=1)
  start = piece & ((wid != prev_w) | (seg != prev_s))
  last = jnp.cumsum(start.astype(jnp.int32), axis=1) - 1                   # [b, k]
  word = jnp.where(piece, last, -1)
  runs = jnp.arange(k, dtype=jnp.int32)
  first_pos = jax.vmap(lambda row: jnp.searchsorted(row, runs, side="left"))(last)  # [b, k]
  exists = runs[None, :] <= last[:, -1:]
  at = jnp.clip(first_pos, 0, k - 1)
  word_id = jnp.where(exists, jnp.take_along_axis(wid, at, axis=1), -1)
  word_segment = jnp.where(exists, jnp.take_along_axis(seg, at, axis=1), -1)
  count = jax.vmap(lambda w: jnp.zeros(k, jnp.float32).at[w].add(1.0, mode="drop"))(
      jnp.where(piece, word, k))
  return {"word": word, "last": last, "word_id": word_id, "word_segment": word_segment,
          "count": count}


def _query_words(tile, layout) -> jnp.ndarray:
  """``[b, h, W, BK]``: each run's mean over its pieces (as queries) of ``tile`` ``[b, h, q,
  BK]`` (W = q; rows of absent runs 0)."""
  b, h, q, bk = tile.shape
  word = layout["word"]                                                   # [b, q]
  ids = jnp.where(word >= 0, word + q * jnp.arange(b, dtype=jnp.int32)[:, None], b * q)
  data = jnp.transpose(tile, (0, 2, 1, 3)).reshape(b * q, h, bk)
  sums = jax.ops.segment_sum(data, ids.reshape(-1), num_segments=b * q)   # [b q, h, BK]
  sums = jnp.transpose(sums.reshape(b, q, h, bk), (0, 2, 1, 3))
  return sums / jnp.maximum(layout["count"], 1.0)[:, None, :, None]


def _run_sums(x, local, valid):
  """Per local run j = 0..BK-1 of a key block: the sum of ``x`` ``[..., BK]`` over the block's
  keys with ``local == j`` and ``valid`` (``local`` ``[b, BK]`` non-decreasing, ``valid`` bool
  ``[b, BK]``; broadcast over x's middle axes), as differences of a cumulative sum at each run's
  last key."""
  bk = local.shape[-1]
  c = jnp.cumsum(jnp.where(valid[:, None, None, :], x, 0.0), axis=-1)
  ends = jax.vmap(lambda row: jnp.searchsorted(row, jnp.arange(bk), side="right") - 1)(local)
  taken = jnp.where(ends[:, None, None, :] >= 0,
                    jnp.take_along_axis(c, jnp.clip(ends, 0)[:, None, None, :].astype(jnp.int32)
                                        * jnp.ones(c.shape[:-1] + (1,), jnp.int32), axis=-1), 0.0)
  before = jnp.concatenate([jnp.zeros_like(taken[..., :1]), taken[..., :-1]], axis=-1)
  return taken - before


def key_block_loop(tile_fn, blocks: int, block_k: int, layout, real_q, parsing: bool = True):
  """One pass over the key blocks of a layer's attention (``tile_fn(i) -> float32 [b, h, q,
  BK]``, the probabilities of every query on keys ``i BK .. (i + 1) BK - 1``; 0 where a query
  does not see the key): each key's mass over the real queries (``real_q`` float32 ``[b, q]``),
  float32 ``[b, h, blocks BK]``, and with ``parsing`` each run's predicted run (the
  ``predicted_heads`` of the run's word, as a run index; -1 where none), int32 ``[b, h, W]``.

  The prediction is a streaming arg-max: in each block the runs' to-word sums (sums over the
  block's pieces of each run, ``_run_sums``, of the from-word means, ``_query_words``); a run
  that goes on past the block's end stays open (its partial sum carried) and is compared once it
  ends, so runs are compared in position order and the first maximum wins, as ``argmax`` does.
  Memory: ``[b, h, q, BK]`` per step (linear in the length)."""
  first = jax.eval_shape(tile_fn, 0)
  b, h, q, bk = first.shape
  if bk != block_k:
    raise ValueError(f"tile_fn gave {bk} keys a block, expected {block_k}")
  w = q
  last = jnp.pad(layout["last"], ((0, 0), (0, blocks * bk - layout["last"].shape[1])),
                 mode="edge")
  word_k = jnp.pad(layout["word"], ((0, 0), (0, blocks * bk - layout["word"].shape[1])),
                   constant_values=-1)
  own = jnp.arange(w, dtype=jnp.int32)                                    # the query run i
  q_seg = layout["word_segment"]                                          # [b, W]
  neg = jnp.float32(-jnp.inf)

  def offer(best, arg, value, index, ok):
    """Keeps the earlier run on ties: ``value`` [b, h, W] of run ``index`` [b, 1, 1] or
    [b, 1, W]-broadcastable, where ``ok``."""
    value = jnp.where(ok, value, neg)
    better = value > best
    return jnp.where(better, value, best), jnp.where(better, index, arg)

  def step(i, carry):
    mass, best, arg, open_sum, open_g = carry
    tile = tile_fn(i)                                                     # [b, h, q, BK]
    mass = jax.lax.dynamic_update_slice_in_dim(
        mass, jnp.einsum("bhqk,bq->bhk", tile, real_q, precision=_HIGHEST), i * bk, axis=2)
    if not parsing:
      return mass, best, arg, open_sum, open_g
    runs_k = jax.lax.dynamic_slice_in_dim(last, i * bk, bk, axis=1)       # [b, BK]
    piece = jax.lax.dynamic_slice_in_dim(word_k, i * bk, bk, axis=1) >= 0
    base = runs_k[:, :1]                                                  # [b, 1]
    local = runs_k - base                                                 # [b, BK], 0..
    from_words = _query_words(tile, layout)                              # [b, h, W, BK]
    sums = _run_sums(from_words, local, piece)                            # [b, h, W, BK]
    present = _run_sums(jnp.ones((b, 1, 1, bk), jnp.float32), local, piece)[:, 0, 0] > 0
    cont = (base[:, 0] == open_g)                                         # the open run goes on
    # the open run ends before this block: offer it first (its index is the smallest)
    ended = (open_g >= 0) & ~cont
    seg_open = jnp.take_along_axis(q_seg, jnp.clip(open_g, 0)[:, None], axis=1)  # [b, 1]
    ok = (ended[:, None, None] & (open_g[:, None, None] != own[None, None, :])
          & (seg_open[:, :, None] == q_seg[:, None, :]) & (open_sum > neg))
    best, arg = offer(best, arg, open_sum, open_g[:, None, None], ok)
    carried = jnp.where(cont[:, None, None], open_sum, neg)
    sums = sums.at[..., 0].add(jnp.where(cont[:, None, None], jnp.maximum(carried, 0.0), 0.0))
    present = present.at[:, 0].set(present[:, 0] | (cont & (open_sum[:, 0, 0] > neg)))
    j_last = local[:, -1]                                                 # [b]
    index = base + jnp.arange(bk, dtype=jnp.int32)[None]                  # [b, BK] run index
    seg_k = jnp.take_along_axis(q_seg, jnp.clip(index, 0, w - 1), axis=1)  # [b, BK]
    closed = (jnp.arange(bk)[None] < j_last[:, None]) & present & (index >= 0)
    allowed = (closed[:, None, None, :] & (index[:, None, None, :] != own[None, None, :, None])
               & (seg_k[:, None, None, :] == q_seg[:, None, :, None]))     # [b, 1, W, BK]
    scored = jnp.where(allowed, sums, neg)
    top = jnp.argmax(scored, axis=-1)                                     # first maximum
    value = jnp.take_along_axis(scored, top[..., None], axis=-1)[..., 0]
    best, arg = offer(best, arg, value, jnp.take_along_axis(
        jnp.broadcast_to(index[:, None, None, :], scored.shape), top[..., None], axis=-1)[..., 0],
        value > neg)
    # the block's last run stays open
    open_sum = jnp.take_along_axis(sums, j_last[:, None, None, None] * jnp.ones(
        (b, h, w, 1), jnp.int32), axis=-1)[..., 0]
    has = jnp.take_along_axis(present, j_last[:, None], axis=1)[:, 0]    # [b]
    open_sum = jnp.where(has[:, None, None], open_sum, neg)
    open_g = jnp.where(has, (base[:, 0] + j_last), -1)
    return mass, best, arg, open_sum, open_g

  init = (jnp.zeros((b, h, blocks * bk), jnp.float32), jnp.full((b, h, w), neg, jnp.float32),
          jnp.full((b, h, w), -1, jnp.int32), jnp.full((b, h, w), neg, jnp.float32),
          jnp.full((b,), -1, jnp.int32))
  mass, best, arg, open_sum, open_g = jax.lax.fori_loop(0, blocks, step, init)
  if not parsing:
    return mass, None
  seg_open = jnp.take_along_axis(q_seg, jnp.clip(open_g, 0)[:, None], axis=1)
  ok = ((open_g >= 0)[:, None, None] & (open_g[:, None, None] != own[None, None, :])
        & (seg_open[:, :, None] == q_seg[:, None, :]) & (open_sum > neg))
  best, arg = offer(best, arg, open_sum, open_g[:, None, None], ok)
  return mass, arg


def run_predictions(arg, layout, slots: int, length: int) -> jnp.ndarray:
  """``key_block_loop``'s run predictions ``[b, h, W]`` -> ``predicted_heads``' form per
  sequence: int32 ``[b, h, S, length]`` (S = ``max(slots, 1)``), the predicted word id at each
  word id of the sequence in slot s (segment s + 1), -1 where none."""
  b, h, w = arg.shape
  s = max(int(slots), 1)
  wid, wseg = layout["word_id"], layout["word_segment"]                   # [b, W]
  target = jnp.where(arg >= 0, jnp.take_along_axis(
      jnp.broadcast_to(wid[:, None, :], arg.shape), jnp.clip(arg, 0), axis=-1), -1)
  slot = (wseg - 1) if slots else jnp.zeros_like(wseg)
  where = jnp.where((wid >= 0) & (wid < length) & (slot >= 0) & (slot < s),
                    slot * length + wid, s * length)                      # [b, W]
  out = jax.vmap(lambda t, i: jnp.full((h, s * length), -1, jnp.int32).at[:, i].set(
      t, mode="drop"))(target, where)
  return out.reshape(b, h, s, length)
