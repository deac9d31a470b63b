"""A causal test of a role: does removing the role's heads hurt more than removing random heads?

For each group of heads (a coarse or fine role of ``tests.csv``, or any ``HeadGroup``) the
classifier is evaluated with the group ablated, and with each of ``random_groups`` random groups
of the same size **and the same layer distribution** (per layer, as many heads as the group has
there, drawn uniformly without replacement from that layer: a role concentrated in the last
layers is compared with heads of the same layers, not with cheap heads of early ones). The
harm of an ablation is the metric's change in the bad direction (accuracy and F1 down, loss up).

This matched draw (`matched_random_groups`) is the one random baseline of every group ablation
(``heads_jax.ablation.ablate`` uses it too). A group that holds every head of each of its layers
(a whole layer) has no other group of its layers: its random columns, rank and p-value are empty
("n/a": no test), not a p-value of 1.

* ``rank``: 1 + the number of random groups whose harm is at least the group's (1: the role hurts
  most), and the permutation p-value ``p_value = rank / (random_groups + 1)`` (the one-sided
  test of "the role's heads matter no more than random heads of the same layers"; its smallest
  value is ``1 / (random_groups + 1)``).

Ablation modes (``MODES``): ``remove`` (the heads' outputs dropped: gate 0), ``uniform``
(their attention replaced by uniform attention over the real tokens) and ``mean`` (each head's
output replaced by its mean over the evaluation data: ``mean_q ctx_h(q)`` over every real position
of the data, on the unablated model; the standard "mean ablation"). Since a head's output
``ctx_h W_O^h`` is linear in its context vector, the mean ablation is the ``remove`` gate plus
``sum_{h in group} mean(ctx_h) W_O^h`` added to the layer's output bias: no model change. Models
whose layers share parameters (ALBERT) cannot take a per-layer bias shift and are refused in
``mean`` mode.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx

from heads_jax.ablation.groups import HeadGroup, format_heads, gate_for
from heads_jax.errors import UserError
from heads_jax.parallel import replicate
from heads_jax.stats.norms import layer_values

MODES = ("remove", "uniform", "mean")
METRICS = ("accuracy", "f1", "loss", "attribution", "patching")
# the direction in which a group matters more: the metric's change in the bad direction for an
# ablation; a per-head score summed over the group (`HeadScores`) for attribution and patching
HARM_SIGN = {"accuracy": -1.0, "f1": -1.0, "loss": 1.0, "attribution": 1.0, "patching": 1.0}
# why a group holding whole layers has no random baseline (a table's n/a, a log line)
WHOLE_LAYERS = ("the group holds every head of its layers, so the only group of the same layers "
                "is itself")
CAUSAL_COLUMNS = ("group", "kind", "num_heads", "layers", "ablation", "metric", "base", "value",
                  "change", "random_mean_change", "random_std_change", "random_groups", "rank",
                  "p_value", "heads")


def layer_counts(heads) -> dict[int, int]:
  """Heads per layer of a group, ``{layer: count}`` sorted by layer."""
  return dict(sorted(Counter(int(l) for l, _ in heads).items()))


def format_layers(heads) -> str:
  """``"0x2,5x1"``: two heads of layer 0, one of layer 5."""
  return ",".join(f"{l}x{c}" for l, c in layer_counts(heads).items())


def matched_random_group(heads, num_layers: int, num_heads: int, rng: np.random.Generator,
                         name: str = "random") -> HeadGroup:
  """A random group with the layer distribution of ``heads``: per layer, as many heads as
  ``heads`` has there, drawn uniformly without replacement from that layer's heads."""
  picked = []
  for layer, count in layer_counts(heads).items():
    if not (0 <= layer < num_layers) or count > num_heads:
      raise ValueError(f"layer {layer} with {count} heads does not fit {num_layers} x {num_heads}")
    picked += [(layer, int(h)) for h in rng.choice(num_heads, size=count, replace=False)]
  return HeadGroup(name, "random", tuple(sorted(picked)))


def whole_layers(heads, num_heads: int) -> bool:
  """Whether ``heads`` holds every head of each layer it touches: then the only group with its
  layer distribution is itself, and no random group of the same layers can be compared."""
  return all(count >= num_heads for count in layer_counts(heads).values())


