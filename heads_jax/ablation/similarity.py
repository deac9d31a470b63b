"""Attention similarity before and after fine-tuning (Kovaleva et al., EMNLP 2019, sec. 5).

For every head, the cosine similarity of its attention map (the flattened real ``[q, k]``
block) under two models on the same input, averaged over the sequences: an ``[l, h]`` map
where 1 means fine-tuning left the head's attention unchanged.

Both models' states are replicated on the ``data`` mesh and run inside one jitted step per
batch, which reduces the two attention tensors to ``heads_jax.stats.measures.attention_cosine``
and adds the batch's sum to a device accumulator; attention maps never leave the device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx

from heads_jax.data.specs import encode_spec
from heads_jax.errors import UserError
from heads_jax.parallel import data_mesh, pad_to_multiple, replicate, shard_batch
from heads_jax.stats.measures import attention_cosine


def _encoder(model):
  return getattr(model, "bert", model)


def check_compatible(model_a, model_b) -> None:
  """Both models must have the same layers, heads and vocabulary."""
  ca, cb = _encoder(model_a).config, _encoder(model_b).config
  for field in ("num_layers", "num_heads", "vocab_size"):
    if getattr(ca, field) != getattr(cb, field):
      raise UserError(f"the two models differ in {field} ({getattr(ca, field)} vs "
                      f"{getattr(cb, field)}): attention similarity needs the same architecture "
                      "(a model before and after fine-tuning)")


class SimilarityStep:
  """``step.add(batch)`` accumulates per-head cosine sums on the device; ``step.result()``
  returns ``(mean [l, h], number of sequences)``."""

  def __init__(self, model_a, model_b, *, mesh=None):
    check_compatible(model_a, model_b)
    self.mesh = data_mesh() if mesh is None else mesh
    local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
    self.multiple = max(1, len(local))
    cfg = _encoder(model_a).config
    self.shape = (cfg.num_layers, cfg.num_heads)
    ga, sa = nnx.split(_encoder(model_a))
    gb, sb = nnx.split(_encoder(model_b))
    self._states = (replicate(sa, self.mesh), replicate(sb, self.mesh))

    def run(states, batch, acc):
      outs = []
      for graphdef, state in zip((ga, gb), states):
        m = nnx.merge(graphdef, state)
        outs.append(m(batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch["token_type_ids"], return_attentions=True,
                      deterministic=True)["attentions"])
      cos = attention_cosine(outs[0], outs[1], batch["attention_mask"])      # [b, l, h]
      real = (jnp.sum(batch["attention_mask"], axis=-1) > 0).astype(jnp.float32)
      return acc + jnp.einsum("blh,b->lh", cos, real), jnp.sum(real)

    self._run = jax.jit(run, donate_argnums=(2,))
    self._acc = replicate(jnp.zeros(self.shape, jnp.float32), self.mesh)
    self._count = []

  def add(self, batch: dict) -> None:
    fields = {k: np.asarray(batch[k], np.int32)
              for k in ("input_ids", "attention_mask", "token_type_ids")}
    padded, _ = pad_to_multiple(fields, self.multiple)
    self._acc, n = self._run(self._states, shard_batch(padded, self.mesh), self._acc)
    self._count.append(n)

  def result(self) -> tuple[np.ndarray, int]:
    n = int(round(sum(float(c) for c in self._count)))
    if n == 0:
      raise UserError("no sequence reached the similarity step: the data is empty")
    return (np.asarray(self._acc, np.float64) / n).astype(np.float32), n


def attention_similarity(model_a, model_b, batches, *, mesh=None) -> tuple[np.ndarray, int]:
  """Mean cosine similarity ``[l, h]`` of the two models' attention maps over ``batches``
  (encoded batches, or ``(indices, batch)`` pairs as ``heads_jax.data.encoding.iter_batches``
  yields), and the number of sequences."""
  step = SimilarityStep(model_a, model_b, mesh=mesh)
  for item in batches:
    batch = item[1] if isinstance(item, tuple) else item
    step.add(batch)
  return step.result()


def similarity_on_spec(model_a, model_b, tokenizer, spec: str, *, max_examples: int | None = 500,
                       max_length: int = 128, batch_size: int = 32, mesh=None):
  """``attention_similarity`` on a data spec (``heads_jax.data.specs``), without parsing."""
  for model in (model_a, model_b):
    model.config.check_max_length(max_length)
  _, batches, n = encode_spec(spec, tokenizer, max_length=max_length, batch_size=batch_size,
                              max_examples=max_examples, syntax=False)
  if n == 0:
    raise UserError(f"data spec {spec!r} holds no examples")
  return attention_similarity(model_a, model_b, batches, mesh=mesh)


def similarity_table(similarity) -> pd.DataFrame:
  """Long table: layer, head, cosine."""
  sim = np.asarray(similarity)
  l, h = np.meshgrid(np.arange(sim.shape[0]), np.arange(sim.shape[1]), indexing="ij")
  return pd.DataFrame({"layer": l.ravel(), "head": h.ravel(), "cosine": sim.ravel()})
