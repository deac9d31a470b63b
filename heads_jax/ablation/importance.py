"""Head importance (Michel, Levy and Neubig, NeurIPS 2019, sec. 4).

The importance of head h is the expected absolute gradient of the loss with respect to its
gate xi_h (``gate_mode="remove"``: the head's context vector is multiplied by xi_h), taken at
the current gates (all 1 for the full model):

    I_h = E_x | dL(x) / d xi_h |

``per_example=True`` (default) takes the expectation over examples as the formula says: the
gradient of each example's own loss, its absolute value, averaged over the examples. As only
the ``[l, h]`` gate is differentiated, the per-example gradients (``jax.vmap`` of ``jax.grad``)
cost one backward pass per batch, like the batch gradient. ``per_example=False`` follows the
authors' released code: the absolute gradient of each batch's mean loss, averaged over batches
(batches of ``batch_size`` examples sorted by length here).

Optionally each layer's scores are divided by their L2 norm (``normalize_layers``; Michel et
al.'s code does this by default before pruning, so that heads of different layers compare).

Everything runs on the device in one pass over the data: one jitted call per batch adds the
batch's absolute gradients ``[l, h]`` to an accumulator that stays on the device (donated), on
the batches and replicated state of an ``heads_jax.ablation.evaluate.Evaluator`` (data-parallel
over its ``data`` mesh); the ``[l, h]`` result is fetched once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from heads_jax.parallel import replicate


def normalize_by_layer(importance, exponent: float = 2.0) -> np.ndarray:
  """Each layer's row divided by its L-``exponent`` norm (Michel et al.'s ``norm_by_layer``)."""
  imp = np.asarray(importance, np.float64)
  norm = np.power(np.power(np.abs(imp), exponent).sum(-1, keepdims=True), 1.0 / exponent)
  return (imp / (norm + 1e-20)).astype(np.float32)


class ImportanceEstimator:
  """``estimator(head_gate=None) -> float32 [l, h]``: the head importance on an evaluator's data.

  Args:
    evaluator: an ``Evaluator`` (model state, device batches, mesh).
    per_example: expectation of per-example absolute gradients (default) or of batch ones.
    normalize_layers: divide each layer's scores by their L2 norm.
  """

  def __init__(self, evaluator, *, per_example: bool = True, normalize_layers: bool = False):
    self.evaluator = evaluator
    self.per_example = per_example
    self.normalize_layers = normalize_layers
    graphdef = evaluator.graphdef

    def example_loss(model, gate, ids, mask, types, label):
      out = model(ids[None], mask[None], types[None], head_gate=gate, gate_mode="remove",
                  deterministic=True)
      return optax.softmax_cross_entropy_with_integer_labels(
          out["logits"].astype(jnp.float32), label[None])[0]

    def batch_loss(model, gate, batch):
      out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                  head_gate=gate, gate_mode="remove", deterministic=True)
      nll = optax.softmax_cross_entropy_with_integer_labels(
          out["logits"].astype(jnp.float32), batch["labels"])
      w = batch["weights"]
      return jnp.sum(w * nll) / jnp.maximum(jnp.sum(w), 1.0)

    def accumulate(state, batch, gate, acc):
      model = nnx.merge(graphdef, state)
      if per_example:
        grad = jax.vmap(jax.grad(lambda g, *x: example_loss(model, g, *x)),
                        in_axes=(None, 0, 0, 0, 0))
        g = grad(gate, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                 batch["labels"])                                              # [b, l, h]
        return acc + jnp.einsum("blh,b->lh", jnp.abs(g), batch["weights"])
      g = jax.grad(lambda gate_: batch_loss(model, gate_, batch))(gate)        # [l, h]
      return acc + jnp.abs(g)

    self._step = jax.jit(accumulate, donate_argnums=(3,))

  def raw(self, head_gate=None) -> np.ndarray:
    """The expected absolute gradient ``[l, h]`` (before any normalisation)."""
    ev = self.evaluator
    shape = (ev.num_layers, ev.num_heads)
    gate = np.ones(shape, np.float32) if head_gate is None else np.asarray(head_gate, np.float32)
    if gate.shape != shape:
      raise ValueError(f"head_gate must be [layers, heads] = {shape}, got {gate.shape}")
    gate = replicate(jnp.asarray(gate), ev.mesh)
    acc = replicate(jnp.zeros(shape, jnp.float32), ev.mesh)
    for batch in ev.batches:
      acc = self._step(ev.state, batch, gate, acc)
    total = np.asarray(acc, np.float64)
    count = len(ev.data) if self.per_example else len(ev.batches)
    return (total / max(count, 1)).astype(np.float32)

  def __call__(self, head_gate=None) -> np.ndarray:
    imp = self.raw(head_gate)
    return normalize_by_layer(imp) if self.normalize_layers else imp


def head_importance(evaluator, head_gate=None, *, per_example: bool = True,
                    normalize_layers: bool = False) -> np.ndarray:
  """Head importance ``[l, h]`` of the evaluator's model on its data (see the module docstring)."""
  return ImportanceEstimator(evaluator, per_example=per_example,
                             normalize_layers=normalize_layers)(head_gate)
