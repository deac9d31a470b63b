"""Per-layer reduction of attention to the analysis statistics (jnp, jit-friendly).

The analysis step (``heads_jax.stats.step``) hands ``layer_reducer(tables)`` to the model as its
``attention_reduce`` hook, so each layer's attention ``[b, h, q, k]`` is reduced right after its
softmax to the per-sequence statistics and no ``[b, l, h, q, k]`` stack, no normalised copy and
no entropy-weighted copy is ever made. Every statistic is a weighted sum of the attention over
(query, key) pairs, computed per layer as (issue 38 item 4; ``_layout`` says which goes where):

* one batched matmul ``[b, h, q*k] @ [b, q*k, Cp]`` against the per-pair weights of
  ``batch_tables`` (built once per batch): the ``keys``, relation and plain ``block`` roles, 20
  of the 21 distance features and with the measures the [CLS], [SEP] and punctuation masses,
  padded to 32 columns (XLA:CPU's matmul takes 33 columns 1.4-1.5x longer than 32);
* the ``offsets`` roles, the distance feature "self" and the previous / next token masses from a
  few diagonals of the map (strided slices: ``diagonals``), weighted per query;
* the row entropy (``block``: bias x entropy, and the entropy measures) from one pass over the
  probabilities with the block masses ``probs @ block_cols`` ``[b, k, 2]``, only where read:
  with the measures, or when the batch has a pair sequence (``block``'s sieve is empty in single
  texts, and ``lax.cond`` skips the pass).

A packed batch (``slots``) does the same per query (``[b, q]``-batched products), then sums the
queries of each sequence. Padding query rows are never read (their weights are 0), so the model
need not zero them (``masks_padding_queries``).

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

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from heads_jax.data import vocabulary as vocab
from heads_jax.data.vocabulary import TOKEN_CLS, TOKEN_SEP
from heads_jax.sieves import (NUM_DISTANCE_FEATURES, SELF_FEATURE, build_sieves,
                              check_direction, check_roles, real_pairs, segment_positions,
                              segments_of)
from heads_jax.stats.distance import _bin_weights, query_over_n
from heads_jax.stats.measures import _token_weights, js_distances
from heads_jax.stats.sieve_bias import row_mass_entropy

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
  size = jnp.sum(sieves, axis=-1, dtype=jnp.float32)                          # [b, r, q]
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


def _layout(roles: tuple, measures: bool) -> dict:
  """The static plan of the reduction (python only, no arrays) for ``roles`` (and the measures):

  * ``pair``: the output columns whose weights go in the per-pair table (``batch_tables``'s
    ``weights``): the ``block`` sieves without the entropy factor, the ``keys`` and relation
    roles, the distance features but "self", and with ``measures`` the [CLS], [SEP] and
    punctuation masses (one matmul per layer; the table is padded to a multiple of 16 columns:
    XLA:CPU ran 17 to 32 columns in the same time, 33 in 1.4x that);
  * ``offsets``: the diagonals (key = query + offset) that give the ``offsets`` roles, "self"
    and the previous / next token masses (a gather of a few elements per row);
  * ``entropy``: whether the row entropy is needed (entropy-weighted ``block`` roles, measures).

  Output columns: the roles, the 21 distance features, then with ``measures`` the 5 token
  measures, the mean entropy and the [CLS] row's entropy."""
  r = len(roles)
  pair, offsets, entropy_roles = [], {0}, []
  for j, name in enumerate(roles):
    role = vocab.role(name)
    if role.entropy_weighted:
      _check_block_sieve(name)
      entropy_roles.append(j)
    elif role.sieve == vocab.SIEVE_OFFSETS:
      offsets.update(range(role.offsets[0], role.offsets[1] + 1))
    else:
      pair.append(j)
  pair += [r + f for f in range(NUM_DISTANCE_FEATURES) if f != SELF_FEATURE]
  if measures:
    pair += [r + NUM_DISTANCE_FEATURES + t for t in range(3)]               # [CLS], [SEP], punct.
    offsets.update((-1, 1))
  return {"pair": tuple(pair), "offsets": tuple(sorted(offsets)),
          "entropy_roles": tuple(entropy_roles), "entropy": bool(entropy_roles) or measures,
          "outputs": r + NUM_DISTANCE_FEATURES + (NUM_TOKEN_MEASURES + 2) * measures}


