"""Sieves: boolean role masks over (query, key) positions, built from an encoded batch (jnp).

A sieve ``S(t)`` is, for each query position ``t``, the set of key positions a head with that
role is expected to attend to (DESIGN.md section 3). Here every sieve is a boolean mask
``[b, r, q, k]``: ``sieves[i, j, t, s]`` is True when key ``s`` is in role ``j``'s sieve of
query ``t`` of sequence ``i``. Padding is never a query and never a key (its rows and columns
are all False), so ``|S(t)|`` is simply the row count.

=================  ==========================================================================
role               S(t)
=================  ==========================================================================
``local``          ``{s : |s - t| <= 2}``, self included, clipped to the real positions
``prev_local``     ``{t-2, t-1}`` clipped
``next_local``     ``{t+1, t+2}`` clipped
``block``          non-special positions (not ``[CLS]``/``[SEP]``) with t's token type; only
                   for pairs (any real position with token type 1), empty for single texts.
                   Commas and periods are ordinary sentence positions here.
``block_plain``    the same mask as ``block`` (the statistic differs, not the sieve)
``cls``            ``{0}``
``sep``            every ``[SEP]`` position
``delimiter``      ``cls`` union ``sep``
``nsubj`` ...      dependent -> head: when t's word is the dependent of an arc with that
                   relation, all wordpieces of the head word; otherwise empty. With
                   ``direction="both"`` also head -> dependent: all wordpieces of the
                   words that depend on t's word by that relation.
``syntactic``      union of ``nsubj``, ``obj``, ``amod``, ``advmod``
=================  ==========================================================================

Each role's sieve kind and parameters come from the role registry
(``heads_jax.data.vocabulary.REGISTRY``); the table above is the registry's content.

This module is pure ``jax.numpy`` on an encoded batch (``heads_jax.data.vocabulary``); it never
imports the model (the two meet only in ``heads_jax.stats.step``). It is jit-friendly when
``roles`` and ``direction`` are static.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp

from heads_jax.data import vocabulary as vocab
from heads_jax.data.vocabulary import ROLES, TOKEN_CLS, TOKEN_COMMA, TOKEN_PERIOD, TOKEN_SEP

DIRECTIONS = ("dep2head", "both")

# Index of each distance feature in the 21-vector (DESIGN.md: windows 0..15, self, [CLS],
# [SEP], ',', '.').
NUM_WINDOWS = 16
SELF_FEATURE = 16
CLS_FEATURE, SEP_FEATURE, COMMA_FEATURE, PERIOD_FEATURE = 17, 18, 19, 20
NUM_DISTANCE_FEATURES = 21


def check_roles(roles: Sequence[str]) -> tuple[str, ...]:
  """Validates role names against ``ROLES``; returns them as a tuple (order kept)."""
  roles = tuple(roles)
  unknown = [r for r in roles if r not in vocab.ROLE_TABLE]
  if unknown:
    raise ValueError(f"unknown role(s) {unknown}; choose from {list(vocab.ROLE_TABLE)} (the "
                     f"role registry, heads_jax/data/vocabulary.py)")
  if len(set(roles)) != len(roles):
    raise ValueError(f"roles must not repeat, got {list(roles)}")
  if not roles:
    raise ValueError("roles is empty; pass at least one of " + ", ".join(vocab.ROLE_TABLE))
  return roles


def check_direction(direction: str) -> str:
  if direction not in DIRECTIONS:
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
  return direction


def segments_of(batch: dict) -> jnp.ndarray:
  """int32 ``[b, k]``: the batch's ``segment_ids`` (packed rows: 1, 2, ... per sequence of a row,
  0 on padding), or for an unpacked batch 1 on its real positions and 0 on padding."""
  if batch.get("segment_ids") is not None:
    return jnp.asarray(batch["segment_ids"]).astype(jnp.int32)
  return (jnp.asarray(batch["attention_mask"]) > 0).astype(jnp.int32)


def same_segment(segment_ids) -> jnp.ndarray:
  """bool ``[b, q, k]``: query and key are real positions of the same sequence (segment)."""
  seg = jnp.asarray(segment_ids)
  return (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)


def segment_positions(segment_ids) -> jnp.ndarray:
  """int32 ``[b, k]``: each position's index inside its own segment (0 at a sequence's first
  position; the padding run after the last sequence counts on from 0 too). For an unpacked row
  this is ``0..k-1`` over the real positions: the model's positions of each sequence alone."""
  seg = jnp.asarray(segment_ids).astype(jnp.int32)
  k = seg.shape[-1]
  pos = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), seg.shape)
  starts = jnp.concatenate([jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  first = jax.lax.cummax(jnp.where(starts, pos, 0), axis=1)
  return pos - first


def real_pairs(attention_mask, segment_ids=None) -> jnp.ndarray:
  """bool ``[b, q, k]``: both the query and the key are real (non-padding) positions, and with
  ``segment_ids`` (packed rows) of the same sequence."""
  real = jnp.asarray(attention_mask) > 0
  pairs = real[:, :, None] & real[:, None, :]
  if segment_ids is not None:
    pairs = pairs & same_segment(segment_ids)
  return pairs


def _offsets(k: int) -> jnp.ndarray:
  """int32 ``[q, k]``: ``s - t`` for query t (rows) and key s (columns)."""
  pos = jnp.arange(k, dtype=jnp.int32)
  return pos[None, :] - pos[:, None]


def _relation_sieve(word_ids, dep_head, dep_rel, rel_ids, direction: str) -> jnp.ndarray:
  """bool ``[b, q, k]`` for the union of relations ``rel_ids``, before the padding mask."""
  has_rel = functools.reduce(jnp.logical_or, [dep_rel == r for r in rel_ids])
  # dependent -> head: t's word depends on s's word by one of the relations.
  dep_of = has_rel & (dep_head >= 0)                                  # [b, q]
  sieve = dep_of[:, :, None] & (word_ids[:, None, :] == dep_head[:, :, None])
  if direction == "both":
    # head -> dependent: s's word depends on t's word by one of the relations.
    head_of = has_rel & (dep_head >= 0)                               # [b, k]
    sieve = sieve | (head_of[:, None, :] & (word_ids[:, :, None] >= 0)
                     & (dep_head[:, None, :] == word_ids[:, :, None]))
  return sieve


def build_sieves(batch: dict, roles: Sequence[str] = ROLES, direction: str = "dep2head"):
  """Role masks of an encoded batch.

  Args:
    batch: encoded batch (``heads_jax.data.vocabulary``); uses ``attention_mask``,
      ``token_type_ids``, ``token_class``, ``word_ids``, ``dep_head``, ``dep_rel``, all
      ``[b, k]`` (numpy or jax arrays); a packed batch also carries ``segment_ids`` ``[b, k]``
      (1, 2, ... per sequence of a row, 0 on padding): every sieve then stays inside its
      query's sequence, whose first position is its ``[CLS]`` and whose token types decide
      whether it is a pair (``segments_of``).
    roles: role names, a subset of ``ROLES`` in any order; the output's r axis follows it.
    direction: ``"dep2head"`` (default, as the paper's code) or ``"both"`` (adds
      head -> dependent for the relation roles and ``syntactic``).

  Returns:
    bool ``[b, r, q, k]`` with q = k = the padded length.
  """
  roles = check_roles(roles)
  direction = check_direction(direction)
  missing = [f for f in ("attention_mask", "token_type_ids", "token_class", "word_ids",
                         "dep_head", "dep_rel") if f not in batch]
  if missing:
    raise KeyError(f"batch lacks field(s) {missing}; encode it with heads_jax.data "
                   "(see heads_jax/data/vocabulary.py for the format)")
  mask = jnp.asarray(batch["attention_mask"])
  if mask.ndim != 2:
    raise ValueError(f"batch fields must be [b, k]; attention_mask has shape {mask.shape}")
  real = mask > 0
  token_type = jnp.asarray(batch["token_type_ids"])
  token_class = jnp.asarray(batch["token_class"])
  word_ids = jnp.asarray(batch["word_ids"])
  dep_head = jnp.asarray(batch["dep_head"])
  dep_rel = jnp.asarray(batch["dep_rel"])
  b, k = mask.shape

  segments = segments_of(batch)                                       # [b, k]
  pairs = real_pairs(mask, segments)                                  # [b, q, k]
  off = _offsets(k)[None]                                             # [1, q, k]
  key_is = lambda x: x[:, None, :]                                    # noqa: E731  [b, 1, k]

  # per query: its sequence (segment) is a pair (it has a real position of token type 1)
  is_pair = jnp.any(pairs & key_is(token_type == 1), axis=2)          # [b, q]
  special = (token_class == TOKEN_CLS) | (token_class == TOKEN_SEP)
  key_masks = {vocab.KEY_POSITION0: key_is(segment_positions(segments) == 0),  # [CLS] position
               vocab.KEY_SEP: key_is(token_class == TOKEN_SEP)}

  def sieve(name):
    """The sieve of one registry role (`heads_jax.data.vocabulary.REGISTRY`)."""
    role = vocab.role(name)
    if role.sieve == vocab.SIEVE_OFFSETS:
      lo, hi = role.offsets
      s = (off >= lo) & (off <= hi)
    elif role.sieve == vocab.SIEVE_BLOCK:
      s = (is_pair[:, :, None] & key_is(~special)
           & (token_type[:, :, None] == token_type[:, None, :]))
    elif role.sieve == vocab.SIEVE_KEYS:
      s = functools.reduce(jnp.logical_or, [key_masks[kind] for kind in role.keys])
    elif role.sieve == vocab.SIEVE_RELATION:
      s = _relation_sieve(word_ids, dep_head, dep_rel, role.relations, direction)
    else:  # pragma: no cover - Role validates its kind
      raise ValueError(f"role {name!r} has sieve kind {role.sieve!r}, which heads_jax.sieves "
                       f"does not build")
    return jnp.broadcast_to(s, (b, k, k)) & pairs

  return jnp.stack([sieve(r) for r in roles], axis=1)


def distance_bins(token_class, attention_mask, segment_ids=None) -> jnp.ndarray:
  """The distance feature (0..20) each (query, key) pair contributes to, int32 ``[b, q, k]``.

  Per DESIGN.md (Guan et al.): the key t itself -> ``SELF_FEATURE`` (16; self wins over
  special); a ``[CLS]``/``[SEP]``/``,``/``.`` key -> 17/18/19/20; any other real key at
  distance ``d = |s - t| >= 1`` -> window ``min(15, floor(16 * d / n))`` with n the number of
  real positions. ``,`` and ``.`` count as special here: such a key goes to its own feature,
  never to a window. Pairs with a padding query or key get -1 (no feature). With
  ``segment_ids`` (packed rows) n is the query's own sequence's length and pairs across
  sequences get -1 too.
  """
  token_class = jnp.asarray(token_class)
  mask = jnp.asarray(attention_mask)
  b, k = mask.shape
  pairs = real_pairs(mask, segment_ids)                               # [b, q, k]
  n = jnp.maximum(jnp.sum(pairs, axis=2), 1).astype(jnp.int32)        # [b, q]
  off = _offsets(k)
  dist = jnp.abs(off)[None]                                           # [1, q, k]
  window = jnp.minimum(NUM_WINDOWS - 1, (NUM_WINDOWS * dist) // n[:, :, None])
  kc = token_class[:, None, :]                                        # [b, 1, k]
  bins = jnp.where(kc == TOKEN_CLS, CLS_FEATURE,
         jnp.where(kc == TOKEN_SEP, SEP_FEATURE,
         jnp.where(kc == TOKEN_COMMA, COMMA_FEATURE,
         jnp.where(kc == TOKEN_PERIOD, PERIOD_FEATURE, window))))
  bins = jnp.where(dist == 0, SELF_FEATURE, bins)
  return jnp.where(pairs, bins, -1).astype(jnp.int32)
