"""What every encoder family's ``__call__`` does the same way around its layers: checking the
inputs, Guan et al.'s segment removal on one layer's attention, and collecting and stacking
the per-layer outputs (`LayerOutputs`).

``BertModel`` (``heads_jax.model.bert``) defines the signature and the outputs the families share
(the analysis, the ablations and fine-tuning call every family alike); DeBERTa
(``heads_jax.model.deberta``) and ModernBERT (``heads_jax.model.modernbert``) compute their
attention differently but take and give the same things, through these functions.

Shape legend: b batch, q query positions, k key positions, l layer, h head, d hidden.
Imports no model module (the families import this one).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def check_inputs(cfg, input_ids, attention_mask=None, token_type_ids=None, *, head_gate=None,
                 segment_removal=None, position_ids=None, segment_ids=None):
  """The encoder's inputs checked against ``cfg`` (``num_layers``, ``num_heads``,
  ``max_positions``) and as arrays.

  Args:
    input_ids: int ``[b, q]``.
    attention_mask, token_type_ids: int ``[b, q]`` or None (all real; all type 0).
    head_gate: ``[l, h]`` or None; segment_removal: ``[l, h, 2]`` or None.
    position_ids, segment_ids: ``[b, q]`` or None (only their shapes are checked here).

  Returns:
    ``(input_ids, mask, types, head_gate, segment_removal)``: int32 ``[b, q]`` each for the first
    three, the gates as arrays (or None).

  Raises:
    ValueError naming the input and the shape it must have.
  """
  input_ids = jnp.asarray(input_ids, jnp.int32)
  if input_ids.ndim != 2:
    raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
  if input_ids.shape[1] > cfg.max_positions:
    raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the model's "
                     f"{cfg.max_positions} positions; truncate the inputs (e.g. --max-length)")
  mask = jnp.ones_like(input_ids) if attention_mask is None else jnp.asarray(attention_mask, jnp.int32)
  types = jnp.zeros_like(input_ids) if token_type_ids is None else jnp.asarray(token_type_ids, jnp.int32)
  shape = (cfg.num_layers, cfg.num_heads)
  if head_gate is not None:
    head_gate = jnp.asarray(head_gate)
    if head_gate.shape != shape:
      raise ValueError(f"head_gate must have shape [layers, heads] = {shape}, got {head_gate.shape}")
  if segment_removal is not None:
    segment_removal = jnp.asarray(segment_removal)
    if segment_removal.shape != shape + (2,):
      raise ValueError(f"segment_removal must have shape [layers, heads, 2] = {shape + (2,)}, "
                       f"got {segment_removal.shape}")
  for name, ids in (("position_ids", position_ids), ("segment_ids", segment_ids)):
    if ids is not None and jnp.shape(ids) != input_ids.shape:
      raise ValueError(f"{name} must have the shape of input_ids {input_ids.shape}, "
                       f"got {jnp.shape(ids)}")
  return input_ids, mask, types, head_gate, segment_removal


def remove_segments(probs, segments, removal, renormalise: bool):
  """Guan et al. 2020 (Table 3): one layer's attention ``probs`` float32 ``[b, h, q, k]`` with
  the intra-segment (``removal[:, 0]``) and inter-segment (``removal[:, 1]``) weights of each
  head scaled by ``1 - removal`` (``removal`` ``[h, 2]``, 1: removed); a query's segment is its
  token type, ``segments`` ``[b, k]``. With ``renormalise``, each row is divided by its new sum
  (a row with nothing left stays 0)."""
  same = segments[:, None, :, None] == segments[:, None, None, :]       # [b, 1, q, k]
  r = removal.astype(jnp.float32)                                       # [h, 2]
  probs = probs * jnp.where(same, 1.0 - r[None, :, 0, None, None], 1.0 - r[None, :, 1, None, None])
  if renormalise:
    total = jnp.sum(probs, axis=-1, keepdims=True)
    probs = jnp.where(total > 0, probs / jnp.where(total > 0, total, 1.0), 0.0)
  return probs


class LayerOutputs:
  """What the caller asked of the layers, collected one layer at a time and stacked over them.

  ``add(x, probs, reduced)`` after each layer (its output ``[b, q, d]``, attention
  ``[b, h, q, k]`` and reduction); ``stacked(out, mask)`` then adds to ``out``: ``attentions``
  float32 ``[b, l, h, q, k]`` (rows of padded queries zeroed; ``mask`` ``[b, q]``),
  ``hidden_states`` float32 ``[l + 1, b, q, d]`` (the embeddings, then each layer's output) and
  ``attention_reduced`` (each leaf ``[b, l, ...]``), each only when asked for.
  """

  def __init__(self, embeddings, *, return_attentions: bool, return_hidden_states: bool,
               attention_reduce):
    self.return_attentions = return_attentions
    self.return_hidden_states = return_hidden_states
    self.attention_reduce = attention_reduce
    self.hidden, self.attentions, self.reduced = [embeddings], [], []

  def add(self, x, probs, reduced) -> None:
    self.hidden.append(x)
    if self.return_attentions:
      self.attentions.append(probs)
    if self.attention_reduce is not None:
      self.reduced.append(reduced)

  def stacked(self, out: dict, mask) -> dict:
    """``out`` with the stacked entries added (module docstring); returns ``out``."""
    if self.return_attentions:
      query_real = mask[:, None, None, :, None].astype(jnp.float32)
      out["attentions"] = jnp.stack(self.attentions, axis=1) * query_real    # [b, l, h, q, k]
    if self.return_hidden_states:
      out["hidden_states"] = jnp.stack([h.astype(jnp.float32) for h in self.hidden])
    if self.attention_reduce is not None:
      out["attention_reduced"] = jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *self.reduced)
    return out
