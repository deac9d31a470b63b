"""Heads as dependency parsers (Clark et al. 2019, section 4), reduced on the device (jnp).

Each head's token-to-token attention ``alpha[q, k]`` becomes a word-to-word map: attention *to*
a word is the sum over its pieces, attention *from* a word the mean over its pieces
(Clark et al.: "For attention to a split-up word, we sum up the attention weights over its
tokens. For attention from a split-up word, we take the mean of the attention weights over its
tokens."). ``[CLS]``, ``[SEP]`` and padding belong to no word (``word_ids == -1``) and are
neither predicted nor predicting. A head's prediction for word ``i`` is the other word ``j != i``
it attends to most: ``argmax_j word_attention[i, j]``.

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
