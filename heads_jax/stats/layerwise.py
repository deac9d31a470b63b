"""Per-layer reduction of attention to the analysis statistics (jnp, jit-friendly).

The analysis step (``heads_jax.stats.step``) hands ``layer_reducer(tables)`` to the model as its
``attention_reduce`` hook, so each layer's attention ``[b, h, q, k]`` is reduced right after its
softmax to the per-sequence statistics and no ``[b, l, h, q, k]`` stack, no normalised copy and
no entropy-weighted copy is ever made:

* one batched matmul ``[b, h, q*k] @ [b, q*k, C]`` against the weights of ``batch_tables`` gives
  every sieve-bias sum (roles), the 21 distance features and the 5 token measures at once
  (C = r + 21 [+ 5]); the weights depend on the batch only and are built once per batch;
* one fused pass gives each row's mass ``T`` and ``sum a ln a``, i.e. its entropy
  ``H = ln T - sum(a ln a) / T`` (for ``block`` and the entropy measures);
* ``block`` (bias x row entropy) needs the entropy per query: a small matmul of the attention
  with the two "non-special key of token type 0 / 1" columns ``[b, k, 2]`` gives each query's
  mass in its block, weighted by ``H(t)`` and summed over the queries.

The rows are taken as they come from the model's softmax: normalised over the real keys. The
stand-alone functions (``sieve_bias``, ``distance_features``, ``measures``) renormalise each row
first, which for a softmax row changes the result by float32 rounding only (about 1e-7
relative); ``tests/stats/test_fused.py`` checks the per-layer statistics against them and the
loop reference. Rows that do not sum to 1 (e.g. segment removal, never used by the analysis
step) need the stand-alone functions.

``finish`` turns the stacked per-layer outputs ``[b, l, h, ...]`` into the step's results
(NaN where a role's sieve is empty in a sequence). ``heads_jax.stats.fused`` computes the same
outputs from the queries and keys with a Pallas kernel that never writes the probabilities.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from heads_jax.data import vocabulary as vocab
from heads_jax.data.vocabulary import TOKEN_CLS, TOKEN_SEP
from heads_jax.sieves import (NUM_DISTANCE_FEATURES, build_sieves, check_direction, check_roles,
                              real_pairs, segment_positions, segments_of)
from heads_jax.stats.distance import _bin_weights, query_over_n
from heads_jax.stats.measures import _token_weights, js_distances
from heads_jax.stats.sieve_bias import entropy_weighted_mask, row_mass_entropy

_HIGHEST = jax.lax.Precision.HIGHEST
NUM_TOKEN_MEASURES = 5


def slot_onehot(segment_ids, slots: int) -> jnp.ndarray:
  """float32 ``[b, q, S]``: position q belongs to slot j (segment id j + 1) of its packed row."""
  seg = jnp.asarray(segment_ids)
  return (seg[:, :, None] == jnp.arange(1, slots + 1)).astype(jnp.float32)


def role_weights(sieves, attention_mask, segment_ids=None, slots: int = 0):
  """Per-query weights of the sieve-bias mean: ``n / (|S(t)| V)`` on queries with a non-empty
  sieve (V of them in the query's sequence), else 0; float32 ``[b, r, q]``, and the count V
  ``[b, r]`` (with ``slots`` S, a packed batch: ``[b, S, r]`` per sequence of each row, n and V
  of the query's own segment)."""
  size = jnp.sum(sieves, axis=-1).astype(jnp.float32)                         # [b, r, q]
  valid = size > 0
  if not slots:
    n = jnp.sum(jnp.asarray(attention_mask) > 0, axis=-1).astype(jnp.float32)   # [b]
    count = jnp.sum(valid, axis=-1).astype(jnp.float32)                         # [b, r]
    weight = jnp.where(valid, n[:, None, None] / (jnp.maximum(size, 1.0)
                                                  * jnp.maximum(count, 1.0)[:, :, None]), 0.0)
    return weight, count
  onehot = slot_onehot(segment_ids, slots)                                    # [b, q, S]
  n = jnp.sum(real_pairs(attention_mask, segment_ids), axis=-1).astype(jnp.float32)  # [b, q]
  count = jnp.einsum("brq,bqs->bsr", valid.astype(jnp.float32), onehot)      # [b, S, r]
  count_q = jnp.einsum("bsr,bqs->brq", count, onehot)                         # [b, r, q]
  weight = jnp.where(valid, n[:, None, :] / (jnp.maximum(size, 1.0) * jnp.maximum(count_q, 1.0)),
                     0.0)
  return weight, count


def block_columns(batch) -> jnp.ndarray:
  """float32 ``[b, k, 2]``: key s is real, not ``[CLS]``/``[SEP]``, and of token type 0 / 1
  (the ``block`` sieve of a query of that type, before the pair and query conditions; in a
  packed row the attention itself keeps a query to its own sequence's keys)."""
  real = jnp.asarray(batch["attention_mask"]) > 0
  tc = jnp.asarray(batch["token_class"])
  tt = jnp.asarray(batch["token_type_ids"])
  plain = real & (tc != TOKEN_CLS) & (tc != TOKEN_SEP)
  return jnp.stack([plain & (tt == 0), plain & (tt == 1)], axis=-1).astype(jnp.float32)


def batch_tables(batch, roles: Sequence[str], direction: str = "dep2head",
                 measures: bool = False, slots: int = 0) -> dict:
  """Everything the per-layer reduction needs from a batch (built once per batch, on device).

  Returns a dict: ``weights`` float32 ``[b, q*k, C]`` (roles, then 21 distance features, then
  with ``measures`` the 5 token measures), ``count`` ``[b, r]``, ``role_weight`` ``[b, r, q]``,
  ``block_cols`` ``[b, k, 2]``, ``token_type`` ``[b, q]``, ``real_over_n`` ``[b, q]`` and
  ``cls_real`` ``[b]``.

  With ``slots`` S (a packed batch: ``batch["segment_ids"]`` ``[b, k]``, 1..S per sequence of a
  row, 0 on padding), every weight is per sequence (its own length, sieves and [CLS]), ``count``
  is ``[b, S, r]``, ``cls_real`` ``[b, q]`` (the first position of each sequence) and ``slots``
  ``[b, q, S]`` says which slot each query feeds: the reduction then returns every statistic
  per slot (``reduce_layer``).
  """
  roles = check_roles(roles)
  direction = check_direction(direction)
  mask = jnp.asarray(batch["attention_mask"])
  b, k = mask.shape
  segments = segments_of(batch) if slots else None
  sieves = build_sieves(batch, roles, direction)                           # [b, r, q, k]
  weight, count = role_weights(sieves, mask, segments, slots)
  w = jnp.where(sieves, weight[..., None], 0.0)                           # [b, r, q, k]
  parts = [jnp.transpose(w, (0, 2, 3, 1)),
           _bin_weights(batch["token_class"], mask, False, segments)]     # [b, q, k, 21]
  if measures:
    parts.append(_token_weights(jnp.asarray(batch["token_class"]), mask, segments))  # [b, q, k, 5]
  weights = jnp.concatenate(parts, axis=-1).reshape(b, k * k, -1)
  tables = {"weights": weights, "count": count, "role_weight": weight,
            "block_cols": block_columns(batch), "token_type": jnp.asarray(batch["token_type_ids"]),
            "real_over_n": query_over_n(mask, segments)}
  real = (mask > 0).astype(jnp.float32)
  if slots:
    tables["slots"] = slot_onehot(segments, slots)
    tables["cls_real"] = real * (segment_positions(segments) == 0)
  else:
    tables["cls_real"] = real[:, 0]
  return tables


def _check_block_sieve(name: str) -> None:
  """This path weights by the entropy only roles with the block sieve (its mass per query comes
  from ``block_cols``)."""
  if vocab.role(name).sieve != vocab.SIEVE_BLOCK:
    raise ValueError(f"role {name!r} is entropy-weighted with a {vocab.role(name).sieve!r} sieve; "
                     f"the per-layer path weights only {vocab.SIEVE_BLOCK!r} sieves (use "
                     f"stats_impl='fused' or the reference heads_jax.stats.sieve_bias)")


def reduce_layer(probs, tables: dict, roles: Sequence[str], attention_mask,
                 measures: bool = False, columns=None, entropy=None) -> dict:
  """One layer's statistics from its attention ``probs`` float32 ``[b, h, q, k]`` (padding keys
  and padding query rows 0, rows normalised over the real keys; any number of heads, e.g. the
  ``l*h`` of a stack: ``reduce_stack``).

  Returns ``sieve_bias`` ``[b, h, r]`` (0 where the role's sieve is empty in the sequence:
  ``finish`` writes the NaN), ``distance`` ``[b, h, 21]`` and with ``measures`` ``entropy``,
  ``cls_entropy`` ``[b, h]`` and ``token_attention`` ``[b, h, 5]``; with packed tables
  (``batch_tables(..., slots=S)``) each with a slot axis after h (``[b, h, S, ...]``).

  ``columns`` ``[b, h, q, 2]`` (``probs @ block_cols``) and ``entropy`` ``[b, h, q]`` (each row's
  entropy), when the model computed them with the attention (``layer_reducer``), save this
  function its own passes over ``probs`` for them.
  """
  roles = tuple(roles)
  r = len(roles)
  b, h, q, k = probs.shape
  probs = probs.astype(jnp.float32)
  slots = tables.get("slots")                                             # [b, q, S] or None
  if slots is None:
    sums = jnp.matmul(probs.reshape(b, h, q * k), tables["weights"], precision=_HIGHEST)  # [b, h, C]
    per_sequence = lambda x, w: jnp.sum(x * w[:, None, :], axis=-1)      # noqa: E731  [b, h]
  else:
    # per query, then per slot: the FLOPs of the unpacked matmul, no S-fold weight table (the
    # [b, q, h, C] order runs about 1.5x faster on XLA:CPU than [b, h, q, C])
    per_query = jnp.einsum("bhqk,bqkc->bqhc", probs, tables["weights"].reshape(b, q, k, -1),
                           precision=_HIGHEST)
    sums = jnp.einsum("bqhc,bqs->bhsc", per_query, slots, precision=_HIGHEST)  # [b, h, S, C]
    per_sequence = lambda x, w: jnp.einsum("bhq,bqs->bhs", x, w[:, :, None] * slots,  # noqa: E731
                                           precision=_HIGHEST)
  out = {"sieve_bias": sums[..., :r],
         "distance": sums[..., r:r + NUM_DISTANCE_FEATURES]}
  weighted = np.flatnonzero(entropy_weighted_mask(roles))   # the registry's entropy-weighted roles
  if len(weighted) or measures:
    if entropy is None:
      _, entropy = row_mass_entropy(probs, attention_mask)                # [b, h, q]
    if len(weighted):
      if columns is None:
        columns = jnp.matmul(probs.reshape(b, h * q, k), tables["block_cols"],
                             precision=_HIGHEST).reshape(b, h, q, 2)
      own = jnp.where((tables["token_type"] == 0)[:, None, :], columns[..., 0], columns[..., 1])
    for j in weighted:
      _check_block_sieve(roles[j])
      block = per_sequence(own * entropy, tables["role_weight"][:, j, :])
      out["sieve_bias"] = out["sieve_bias"].at[..., j].set(block)
    if measures:
      out["entropy"] = per_sequence(entropy, tables["real_over_n"])
      if slots is None:
        out["cls_entropy"] = entropy[..., 0] * tables["cls_real"][:, None]
      else:
        out["cls_entropy"] = per_sequence(entropy, tables["cls_real"])
      out["token_attention"] = sums[..., r + NUM_DISTANCE_FEATURES:]
  return out


def finish(reduced: dict, tables: dict) -> dict:
  """Stacked per-layer outputs ``[b, l, h, ...]`` -> the step's results: NaN sieve bias where no
  query of the sequence has a non-empty sieve for the role. Packed outputs ``[b, l, h, S, ...]``
  come back per sequence slot, ``[b * S, l, h, ...]`` (row ``i * S + j``: slot j of row i)."""
  out = dict(reduced)
  if "slots" in tables:
    def unpack(x):
      x = jnp.moveaxis(x, 3, 1)                                           # [b, S, l, h, ...]
      return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])
    out = {name: unpack(x) for name, x in out.items()}
    count = tables["count"].reshape(-1, tables["count"].shape[-1])[:, None, None, :]
  else:
    count = tables["count"][:, None, None, :]
  out["sieve_bias"] = jnp.where(count > 0, out["sieve_bias"], jnp.nan)
  return out


