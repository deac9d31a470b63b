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
"""

from __future__ import annotations

import jax
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


def make_optimizer(*, learning_rate: float, warmup_steps: int, total_steps: int,
                   weight_decay: float = 0.01, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-6, clip_norm: float | None = 1.0, accumulate_steps: int = 1,
                   end_learning_rate: float = 0.0, power: float = 1.0, name: str = "lamb"):
  """Returns ``(tx, schedule)``: the optimizer (``lamb`` or ``adamw`` with the same masks,
  clipping and schedule) and its learning-rate schedule (a function of the update count)."""
  schedule = lr_schedule(learning_rate, warmup_steps, total_steps, end_learning_rate, power)
  if name == "lamb":
    tx = lamb(schedule, weight_decay=weight_decay, b1=b1, b2=b2, eps=eps, clip_norm=clip_norm)
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
