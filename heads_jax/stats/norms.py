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

**Massive activations** (Sun et al. 2024; issue 40): ``hidden_norms`` ``[b, l + 1, 3]``, per
sequence and hidden state (embeddings, then each layer): the L2 norm at position 0, the mean L2
norm over the real ``[SEP]`` positions (NaN if none) and the median L2 norm over the other real
positions (not position 0 nor ``[SEP]``; NaN if none) (``hidden_norms``).

``make_norm_step`` runs all three as one jitted, data-parallel pass: the model returns its
attentions ``[b, l, h, q, k]`` and hidden states, and each layer's values are recomputed from
the layer's input with the layer's own value projection. The stack of attentions is the price
of a pass that needs each layer's input (batch it accordingly: BERT-base at 32 x 128 tokens is
300 MB). Only ``[b, l, h, ...]`` reductions leave the device.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from heads_jax.data.vocabulary import BATCH_FIELDS, ROLES, TOKEN_SEP
from heads_jax.parallel import batch_sharding, data_mesh, pad_to_multiple, replicate, shard_batch
from heads_jax.sieves import check_direction, check_roles
from heads_jax.stats import compiling
from heads_jax.stats.layerwise import batch_tables, finish, reduce_layer
from heads_jax.stats.parsing import predicted_heads

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


def norm_ratio(probs, values, out_kernel, attention_mask) -> jnp.ndarray:
  """``mean_q ||sum_k a[q, k] f(x_k)|| / mean_k ||f(x_k)||`` over real queries and keys, float32
  ``[b, h]`` (0 for a head whose transformed values are all 0)."""
  h = values.shape[2]
  gram = output_gram(out_kernel, h)
  real = (jnp.asarray(attention_mask) > 0).astype(jnp.float32)        # [b, k]
  n = jnp.maximum(jnp.sum(real, axis=-1), 1.0)                         # [b]
  ctx = jnp.einsum("bhqk,bkhe->bqhe", probs.astype(jnp.float32), values.astype(jnp.float32),
                   precision=_HIGHEST)
  out_norm = jnp.sum(_quadratic_norm(ctx, gram) * real[:, None, :], axis=-1) / n[:, None]
  fx_mean = jnp.sum(_quadratic_norm(values, gram) * real[:, None, :], axis=-1) / n[:, None]
  return jnp.where(fx_mean > 0, out_norm / jnp.where(fx_mean > 0, fx_mean, 1.0), 0.0)


def sink_attention(probs, token_class, attention_mask):
  """Mean over real queries of the attention on the first token, ``[b, h]``, and on the first and
  second ``[SEP]``, ``[b, h, 2]`` (NaN where the sequence has no such ``[SEP]``)."""
  real = (jnp.asarray(attention_mask) > 0).astype(jnp.float32)        # [b, q]
  n = jnp.maximum(jnp.sum(real, axis=-1), 1.0)
  per_key = jnp.einsum("bhqk,bq->bhk", probs.astype(jnp.float32), real,
                       precision=_HIGHEST) / n[:, None, None]          # [b, h, k]
  first = per_key[..., 0]
  is_sep = (jnp.asarray(token_class) == TOKEN_SEP) & (real > 0)        # [b, k]
  order = jnp.cumsum(is_sep, axis=-1)                                  # 1 at the first [SEP], ...
  seps = []
  for j in (1, 2):
    at = (is_sep & (order == j)).astype(jnp.float32)                   # [b, k]
    value = jnp.einsum("bhk,bk->bh", per_key, at, precision=_HIGHEST)
    seps.append(jnp.where(jnp.any(at > 0, axis=-1)[:, None], value, jnp.nan))
  return first, jnp.stack(seps, axis=-1)