def reduce_stack(attn, batch, roles: Sequence[str], direction: str = "dep2head",
                 measures: bool = False, js: bool = False, slots: int = 0) -> dict:
  """The step's results from the whole attention stack ``[b, l, h, q, k]`` (the ``stacked``
  path): ``reduce_layer`` on the stack seen as ``l*h`` heads, i.e. one weight table and one
  matmul for every role, distance feature and token measure, one entropy pass shared by
  ``block`` and the measures, and ``block``'s per-query mass from ``[b, lhq, k] @ [b, k, 2]``;
  no normalised or entropy-weighted copy of the stack (softmax rows already sum to 1 over the
  real keys; the stand-alone ``sieve_bias`` / ``distance_features`` / ``all_measures``, which
  renormalise, agree to float32 rounding). ``js`` adds ``measures.js_distances`` (unpacked
  batches only). Outputs as ``finish``.
  """
  attn = jnp.asarray(attn).astype(jnp.float32)
  b, l, h, q, k = attn.shape
  mask = jnp.asarray(batch["attention_mask"])
  measures = bool(measures or js)
  tables = batch_tables(batch, roles, direction, measures, slots)
  flat = reduce_layer(attn.reshape(b, l * h, q, k), tables, roles, mask, measures)
  out = finish({name: x.reshape((b, l, h) + x.shape[2:]) for name, x in flat.items()}, tables)
  if js:
    if slots:
      raise ValueError("js needs unpacked batches (the distances compare whole rows)")
    out["js"] = js_distances(attn, mask)
  return out


def layer_reducer(tables: dict, roles: Sequence[str], attention_mask, measures: bool = False):
  """The model's ``attention_reduce`` hook for the XLA per-layer path (needs the probabilities).

  It asks the model for ``probs @ block_cols`` inside its ``probs @ V`` product
  (``value_columns``) and for each row's entropy from the softmax (``wants_entropy``) where the
  model offers them (keywords ``columns``/``entropy``); a model that does not calls it with the
  five positional arguments and the reduction computes both itself.
  """
  roles = tuple(roles)
  needs = bool(entropy_weighted_mask(roles).any())

  def reduce(layer, probs, query, key, mask, columns=None, entropy=None):
    del layer, query, key, mask
    return reduce_layer(probs, tables, roles, attention_mask, measures, columns=columns,
                        entropy=entropy)

  reduce.needs_probs = True
  reduce.value_columns = tables["block_cols"] if needs else None
  reduce.wants_entropy = needs or bool(measures)
  return reduce
