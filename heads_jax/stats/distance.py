"""Distance features (Guan et al., COLING 2020), reduced on the device (jnp, jit-friendly).

Per query t of a sequence with n real positions, 21 attention masses in this order:
windows 0..15, self, ``[CLS]``, ``[SEP]``, ``,``, ``.``. A key s that is t itself goes to
"self" (self wins over special); otherwise a ``[CLS]``/``[SEP]``/``,``/``.`` key goes to its
token's feature (so commas and periods never fall into a window); every other real key, at
distance ``d = |s - t| >= 1``, goes to window ``min(15, floor(16 * d / n))``. The 21 values of
a query therefore sum to its row's total mass over the real keys (1 for softmax rows). The
feature of a sequence is the mean over its real queries. See
``heads_jax.sieves.distance_bins`` for the assignment.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from heads_jax.sieves import NUM_DISTANCE_FEATURES, distance_bins, real_pairs

_HIGHEST = jax.lax.Precision.HIGHEST


def _bin_weights(token_class, attention_mask, per_query: bool, segment_ids=None) -> jnp.ndarray:
  """float32 ``[b, q, k, 21]`` one-hot of each pair's feature, times 1/n per real query unless
  ``per_query`` (n: the query's sequence's length; with ``segment_ids``, of its own segment)."""
  bins = distance_bins(token_class, attention_mask, segment_ids)      # [b, q, k]
  onehot = (bins[..., None] == jnp.arange(NUM_DISTANCE_FEATURES)).astype(jnp.float32)
  if per_query:
    return onehot
  return onehot * query_over_n(attention_mask, segment_ids)[:, :, None, None]


def query_over_n(attention_mask, segment_ids=None) -> jnp.ndarray:
  """float32 ``[b, q]``: 1/n on real queries, n the length of the query's sequence (its segment
  in a packed row), 0 on padding: the weight of a query in its sequence's mean."""
  real = jnp.asarray(attention_mask) > 0
  if segment_ids is None:
    n = jnp.maximum(jnp.sum(real, axis=-1, keepdims=True), 1).astype(jnp.float32)   # [b, 1]
  else:
    n = jnp.maximum(jnp.sum(real_pairs(attention_mask, segment_ids), axis=-1), 1).astype(jnp.float32)
  return real.astype(jnp.float32) / n


def distance_features(attn, token_class, attention_mask, per_query: bool = False) -> jnp.ndarray:
  """Distance features of each sequence and head.

  Args:
    attn: attention probabilities ``[b, l, h, q, k]``.
    token_class: ``[b, k]`` (``heads_jax.data.vocabulary.TOKEN_*``).
    attention_mask: ``[b, k]``, 1 on real positions.
    per_query: return the per-query features ``[b, l, h, q, 21]`` (zero on padding queries)
      instead of their mean.

  Returns:
    float32 ``[b, l, h, 21]``: the mean over real queries (all zero for an all-padding row).
  """
  attn = jnp.asarray(attn).astype(jnp.float32)
  token_class = jnp.asarray(token_class)
  attention_mask = jnp.asarray(attention_mask)
  if attn.ndim != 5:
    raise ValueError(f"attn must be [b, l, h, q, k], got shape {attn.shape}")
  b, _, _, q, k = attn.shape
  if q != k or token_class.shape != (b, k) or attention_mask.shape != (b, k):
    raise ValueError(f"attn {attn.shape} needs q == k and token_class, attention_mask of shape "
                     f"{(b, k)}; got {token_class.shape}, {attention_mask.shape}")
  weights = _bin_weights(token_class, attention_mask, per_query)
  if per_query:
    return jnp.einsum("blhqk,bqkf->blhqf", attn, weights, precision=_HIGHEST)
  # One batched matmul [b, lh, qk] @ [b, qk, 21] (XLA:CPU runs this ~4x faster than the einsum).
  l, h = attn.shape[1:3]
  out = jnp.matmul(attn.reshape(b, l * h, q * k), weights.reshape(b, q * k, NUM_DISTANCE_FEATURES),
                   precision=_HIGHEST)
  return out.reshape(b, l, h, NUM_DISTANCE_FEATURES)
