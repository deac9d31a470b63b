"""Norm-weighted attention, attention sinks and word-level parsing: a second analysis pass (jnp).

**Norm weights** (Kobayashi et al. 2020, "Attention is not only a weight"). For layer l and head h
with attention ``a[q, k]``, the vector that key k adds to query q's output is
``a[q, k] f_h(x_k)`` with ``f_h(x) = (x W_V^h + b_V^h) W_O^h`` (``W_O^h``: the rows of the
attention output projection that head h's values multiply; no output bias). The norm weight is

    w[q, k] = || a[q, k] f_h(x_k) || / sum_{k' real} || a[q, k'] f_h(x_k') ||

(a row with no mass stays 0). ``||f_h(x_k)||`` is computed as ``sqrt(v G_h v)`` with the value
``v = x W_V^h + b_V^h`` and ``G_h = W_O^h W_O^h^T`` (``[e, e]``), so no ``[b, h, k, d]`` array is
formed. The sieve bias, the distance features, the tests and the roles are computed on ``w``
exactly as on ``a`` (``heads_jax.stats.layerwise.reduce_layer``): ``norm_sieve_bias``.

**Sinks and no-ops** (Gu et al. 2025; Bondarenko et al. 2023): per head and sequence, the mean
over real queries of the attention on the first token (``first_attention``) and on the first
and second ``[SEP]`` (``sep_attention``, NaN for a second ``[SEP]`` a single text lacks), and the
norm ratio ``mean_q ||sum_k a[q, k] f_h(x_k)|| / mean_k ||f_h(x_k)||``: near 0 when a head's
output is small next to what it could move (a no-op head), 1 for a head that copies one key.

**Parsing** (``heads_jax.stats.parsing``): each head's predicted word per word.

**Packed rows**: with ``slots`` S every output is per sequence (slot j of row i is row
``i * S + j``), equal to the unpacked pass's (a sequence's first position, its own ``[SEP]``s,
its own words and queries).

**Massive activations** (Sun et al. 2024; issue 40): ``hidden_norms`` ``[b, l + 1, 3]``, per
sequence and hidden state (embeddings, then each layer): the L2 norm at position 0, the mean L2
norm over the real ``[SEP]`` positions (NaN if none) and the median L2 norm over the other real
positions (not position 0 nor ``[SEP]``; NaN if none) (``hidden_norms``).

``make_norm_step`` runs all of it as one jitted, data-parallel pass on the first pass's path
(issue 52): the forward runs with a per-layer hook (``norm_reducer``; the model hands it each
layer's values and context vectors, ``wants_values``), so no ``[b, l, h, q, k]`` stack is ever
made. Where the first pass runs each layer's map (``layerwise``) the hook reads that layer's
map; where the first pass is map-free (``stats_impl="kernel"``, e.g. long sequences) no map is
made at all. Both take packed rows (``slots``), as the first pass's paths do:

* the norm weights' sieve bias is the first pass's statistics kernel on augmented queries and
  keys, since ``w[q, k] = softmax_k(q.k / sqrt(e) + ln ||f(x_k)||)`` (``_augmented``: one more
  column, ``ln ||f(x_k)||`` on the key side);
* the sinks and the parse come from one loop over key blocks of 128
  (``parsing.key_block_loop``): each block's probabilities recomputed from the queries, keys
  and each row's log-sum-exp, summed over the queries per key (the sinks) and reduced to a
  streaming arg-max over words (the parse);
* the norm ratio from the context vectors the forward computes anyway.

Memory is then linear in the length (``[b, h, q, 128]`` tiles; ``tests/stats/
test_norms_mapfree.py`` checks the compiled program's buffers at 8,192 positions), and the
operations about the first pass's (BENCHMARKS.md, issue 52). ``tests/stats/test_norms.py``
checks both paths against a loop over transformers' model. Only ``[b, l, h, ...]`` reductions
leave the device.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from heads_jax.data.vocabulary import BATCH_FIELDS, ROLES, TOKEN_SEP
from heads_jax.parallel import DATA_AXIS, batch_sharding, data_mesh, pad_to_multiple, replicate, shard_batch
from heads_jax.sieves import check_direction, check_roles
from heads_jax.sieves import segment_positions, segments_of
from heads_jax.stats import compiling, kernel
from heads_jax.stats import parsing as parsing_mod
from heads_jax.stats.layerwise import batch_tables, reduce_layer
from heads_jax.stats.fused import target_platform
from heads_jax.stats.parsing import KEY_BLOCK
from heads_jax.stats.step import (HostTables, accepts_packing, auto_stats_impl,
                                  can_go_map_free, device_memory_bytes)

_HIGHEST = jax.lax.Precision.HIGHEST
SINK_THRESHOLD = 0.3   # Gu et al.: a head is a sink head when its mean first-token attention > 0.3


def output_gram(out_kernel, num_heads: int) -> jnp.ndarray:
  """``G_h = W_O^h W_O^h^T`` float32 ``[h, e, e]`` from the output projection kernel ``[h*e, d]``
  (rows h*e .. (h+1)*e - 1 multiply head h's context)."""
  w = jnp.asarray(out_kernel, jnp.float32)
  hd, d = w.shape
  w = w.reshape(num_heads, hd // num_heads, d)
  return jnp.einsum("hed,hfd->hef", w, w, precision=_HIGHEST)


def _quadratic_norm(v, gram) -> jnp.ndarray:
  """``sqrt(v G_h v)`` for ``v`` ``[b, n, h, e]``: ``[b, h, n]``."""
  sq = jnp.einsum("bnhe,hef,bnhf->bhn", v.astype(jnp.float32), gram, v.astype(jnp.float32),
                  precision=_HIGHEST)
  return jnp.sqrt(jnp.maximum(sq, 0.0))


def transformed_norms(values, out_kernel) -> jnp.ndarray:
  """``||f_h(x_k)|| = ||v_k^h W_O^h||`` float32 ``[b, h, k]`` from the values ``[b, k, h, e]``
  (with the value bias) and the output kernel ``[h*e, d]``."""
  return _quadratic_norm(values, output_gram(out_kernel, values.shape[2]))


def norm_weights(probs, fx, attention_mask) -> jnp.ndarray:
  """``w[q, k] = a[q, k] ||f(x_k)|| / sum_k' a[q, k'] ||f(x_k')||`` over real keys, float32
  ``[b, h, q, k]`` from ``probs`` ``[b, h, q, k]`` and ``fx`` ``[b, h, k]``; padding keys and
  rows without mass 0."""
  keys = (jnp.asarray(attention_mask) > 0)[:, None, None, :]
  w = jnp.where(keys, probs.astype(jnp.float32) * fx[:, :, None, :], 0.0)
  total = jnp.sum(w, axis=-1, keepdims=True)
  return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), 0.0)


