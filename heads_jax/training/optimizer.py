"""LAMB with the BERT conventions, built from optax pieces.

The update of one step, in order:

1. clip the gradients to global norm ``clip_norm`` (1.0), as BERT's ``optimization.py``;
2. Adam moments (``b1`` 0.9, ``b2`` 0.999, ``eps`` 1e-6, bias-corrected): ``u = m / (sqrt(v) + eps)``;
3. decoupled weight decay ``u += weight_decay * w`` (0.01) on every parameter except biases and
   LayerNorm parameters;
4. the layer-wise trust ratio ``u *= ||w|| / ||u||`` (1 where either norm is 0), again for every
   parameter except biases and LayerNorm parameters. ``optax.lamb`` applies the trust ratio to
   every parameter; the LAMB references (google-research/bert's and TF-Addons' ``LAMB`` with
   ``exclude_from_layer_adaptation`` defaulting to the weight-decay exclusions, NVIDIA's
   BERT LAMB) exclude bias and LayerNorm, and so does this chain;
5. ``w -= lr(step) * u`` with a linear warm-up from 0 to ``learning_rate`` over ``warmup_steps``,
   then a polynomial decay (power 1 = linear) to ``end_learning_rate`` (0) at ``total_steps``.

A parameter counts as "bias or LayerNorm" when its leaf name is ``bias`` or ``scale`` or any
key on its path contains ``norm`` (``LayerNorm``, ``layer_norm``, ``norm``); kernels and
embedding tables are decayed and adapted.

``accumulate_steps > 1`` wraps the chain in ``optax.MultiSteps``: gradients of that many
micro-batches are averaged before one update (the schedule counts updates).
The parameters (the master weights) stay float32 whatever the model's compute dtype.

Two implementations of the same update:

* ``lamb``: the optax chain above, one small program per parameter leaf at every stage
  (compiled for BERT-base on the CPU: 2,237 fusions);
* ``flat_lamb`` (``make_optimizer(..., flat=True)``; not the default: 1.61x slower a step than
  the chain on an H200, BENCHMARKS.md issue 39, 37 ms of it in the ``segment_sum`` scatters that
  ``leaf_sums`` has replaced since; without it its passes measured ~2.5 ms against the chain's
  2.6, so it stays off: BENCHMARKS.md issue 49): the moments live
  in one flat float32 vector, each leaf a segment padded to whole rows of ``FLAT_ROW`` elements
  (``[R, FLAT_ROW]``). The update is a few passes over it: the gradients' global norm; the
  moments, the Adam direction, the decay and each row's ``||w||^2`` and ``||u||^2``; the
  per-leaf sums of those rows (``leaf_sums``: a product with the rows' one-hot leaf matrix, not a
  scatter) and the trust ratios; the scaled update, cut back into the leaves. The same arithmetic as the chain in
  the same order, so the two agree to float32 rounding (summation order only:
  ``tests/training/test_flat_lamb.py``). Its state (``FlatLambState``) is not the chain's, so a
  run keeps the implementation it started with (``optimizer.flat`` in the config).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


def is_bias_or_norm(path) -> bool:
  """True for bias and LayerNorm leaves of a parameter pytree (see the module docstring)."""
  names = [_key_name(k) for k in path]
  names = [n for n in names if n not in ("value",)]
  if not names:
    return False
  if names[-1] in ("bias", "scale"):
    return True
  return any("norm" in n.lower() for n in names)


def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def decay_mask(params):
  """Pytree of bools like ``params``: True where weight decay and the trust ratio apply."""
  return jax.tree_util.tree_map_with_path(lambda p, _: not is_bias_or_norm(p), params)


def lr_schedule(learning_rate: float, warmup_steps: int, total_steps: int,
                end_learning_rate: float = 0.0, power: float = 1.0) -> optax.Schedule:
  """Linear warm-up over ``warmup_steps``, then polynomial decay to ``end_learning_rate`` at
  ``total_steps`` (constant after it)."""
  if total_steps <= 0:
    raise ValueError(f"total_steps must be positive, got {total_steps}")
  warmup_steps = max(0, min(int(warmup_steps), int(total_steps)))
  decay = optax.polynomial_schedule(learning_rate, end_learning_rate, power,
                                    max(1, total_steps - warmup_steps))
  if warmup_steps == 0:
    return decay
  warm = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  return optax.join_schedules([warm, decay], [warmup_steps])


def lamb(learning_rate: float | optax.Schedule, *, weight_decay: float = 0.01, b1: float = 0.9,
         b2: float = 0.999, eps: float = 1e-6, clip_norm: float | None = 1.0,
         mask=decay_mask) -> optax.GradientTransformation:
  """The LAMB chain of the module docstring (``mask``: pytree or function of the params)."""
  parts = []
  if clip_norm:
    parts.append(optax.clip_by_global_norm(clip_norm))
  parts += [
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask=mask),
      optax.masked(optax.scale_by_trust_ratio(), mask),
      optax.scale_by_learning_rate(learning_rate),
  ]
  return optax.chain(*parts)


# ------------------------------------------------------------------------------------------------
# The flat LAMB

FLAT_ROW = 1024   # elements per row of the flat layout; a leaf is padded to whole rows


class FlatLayout(NamedTuple):
  """Where each leaf (in ``jax.tree.flatten`` order) lives in the flat ``[rows, FLAT_ROW]`` array."""
  shapes: tuple            # leaf shapes
  offsets: tuple           # first element of each leaf in the flat vector
  rows: int                # R
  row_leaf: np.ndarray     # int32 [R]: the leaf of each row
  leaf_adapted: np.ndarray  # bool [L]: weight decay and trust ratio apply


@functools.lru_cache(maxsize=32)
def _layout_of(shapes: tuple, adapted: tuple) -> FlatLayout:
  offsets, row_leaf, at = [], [], 0
  for i, shape in enumerate(shapes):
    n = int(np.prod(shape, dtype=np.int64))
    r = -(-n // FLAT_ROW)
    offsets.append(at)
    row_leaf += [i] * r
    at += r * FLAT_ROW
  return FlatLayout(tuple(shapes), tuple(offsets), at // FLAT_ROW,
                    np.asarray(row_leaf, np.int32), np.asarray(adapted, bool))


def flat_layout(params, mask=None) -> FlatLayout:
  """The layout of ``params`` (a pytree of arrays or shape structs); ``mask`` (default
  ``decay_mask``): True where decay and the trust ratio apply."""
  mask = decay_mask if mask is None else mask
  mask = mask(params) if callable(mask) else mask
  leaves = jax.tree.leaves(params)
  adapted = jax.tree.leaves(mask)
  if len(adapted) != len(leaves):
    raise ValueError("the mask must have one boolean per parameter leaf")
  return _layout_of(tuple(tuple(x.shape) for x in leaves), tuple(bool(a) for a in adapted))


def to_flat(leaves, layout: FlatLayout):
  """float32 ``[R, FLAT_ROW]``: the leaves raveled, each padded with zeros to whole rows."""
  parts = []   # one concatenation (zeros between the leaves), not a padding op per leaf
  for x in leaves:
    x = jnp.ravel(x).astype(jnp.float32)
    parts.append(x)
    if x.size % FLAT_ROW:
      parts.append(jnp.zeros((-x.size % FLAT_ROW,), jnp.float32))
  return jnp.concatenate(parts).reshape(layout.rows, FLAT_ROW)


def from_flat(flat, layout: FlatLayout) -> list:
  """The leaves back from a ``[R, FLAT_ROW]`` array (inverse of ``to_flat``)."""
  v = flat.reshape(-1)
  out = []
  for shape, off in zip(layout.shapes, layout.offsets):
    n = int(np.prod(shape, dtype=np.int64))
    out.append(jax.lax.slice(v, (off,), (off + n,)).reshape(shape))
  return out


def leaf_sums(row_values, layout: FlatLayout):
  """``[R] -> [L]``: each leaf's rows summed, as one float32 product with the rows' one-hot
  leaf matrix ``[R, L]`` (exact products by 0 and 1; ``HIGHEST``: no TF32). Not
  ``jax.ops.segment_sum``: its scatter-add of ~10^5 rows into ~200 sums serialises on a GPU's
  atomics (37.4 of the flat update's 39.9 ms in BERT-base's step on an H200, BENCHMARKS.md);
  nor a slice per leaf (~2 kernels a leaf)."""
  # the barrier keeps XLA from folding the [R, L] one-hot into a constant of the program
  row_leaf = jax.lax.optimization_barrier(jnp.asarray(layout.row_leaf))
  onehot = (row_leaf[:, None] == jnp.arange(len(layout.shapes))[None, :]).astype(jnp.float32)
  return jnp.dot(row_values.astype(jnp.float32), onehot, precision=jax.lax.Precision.HIGHEST)


class FlatLambState(NamedTuple):
  """``count`` int32 (updates done), first and second moments ``mu``, ``nu`` float32
  ``[R, FLAT_ROW]`` in the flat layout of the parameters, and ``grad_norm`` float32 ``[]``: the
  global norm of the last update's gradients (before clipping; the train step's ``grad_norm``
  metric reads it instead of a second pass over the gradients)."""
  count: jax.Array
  mu: jax.Array
  nu: jax.Array
  grad_norm: jax.Array


def flat_lamb(learning_rate: float | optax.Schedule, *, weight_decay: float = 0.01,
              b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
              clip_norm: float | None = 1.0, mask=decay_mask) -> optax.GradientTransformation:
  """``lamb``'s update (same arguments) over one flat vector (module docstring)."""
  schedule = learning_rate if callable(learning_rate) else (lambda _: learning_rate)

  def init_fn(params):
    lay = flat_layout(params, mask)
    zeros = jnp.zeros((lay.rows, FLAT_ROW), jnp.float32)
    return FlatLambState(jnp.zeros([], jnp.int32), zeros, zeros, jnp.zeros([], jnp.float32))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("flat_lamb needs the parameters (tx.update(grads, state, params))")
    lay = flat_layout(params, mask)
    leaves, treedef = jax.tree.flatten(updates)
    g = to_flat(leaves, lay)                                          # [R, C]
    w = to_flat(treedef.flatten_up_to(params), lay)
    g_norm = jnp.sqrt(jnp.sum(g * g))
    if clip_norm:
      g = jnp.where(g_norm < clip_norm, g, (g / g_norm) * clip_norm)
    mu = (1 - b1) * g + b1 * state.mu
    nu = (1 - b2) * (g ** 2) + b2 * state.nu
    count = optax.safe_increment(state.count)
    mu_hat = mu / (1 - b1 ** count).astype(jnp.float32)
    nu_hat = nu / (1 - b2 ** count).astype(jnp.float32)
    u = mu_hat / (jnp.sqrt(nu_hat) + eps)
    row_adapted = jnp.asarray(lay.leaf_adapted[lay.row_leaf])[:, None]   # [R, 1]
    u = jnp.where(row_adapted, u + weight_decay * w, u)
    row_leaf = jnp.asarray(lay.row_leaf)
    w_norm = jnp.sqrt(leaf_sums(jnp.sum(w * w, axis=1), lay))           # [L]
    u_norm = jnp.sqrt(leaf_sums(jnp.sum(u * u, axis=1), lay))
    ratio = jnp.where((w_norm == 0.0) | (u_norm == 0.0), 1.0, w_norm / u_norm)
    ratio = jnp.where(jnp.asarray(lay.leaf_adapted), ratio, 1.0)
    step_size = -1 * schedule(state.count)
    out = (u * ratio[row_leaf][:, None]) * step_size
    return (jax.tree.unflatten(treedef, from_flat(out, lay)),
            FlatLambState(count, mu, nu, g_norm))

  return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(*, learning_rate: float, warmup_steps: int, total_steps: int,
                   weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-6, clip_norm: float | None = 1.0, accumulate_steps: int = 1,
                   end_learning_rate: float = 0.0, power: float = 1.0, name: str = "lamb",
                   flat: bool = False):
  """Returns ``(tx, schedule)``: the optimizer (``lamb`` or ``adamw`` with the same masks,
  clipping and schedule) and its learning-rate schedule (a function of the update count).
  ``flat``: LAMB as ``flat_lamb`` (the same update in a few passes over one flat vector)."""
  schedule = lr_schedule(learning_rate, warmup_steps, total_steps, end_learning_rate, power)
  if flat and name != "lamb":
    raise ValueError(f"optimizer.flat exists for 'lamb' only, not {name!r}")
  if name == "lamb":
    make = flat_lamb if flat else lamb
    tx = make(schedule, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps, clip_norm=clip_norm)
  elif name == "adamw":
    parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                             mask=decay_mask))
    tx = optax.chain(*parts)
  else:
    raise ValueError(f"optimizer must be 'lamb' or 'adamw', got {name!r}")
  if accumulate_steps > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=accumulate_steps)
  return tx, schedule
