"""Sieve bias scores (Pande et al. 2021), reduced on the device (jnp, jit-friendly).

For one head with attention ``alpha`` over the n real positions and one role with sieve S:

    beta(t) = ( sum_{s in S(t)} alpha[t, s] / |S(t)| ) / ( sum_{s=0..n-1} alpha[t, s] / n )

The ``block`` role multiplies ``beta(t)`` by the natural-log entropy of ``alpha[t, 0..n-1]``
(the authors' released code; ``block_plain`` has no factor). As ``scipy.stats.entropy`` (which
the authors call) the row is normalised over the real keys first, a no-op for softmax rows.
The value of a sequence is the mean of ``beta(t)`` over the real queries whose sieve is
non-empty, NaN if there is none.

``sieve_bias`` never forms per-query values: the sequence value is linear in the row-normalised
attention, so it is one batched matmul ``[b, lh, qk] @ [b, qk, r]`` against weights built from
the sieves (which have no l/h axes). Besides the attention it materialises the normalised
copy (and, for ``block``, the entropy-weighted copy), each the size of the attention; its
outputs are ``[b, l, h, r]``. ``sieve_bias_per_query`` gives ``beta(t)`` itself (tests,
inspection).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from heads_jax.data import vocabulary as vocab
from heads_jax.sieves import check_roles

_HIGHEST = jax.lax.Precision.HIGHEST  # full float32 matmuls also on TPU (bf16 passes) / GPU (TF32)


def entropy_weighted_mask(roles: Sequence[str]) -> np.ndarray:
  """bool ``[r]``: which roles' score is bias x row entropy (the registry's
  ``entropy_weighted``, `heads_jax.data.vocabulary.REGISTRY`)."""
  return np.asarray([vocab.role(r).entropy_weighted for r in roles], bool).reshape(len(roles))


def _check_shapes(attn, sieves, attention_mask, roles):
  if attn.ndim != 5:
    raise ValueError(f"attn must be [b, l, h, q, k], got shape {attn.shape}")
  b, _, _, q, k = attn.shape
  if sieves.shape != (b, len(roles), q, k):
    raise ValueError(f"sieves must be [b, r, q, k] = {(b, len(roles), q, k)} for {len(roles)} "
                     f"roles and attention {attn.shape}, got {sieves.shape}")
  if attention_mask.shape != (b, k):
    raise ValueError(f"attention_mask must be [b, k] = {(b, k)}, got {attention_mask.shape}")


def row_mass_entropy(attn, attention_mask):
  """Each query row's mass over the real keys and its natural-log entropy after normalisation
  over them (as ``scipy.stats.entropy``), both float32 ``[b, ..., q]``, for attention
  ``[b, ..., q, k]`` (any axes between b and q, e.g. ``[b, l, h, q, k]`` or ``[b, h, q, k]``).

  With ``T = sum_s a_s`` and ``p_s = a_s / T``, ``-sum_s p_s ln p_s = ln T - (sum_s a_s ln a_s)
  / T``, which needs one pass, one logarithm per element and no division (0 ln 0 = 0); an empty
  row (``T = 0``) has entropy 0. The one definition of the row entropy: ``row_entropy`` and
  ``heads_jax.stats.layerwise`` use it.
  """
  attn = jnp.asarray(attn)
  mask = jnp.asarray(attention_mask) > 0
  b, k = mask.shape
  keys = mask.reshape((b,) + (1,) * (attn.ndim - 2) + (k,))
  a = jnp.where(keys, attn.astype(jnp.float32), 0.0)
  total = jnp.sum(a, axis=-1)
  a_log_a = jnp.sum(a * jnp.log(jnp.maximum(a, jnp.finfo(jnp.float32).tiny)), axis=-1)
  safe = jnp.where(total > 0, total, 1.0)
  return total, jnp.where(total > 0, jnp.log(safe) - a_log_a / safe, 0.0)


def row_entropy(attn, attention_mask) -> jnp.ndarray:
  """Natural-log entropy of each query's attention row over the real keys, ``[b, l, h, q]``
  (the row normalised over the real keys first; `row_mass_entropy`)."""
  return row_mass_entropy(attn, attention_mask)[1]


def sieve_bias_per_query(attn, sieves, attention_mask, roles: Sequence[str]):
  """Per-query sieve bias ``beta(t)``.

  Args:
    attn: attention probabilities ``[b, l, h, q, k]``.
    sieves: bool ``[b, r, q, k]`` (``heads_jax.sieves.build_sieves`` with the same roles).
    attention_mask: ``[b, k]``, 1 on real positions.
    roles: the role names of the r axis (``block`` gets the entropy factor).

  Returns:
    ``(beta, valid)``: float32 ``[b, l, h, r, q]`` (0 where not valid) and bool ``[b, r, q]``
    (a real query with a non-empty sieve).
  """
  roles = check_roles(roles)
  attn = jnp.asarray(attn).astype(jnp.float32)
  sieves = jnp.asarray(sieves)
  attention_mask = jnp.asarray(attention_mask)
  _check_shapes(attn, sieves, attention_mask, roles)
  real = (attention_mask > 0).astype(jnp.float32)                     # [b, k]
  n = jnp.sum(real, axis=-1)                                          # [b]

  in_sieve = jnp.einsum("blhqk,brqk->blhrq", attn, sieves.astype(jnp.float32), precision=_HIGHEST)
  total = jnp.einsum("blhqk,bk->blhq", attn, real, precision=_HIGHEST)
  size = jnp.sum(sieves, axis=-1)                                     # [b, r, q]
  valid = size > 0

  mean_in = in_sieve / jnp.maximum(size, 1)[:, None, None].astype(jnp.float32)
  mean_all = total / jnp.maximum(n, 1.0)[:, None, None, None]         # [b, l, h, q]
  mean_all = jnp.where(mean_all > 0, mean_all, 1.0)[:, :, :, None, :]
  beta = mean_in / mean_all                                           # [b, l, h, r, q]
  weighted = entropy_weighted_mask(roles)
  if weighted.any():
    entropy = row_entropy(attn, attention_mask)                       # [b, l, h, q]
    is_weighted = jnp.asarray(weighted)[None, None, None, :, None]
    beta = jnp.where(is_weighted, beta * entropy[:, :, :, None, :], beta)
  beta = jnp.where(valid[:, None, None], beta, 0.0)
  return beta, valid


def normalised_rows(attn, attention_mask) -> jnp.ndarray:
  """``alpha[t, s] / sum_{s' real} alpha[t, s']`` on real keys, 0 on padding keys,
  float32 ``[b, l, h, q, k]`` (rows of real queries sum to 1; padding query rows are 0)."""
  attn = jnp.asarray(attn).astype(jnp.float32)
  mask = jnp.asarray(attention_mask) > 0
  total = jnp.einsum("blhqk,bk->blhq", attn, mask.astype(jnp.float32), precision=_HIGHEST)
  total = jnp.where(total > 0, total, 1.0)
  keep = mask[:, None, None, None, :] & mask[:, None, None, :, None]
  return jnp.where(keep, attn / total[..., None], 0.0)


def sieve_bias(attn, sieves, attention_mask, roles: Sequence[str]) -> jnp.ndarray:
  """Sieve bias of each sequence, head and role.

  Args:
    attn: attention probabilities ``[b, l, h, q, k]``.
    sieves: bool ``[b, r, q, k]``.
    attention_mask: ``[b, k]``.
    roles: names of the r axis.

  Returns:
    float32 ``[b, l, h, r]``: the mean of ``beta(t)`` over real queries with a non-empty
    sieve; NaN where no query has one (e.g. ``obj`` in a sentence without an ``obj`` arc,
    ``block`` for a single text, or an all-padding row).

  How: with ``p = alpha / T`` the rows normalised over the real keys (``T(t) = sum_s
  alpha[t, s]``), ``beta(t) = n / |S(t)| * sum_{s in S(t)} p[t, s]``, so the sequence value
  ``1/V sum_t beta(t)`` (V valid queries) is linear in p: one batched matmul
  ``[b, lh, qk] @ [b, qk, r]`` against weights ``sieve * n / (|S(t)| V)``, no per-query
  intermediate. ``block`` is the same form on ``H(t) p[t, s]`` (H the row entropy).
  Equals ``mean_t sieve_bias_per_query`` (tests check both against a loop reference).
  """
  roles = check_roles(roles)
  attn = jnp.asarray(attn).astype(jnp.float32)
  sieves = jnp.asarray(sieves)
  attention_mask = jnp.asarray(attention_mask)
  _check_shapes(attn, sieves, attention_mask, roles)
  b, l, h, q, k = attn.shape
  r = len(roles)
  n = jnp.sum(attention_mask > 0, axis=-1).astype(jnp.float32)        # [b]
  size = jnp.sum(sieves, axis=-1).astype(jnp.float32)                 # [b, r, q]
  valid = size > 0
  count = jnp.sum(valid, axis=-1).astype(jnp.float32)                 # [b, r]
  # weight of query t in the sequence mean, times n / |S(t)|
  weight = jnp.where(valid, n[:, None, None] / (jnp.maximum(size, 1.0)
                                                * jnp.maximum(count, 1.0)[:, :, None]), 0.0)
  p = normalised_rows(attn, attention_mask)                          # [b, l, h, q, k]
  w = jnp.where(sieves, weight[..., None], 0.0)                       # [b, r, q, k]
  w = jnp.transpose(w, (0, 2, 3, 1)).reshape(b, q * k, r)
  out = jnp.matmul(p.reshape(b, l * h, q * k), w, precision=_HIGHEST).reshape(b, l, h, r)
  for j in np.flatnonzero(entropy_weighted_mask(roles)):
    # block: sum_t H(t) n/|S(t)|/V sum_s p[t, s] sieve[t, s]: the same linear form on H(t) p[t, s]
    entropy = row_entropy(p, attention_mask)                          # [b, l, h, q]
    weighted = (p * entropy[..., None]).reshape(b, l * h, q * k)
    block = jnp.matmul(weighted, w[:, :, j:j + 1], precision=_HIGHEST)  # [b, lh, 1]
    out = out.at[..., j].set(block.reshape(b, l, h))
  return jnp.where(count[:, None, None, :] > 0, out, jnp.nan)