def layer_values(layer, x) -> jnp.ndarray:
  """A layer's value vectors ``[b, k, h, e]`` (bias included) from its input ``x`` ``[b, k, d]``;
  a layer with its own ``values(x)`` (ModernBERT, DeBERTa: pre-norm or fused projections) gives them."""
  if hasattr(layer, "values"):
    return layer.values(x).astype(jnp.float32)
  att = layer.attention
  cfg = att.cfg
  b, k, _ = x.shape
  return att.value(x).astype(jnp.float32).reshape(b, k, cfg.num_heads, cfg.head_dim)


# ------------------------------------------------------------------------------------------------
# The pass: a per-layer reduction inside the forward, with or without the layer's map

def slot_positions(batch, slots: int) -> dict:
  """Per sequence (slot s of a row: segment s + 1; unpacked: S = 1, the real positions), float32
  ``[b, S, k]`` one-hots: ``real`` (its positions), ``first`` (its first position), ``sep1`` /
  ``sep2`` (its first and second real ``[SEP]``); and ``n`` ``[b, S]`` (its length)."""
  seg = segments_of(batch)                                                # [b, k]
  s = max(int(slots), 1)
  mine = seg[:, None, :] == jnp.arange(1, s + 1, dtype=jnp.int32)[None, :, None]  # [b, S, k]
  is_sep = (jnp.asarray(batch["token_class"]) == TOKEN_SEP)[:, None, :] & mine
  order = jnp.cumsum(is_sep.astype(jnp.int32), axis=-1)
  first = mine & (jnp.cumsum(mine.astype(jnp.int32), axis=-1) == 1)
  f32 = lambda x: x.astype(jnp.float32)                                   # noqa: E731
  return {"real": f32(mine), "first": f32(first), "sep1": f32(is_sep & (order == 1)),
          "sep2": f32(is_sep & (order == 2)), "n": jnp.sum(f32(mine), axis=-1)}


