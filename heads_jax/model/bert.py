"""A post-LN BERT encoder in Flax NNX that can return every attention map.

Shape legend: b batch, q query positions, k key positions (q == k == sequence length),
l layer, h head, d hidden, e head dimension (d = h * e), f feed-forward width.

The forward pass matches ``transformers.BertModel`` (eager attention) to float32 rounding;
``tests/test_model_parity.py`` checks hidden states and every attention map.

Two switches serve the analysis and ablations, and cost nothing when off:

* ``return_attentions=True`` adds ``attentions`` float32 ``[b, l, h, q, k]``: rows over real
  keys sum to 1; padding keys get exactly 0 and padding query rows are 0.
* ``head_gate`` float ``[l, h]`` with ``gate_mode``:
  ``"remove"`` multiplies each head's context vector by its gate before the output projection
  (1 keeps the head, 0 removes it; the gradient with respect to the gate is the head importance
  of Michel et al. 2019); ``"uniform"`` replaces a head's attention by
  ``gate * alpha + (1 - gate) * uniform``, with ``uniform`` the uniform distribution over the
  sequence's real keys (0 replaces the head by uniform attention, 1 keeps it). The returned
  attentions are the ones actually used.
* ``segment_removal`` float ``[l, h, 2]`` (Guan et al. 2020, Table 3): for each head, the share
  of its intra-segment attention (index 0: query and key have the same token type) and of its
  inter-segment attention (index 1: different token types) that is removed, i.e.
  ``alpha[t, s] * (1 - removal)``, applied after the gate. ``[CLS]`` and the first ``[SEP]``
  belong to segment A (token type 0), the final ``[SEP]`` to B, as the encoding defines; a single
  text has only intra-segment attention. Rows are not renormalised (as the paper) unless
  ``renormalise_segments=True``, which divides each row by its remaining mass (a row left with
  no mass stays 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from heads_jax.model.config import BertConfig

GATE_MODES = ("remove", "uniform")


def _init(cfg: BertConfig):
  return nnx.initializers.normal(stddev=cfg.initializer_range)


def _dtype(cfg: BertConfig):
  return jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32


def activation(name: str, x):
  if name == "gelu":
    return jax.nn.gelu(x, approximate=False)
  if name == "relu":
    return jax.nn.relu(x)
  return jax.nn.gelu(x, approximate=True)  # gelu_new / gelu_tanh / gelu_pytorch_tanh


def dense(cfg: BertConfig, din: int, dout: int, rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(din, dout, kernel_init=_init(cfg), bias_init=nnx.initializers.zeros_init(),
                    dtype=_dtype(cfg), param_dtype=jnp.float32, rngs=rngs)


def layer_norm(cfg: BertConfig, d: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
  # float32 LayerNorm even under bfloat16 compute.
  return nnx.LayerNorm(d, epsilon=cfg.layer_norm_eps, dtype=jnp.float32, param_dtype=jnp.float32,
                       rngs=rngs)


class Embeddings(nnx.Module):
  """Word + position + token-type embeddings, LayerNorm, dropout."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    embed = lambda n: nnx.Embed(n, cfg.hidden_size, embedding_init=_init(cfg),
                                param_dtype=jnp.float32, rngs=rngs)
    self.word = embed(cfg.vocab_size)
    self.position = embed(cfg.max_position_embeddings)
    self.token_type = embed(cfg.type_vocab_size)
    self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
    self.dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)

  def __call__(self, input_ids, token_type_ids, *, deterministic: bool):
    """ids ``[b, q]`` -> ``[b, q, d]`` float32."""
    q = input_ids.shape[1]
    x = (self.word(input_ids) + self.position(jnp.arange(q))[None]
         + self.token_type(token_type_ids))
    return self.dropout(self.norm(x), deterministic=deterministic)


class SelfAttention(nnx.Module):
  """Multi-head self-attention with output projection, residual and LayerNorm."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    d = cfg.hidden_size
    self.cfg = cfg
    self.query = dense(cfg, d, d, rngs)
    self.key = dense(cfg, d, d, rngs)
    self.value = dense(cfg, d, d, rngs)
    self.output = dense(cfg, d, d, rngs)
    self.norm = layer_norm(cfg, d, rngs)
    self.attention_dropout = nnx.Dropout(cfg.attention_dropout, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)

  def __call__(self, x, mask, *, gate, gate_mode: str, deterministic: bool,
               segment_removal=None, segments=None, renormalise_segments: bool = False):
    """x ``[b, q, d]``, mask ``[b, k]`` (1 real) , gate ``[h]`` or None; ``segment_removal``
    ``[h, 2]`` or None with ``segments`` ``[b, k]`` (token types; see the module docstring).

    Returns the new hidden state ``[b, q, d]`` and the attention ``[b, h, q, k]`` float32.
    """
    cfg = self.cfg
    b, q, _ = x.shape
    split = lambda y: y.reshape(b, q, cfg.num_heads, cfg.head_dim)
    qh, kh, vh = split(self.query(x)), split(self.key(x)), split(self.value(x))
    scale = 1.0 / jnp.sqrt(jnp.float32(cfg.head_dim))
    scores = jnp.einsum("bqhe,bkhe->bhqk", qh, kh, preferred_element_type=jnp.float32) * scale
    key_real = mask[:, None, None, :].astype(bool)
    scores = jnp.where(key_real, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(key_real, probs, 0.0)  # exact zeros on padding keys
    if gate is not None and gate_mode == "uniform":
      n = jnp.maximum(mask.sum(-1), 1).astype(jnp.float32)
      uniform = key_real.astype(jnp.float32) / n[:, None, None, None]
      g = gate.astype(jnp.float32)[None, :, None, None]
      probs = g * probs + (1.0 - g) * uniform
    if segment_removal is not None:
      same = segments[:, None, :, None] == segments[:, None, None, :]       # [b, 1, q, k]
      r = segment_removal.astype(jnp.float32)                               # [h, 2]
      probs = probs * jnp.where(same, 1.0 - r[None, :, 0, None, None], 1.0 - r[None, :, 1, None, None])
      if renormalise_segments:
        total = jnp.sum(probs, axis=-1, keepdims=True)
        probs = jnp.where(total > 0, probs / jnp.where(total > 0, total, 1.0), 0.0)
    dropped = self.attention_dropout(probs, deterministic=deterministic)
    ctx = jnp.einsum("bhqk,bkhe->bqhe", dropped.astype(vh.dtype), vh)
    if gate is not None and gate_mode == "remove":
      ctx = ctx * gate.astype(ctx.dtype)[None, None, :, None]
    out = self.dropout(self.output(ctx.reshape(b, q, cfg.hidden_size)), deterministic=deterministic)
    return self.norm(out + x), probs


class Layer(nnx.Module):
  """One post-LN transformer layer: attention block, then feed-forward block."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.attention = SelfAttention(cfg, rngs=rngs)
    self.intermediate = dense(cfg, cfg.hidden_size, cfg.intermediate_size, rngs)
    self.output = dense(cfg, cfg.intermediate_size, cfg.hidden_size, rngs)
    self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
    self.dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)

  def __call__(self, x, mask, *, gate, gate_mode, deterministic, **segment_kw):
    x, probs = self.attention(x, mask, gate=gate, gate_mode=gate_mode, deterministic=deterministic,
                              **segment_kw)
    y = activation(self.cfg.hidden_act, self.intermediate(x))
    y = self.dropout(self.output(y), deterministic=deterministic)
    return self.norm(y + x), probs