def matched_random_groups(heads, num_layers: int, num_heads: int, count: int,
                          seed: int) -> list[HeadGroup]:
  """THE random baseline of every group ablation (``ablate_groups``, ``ablate_segments`` and
  ``causal_tests``): ``count`` groups of `matched_random_group`, drawn from one stream keyed by
  ``seed`` and the layer distribution of ``heads``. Groups with the same distribution get the
  same draws, and the first ``n`` of ``count`` draws are the ``n`` draws of a smaller count (a
  group table's few random groups are the first of the causal test's many). ``[]`` when
  ``heads`` is empty or holds whole layers (`whole_layers`): there is nothing to compare."""
  if not len(heads) or whole_layers(heads, num_heads):
    return []
  rng = np.random.default_rng([seed, *np.ravel(tuple(layer_counts(heads).items()))])
  return [matched_random_group(heads, num_layers, num_heads, rng) for _ in range(count)]


def head_output_means(evaluator) -> np.ndarray:
  """Each head's mean context vector ``sum_k a[q, k] v_k`` over every real position of the
  evaluator's data (weight-0 filler rows excluded), float32 ``[l, h, e]``, on the unablated
  model."""
  graphdef = evaluator.graphdef

  def sums(state, batch):
    model = nnx.merge(graphdef, state)
    encoder = model.bert
    mask = batch["attention_mask"]
    out = encoder(batch["input_ids"], mask, batch["token_type_ids"], return_attentions=True,
                  return_hidden_states=True, deterministic=True, attention="explicit")
    w = mask.astype(jnp.float32) * batch["weights"].astype(jnp.float32)[:, None]   # [b, q]
    totals = []
    for i, which in enumerate(encoder.config.layer_schedule):
      values = layer_values(encoder.layers[which], out["hidden_states"][i])        # [b, k, h, e]
      ctx = jnp.einsum("bhqk,bkhe->bqhe", out["attentions"][:, i], values)
      totals.append(jnp.einsum("bqhe,bq->he", ctx, w))
    return jnp.stack(totals), jnp.sum(w)

  run = jax.jit(sums)
  total, count = None, 0.0
  for batch in evaluator.batches:
    s, c = run(evaluator.state, batch)
    total = s if total is None else total + s
    count += float(c)
  if not count:
    raise UserError("the evaluation set has no real positions to average head outputs over")
  return np.asarray(total, np.float32) / count


class GroupEvaluator:
  """``evaluate(heads) -> metrics`` with ``heads`` ablated in one of ``MODES``."""

  def __init__(self, evaluator, mode: str = "remove", means: np.ndarray | None = None):
    if mode not in MODES:
      raise UserError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    self.evaluator, self.mode = evaluator, mode
    self.num_layers, self.num_heads = evaluator.num_layers, evaluator.num_heads
    self.means = None
    if mode == "mean":
      model = nnx.merge(evaluator.graphdef, evaluator.state)
      schedule = tuple(model.bert.config.layer_schedule)
      if len(set(schedule)) != len(schedule):
        raise UserError("--mode mean shifts each layer's output bias, but this model's layers "
                        "share parameters (ALBERT); use --mode remove or uniform")
      if any(getattr(model.bert.layers[i].attention.output, "bias", None) is None
             for i in set(schedule)):
        raise UserError("--mode mean shifts each layer's output bias, but this model's attention "
                        "output has no bias (ModernBERT); use --mode remove or uniform")
      self.means = head_output_means(evaluator) if means is None else np.asarray(means, np.float32)
      expected = (self.num_layers, self.num_heads, model.bert.config.head_dim)
      if self.means.shape != expected:
        raise ValueError(f"means must be [l, h, e] = {expected}, got {self.means.shape}")

  def mean_state(self, heads):
    """The evaluator's state with each layer's output bias plus ``sum_h mean(ctx_h) W_O^h`` over
    the group's heads of that layer (replicated on the evaluator's mesh)."""
    ev = self.evaluator
    model = nnx.merge(ev.graphdef, ev.state, copy=True)   # never edit the evaluator's variables
    encoder = model.bert
    e = encoder.config.head_dim
    for layer, _ in layer_counts(heads).items():
      out = encoder.layers[encoder.config.layer_schedule[layer]].attention.output
      kernel = np.asarray(out.kernel.value, np.float32)                     # [h*e, d]
      shift = sum(self.means[layer, h] @ kernel[h * e:(h + 1) * e] for l, h in heads if l == layer)
      out.bias.value = out.bias.value + jnp.asarray(shift, out.bias.value.dtype)
    _, state = nnx.split(model)
    return replicate(state, ev.mesh)

  def evaluate(self, heads) -> dict:
    heads = tuple(heads)
    ev = self.evaluator
    if not heads:
      return ev.evaluate()
    gate = gate_for(heads, self.num_layers, self.num_heads)
    if self.mode == "mean":
      # the Evaluator's jitted call takes its state as an argument: the shifted state of the
      # same graph runs without recompiling
      kept, ev.state = ev.state, self.mean_state(heads)
      try:
        return ev.evaluate(gate, gate_mode="remove")
      finally:
        ev.state = kept
    return ev.evaluate(gate, gate_mode=self.mode)