def _query_terms(layout: dict, roles: tuple) -> tuple:
  """The per-query part of the reduction, static: ``(feature, output, weight)`` triples, each
  adding ``feature(t) * weight(t)`` over the queries t to output column ``output`` (``_layout``).
  Features: ``offset:o`` (the diagonal key = t + o), ``entropy`` (the row's),
  ``block0*entropy`` / ``block1*entropy`` (the row's block mass times it); weights are named
  per-query vectors (``_query_weights``)."""
  terms = []
  for j, name in enumerate(roles):
    role = vocab.role(name)
    if role.sieve == vocab.SIEVE_OFFSETS:
      terms += [(f"offset:{o}", j, f"role:{j}") for o in range(role.offsets[0], role.offsets[1] + 1)]
    elif j in layout["entropy_roles"]:
      terms += [("block0*entropy", j, f"role:{j}*type0"), ("block1*entropy", j, f"role:{j}*type1")]
  r = len(roles)
  terms.append(("offset:0", r + SELF_FEATURE, "over_n"))
  if layout["outputs"] > r + NUM_DISTANCE_FEATURES:                         # the measures
    t = r + NUM_DISTANCE_FEATURES
    terms += [("offset:-1", t + 3, "over_n1"), ("offset:1", t + 4, "over_n1"),
              ("entropy", t + 5, "over_n"), ("entropy", t + 6, "first")]
  return tuple(terms)


def _query_weights(layout: dict, roles: tuple, batch, weight, segments) -> jnp.ndarray:
  """float32 ``[b, q, T]``: the weight vector of each of ``_query_terms``."""
  mask = jnp.asarray(batch["attention_mask"])
  real = (mask > 0).astype(jnp.float32)
  tt = jnp.asarray(batch["token_type_ids"])
  n = jnp.sum(real_pairs(mask, segments), axis=-1).astype(jnp.float32)     # [b, q]
  named = {"over_n": query_over_n(mask, segments),
           "over_n1": real / jnp.maximum(n - 1.0, 1.0),
           "first": real * (segment_positions(segments) == 0)}
  for j in range(len(roles)):
    named[f"role:{j}"] = weight[:, j]
    named[f"role:{j}*type0"] = weight[:, j] * (tt == 0)
    named[f"role:{j}*type1"] = weight[:, j] * (tt == 1)
  return jnp.stack([named[w].astype(jnp.float32) for _, _, w in _query_terms(layout, roles)],
                   axis=-1)