class BertModel(nnx.Module):
  """The BERT encoder with pooler (``transformers.BertModel``)."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.embeddings = Embeddings(cfg, rngs=rngs)
    self.layers = nnx.List([Layer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.pooler = dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, head_gate=None,
               gate_mode: str = "remove", return_attentions: bool = False,
               return_hidden_states: bool = False, deterministic: bool = True,
               segment_removal=None, renormalise_segments: bool = False) -> dict:
    """Encodes ``input_ids`` ``[b, q]``.

    Args:
      attention_mask: ``[b, q]``, 1 on real tokens (default: all real).
      token_type_ids: ``[b, q]`` (default: zeros).
      head_gate: optional float ``[l, h]`` (see the module docstring).
      gate_mode: ``"remove"`` or ``"uniform"``.
      return_attentions: add ``attentions`` float32 ``[b, l, h, q, k]``.
      return_hidden_states: add ``hidden_states`` ``[l + 1, b, q, d]`` (embeddings, then each layer).
      deterministic: False enables dropout.
      segment_removal: optional float ``[l, h, 2]``: share of each head's intra-segment (0) and
        inter-segment (1) attention removed (see the module docstring).
      renormalise_segments: renormalise rows after ``segment_removal`` (default: not, as Guan
        et al.).

    Returns:
      dict with ``last_hidden_state`` ``[b, q, d]`` and ``pooled`` ``[b, d]`` (float32), plus the
      optional entries above.
    """
    cfg = self.config
    if gate_mode not in GATE_MODES:
      raise ValueError(f"gate_mode must be one of {GATE_MODES}, got {gate_mode!r}")
    input_ids = jnp.asarray(input_ids, jnp.int32)
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    if input_ids.shape[1] > cfg.max_position_embeddings:
      raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                       f"{cfg.max_position_embeddings}; truncate the inputs (e.g. --max-length)")
    mask = jnp.ones_like(input_ids) if attention_mask is None else jnp.asarray(attention_mask, jnp.int32)
    types = jnp.zeros_like(input_ids) if token_type_ids is None else jnp.asarray(token_type_ids, jnp.int32)
    if head_gate is not None:
      head_gate = jnp.asarray(head_gate)
      if head_gate.shape != (cfg.num_layers, cfg.num_heads):
        raise ValueError(f"head_gate must have shape [layers, heads] = "
                         f"{(cfg.num_layers, cfg.num_heads)}, got {head_gate.shape}")
    if segment_removal is not None:
      segment_removal = jnp.asarray(segment_removal)
      if segment_removal.shape != (cfg.num_layers, cfg.num_heads, 2):
        raise ValueError(f"segment_removal must have shape [layers, heads, 2] = "
                         f"{(cfg.num_layers, cfg.num_heads, 2)}, got {segment_removal.shape}")

    x = self.embeddings(input_ids, types, deterministic=deterministic)
    hidden, attentions = [x], []
    for i, layer in enumerate(self.layers):
      gate = None if head_gate is None else head_gate[i]
      segment_kw = {}
      if segment_removal is not None:
        segment_kw = {"segment_removal": segment_removal[i], "segments": types,
                      "renormalise_segments": renormalise_segments}
      x, probs = layer(x, mask, gate=gate, gate_mode=gate_mode, deterministic=deterministic,
                       **segment_kw)
      hidden.append(x)
      if return_attentions:
        attentions.append(probs)
    x = x.astype(jnp.float32)
    out = {"last_hidden_state": x, "pooled": jnp.tanh(self.pooler(x[:, 0]).astype(jnp.float32))}
    if return_attentions:
      query_real = mask[:, None, None, :, None].astype(jnp.float32)
      out["attentions"] = jnp.stack(attentions, axis=1) * query_real  # [b, l, h, q, k]
    if return_hidden_states:
      out["hidden_states"] = jnp.stack([h.astype(jnp.float32) for h in hidden])
    return out