def slot_norm_ratio(context, values, out_kernel, where: dict) -> jnp.ndarray:
  """``norm_ratio`` per sequence, float32 ``[b, h, S]``, from the layer's context vectors
  ``[b, q, h, e]`` (``sum_k a[q, k] v_k`` per head, what the model computes anyway) and values
  ``[b, k, h, e]``: ``mean_q ||ctx_q W_O^h|| / mean_k ||v_k W_O^h||`` over the sequence's
  positions (0 where the values' norms are all 0)."""
  gram = output_gram(out_kernel, values.shape[2])
  n = jnp.maximum(where["n"], 1.0)[:, None, :]                            # [b, 1, S]
  out = jnp.einsum("bhq,bsq->bhs", _quadratic_norm(context, gram), where["real"],
                   precision=_HIGHEST) / n
  fx = jnp.einsum("bhk,bsk->bhs", _quadratic_norm(values, gram), where["real"],
                  precision=_HIGHEST) / n
  return jnp.where(fx > 0, out / jnp.where(fx > 0, fx, 1.0), 0.0)


def slot_sinks(mass, where: dict):
  """``first_attention`` ``[b, h, S]`` and ``sep_attention`` ``[b, h, S, 2]`` (NaN where the
  sequence has no such ``[SEP]``) from each key's mass over the real queries ``mass`` ``[b, h,
  k]`` (``parsing.key_block_loop``): the mean attention of a sequence's queries on its first
  position and on its first and second ``[SEP]``."""
  n = jnp.maximum(where["n"], 1.0)[:, None, :]
  at = lambda name: jnp.einsum("bhk,bsk->bhs", mass, where[name], precision=_HIGHEST) / n  # noqa: E731
  seps = [jnp.where(jnp.any(where[name] > 0, -1)[:, None, :], at(name), jnp.nan)
          for name in ("sep1", "sep2")]
  return at("first"), jnp.stack(seps, axis=-1)