def hidden_norms(hidden_states, batch) -> jnp.ndarray:
  """float32 ``[b, l + 1, 3]`` from ``hidden_states`` ``[l + 1, b, q, d]``: per sequence and hidden
  state the L2 norm at position 0, the mean over the real ``[SEP]`` positions and the median over
  the other real positions (NaN where there is none; module docstring)."""
  norms = jnp.transpose(jnp.linalg.norm(hidden_states.astype(jnp.float32), axis=-1), (1, 0, 2))
  real = jnp.asarray(batch["attention_mask"]) > 0                         # [b, q]
  sep = (jnp.asarray(batch["token_class"]) == TOKEN_SEP) & real
  other = real & ~sep & (jnp.arange(real.shape[1]) > 0)[None]
  count = jnp.sum(sep, axis=-1)[:, None]                                  # [b, 1]
  sep_mean = jnp.where(count > 0, jnp.sum(norms * sep[:, None], -1) / jnp.maximum(count, 1), jnp.nan)
  median = jnp.nanmedian(jnp.where(other[:, None], norms, jnp.nan), axis=-1)
  return jnp.stack([norms[..., 0], sep_mean, median], axis=-1)


def layer_values(layer, x) -> jnp.ndarray:
  """A layer's value vectors ``[b, k, h, e]`` (bias included) from its input ``x`` ``[b, k, d]``;
  a layer with its own ``values(x)`` (ModernBERT, DeBERTa: pre-norm or fused projections) gives them."""
  if hasattr(layer, "values"):
    return layer.values(x).astype(jnp.float32)
  att = layer.attention
  cfg = att.cfg
  b, k, _ = x.shape
  return att.value(x).astype(jnp.float32).reshape(b, k, cfg.num_heads, cfg.head_dim)


def norm_layer(probs, values, out_kernel, tables: dict, roles: Sequence[str], batch: dict,
               parsing: bool = True) -> dict:
  """One layer's outputs of the pass: ``norm_sieve_bias`` ``[b, h, r]`` (0 where the sieve is
  empty; ``layerwise.finish`` writes NaN), ``first_attention`` ``[b, h]``, ``sep_attention``
  ``[b, h, 2]``, ``norm_ratio`` ``[b, h]`` and with ``parsing`` ``parse_pred`` ``[b, h, k]``."""
  mask = batch["attention_mask"]
  probs = probs * (jnp.asarray(mask) > 0)[:, None, :, None]            # padding query rows 0
  fx = transformed_norms(values, out_kernel)
  w = norm_weights(probs, fx, mask)
  w = w * (jnp.asarray(mask) > 0)[:, None, :, None]
  out = {"sieve_bias": reduce_layer(w, tables, roles, mask)["sieve_bias"]}
  out["first_attention"], out["sep_attention"] = sink_attention(probs, batch["token_class"], mask)
  out["norm_ratio"] = norm_ratio(probs, values, out_kernel, mask)
  if parsing:
    out["parse_pred"] = predicted_heads(probs, batch["word_ids"])
  return out


@functools.lru_cache(maxsize=None)
def norm_program(graphdef, roles: tuple[str, ...], direction: str, parsing: bool, mesh):
  """The jitted second pass ``run(state, batch) -> dict`` for one encoder graph, roles, direction
  and mesh: compiled once and shared by every `NormStep` (a trajectory's checkpoints included)."""

  def norm_pass(state, batch):
    module = nnx.merge(graphdef, state)
    out = module(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                 return_attentions=True, return_hidden_states=True, deterministic=True,
                 attention="explicit")
    tables = batch_tables(batch, roles, direction)
    per_layer = []
    for i, which in enumerate(module.config.layer_schedule):
      layer = module.layers[which]
      values = layer_values(layer, out["hidden_states"][i])
      per_layer.append(norm_layer(out["attentions"][:, i], values,
                                  layer.attention.output.kernel.value, tables, roles, batch,
                                  parsing))
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *per_layer)
    result = finish(stacked, tables)                                  # NaN for empty sieves
    result["norm_sieve_bias"] = result.pop("sieve_bias")
    result["hidden_norms"] = hidden_norms(out["hidden_states"], batch)
    return result

  return jax.jit(norm_pass, out_shardings=batch_sharding(mesh))  # name: compiling.PROGRAM_NAMES


