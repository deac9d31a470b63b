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
from heads_jax.sieves import NUM_DISTANCE_FEATURES, build_sieves, check_direction, check_roles
from heads_jax.stats.distance import _bin_weights
from heads_jax.stats.measures import _token_weights
from heads_jax.stats.sieve_bias import entropy_weighted_mask, row_mass_entropy

_HIGHEST = jax.lax.Precision.HIGHEST
NUM_TOKEN_MEASURES = 5


def role_weights(sieves, attention_mask):
  """Per-query weights of the sieve-bias mean: ``n / (|S(t)| V)`` on queries with a non-empty
  sieve (V of them), else 0; float32 ``[b, r, q]``, and the count V ``[b, r]``."""
  n = jnp.sum(jnp.asarray(attention_mask) > 0, axis=-1).astype(jnp.float32)   # [b]
  size = jnp.sum(sieves, axis=-1).astype(jnp.float32)                         # [b, r, q]
  valid = size > 0
  count = jnp.sum(valid, axis=-1).astype(jnp.float32)                         # [b, r]
  weight = jnp.where(valid, n[:, None, None] / (jnp.maximum(size, 1.0)
                                                * jnp.maximum(count, 1.0)[:, :, None]), 0.0)
  return weight, count


def block_columns(batch) -> jnp.ndarray:
  """float32 ``[b, k, 2]``: key s is real, not ``[CLS]``/``[SEP]``, and of token type 0 / 1
  (the ``block`` sieve of a query of that type, before the pair and query conditions)."""
  real = jnp.asarray(batch["attention_mask"]) > 0
  tc = jnp.asarray(batch["token_class"])
  tt = jnp.asarray(batch["token_type_ids"])
  plain = real & (tc != TOKEN_CLS) & (tc != TOKEN_SEP)
  return jnp.stack([plain & (tt == 0), plain & (tt == 1)], axis=-1).astype(jnp.float32)


def batch_tables(batch, roles: Sequence[str], direction: str = "dep2head",
                 measures: bool = False) -> dict:
  """Everything the per-layer reduction needs from a batch (built once per batch, on device).

  Returns a dict: ``weights`` float32 ``[b, q*k, C]`` (roles, then 21 distance features, then
  with ``measures`` the 5 token measures), ``count`` ``[b, r]``, ``role_weight`` ``[b, r, q]``,
  ``block_cols`` ``[b, k, 2]``, ``token_type`` ``[b, q]``, ``real_over_n`` ``[b, q]`` and
  ``cls_real`` ``[b]``.
  """
  roles = check_roles(roles)
  direction = check_direction(direction)
  mask = jnp.asarray(batch["attention_mask"])
  b, k = mask.shape
  sieves = build_sieves(batch, roles, direction)                           # [b, r, q, k]
  weight, count = role_weights(sieves, mask)
  w = jnp.where(sieves, weight[..., None], 0.0)                           # [b, r, q, k]
  parts = [jnp.transpose(w, (0, 2, 3, 1)),
           _bin_weights(batch["token_class"], mask, per_query=False)]     # [b, q, k, 21]
  if measures:
    parts.append(_token_weights(jnp.asarray(batch["token_class"]), mask))  # [b, q, k, 5]
  weights = jnp.concatenate(parts, axis=-1).reshape(b, k * k, -1)
  real = (mask > 0).astype(jnp.float32)
  n = jnp.maximum(jnp.sum(real, axis=-1), 1.0)
  return {"weights": weights, "count": count, "role_weight": weight,
          "block_cols": block_columns(batch), "token_type": jnp.asarray(batch["token_type_ids"]),
          "real_over_n": real / n[:, None], "cls_real": real[:, 0]}


def _check_block_sieve(name: str) -> None:
  """This path weights by the entropy only roles with the block sieve (its mass per query comes
  from ``block_cols``)."""
  if vocab.role(name).sieve != vocab.SIEVE_BLOCK:
    raise ValueError(f"role {name!r} is entropy-weighted with a {vocab.role(name).sieve!r} sieve; "
                     f"the per-layer path weights only {vocab.SIEVE_BLOCK!r} sieves (use "
                     f"stats_impl='fused' or the reference heads_jax.stats.sieve_bias)")


def reduce_layer(probs, tables: dict, roles: Sequence[str], attention_mask,
                 measures: bool = False) -> dict:
  """One layer's statistics from its attention ``probs`` float32 ``[b, h, q, k]`` (padding keys
  and padding query rows 0, rows normalised over the real keys).

  Returns ``sieve_bias`` ``[b, h, r]`` (0 where the role's sieve is empty in the sequence:
  ``finish`` writes the NaN), ``distance`` ``[b, h, 21]`` and with ``measures`` ``entropy``,
  ``cls_entropy`` ``[b, h]`` and ``token_attention`` ``[b, h, 5]``.
  """
  roles = tuple(roles)
  r = len(roles)
  b, h, q, k = probs.shape
  probs = probs.astype(jnp.float32)
  sums = jnp.matmul(probs.reshape(b, h, q * k), tables["weights"], precision=_HIGHEST)  # [b, h, C]
  out = {"sieve_bias": sums[..., :r],
         "distance": sums[..., r:r + NUM_DISTANCE_FEATURES]}
  weighted = np.flatnonzero(entropy_weighted_mask(roles))   # the registry's entropy-weighted roles
  if len(weighted) or measures:
    _, entropy = row_mass_entropy(probs, attention_mask)                  # [b, h, q]
    if len(weighted):
      cols = jnp.matmul(probs.reshape(b, h * q, k), tables["block_cols"],
                        precision=_HIGHEST).reshape(b, h, q, 2)
      own = jnp.where((tables["token_type"] == 0)[:, None, :], cols[..., 0], cols[..., 1])
    for j in weighted:
      _check_block_sieve(roles[j])
      block = jnp.sum(own * entropy * tables["role_weight"][:, None, j, :], axis=-1)
      out["sieve_bias"] = out["sieve_bias"].at[..., j].set(block)
    if measures:
      out["entropy"] = jnp.sum(entropy * tables["real_over_n"][:, None, :], axis=-1)
      out["cls_entropy"] = entropy[..., 0] * tables["cls_real"][:, None]
      out["token_attention"] = sums[..., r + NUM_DISTANCE_FEATURES:]
  return out


def finish(reduced: dict, tables: dict) -> dict:
  """Stacked per-layer outputs ``[b, l, h, ...]`` -> the step's results: NaN sieve bias where no
  query of the sequence has a non-empty sieve for the role."""
  out = dict(reduced)
  count = tables["count"][:, None, None, :]
  out["sieve_bias"] = jnp.where(count > 0, reduced["sieve_bias"], jnp.nan)
  return out


def layer_reducer(tables: dict, roles: Sequence[str], attention_mask, measures: bool = False):
  """The model's ``attention_reduce`` hook for the XLA per-layer path (needs the probabilities)."""
  roles = tuple(roles)

  def reduce(layer, probs, query, key, mask):
    del layer, query, key, mask
    return reduce_layer(probs, tables, roles, attention_mask, measures)

  reduce.needs_probs = True
  return reduce
