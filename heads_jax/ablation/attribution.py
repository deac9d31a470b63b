"""Self-attention attribution (Hao et al., AAAI 2021): integrated gradients of the model's output
with respect to each head's attention map.

The text of Hao et al. was not available to this project; the method as issue 51 states it:
"integrated gradients of the model's output with respect to each head's attention map,
``A_h * integral over alpha of dF(alpha A)/dA_h``, approximated with m steps (m = 20 in the
paper); a head's importance is its largest attribution". The details below follow the authors'
released code (github.com/YRdddream/attattr, ``examples/generate_attrscore.py`` and
``pytorch_pretrained_bert/model_attr.py``), read for this purpose:

* one layer at a time: layer ``l``'s attention probabilities (all its heads) are replaced by
  ``alpha * A_l`` (``A_l`` the clean run's), every other layer computing its attention as usual
  from the changed hidden states; the baseline is the zero attention map;
* the integral is the left Riemann sum over ``alpha = i / m``, ``i = 0 .. m-1`` (their
  ``scaled_input``): ``Attr_h = A_h / m * sum_i dF(alpha_i A)/dA_h``;
* ``F`` is the softmax probability of the class the clean run predicts (their ``tar_prob``);
  ``objective="logit"`` and ``"log_probability"`` are offered beside it. For a span model
  (SQuAD) ``F`` is the start logit of the clean run's most likely start plus the end logit of
  its most likely end (each over the real positions).

By completeness of integrated gradients, the attributions of a layer summed over its heads and
token pairs approach ``F(A) - F(0)`` (layer ``l`` zeroed) as ``m`` grows (the Riemann error is
O(1/m) for the left sum; tests/ablation/test_attribution.py checks it).

A model enters as ``apply(params, batch, *, edit_probs=None, edit_context=None,
return_attentions=False) -> outputs dict`` (`model_apply` makes it for a heads_jax model; the
edits are `heads_jax.model.attention.AttentionHooks`'s two intervention points), so the
functions here are pure functions of one model call, jitted once per shape: the layer is a
traced argument (``jnp.where(l == layer, x, probs)`` in the edit), and the m steps are one
``vmap``.

Shapes: b batch, l layer, h head, q query, k key (q == k), m steps.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from heads_jax.errors import UserError

OBJECTIVES = ("probability", "log_probability", "logit")
DEFAULT_STEPS = 20   # m: "approximated with m steps (m = 20 in the paper)" (issue 51's statement)

Apply = Callable[..., dict]


def model_apply(graphdef) -> Apply:
  """``apply(state, batch, *, edit_probs, edit_context, return_attentions)`` of the heads_jax
  model ``graphdef`` (a classifier or a span model of any family): deterministic, the edits
  handed down as `heads_jax.model.attention.AttentionHooks`."""
  from heads_jax.model.attention import AttentionHooks

  def apply(state, batch, *, edit_probs=None, edit_context=None, return_attentions=False):
    model = nnx.merge(graphdef, state)
    hooks = AttentionHooks(edit_probs=edit_probs, edit_context=edit_context)
    return model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                 hooks=hooks, return_attentions=return_attentions, deterministic=True)
  return apply


def check_task_head(model) -> str:
  """``"classifier"`` or ``"span"``: the task head of ``model``; UserError (one line) for a
  model without one (a pre-trained encoder has nothing to attribute a prediction to)."""
  if hasattr(model, "classifier") and hasattr(model, "bert"):
    return "classifier"
  if hasattr(model, "qa_outputs"):
    return "span"
  raise UserError(f"the model is a {type(model).__name__} without a task head: attribution and "
                  "patching explain a prediction; pass a fine-tuned classifier (a fine-tuning "
                  "run's best_model) or a SQuAD span model")


def check_steps(steps) -> int:
  if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
    raise UserError(f"--steps {steps}: the integral needs m >= 1 Riemann steps (default "
                    f"m = {DEFAULT_STEPS}, Hao et al.'s as issue 51 states it)")
  return int(steps)


def _masked(logits, mask):
  return jnp.where(mask > 0, logits, jnp.finfo(jnp.float32).min)


def predicted(outputs: dict, mask) -> jax.Array:
  """int ``[b]`` (the predicted class) or ``[b, 2]`` (a span model's most likely start and
  end over the real positions ``mask`` ``[b, k]``): the target of the objective, fixed from the
  clean run."""
  if "logits" in outputs:
    return jnp.argmax(outputs["logits"], -1).astype(jnp.int32)
  return jnp.stack([jnp.argmax(_masked(outputs["start_logits"], mask), -1),
                    jnp.argmax(_masked(outputs["end_logits"], mask), -1)], -1).astype(jnp.int32)


def objective_value(outputs: dict, target, objective: str = "probability") -> jax.Array:
  """float32 ``[b]``: ``F`` of each row (module docstring) for the fixed ``target``
  (`predicted`)."""
  if "logits" in outputs:
    z = outputs["logits"].astype(jnp.float32)
    if objective == "logit":
      v = z
    elif objective == "log_probability":
      v = jax.nn.log_softmax(z, -1)
    elif objective == "probability":
      v = jax.nn.softmax(z, -1)
    else:
      raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    return jnp.take_along_axis(v, target[:, None], -1)[:, 0]
  start = jnp.take_along_axis(outputs["start_logits"], target[:, :1], -1)[:, 0]
  end = jnp.take_along_axis(outputs["end_logits"], target[:, 1:], -1)[:, 0]
  return (start + end).astype(jnp.float32)


def left_riemann(steps: int) -> jax.Array:
  """``alpha_i = i / m``, ``i = 0 .. m-1`` (the authors' ``scaled_input``)."""
  return jnp.arange(steps, dtype=jnp.float32) / steps


def layer_attribution(apply: Apply, params, batch: dict, target, probs, layer, *, steps: int,
                      objective: str = "probability") -> jax.Array:
  """float32 ``[b, h, q, k]``: ``Attr = A / m * sum_i dF(alpha_i A)/dA`` of layer ``layer``
  (an int or a traced int32), ``probs`` its clean attention ``A`` ``[b, h, q, k]``; the m steps
  in one ``vmap``."""

  def f(x):
    out = apply(params, batch, edit_probs=lambda l, p: jnp.where(l == layer, x, p))
    return jnp.sum(objective_value(out, target, objective))

  grads = jax.vmap(lambda a: jax.grad(f)(a * probs))(left_riemann(steps))
  return probs * jnp.mean(grads, 0)


def zeroed_value(apply: Apply, params, batch: dict, target, layer, objective: str) -> jax.Array:
  """float32 ``[b]``: ``F`` with layer ``layer``'s attention zeroed (the integral's baseline)."""
  out = apply(params, batch, edit_probs=lambda l, p: jnp.where(l == layer, 0.0 * p, p))
  return objective_value(out, target, objective)


@dataclasses.dataclass
class Attribution:
  """The attribution of every head over a data set.

  ``importance`` float32 ``[n, l, h]``: each row's largest attribution of each head (over its
  real token pairs; "a head's importance is its largest attribution"); ``total`` ``[n, l]``:
  each layer's attributions summed (``F(A) - F(0)`` up to the Riemann error); ``value`` ``[n]``
  ``F(A)`` and ``baseline`` ``[n, l]`` ``F`` with the layer zeroed; ``target`` the predicted
  class ``[n]`` (or span ``[n, 2]``); ``maps`` float32 ``[r, l, h, q, k]`` the token-to-token
  attribution of the first ``r`` rows (padded to the longest; ``map_rows`` their rows), for
  the report's head view; ``steps`` m; ``objective`` F."""
  importance: np.ndarray
  total: np.ndarray
  value: np.ndarray
  baseline: np.ndarray
  target: np.ndarray
  maps: np.ndarray
  map_rows: np.ndarray
  steps: int
  objective: str

  def head_importance(self) -> np.ndarray:
    """float ``[l, h]``: the mean over rows of each head's largest attribution."""
    return self.importance.mean(0)


class Attributor:
  """Jitted attribution programs of one model (``apply``, ``params``): `clean` (one forward
  with the attention returned: the target, ``F(A)``, ``A``) and `layer` (one layer's
  integrated gradients, the layer traced: one compilation per batch shape for every layer)."""

  def __init__(self, apply: Apply, params, *, steps: int = DEFAULT_STEPS,
               objective: str = "probability"):
    if objective not in OBJECTIVES:
      raise UserError(f"--objective {objective}: choose one of {', '.join(OBJECTIVES)}")
    self.steps, self.objective, self.params = check_steps(steps), objective, params

    def clean(params, batch):
      out = apply(params, batch, return_attentions=True)
      target = predicted(out, batch["attention_mask"])
      return target, objective_value(out, target, objective), out["attentions"]

    def layer(params, batch, target, probs, layer):
      attr = layer_attribution(apply, params, batch, target, probs, layer, steps=self.steps,
                               objective=objective)
      real = (batch["attention_mask"][:, None, :, None] > 0) & (
          batch["attention_mask"][:, None, None, :] > 0)                   # [b, 1, q, k]
      top = jnp.max(jnp.where(real, attr, -jnp.inf), axis=(-2, -1))        # [b, h]
      base = zeroed_value(apply, params, batch, target, layer, objective)
      return attr, top, jnp.sum(attr, axis=(1, 2, 3)), base

    self._clean = jax.jit(clean)
    self._layer = jax.jit(layer)

  def batch(self, batch: dict, maps: int = 0) -> dict:
    """One batch's attribution: ``importance`` ``[b, l, h]``, ``total`` ``[b, l]``, ``value``
    ``[b]``, ``baseline`` ``[b, l]``, ``target``, and ``maps`` ``[maps, l, h, q, k]`` of its
    first ``maps`` rows."""
    target, value, attentions = self._clean(self.params, batch)      # attentions [b, l, h, q, k]
    tops, totals, bases, kept = [], [], [], []
    for l in range(attentions.shape[1]):
      attr, top, total, base = self._layer(self.params, batch, target, attentions[:, l],
                                           jnp.int32(l))
      tops.append(np.asarray(top))
      totals.append(np.asarray(total))
      bases.append(np.asarray(base))
      if maps:
        kept.append(np.asarray(attr[:maps]))
    return {"importance": np.stack(tops, 1), "total": np.stack(totals, 1),
            "value": np.asarray(value), "baseline": np.stack(bases, 1),
            "target": np.asarray(target),
            "maps": np.stack(kept, 1) if maps else None}


def attribute(apply: Apply, params, batches, *, steps: int = DEFAULT_STEPS,
              objective: str = "probability", maps: int = 4, progress=None) -> Attribution:
  """The `Attribution` of every row of ``batches`` (``[(batch dict, rows [b])]``, rows -1 for
  filler rows, as `heads_jax.ablation.evaluate.make_batches` cuts them); the maps of the
  ``maps`` rows of lowest index. ``progress(done, total)`` after each batch."""
  att = Attributor(apply, params, steps=steps, objective=objective)
  parts, map_parts = [], []
  for i, (batch, rows) in enumerate(batches):
    rows = np.asarray(rows)
    want = int(np.sum((rows >= 0) & (rows < maps)))
    r = att.batch({k: jnp.asarray(v) for k, v in batch.items()}, maps=len(rows) if want else 0)
    keep = rows >= 0
    parts.append((rows[keep], {k: v[keep] for k, v in r.items() if k != "maps"}))
    if want:
      sel = (rows >= 0) & (rows < maps)
      map_parts.append((rows[sel], r["maps"][sel]))
    if progress is not None:
      progress(i + 1, len(batches))
  order = np.concatenate([rows for rows, _ in parts])
  inv = np.argsort(order)
  cat = {k: np.concatenate([p[k] for _, p in parts])[inv] for k in parts[0][1]}
  if map_parts:
    width = max(m.shape[-1] for _, m in map_parts)
    pad = lambda m: np.pad(m, [(0, 0)] * 3 + [(0, width - m.shape[-2]), (0, width - m.shape[-1])])  # noqa: E731
    map_rows = np.concatenate([r for r, _ in map_parts])
    map_arr = np.concatenate([pad(m) for _, m in map_parts])[np.argsort(map_rows)]
    map_rows = np.sort(map_rows)
  else:
    map_rows, map_arr = np.zeros(0, np.int64), np.zeros((0, 0, 0, 0, 0), np.float32)
  return Attribution(importance=cat["importance"], total=cat["total"], value=cat["value"],
                     baseline=cat["baseline"], target=cat["target"], maps=map_arr,
                     map_rows=map_rows, steps=att.steps, objective=objective)


def head_table(per_row, *, draws: int = 1000, seed: int = 0, level: float = 0.95):
  """A (layer, head) table of a per-row score ``per_row`` ``[n, l, h]``: its mean over rows
  (``value``), the percentile bootstrap interval of the mean (``low``, ``high``) and the rank
  (1: the largest mean)."""
  import pandas as pd
  x = np.asarray(per_row, np.float64)
  n, L, H = x.shape
  rng = np.random.default_rng(seed)
  boot = x[rng.integers(0, n, size=(draws, n))].mean(1)                  # [draws, l, h]
  a = (1 - level) / 2
  mean = x.mean(0)
  rank = np.empty(L * H, int)
  rank[np.argsort(-mean.ravel(), kind="stable")] = np.arange(1, L * H + 1)
  layer, head = np.divmod(np.arange(L * H), H)
  return pd.DataFrame({"layer": layer, "head": head, "value": mean.ravel(),
                       "low": np.quantile(boot, a, axis=0).ravel(),
                       "high": np.quantile(boot, 1 - a, axis=0).ravel(), "rank": rank})