class NormStep:
  """Callable second pass; see ``make_norm_step``."""

  def __init__(self, model, roles: Sequence[str] = ROLES, direction: str = "dep2head",
               parsing: bool = True, mesh=None):
    self.roles = roles = check_roles(roles)
    self.direction = direction = check_direction(direction)
    self.parsing = parsing = bool(parsing)
    encoder = getattr(model, "bert", model)
    if not (isinstance(encoder, nnx.Module) and hasattr(encoder, "layers")
            and hasattr(encoder, "config")):
      raise TypeError(f"the norm pass needs a heads_jax encoder (BertModel or a task model with "
                      f".bert), got {type(model).__name__}")
    self.mesh = mesh = data_mesh() if mesh is None else mesh
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    self.multiple = max(1, len(local))
    graphdef, state = nnx.split(encoder)
    self._state = replicate(state, mesh)
    self._run = norm_program(graphdef, tuple(roles), direction, parsing, mesh)
    self._state_signature = compiling.signature(self._state)

  def _executable(self, rows: int, length: int, background: bool = False, priority: int = 0):
    """The Future of the compiled pass of a padded batch ``[rows, length]`` (one per process)."""
    spec = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=batch_sharding(self.mesh))
    return compiling.executable(
        self._run, (rows, length, self._state_signature),
        lambda: self._run.lower(self._state, {f: spec for f in BATCH_FIELDS}),
        background=background, priority=priority)

  def precompile(self, rows: int, length: int, priority: int = 0) -> None:
    """Starts compiling the pass of a batch ``[rows, length]`` on the background compile thread
    (``heads_jax.stats.compiling``), e.g. while the first pass runs on the same shapes."""
    self._executable(-(-int(rows) // self.multiple) * self.multiple, int(length),
                     background=True, priority=priority)

  def __call__(self, batch: dict) -> dict:
    """numpy results for the real rows: ``norm_sieve_bias`` float32 ``[b, l, h, r]``,
    ``first_attention`` ``[b, l, h]``, ``sep_attention`` ``[b, l, h, 2]``, ``norm_ratio``
    ``[b, l, h]``, ``hidden_norms`` ``[b, l + 1, 3]`` and with parsing ``parse_pred`` int32
    ``[b, l, h, k]``."""
    missing = [f for f in BATCH_FIELDS if f not in batch]
    if missing:
      raise KeyError(f"batch lacks field(s) {missing} (see heads_jax/data/vocabulary.py)")
    host = {f: np.asarray(batch[f], np.int32) for f in BATCH_FIELDS}
    padded, rows = pad_to_multiple(host, self.multiple)
    run = self._executable(*padded["input_ids"].shape).result()
    out = run(self._state, shard_batch(padded, self.mesh))
    return {k: np.asarray(v)[:rows] for k, v in out.items()}


def make_norm_step(model, roles: Sequence[str] = ROLES, direction: str = "dep2head",
                   parsing: bool = True, mesh=None) -> NormStep:
  """The jitted second pass (module docstring) of a heads_jax encoder ``model`` (or a task model
  whose ``.bert`` is used): ``step(batch) -> dict`` of numpy arrays (``NormStep.__call__``).

  Args:
    roles, direction: as ``heads_jax.stats.step.make_analysis_step`` (the r axis of
      ``norm_sieve_bias``).
    parsing: also return each head's predicted word per word (``parse_pred``).
    mesh: the one-axis ``data`` mesh (default: all devices).
  """
  return NormStep(model, roles=roles, direction=direction, parsing=parsing, mesh=mesh)


PASS_KEYS = ("norm_sieve_bias", "first_attention", "sep_attention", "norm_ratio", "hidden_norms")


def run_norm_pass(step: NormStep, batches, num_sequences: int, max_length: int,
                  progress=None) -> dict:
  """Drives ``step`` over ``batches`` (``(indices, batch)`` of ``heads_jax.data.encoding.
  iter_batches``; index -1 for filler rows) and gathers the results in dataset order:
  ``PASS_KEYS`` float32 ``[N, ...]`` and with parsing ``parse_pred`` int16 ``[N, l, h,
  max_length]`` (-1 beyond a sequence's words). ``progress``: optional callable(done, total)."""
  out: dict = {}
  seen = np.zeros(num_sequences, bool)
  for indices, batch in batches:
    indices = np.asarray(indices)
    keep = indices >= 0
    res = step(batch)
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