def key_blocks(length: int, block_k: int = KEY_BLOCK) -> tuple[int, int]:
  """The key loop's keys per block and block count for ``length`` keys (one block up to
  ``block_k``)."""
  bk = min(int(block_k), int(length))
  return bk, -(-int(length) // bk)


def _visible_block(batch, i, bk: int, kp: int):
  """bool ``[b, 1, q, BK]``: which of key block i's keys each query sees (real, same segment)."""
  real = jnp.pad(jnp.asarray(batch["attention_mask"]) > 0, ((0, 0), (0, kp - batch["attention_mask"].shape[1])))
  seg = segments_of(batch)
  seg_k = jnp.pad(seg, ((0, 0), (0, kp - seg.shape[1])))
  rk = jax.lax.dynamic_slice_in_dim(real, i * bk, bk, axis=1)
  sk = jax.lax.dynamic_slice_in_dim(seg_k, i * bk, bk, axis=1)
  return (rk[:, None, :] & (seg[:, :, None] == sk[:, None, :]))[:, None]


def _query_key_tiles(query, key, batch, bk: int, blocks: int):
  """``tile_fn`` of ``parsing.key_block_loop`` recomputed from the queries and keys ``[b, k, h,
  e]`` (no map): each row's log-sum-exp over its visible keys in a first pass over the key
  blocks (a running maximum and its rescaled sum), then ``exp(s - lse)`` per block."""
  b, k, h, e = query.shape
  kp = bk * blocks
  scale = 1.0 / float(e) ** 0.5
  q = query.astype(jnp.float32)
  keys = jnp.pad(key.astype(jnp.float32), ((0, 0), (0, kp - k), (0, 0), (0, 0)))

  def scores(i):
    kb = jax.lax.dynamic_slice_in_dim(keys, i * bk, bk, axis=1)
    s = jnp.einsum("bqhe,bkhe->bhqk", q, kb, precision=_HIGHEST) * scale
    return jnp.where(_visible_block(batch, i, bk, kp), s, -jnp.inf)

  def lse_step(i, carry):
    m, z = carry
    s = scores(i)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    z = z * jnp.exp(jnp.where(jnp.isfinite(m), m - safe, -jnp.inf)) + jnp.sum(
        jnp.exp(s - safe[..., None]), axis=-1)
    return m_new, z

  m, z = jax.lax.fori_loop(0, blocks, lse_step, (jnp.full((b, h, k), -jnp.inf, jnp.float32),
                                                 jnp.zeros((b, h, k), jnp.float32)))
  lse = jnp.where(z > 0, jnp.where(jnp.isfinite(m), m, 0.0) + jnp.log(jnp.maximum(z, 1e-30)),
                  jnp.inf)
  return lambda i: jnp.exp(scores(i) - lse[..., None])


def _map_tiles(probs, bk: int, blocks: int):
  """``tile_fn`` of ``parsing.key_block_loop`` sliced from a layer's map ``[b, h, q, k]``."""
  kp = bk * blocks
  probs = jnp.pad(probs.astype(jnp.float32), ((0, 0), (0, 0), (0, 0), (0, kp - probs.shape[-1])))
  return lambda i: jax.lax.dynamic_slice_in_dim(probs, i * bk, bk, axis=3)


def _augmented(query, key, fx, e_out: int):
  """Queries and keys ``[b, k, h, e_out]`` whose scaled product is the norm weights' logits
  ``q.k / sqrt(e) + ln ||f(x_k)||`` under the kernel's scale ``1 / sqrt(e_out)``: softmax of
  those is ``a[q, k] ||f(x_k)|| / sum_k' a[q, k'] ||f(x_k')||`` (the norm weights), so the
  first pass's statistics kernel gives their sieve bias (columns past ``e + 1`` are 0)."""
  b, k, h, e = query.shape
  ratio = float(e_out) ** 0.5 / float(e) ** 0.5
  logfx = jnp.log(jnp.maximum(jnp.transpose(fx, (0, 2, 1)), 1e-30))       # [b, k, h]
  zeros = jnp.zeros((b, k, h, e_out - e - 1), jnp.float32)
  q = jnp.concatenate([query.astype(jnp.float32) * ratio, jnp.ones((b, k, h, 1), jnp.float32),
                       zeros], axis=-1)
  kk = jnp.concatenate([key.astype(jnp.float32), (logfx * float(e_out) ** 0.5)[..., None], zeros],
                       axis=-1)
  return q, kk


def augmented_dim(e: int, wrapper: str) -> int:
  """The head dimension of ``_augmented``'s queries: ``e + 1`` rounded up to a multiple of 16,
  to a power of two for Triton (Pallas's Triton lowering takes power-of-two blocks only)."""
  if wrapper == "triton":
    return 1 << int(e).bit_length()
  return -(-(int(e) + 1) // 16) * 16


def norm_reducer(module, batch: dict, roles: tuple, direction: str, *, parsing: bool,
                 map_free: bool, slots: int = 0, platform: str | None = None,
                 mesh=None) -> tuple:
  """The model's ``attention_reduce`` hook of the second pass, and its tables. Each layer
  (``wants_values``: the model hands it the layer's values and context vectors):

  * ``||f_h(x_k)||`` from the values; the norm ratio from the context vectors;
  * ``sieve_bias`` of the norm weights: with ``map_free`` the first pass's statistics kernel
    (``stats.kernel``) on ``_augmented`` queries and keys (no map), else
    ``layerwise.reduce_layer`` on the layer's norm weights (its map, as the first pass's
    ``layerwise`` path; packed rows with ``slots``);
  * one loop over key blocks (``parsing.key_block_loop``: each key's mass over the queries for
    the sinks, and the streaming arg-max of the word-level parse), its tiles recomputed from
    the queries and keys with ``map_free``, else sliced from the map.

  Every output has a slot axis after h (``[b, h, S, ...]``, S = 1 unpacked)."""
  mask = jnp.asarray(batch["attention_mask"])
  b, k = mask.shape
  where = slot_positions(batch, slots)
  layout = parsing_mod.word_layout(batch["word_ids"], segments_of(batch))
  real_q = (mask > 0).astype(jnp.float32)
  bk, blocks = key_blocks(k)
  if map_free:
    wrapper = kernel.wrapper_for(platform, k)
    tables = kernel.given_tables(batch, roles, direction, False, wrapper, slots)  # the host's
    stats = functools.partial(kernel.kernel_layer_stats, roles=roles, direction=direction,
                              wrapper=wrapper, platform=platform)
    if wrapper != "xla" and mesh is not None and mesh.size > 1:
      # a Pallas call is not partitioned by XLA: every device reduces its own rows (as
      # kernel.kernel_reducer)
      spec = P(DATA_AXIS)
      stats = jax.shard_map(stats, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                            check_vma=False)
  else:
    wrapper, tables = None, batch_tables(batch, roles, direction, False, slots)
  schedule = module.config.layer_schedule

  def reduce(layer, probs, query, key, mask_, values=None, context=None, **_):
    if values is None or context is None:
      raise ValueError("the second pass needs the layer's values and context vectors: the model's "
                       "attention must honour the reducer's wants_values (model/attention.py)")
    out_kernel = module.layers[schedule[layer]].attention.output.kernel.value
    fx = transformed_norms(values, out_kernel)                            # [b, h, k]
    out = {"norm_ratio": slot_norm_ratio(context, values, out_kernel, where)}
    if map_free:
      e = query.shape[-1]
      q2, k2 = _augmented(query, key, fx, augmented_dim(e, wrapper))
      bias = stats(q2, k2, tables)["sieve_bias"]
      tiles = _query_key_tiles(query, key, batch, bk, blocks)
    else:
      p = probs.astype(jnp.float32) * (mask > 0)[:, None, :, None]
      w = norm_weights(p, fx, mask) * (mask > 0)[:, None, :, None]
      bias = reduce_layer(w, tables, roles, mask)["sieve_bias"]
      tiles = _map_tiles(p, bk, blocks)
    out["sieve_bias"] = bias if slots else bias[:, :, None]               # [b, h, S, r]
    mass, arg = parsing_mod.key_block_loop(tiles, blocks, bk, layout, real_q, parsing)
    out["first_attention"], out["sep_attention"] = slot_sinks(mass[..., :k], where)
    if parsing:
      out["parse_pred"] = parsing_mod.run_predictions(arg, layout, slots, k)
    return out

  reduce.needs_probs = not map_free
  reduce.wants_values = True
  return reduce, tables


def slot_hidden_norms(hidden_states, batch, slots: int) -> jnp.ndarray:
  """``hidden_norms`` per sequence, float32 ``[b, S, l + 1, 3]``: at the sequence's first
  position, the mean over its real ``[SEP]``s, the median over its other positions (NaN where
  none)."""
  where = slot_positions(batch, slots)
  norms = jnp.linalg.norm(hidden_states.astype(jnp.float32), axis=-1)      # [l + 1, b, q]
  norms = jnp.transpose(norms, (1, 0, 2))[:, None]                        # [b, 1, l + 1, q]
  sep = (jnp.asarray(batch["token_class"]) == TOKEN_SEP)[:, None, :] & (where["real"] > 0)
  count = jnp.sum(sep, axis=-1)[..., None]                                # [b, S, 1]
  first = jnp.sum(norms * where["first"][:, :, None, :], axis=-1)
  sep_mean = jnp.where(count > 0, jnp.sum(norms * sep[:, :, None, :], -1) / jnp.maximum(count, 1),
                       jnp.nan)
  other = (where["real"] > 0) & ~sep & (where["first"] == 0)
  median = jnp.nanmedian(jnp.where(other[:, :, None, :], norms, jnp.nan), axis=-1)
  return jnp.stack([first, sep_mean, median], axis=-1)


def unpack_slots(x) -> jnp.ndarray:
  """``[b, l, h, S, ...]`` -> ``[b * S, l, h, ...]`` (row ``i * S + j``: slot j of row i)."""
  x = jnp.moveaxis(x, 3, 1)
  return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


@functools.lru_cache(maxsize=None)
def norm_program(graphdef, roles: tuple[str, ...], direction: str, parsing: bool, mesh,
                 map_free: bool = False, slots: int = 0, platform: str | None = None):
  """The jitted second pass ``run(state, batch) -> dict`` for one encoder graph, roles,
  direction, mesh, path (``map_free``) and packing (``slots``): compiled once per shape and
  shared by every `NormStep` (a trajectory's checkpoints included). The forward runs with
  ``norm_reducer``'s hook (no ``[b, l, h, q, k]`` stack; with ``map_free`` no map at all) and
  returns its hidden states (``[l + 1, b, q, d]``, linear in the length) for ``hidden_norms``."""

  def norm_pass(state, batch):
    module = nnx.merge(graphdef, state)
    reduce, tables = norm_reducer(module, batch, roles, direction, parsing=parsing,
                                  map_free=map_free, slots=slots, platform=platform, mesh=mesh)
    kwargs = {}
    if slots:
      kwargs = {"segment_ids": batch["segment_ids"],
                "position_ids": segment_positions(batch["segment_ids"])}
    out = module(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                 return_hidden_states=True, deterministic=True, attention_reduce=reduce, **kwargs)
    result = {name: unpack_slots(x) for name, x in out["attention_reduced"].items()}
    count = tables["count"].reshape(-1, tables["count"].shape[-1])[:, None, None, :]
    result["norm_sieve_bias"] = jnp.where(count > 0, result.pop("sieve_bias"), jnp.nan)
    hn = slot_hidden_norms(out["hidden_states"], batch, slots)            # [b, S, l + 1, 3]
    result["hidden_norms"] = hn.reshape((-1,) + hn.shape[2:])
    return result

  return jax.jit(norm_pass, out_shardings=batch_sharding(mesh))  # name: compiling.PROGRAM_NAMES


class NormStep(HostTables):
  """Callable second pass; see ``make_norm_step``. On its map-free path the kernel's tables come
  with the batch, built on the host (``HostTables.with_tables``: the pass's batch builders, else
  the call)."""

  def __init__(self, model, roles: Sequence[str] = ROLES, direction: str = "dep2head",
               parsing: bool = True, mesh=None, map_free: bool | None = None,
               platform: str | None = None, memory_bytes: int | None = None):
    self.roles = roles = check_roles(roles)
    self.direction = direction = check_direction(direction)
    self.parsing = parsing = bool(parsing)
    encoder = getattr(model, "bert", model)
    if not (isinstance(encoder, nnx.Module) and hasattr(encoder, "layers")
            and hasattr(encoder, "config")):
      raise TypeError(f"the norm pass needs a heads_jax encoder (BertModel or a task model with "
                      f".bert), got {type(encoder).__name__}")
    self.mesh = mesh = data_mesh() if mesh is None else mesh
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    self.multiple = max(1, len(local))
    self.platform = target_platform(platform)
    # the kernel recomputes each head's logits as q . k over the real keys: not DeBERTa's, not a
    # sliding window's (as the first pass)
    self.can_go_map_free = can_go_map_free(encoder)
    if map_free and not self.can_go_map_free:
      raise ValueError("this model's logits are not q . k over the real keys (DeBERTa, ModernBERT's "
                       "sliding window): its second pass needs the maps (map_free=False)")
    self.map_free = map_free
    self.memory_bytes = device_memory_bytes(mesh) if memory_bytes is None else memory_bytes
    self._shape = (encoder.config.num_layers, encoder.config.num_heads)
    self._packs = accepts_packing(encoder)
    self._graphdef, state = nnx.split(encoder)
    self._state = replicate(state, mesh)
    self._state_signature = compiling.signature(self._state)

  def path_for(self, rows: int, length: int) -> bool:
    """Whether a batch ``[rows, length]`` runs map-free: as asked, else as the first pass's
    ``auto`` would for that shape (``stats.step.auto_stats_impl``: ``"kernel"``), where the
    model allows it."""
    if self.map_free is not None:
      return bool(self.map_free)
    per_device = -(-int(rows) // self.mesh.devices.size)
    impl = auto_stats_impl(self.platform, batch=per_device, layers=self._shape[0],
                           heads=self._shape[1], length=int(length),
                           memory_bytes=self.memory_bytes, map_free=self.can_go_map_free)
    return impl == "kernel" and self.can_go_map_free

  def _kernel_measures(self, rows: int, length: int, head_gate=None) -> bool | None:
    """False (the tables without the measures) where the batch runs map-free, else None
    (``HostTables``)."""
    del head_gate
    return False if self.path_for(rows, length) else None

  def packs_for(self, rows: int, length: int) -> bool:
    """Whether a batch ``[rows, length]`` may be packed (``segment_ids``): the model packs
    (both paths do, as the first pass's)."""
    del rows, length
    return self._packs

  def program(self, map_free: bool, slots: int = 0):
    """The jitted program (``norm_program``) of one path and packing."""
    return norm_program(self._graphdef, tuple(self.roles), self.direction, self.parsing,
                        self.mesh, bool(map_free), int(slots), self.platform)

  def _executable(self, rows: int, length: int, background: bool = False, priority: int = 0,
                  slots: int = 0):
    """The Future of the compiled pass of a padded batch ``[rows, length]`` (one per process)."""
    run = self.program(self.path_for(rows, length), slots)
    key = (rows, length, self._state_signature) + ((slots,) if slots else ())
    return compiling.executable(
        run, key, lambda: run.lower(self._state, self.input_specs(rows, length, slots)),
        background=background, priority=priority)

  def precompile(self, rows: int, length: int, priority: int = 0, slots: int = 0) -> None:
    """Starts compiling the pass of a batch ``[rows, length]`` on the background compile thread
    (``heads_jax.stats.compiling``), e.g. while the first pass runs on the same shapes."""
    rows = -(-int(rows) // self.multiple) * self.multiple
    if slots and not self.packs_for(rows, length):
      return    # such rows are refused at the call
    self._executable(rows, int(length), background=True, priority=priority, slots=int(slots))

  def __call__(self, batch: dict, slots: int | None = None) -> dict:
    """numpy results for the real rows (``b * slots`` rows, slot-major per row, for a packed
    batch with ``segment_ids``): ``norm_sieve_bias`` float32 ``[b, l, h, r]``,
    ``first_attention`` ``[b, l, h]``, ``sep_attention`` ``[b, l, h, 2]``, ``norm_ratio``
    ``[b, l, h]``, ``hidden_norms`` ``[b, l + 1, 3]`` and with parsing ``parse_pred`` int32
    ``[b, l, h, k]``."""
    missing = [f for f in BATCH_FIELDS if f not in batch]
    if missing:
      raise KeyError(f"batch lacks field(s) {missing} (see heads_jax/data/vocabulary.py)")
    fields = BATCH_FIELDS + (("segment_ids",) if "segment_ids" in batch else ())
    host = {f: np.asarray(batch[f], np.int32) for f in fields}
    padded, rows = pad_to_multiple(host, self.multiple)
    if "segment_ids" in host:
      slots = int(host["segment_ids"].max(initial=1)) if slots is None else int(slots)
      if not self.packs_for(*padded["input_ids"].shape):
        raise ValueError("this model cannot take packed batches (no segment_ids); pass unpacked "
                         "batches")
    else:
      slots = 0
    tables = self._tables_for(padded, slots, given=batch.get(kernel.TABLES))
    if tables is not None:
      padded = {**padded, kernel.TABLES: tables}
    run = self._executable(*padded["input_ids"].shape, slots=slots).result()
    out = run(self._state, shard_batch(padded, self.mesh))
    return {k: np.asarray(v)[:rows * max(slots, 1)] for k, v in out.items()}


def make_norm_step(model, roles: Sequence[str] = ROLES, direction: str = "dep2head",
                   parsing: bool = True, mesh=None, map_free: bool | None = None) -> NormStep:
  """The jitted second pass (module docstring) of a heads_jax encoder ``model`` (or a task model
  whose ``.bert`` is used): ``step(batch) -> dict`` of numpy arrays (``NormStep.__call__``).

  Args:
    roles, direction: as ``heads_jax.stats.step.make_analysis_step`` (the r axis of
      ``norm_sieve_bias``).
    parsing: also return each head's predicted word per word (``parse_pred``).
    mesh: the one-axis ``data`` mesh (default: all devices).
    map_free: True: no attention map at all (the statistics kernel and the key-block loop on
      the queries and keys); False: each layer's map, one at a time; None (default): as the
      first pass's ``auto`` for each shape (``NormStep.path_for``). Both take packed rows.
  """
  return NormStep(model, roles=roles, direction=direction, parsing=parsing, mesh=mesh,
                  map_free=map_free)


PASS_KEYS = ("norm_sieve_bias", "first_attention", "sep_attention", "norm_ratio", "hidden_norms")


def run_norm_pass(step: NormStep, batches, num_sequences: int, max_length: int,
                  progress=None) -> dict:
  """Drives ``step`` over ``batches`` (``(indices, batch)`` of ``heads_jax.data.encoding.
  iter_batches``, or packed: ``pipelines.device_pass.pass_packing``, one index per slot; index
  -1 for filler rows and empty slots) and gathers the results in dataset order:
  ``PASS_KEYS`` float32 ``[N, ...]`` and with parsing ``parse_pred`` int16 ``[N, l, h,
  max_length]`` (-1 beyond a sequence's words). ``progress``: optional callable(done, total)."""
  out: dict = {}
  seen = np.zeros(num_sequences, bool)
  for indices, batch in batches:
    indices = np.asarray(indices)
    keep = indices >= 0
    rows = np.asarray(batch["input_ids"]).shape[0]
    res = step(batch, slots=len(indices) // rows if "segment_ids" in batch else None)
    rows = indices[keep]
    for name in PASS_KEYS:
      x = res[name][keep]
      if name not in out:
        out[name] = np.full((num_sequences,) + x.shape[1:], np.nan, np.float32)
      out[name][rows] = x
    if "parse_pred" in res:
      x = res["parse_pred"][keep]
      if "parse_pred" not in out:
        out["parse_pred"] = np.full((num_sequences,) + x.shape[1:3] + (max_length,), -1, np.int16)
      out["parse_pred"][rows, ..., :x.shape[-1]] = x
    seen[rows] = True
    if progress is not None:
      progress(int(seen.sum()), num_sequences)
  if not seen.all():
    raise ValueError(f"the batches covered {int(seen.sum())} of {num_sequences} sequences")
  return out
