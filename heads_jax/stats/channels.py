"""The output channels the statistics kernels share (the first fused kernel,
``heads_jax.stats.fused``, and kernel v2, ``heads_jax.stats.kernel``): their order
(``num_channels``: the roles, Guan's 21 distance features, then with the measures the mean
entropy, the [CLS] row's entropy and the 5 token measures), each channel's per-query weight
(``channel_weights``: the weights of ``heads_jax.stats.layerwise``, unpacked or per sequence slot
of a packed batch) and the split of the weighted sums into what ``layerwise.reduce_layer``
returns (``split_channels``). One definition, so a new kernel reads the same layout."""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp

from heads_jax.sieves import NUM_DISTANCE_FEATURES, build_sieves, segment_positions, segments_of
from heads_jax.stats.layerwise import NUM_TOKEN_MEASURES, role_weights, slot_onehot


def num_channels(roles: Sequence[str], measures: bool) -> int:
  """r + 21 [+ 2 entropies + 5 token measures]: the kernel's output channels."""
  return len(roles) + NUM_DISTANCE_FEATURES + (2 + NUM_TOKEN_MEASURES if measures else 0)


def split_channels(sums, roles: Sequence[str], measures: bool) -> dict:
  """The kernels' per-channel sums ``[..., c]`` (``num_channels`` order) -> what
  ``heads_jax.stats.layerwise.reduce_layer`` returns: ``sieve_bias`` ``[..., r]``, ``distance``
  ``[..., 21]`` and with ``measures`` ``entropy``, ``cls_entropy`` ``[...]`` and
  ``token_attention`` ``[..., 5]``."""
  r = len(roles)
  out = {"sieve_bias": sums[..., :r], "distance": sums[..., r:r + NUM_DISTANCE_FEATURES]}
  if measures:
    base = r + NUM_DISTANCE_FEATURES
    out["entropy"] = sums[..., base]
    out["cls_entropy"] = sums[..., base + 1]
    out["token_attention"] = sums[..., base + 2:base + 2 + NUM_TOKEN_MEASURES]
  return out


def channel_weights(batch, roles: Sequence[str], direction: str = "dep2head",
                    measures: bool = False, sizes=None, slots: int = 0):
  """Each output channel's per-query weight (the channels of ``num_channels``) as float32
  ``[b, c, q]``, and the sieve count ``[b, r]``: the weights of ``heads_jax.stats.layerwise``
  (``n / (|S(t)| V)`` per role, ``1/n`` per distance feature and mean measure, the ``[CLS]``
  row for ``cls_entropy``, ``1/(n-1)`` for the previous/next token). Shared by this kernel and
  kernel v2 (``heads_jax.stats.kernel``), which passes the sieve sizes ``|S(t)|`` ``[b, r, q]``
  (``kernel.sieve_sizes``, linear in the length) instead of building the ``[b, r, q, k]`` sieves.
  With ``slots`` S (a packed batch, ``segment_ids``) every weight is of the query's own sequence
  (its length, its first position, its queries with a non-empty sieve) and the count is
  ``[b, S, r]``, one per sequence slot; linear in the length (a slot one-hot, no pair mask)."""
  mask = jnp.asarray(batch["attention_mask"])
  real = mask > 0
  realf = real.astype(jnp.float32)
  pos = jnp.arange(mask.shape[1])
  if sizes is None:
    sizes = jnp.sum(build_sieves(batch, roles, direction), axis=-1)        # [b, r, q]
  if slots:
    seg = segments_of(batch)
    onehot = slot_onehot(seg, slots)                                       # [b, q, S]
    n = jnp.einsum("bqs,bs->bq", onehot, jnp.sum(onehot, axis=1))          # its sequence's n
    first = (segment_positions(seg) == 0) & real
    valid = sizes > 0
    count = jnp.einsum("brq,bqs->bsr", valid.astype(jnp.float32), onehot)  # [b, S, r]
    count_q = jnp.einsum("bsr,bqs->brq", count, onehot)
    weight = jnp.where(valid, n[:, None, :] / (jnp.maximum(sizes.astype(jnp.float32), 1.0)
                                               * jnp.maximum(count_q, 1.0)), 0.0)
  else:
    n = jnp.broadcast_to(jnp.sum(realf, axis=-1, keepdims=True), realf.shape)  # [b, q]
    first = (pos[None] == 0) & real
    weight, count = role_weights(sizes[..., None], mask)                   # [b, r, q]
  over_n = realf / jnp.maximum(n, 1.0)                                     # [b, q]
  rows = [weight[:, j] for j in range(len(roles))] + [over_n] * NUM_DISTANCE_FEATURES
  if measures:
    over_n1 = realf / jnp.maximum(n - 1.0, 1.0)
    rows += [over_n, first.astype(jnp.float32)]                            # entropy, cls_entropy
    rows += [over_n, over_n, over_n, over_n1, over_n1]                    # cls sep punct prev next
  return jnp.stack(rows, axis=1), count