class HeadScores:
  """The group evaluator of `causal_tests` for a per-head score (attribution, patching effect):
  a group's value is its heads' scores summed (the empty group 0), so the test asks whether a
  role's heads carry more of the prediction than random heads of the same layers."""

  def __init__(self, name: str, scores):
    self.mode = self.metric = name
    self.scores = np.asarray(scores, np.float64)
    self.num_layers, self.num_heads = self.scores.shape

  def evaluate(self, heads) -> dict:
    return {self.metric: float(sum(self.scores[l, h] for l, h in heads))}


def causal_tests(group_evaluator, groups: Sequence[HeadGroup], *, random_groups: int = 100,
                 metric: str = "accuracy", seed: int = 0, base: dict | None = None,
                 log=None) -> pd.DataFrame:
  """The causal test of each group (module docstring).

  Args:
    group_evaluator: a ``GroupEvaluator`` (or anything with ``evaluate(heads) -> metrics``,
      ``num_layers``, ``num_heads``, ``mode``).
    groups: the groups to test; empty groups and groups of whole layers get a row with NaN
      random columns, rank and p-value (and ``random_groups`` 0).
    random_groups: random groups of the same size and layer distribution per group
      (`matched_random_groups`: groups with the same layer distribution share them).
    metric: "accuracy", "f1" or "loss" (a `GroupEvaluator`), or "attribution" / "patching" (a
      `HeadScores` of that name).

  Returns:
    ``CAUSAL_COLUMNS``: one row per group; ``change`` and the random changes are metric changes
    against the unablated model (``base``).
  """
  if metric not in METRICS:
    raise UserError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
  if random_groups < 1:
    raise UserError(f"--random-groups must be >= 1, got {random_groups}")
  log = log or (lambda *_: None)
  L, H = group_evaluator.num_layers, group_evaluator.num_heads
  base = base or group_evaluator.evaluate(())
  sign = HARM_SIGN[metric]
  cache: dict = {}
  rows = []
  for g in groups:
    row = dict(group=g.name, kind=g.kind, num_heads=len(g), layers=format_layers(g.heads),
               ablation=group_evaluator.mode, metric=metric, base=base[metric],
               random_groups=0, heads=format_heads(g.heads))
    untested = dict(random_mean_change=np.nan, random_std_change=np.nan, rank=np.nan,
                    p_value=np.nan)
    if not len(g):
      rows.append(dict(row, value=base[metric], change=0.0, **untested))
      continue
    value = group_evaluator.evaluate(g.heads)[metric]
    change = value - base[metric]
    if whole_layers(g.heads, H):
      rows.append(dict(row, value=value, change=change, **untested))
      log(f"{group_evaluator.mode} {g.kind} {g.name!r} ({len(g)} heads, layers {row['layers']}): "
          f"{metric} {change:+.4f}; no test: {WHOLE_LAYERS}")
      continue
    key = tuple(layer_counts(g.heads).items())
    if key not in cache:
      cache[key] = np.asarray([group_evaluator.evaluate(r.heads)[metric] - base[metric]
                               for r in matched_random_groups(g.heads, L, H, random_groups, seed)])
    random_change = cache[key]
    rank = 1 + int(np.sum(sign * random_change >= sign * change - 1e-12))
    rows.append(dict(row, value=value, change=change, random_groups=random_groups,
                     random_mean_change=float(random_change.mean()),
                     random_std_change=float(random_change.std()), rank=rank,
                     p_value=rank / (random_groups + 1)))
    log(f"{group_evaluator.mode} {g.kind} {g.name!r} ({len(g)} heads, layers {row['layers']}): "
        f"{metric} {change:+.4f} vs random {random_change.mean():+.4f}, p = {rows[-1]['p_value']:.3f}")
  return pd.DataFrame(rows, columns=list(CAUSAL_COLUMNS))