def batch_tables(batch, roles: Sequence[str], direction: str = "dep2head",
                 measures: bool = False, slots: int = 0) -> dict:
  """Everything the per-layer reduction needs from a batch (built once per batch, on device).

  Every statistic is a weighted sum of the attention over (query, key) pairs:

  * ``weights`` float32 ``[b, q*k, Cp]``: the per-pair weights of ``_layout``'s ``pair`` outputs
    (sieve x role weight, distance bin x 1/n, token class x 1/n), zero-padded to a multiple of
    16 columns;
  * ``query_weights`` float32 ``[b, q, T]``: the per-query weights of ``_query_terms``, which
    take a few diagonals of the attention, the row entropy and the block masses times it to
    the other outputs.

  Also ``count`` ``[b, r]`` (the sequences' queries with a non-empty sieve), ``role_weight``
  ``[b, r, q]`` and ``block_cols`` ``[b, k, 2]``.

  With ``slots`` S (a packed batch: ``batch["segment_ids"]`` ``[b, k]``, 1..S per sequence of a
  row, 0 on padding), every weight is per sequence (its own length, sieves and [CLS]), ``count``
  is ``[b, S, r]`` and ``slots`` ``[b, q, S]`` says which slot each query feeds: the reduction
  then returns every statistic per slot (``reduce_layer``).
  """
  roles = check_roles(roles)
  direction = check_direction(direction)
  layout = _layout(roles, bool(measures))
  mask = jnp.asarray(batch["attention_mask"])
  b, k = mask.shape
  r = len(roles)
  segments = segments_of(batch) if slots else None
  sieves = build_sieves(batch, roles, direction)                           # [b, r, q, k]
  weight, count = role_weights(sieves, mask, segments, slots)
  in_table = [j for j in layout["pair"] if j < r]
  parts = [jnp.moveaxis(jnp.where(sieves[:, in_table], weight[:, in_table, :, None], 0.0), 1, -1)]
  distance = [f for f in range(NUM_DISTANCE_FEATURES) if f != SELF_FEATURE]
  parts.append(_bin_weights(batch["token_class"], mask, False, segments)[..., distance])
  if measures:
    parts.append(_token_weights(jnp.asarray(batch["token_class"]), mask, segments)[..., :3])
  width = -(-len(layout["pair"]) // 16) * 16
  pad = jnp.zeros((b, k, k, width - len(layout["pair"])), jnp.float32)
  tables = {"weights": jnp.concatenate(parts + [pad], axis=-1).reshape(b, k * k, width),
            "query_weights": _query_weights(layout, roles, batch, weight, segments_of(batch)),
            "count": count, "role_weight": weight, "block_cols": block_columns(batch)}
  if slots:
    tables["slots"] = slot_onehot(segments, slots)
  return tables


def _check_block_sieve(name: str) -> None:
  """This path weights by the entropy only roles with the block sieve (its mass per query comes
  from ``block_cols``)."""
  if vocab.role(name).sieve != vocab.SIEVE_BLOCK:
    raise ValueError(f"role {name!r} is entropy-weighted with a {vocab.role(name).sieve!r} sieve; "
                     f"the per-layer path weights only {vocab.SIEVE_BLOCK!r} sieves (use "
                     f"stats_impl='fused' or the reference heads_jax.stats.sieve_bias)")


def diagonals(probs, offsets: Sequence[int]) -> jnp.ndarray:
  """``probs[..., t, t + o]`` for each offset o, float32 ``[..., q, len(offsets)]`` (0 where
  ``t + o`` is outside ``0..k-1``): strided slices of the flattened ``[q*k]`` rows (element
  ``(t, t + o)`` sits at ``t * (k + 1) + o``), so only ``q`` elements per offset are read (a
  gather measured several percent of the step on XLA:CPU)."""
  q, k = probs.shape[-2:]
  flat = probs.reshape(probs.shape[:-2] + (q * k,))
  zeros = lambda n: jnp.zeros(probs.shape[:-2] + (n,), probs.dtype)  # noqa: E731
  out = []
  for o in offsets:
    first, last = max(0, -o), min(q - 1, k - 1 - o)
    if last < first:
      out.append(zeros(q))
      continue
    part = jax.lax.slice_in_dim(flat, first * (k + 1) + o, last * (k + 1) + o + 1, stride=k + 1,
                                axis=-1)
    out.append(jnp.concatenate([zeros(first), part, zeros(q - 1 - last)], axis=-1))
  return jnp.stack(out, axis=-1)


def _entropy_features(probs, tables: dict, attention_mask):
  """float32 ``[b, h, q, 3]``: each row's entropy and its block masses (``probs @ block_cols``)
  times it."""
  b, h, q, k = probs.shape
  _, entropy = row_mass_entropy(probs, attention_mask)                     # [b, h, q]
  columns = jnp.matmul(probs.reshape(b, h * q, k), tables["block_cols"],
                       precision=_HIGHEST).reshape(b, h, q, 2)
  return jnp.concatenate([entropy[..., None], columns * entropy[..., None]], axis=-1)


def reduce_layer(probs, tables: dict, roles: Sequence[str], attention_mask,
                 measures: bool = False, entropy=None, block_masses=None) -> dict:
  """One layer's statistics from its attention ``probs`` float32 ``[b, h, q, k]`` (padding keys
  0, rows normalised over the real keys; padding query rows may hold anything: every weight of a
  padding query is 0; any number of heads, e.g. the ``l*h`` of a stack: ``reduce_stack``).

  Returns ``sieve_bias`` ``[b, h, r]`` (0 where the role's sieve is empty in the sequence:
  ``finish`` writes the NaN), ``distance`` ``[b, h, 21]`` and with ``measures`` ``entropy``,
  ``cls_entropy`` ``[b, h]`` and ``token_attention`` ``[b, h, 5]``; with packed tables
  (``batch_tables(..., slots=S)``) each with a slot axis after h (``[b, h, S, ...]``).

  Per layer: one matmul of the probabilities with the per-pair ``weights``, a gather of a few
  diagonals, and a small contraction of the per-query features ``[b, h, q, g]`` with
  ``query_weights``. The entropy (and the block masses it weights) is computed only where read:
  with the measures, or for an entropy-weighted role in a batch with a pair sequence (else its
  weights are all 0 and ``lax.cond`` skips the pass). A model that computed them with its
  softmax hands them in instead (``layer_reducer``'s hooks): ``entropy`` float32 ``[b, h, q]``
  (each row's, 0 on padding queries) and ``block_masses`` ``[b, h, q, 2]`` (``probs @
  block_cols``), and no pass over the probabilities is made for them.
  """
  roles = tuple(roles)
  b, h, q, k = probs.shape
  layout = _layout(roles, bool(measures))
  probs = probs.astype(jnp.float32)
  features = {f"offset:{o}": d for o, d in
              zip(layout["offsets"], jnp.moveaxis(diagonals(probs, layout["offsets"]), -1, 0))}
  if layout["entropy"] and entropy is not None:
    entropy = entropy.astype(jnp.float32)
    features["entropy"] = entropy
    if layout["entropy_roles"]:   # block's masses: only where a sequence is a pair
      def masses(p):
        return jnp.matmul(p.reshape(b, h * q, k), tables["block_cols"],
                          precision=_HIGHEST).reshape(b, h, q, 2)
      needed = jnp.any(tables["role_weight"][:, list(layout["entropy_roles"])] > 0)
      cols = (block_masses if block_masses is not None else
              jax.lax.cond(needed, masses, lambda p: jnp.zeros(p.shape[:-1] + (2,), jnp.float32),
                           probs))
      features["block0*entropy"] = cols[..., 0] * entropy
      features["block1*entropy"] = cols[..., 1] * entropy
  elif layout["entropy"]:
    compute = functools.partial(_entropy_features, tables=tables, attention_mask=attention_mask)
    if measures:
      extra = compute(probs)
    else:
      needed = jnp.any(tables["role_weight"][:, list(layout["entropy_roles"])] > 0)
      extra = jax.lax.cond(needed, compute,
                           lambda p: jnp.zeros(p.shape[:-1] + (3,), jnp.float32), probs)
    features.update(zip(("entropy", "block0*entropy", "block1*entropy"),
                        jnp.moveaxis(extra, -1, 0)))                       # each [b, h, q]
  # the per-query outputs, elementwise (a few terms), then [pair columns | query outputs]
  terms = _query_terms(layout, roles)
  query_x = sorted({x for _, x, _ in terms})
  weights = tables["query_weights"]                                        # [b, q, T]
  per_query = jnp.stack([sum(features[f] * weights[:, None, :, t]
                             for t, (f, x2, _) in enumerate(terms) if x2 == x)
                         for x in query_x], axis=-1)                       # [b, h, q, Xq]
  width = tables["weights"].shape[-1]
  column = np.zeros(layout["outputs"], int)
  column[list(layout["pair"])] = np.arange(len(layout["pair"]))
  column[query_x] = width + np.arange(len(query_x))
  slots = tables.get("slots")                                             # [b, q, S] or None
  if slots is None:
    pairs = jnp.matmul(probs.reshape(b, h, q * k), tables["weights"], precision=_HIGHEST)
    sums = jnp.concatenate([pairs, jnp.sum(per_query, axis=2)], axis=-1)  # [b, h, Cp + Xq]
  else:
    # per query, then per slot: the FLOPs of the unpacked matmul, no S-fold weight table (the
    # [b, q, h, C] order runs about 1.5x faster on XLA:CPU than [b, h, q, C])
    pairs = jnp.einsum("bhqk,bqkc->bqhc", probs, tables["weights"].reshape(b, q, k, -1),
                       precision=_HIGHEST)
    both = jnp.concatenate([pairs, jnp.swapaxes(per_query, 1, 2)], axis=-1)  # [b, q, h, C]
    sums = jnp.einsum("bqhc,bqs->bhsc", both, slots, precision=_HIGHEST)  # [b, h, S, C]
  sums = jnp.take(sums, column, axis=-1)                                  # [..., outputs]
  r = len(roles)
  out = {"sieve_bias": sums[..., :r], "distance": sums[..., r:r + NUM_DISTANCE_FEATURES]}
  if measures:
    t = r + NUM_DISTANCE_FEATURES
    out["token_attention"] = sums[..., t:t + NUM_TOKEN_MEASURES]
    out["entropy"] = sums[..., t + NUM_TOKEN_MEASURES]
    out["cls_entropy"] = sums[..., t + NUM_TOKEN_MEASURES + 1]
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
  path): ``reduce_layer`` on the stack seen as ``l*h`` heads, i.e. one per-pair weight table and
  one matmul, a few diagonals, one entropy pass shared by ``block`` and the measures (skipped
  where nothing reads it), and ``block``'s per-query mass from ``[b, lhq, k] @ [b, k, 2]``;
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
  """The model's ``attention_reduce`` hook for the XLA per-layer path (needs the probabilities;
  ``masks_padding_queries``: the reduction gives padding query rows weight 0 itself, so the
  model need not zero them).

  With the measures (every row's entropy is read) it also asks the model for each row's entropy
  from its softmax (``wants_entropy``: ``ln Z - sum_k p_k (s_k - m)``, no logarithm per
  element, no pass of its own); ``block``'s masses stay a product with the probabilities that
  ``lax.cond`` skips in single texts (riding in the value product, ``P @ [V | E]``, would make
  it 34 columns wide, which XLA:CPU runs about 1.4x slower than 32). Without the measures the
  entropy is needed only for a pair sequence's ``block`` (``lax.cond`` skips its pass in single
  texts). A model that does not hand the entropy in (or edits the probabilities: a uniform
  gate) gets it computed from the probabilities."""
  roles = tuple(roles)
  hooks = bool(measures) and _layout(roles, bool(measures))["entropy"]

  def reduce(layer, probs, query, key, mask, entropy=None, columns=None):
    del layer, query, key, mask
    return reduce_layer(probs, tables, roles, attention_mask, measures, entropy=entropy,
                        block_masses=columns)

  reduce.needs_probs = True
  reduce.masks_padding_queries = True
  if hooks:
    reduce.wants_entropy = True
  return reduce
