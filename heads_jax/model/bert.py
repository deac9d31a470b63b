"""A post-LN Transformer encoder in Flax NNX that can return every attention map: BERT, and
RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA and ALBERT as configurations of the same modules
(``heads_jax.model.config``: token types, position offset, embedding projection, pooler,
shared layers).

Shape legend: b batch, q query positions, k key positions (q == k == sequence length),
l layer, h head, d hidden, e head dimension (d = h * e), f feed-forward width.

The forward pass matches transformers' PyTorch models (eager attention) to float32 rounding;
``tests/model/test_parity.py`` (BERT) and ``tests/model/test_families.py`` (the other families)
check hidden states and every attention map.

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
  text has only intra-segment attention. Rows are not renormalised unless
  ``renormalise_segments=True``, which divides each row by its remaining mass (a row left with
  no mass stays 0). Guan et al. do not say either way: they "remove the intra-sentence attention
  or inter-sentence attention" (guan2020_how_far_does_bert_look_at.txt, section 5.2), and for
  whole heads "mask the attention value to 0" (section 5.1); not renormalising is our reading.

The attention itself (paths, masks, dropout, edits, the reducer's call) is
``heads_jax.model.attention.attend``, shared with ModernBERT and DeBERTa; what a caller wants of
it travels as one ``AttentionHooks`` (``hooks=``; the keywords below build it).

**Two attention paths** (``attention=`` of ``BertModel.__call__``; ``attention_path`` decides):

* *fused*: ``jax.nn.dot_product_attention`` computes each layer's context without returning
  the probabilities: ``implementation="cudnn"`` (cuDNN flash attention) on a GPU when the
  compute dtype is bfloat16 and the head dimension is a multiple of 8 (<= 128), XLA's
  implementation everywhere else (CPU, TPU, float32 on GPU). ``jax.nn.dot_product_attention``
  with ``implementation=None`` always picks XLA in jax 0.10, so ``fused_implementation`` names
  cuDNN explicitly. Padding keys are masked with a boolean mask (XLA) or with key lengths
  (cuDNN: heads_jax batches are right-padded, ``heads_jax.data.vocabulary``).
* *explicit*: scores, masked softmax (float32), optional gate/segment edits, attention dropout,
  then the weighted sum; it yields the probabilities.

* *flash*: ``heads_jax.model.flash_attention``, a Pallas (Triton) flash-attention kernel,
  forward and backward, that applies attention dropout with a mask drawn outside the kernel
  (``attention_keep``: ``jax.random.bernoulli`` on the next key of the attention-dropout rng
  stream, or 8 or 16 bits an element with ``BertConfig.dropout_bits``; the very mask the
  explicit path draws). The masks are therefore a function of the
  step's key (``heads_jax.training.steps``: exact resume holds) and the flash path equals the
  explicit one with dropout on, forward and gradient, to float32 rounding
  (``tests/model/test_flash_attention.py``, interpret mode on the CPU). It costs one byte per
  ``[b, h, q, k]`` element, read by the forward and the backward kernels.

``attention="auto"`` (default; ``BertConfig.attention`` sets the model's default) takes the
fused path whenever nothing needs the probabilities: no ``return_attentions``, no ``"uniform"``
gate, no ``segment_removal``, no ``attention_reduce`` that asks for them. With attention dropout
active (training with ``attention_dropout > 0``, BERT's 0.1) it takes the flash kernel on a GPU
with bfloat16/float16 compute (``flash_preferred``) and the explicit path elsewhere (the CPU,
float32; the kernel runs there only in Pallas's slow interpret mode). ``"explicit"`` forces the
explicit path; ``"flash"`` the kernel (with or without dropout); ``"xla"`` / ``"cudnn"`` force
the fused path with that implementation (ValueError where it cannot be used, e.g. with dropout).
The paths agree to float32 rounding, forward and gradient (``tests/model/test_attention_paths.py``),
except on an all-padding row (no real key), whose context is 0 on the explicit and flash paths
and the mean value on the fused one; nothing reads such rows (filler rows of a batch).

**Activations between kernels** (``BertConfig.layer_norm_dtype``): ``"compute"`` (default)
gives LayerNorm outputs, hence the residual stream, in the compute dtype (bfloat16 under
``dtype="bfloat16"``: half the bytes of every activation written between kernels), with
float32 statistics (flax normalises the float32-promoted input); the residual additions are
then bfloat16 additions, as Megatron-LM's default. ``"float32"`` keeps float32 LayerNorm
outputs and residual stream (the behaviour before issue 39). Under float32 compute both are
the same model. Each block ends in ``LayerNorm(dropout(h) + x)`` as one custom-gradient op
(`dropout_residual_norm`, ``fused_ops.residual_dropout_norm``: flax's forward bit for bit, a
backward that keeps only the LayerNorm input, its row statistics and the mask), and every dropout
mask takes ``BertConfig.dropout_bits`` random bits an element (32: ``nnx.Dropout``'s own).

**Per-layer reductions** (``attention_reduce``): a callable
``fn(layer, probs, query, key, mask) -> pytree`` called once per layer right after the
softmax, so that an analysis can reduce each layer's attention to its statistics without a
``[b, l, h, q, k]`` stack. ``probs`` is float32 ``[b, h, q, k]`` (padding keys and padding
query rows 0, the attention actually used) or None on the fused path; ``query``/``key`` are
``[b, q, h, e]`` in the compute dtype before the ``1/sqrt(e)`` scaling and ``mask`` is ``[b, k]``.
If ``fn.masks_padding_queries`` is true the reduction weights padding queries by 0 itself, and
``probs``' padding query rows are passed as the softmax left them (not zeroed: one pass less).
If ``fn.needs_probs`` is true (the default when the attribute is missing) the model takes the
explicit path and passes the probabilities. The outputs of all layers come back as
``attention_reduced``, each leaf stacked on a new axis 1 (``[b, l, ...]``). Two optional
attributes of ``fn`` ask the explicit path for more, passed as keywords:

* ``fn.value_columns``: float ``[b, k, c]`` key-column features ``E``; the model passes
  ``columns=`` float32 ``[b, h, q, c]`` = ``P @ E`` per head (padding query rows 0). Under
  float32 compute without dropout it rides in the value product (``P @ [V | E]``); otherwise a
  separate float32 product over the probabilities.
* ``fn.wants_entropy``: the model passes ``entropy=`` float32 ``[b, h, q]``, each row's
  natural-log entropy over its visible keys from the scores and probabilities
  (``H = ln Z - sum_k p_k (s_k - m)``, ``ln Z = -ln max_k p_k``: no logarithm per element; the
  probabilities are jax.nn.softmax's, bit for bit), 0 on padding query rows; None when a
  "uniform" gate or segment removal edits the probabilities.
* ``fn.wants_values``: the model passes ``values=`` ``[b, k, h, e]`` (the layer's value vectors,
  compute dtype) and ``context=`` ``[b, q, h, e]`` (each head's context vector, before the
  gate and the output projection).

**Long sequences**: the ``"xla"`` path runs in chunks of 512 queries (``lax.map``) once
``b * h * q * k`` exceeds 2^26, so that memory grows linearly in the length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from heads_jax.model import fused_ops
from heads_jax.model.attention import (  # noqa: F401  (the names callers import from here)
    ATTENTION_PATHS, CHUNK_ELEMENTS, GATE_MODES, QUERY_CHUNK, AttentionHooks, attend,
    attention_keep, attention_path, call_inputs, flash_preferred, fused_implementation, visible,
    xla_attention)
from heads_jax.model.config import LAYER_NORM_DTYPES, BertConfig
from heads_jax.model.encoder_io import LayerOutputs

def _init(cfg: BertConfig):
  return nnx.initializers.normal(stddev=cfg.initializer_range)


def _dtype(cfg: BertConfig):
  return jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32


def activation(name: str, x):
  """The family's activation; ``"gelu"`` is the exact (erf) form with a one-residual backward
  (``heads_jax.model.fused_ops.gelu``, equal to ``jax.nn.gelu(approximate=False)``)."""
  if name == "gelu":
    return jax.nn.gelu(x, approximate=False) if fused_ops.is_plain() else fused_ops.gelu(x)
  if name == "relu":
    return jax.nn.relu(x)
  return jax.nn.gelu(x, approximate=True)  # gelu_new / gelu_tanh / gelu_pytorch_tanh


def dense(cfg: BertConfig, din: int, dout: int, rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(din, dout, kernel_init=_init(cfg), bias_init=nnx.initializers.zeros_init(),
                    dtype=_dtype(cfg), param_dtype=jnp.float32, rngs=rngs)


def dense_activation(linear: nnx.Linear, name: str, x):
  """``activation(name, linear(x))``; for ``"gelu"`` the bias enters `fused_ops.bias_gelu`, so
  that the backward keeps one ``[b, q, f]`` residual and gives the bias gradient from the same
  pass (the product as ``nnx.Linear`` computes it: operands in its dtype)."""
  if name != "gelu" or linear.bias is None or fused_ops.is_plain():
    return activation(name, linear(x))
  dt = linear.dtype or jnp.result_type(x, linear.kernel[...])
  h = jax.lax.dot_general(x.astype(dt), linear.kernel[...].astype(dt),
                          (((x.ndim - 1,), (0,)), ((), ())), precision=linear.precision)
  return fused_ops.bias_gelu(h, linear.bias[...])


def layer_norm_dtype(cfg: BertConfig):
  """The LayerNorm output dtype, hence the residual stream's: the compute dtype (default;
  ``layer_norm_dtype="compute"``) or float32 (``"float32"``). Statistics are float32 either way
  (flax reduces in float32 and normalises the float32-promoted input)."""
  which = getattr(cfg, "layer_norm_dtype", "compute")
  if which not in LAYER_NORM_DTYPES:
    raise ValueError(f"layer_norm_dtype must be one of {LAYER_NORM_DTYPES}, got {which!r}")
  return _dtype(cfg) if which == "compute" else jnp.float32


def layer_norm(cfg: BertConfig, d: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
  return nnx.LayerNorm(d, epsilon=cfg.layer_norm_eps, dtype=layer_norm_dtype(cfg),
                       param_dtype=jnp.float32, rngs=rngs)


def dropout_bits(cfg) -> int:
  """Random bits per dropout-mask element (``BertConfig.dropout_bits``; 32 for configs without
  the field: ``nnx.Dropout``'s own masks)."""
  return getattr(cfg, "dropout_bits", 32)


def dropout_mask(dropout: nnx.Dropout, shape, *, deterministic: bool, bits: int = 32):
  """``(keep, keep_probability)`` of ``dropout`` for an input of ``shape``: the next key of its
  rng stream (as ``nnx.Dropout`` draws it) through `fused_ops.dropout_keep` with ``bits`` bits an
  element; ``(None, 1.0)`` when it is off (``deterministic`` or rate 0)."""
  if deterministic or dropout.rate == 0.0:
    return None, 1.0
  if dropout.rate >= 1.0:
    return jnp.zeros(shape, bool), 0.0
  return fused_ops.dropout_keep(dropout.rngs(), dropout.rate, shape, bits)


def hidden_dropout(dropout: nnx.Dropout, x, *, deterministic: bool, bits: int = 32):
  """``dropout(x)`` with the mask of `dropout_mask` (32 bits: ``nnx.Dropout``'s output bit for
  bit)."""
  keep, p = dropout_mask(dropout, x.shape, deterministic=deterministic, bits=bits)
  return fused_ops.dropped(x, keep, p)


def dropout_residual_norm(norm: nnx.LayerNorm, dropout: nnx.Dropout, h, x, *,
                          deterministic: bool, bits: int = 32):
  """``norm(dropout(h) + x)``, post-LN BERT's end of a block, ``[b, q, d]``: one custom-gradient
  op (`fused_ops.residual_dropout_norm`: the backward keeps the LayerNorm input and the mask),
  the plain composition under ``fused_ops.plain("norm")``; the same forward bits either way."""
  keep, p = dropout_mask(dropout, h.shape, deterministic=deterministic, bits=bits)
  if fused_ops.is_plain("norm"):
    return norm(fused_ops.dropped(h, keep, p) + x)
  return fused_ops.residual_dropout_norm(h, x, keep, norm.scale[...], norm.bias[...],
                                         keep_prob=p, eps=norm.epsilon, dtype=norm.dtype)


def sinusoidal_table(n: int, d: int) -> np.ndarray:
  """float32 ``[n, d]``: Vaswani et al.'s positions (DistilBERT's ``sinusoidal_pos_embds``):
  ``sin(p / 10000^(2 floor(j/2) / d))`` on even columns ``j``, ``cos`` of the same on odd ones."""
  pos = np.arange(n, dtype=np.float64)[:, None]
  j = np.arange(d)
  angle = pos / np.power(10000.0, 2 * (j // 2) / d)
  return np.where(j % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


class Embeddings(nnx.Module):
  """Word + position (+ token-type) embeddings, LayerNorm, dropout (+ projection to the hidden
  size). Widths ``e = cfg.embed_dim``; see ``heads_jax.model.config`` for the families."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    e = cfg.embed_dim
    embed = lambda n, init=_init(cfg): nnx.Embed(n, e, embedding_init=init,  # noqa: E731
                                                 param_dtype=jnp.float32, rngs=rngs)
    self.cfg = cfg
    self.word = embed(cfg.vocab_size)
    if cfg.sinusoidal_positions:
      table = sinusoidal_table(cfg.max_position_embeddings, e)
      self.position = embed(cfg.max_position_embeddings, lambda *_: jnp.asarray(table))
    else:
      self.position = embed(cfg.max_position_embeddings)
    self.token_type = embed(cfg.type_vocab_size) if cfg.type_vocab_size > 0 else None
    self.norm = layer_norm(cfg, e, rngs)
    self.dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)
    self.projection = dense(cfg, e, cfg.hidden_size, rngs) if cfg.embedding_projection else None

  def __call__(self, input_ids, token_type_ids, *, deterministic: bool, position_ids=None):
    """ids ``[b, q]`` -> ``[b, q, d]`` (LayerNorm's output dtype, ``layer_norm_dtype``, or the
    compute dtype after a projection).

    ``token_type_ids`` index the type table when it has two or more rows; a one-row table
    (RoBERTa) adds its row everywhere, and a model without one (DistilBERT) ignores them."""
    q = input_ids.shape[1]
    if position_ids is None:
      x = self.word(input_ids) + self.position(jnp.arange(q) + self.cfg.position_offset)[None]
    else:  # packed rows: each token's position inside its own sequence
      x = self.word(input_ids) + self.position(position_ids + self.cfg.position_offset)
    if self.token_type is not None:
      if self.cfg.type_vocab_size == 1:
        x = x + self.token_type.embedding[...][0]
      else:
        x = x + self.token_type(token_type_ids)
    x = hidden_dropout(self.dropout, self.norm(x), deterministic=deterministic,
                       bits=dropout_bits(self.cfg))
    if self.projection is not None:
      x = self.projection(x)
    return x


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

  def __call__(self, x, mask, *, hooks: AttentionHooks, layer: int, deterministic: bool,
               segment_ids=None):
    """x ``[b, q, d]``, mask ``[b, k]`` (1 real); ``hooks`` what the caller wants
    (``heads_jax.model.attention.AttentionHooks``), ``layer`` the applied layer's index;
    ``segment_ids`` ``[b, q]`` or None: packed sequences (a query attends only the real keys of
    its own nonzero id).

    Returns the new hidden state ``[b, q, d]``, the attention ``[b, h, q, k]`` float32 (None off
    the explicit path) and the reduction's output (None without ``hooks.reduce``).
    """
    cfg = self.cfg
    b, q, _ = x.shape
    split = lambda y: y.reshape(b, q, cfg.num_heads, cfg.head_dim)  # noqa: E731
    qh, kh, vh = split(self.query(x)), split(self.key(x)), split(self.value(x))
    ctx, probs, reduced = attend(qh, kh, vh, mask, hooks=hooks, layer=layer,
                                 dropout=self.attention_dropout, deterministic=deterministic,
                                 scale=1.0 / jnp.sqrt(jnp.float32(cfg.head_dim)),
                                 segment_ids=segment_ids, supports_flash=True,
                                 dropout_bits=dropout_bits(cfg))
    out = self.output(ctx.reshape(b, q, cfg.hidden_size))
    return dropout_residual_norm(self.norm, self.dropout, out, x, deterministic=deterministic,
                                 bits=dropout_bits(cfg)), probs, reduced


class Layer(nnx.Module):
  """One post-LN transformer layer: attention block (``attention_class``), then feed-forward
  block."""

  attention_class = SelfAttention  # a family with its own attention (DeBERTa) subclasses Layer

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.attention = self.attention_class(cfg, rngs=rngs)
    self.intermediate = dense(cfg, cfg.hidden_size, cfg.intermediate_size, rngs)
    self.output = dense(cfg, cfg.intermediate_size, cfg.hidden_size, rngs)
    self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
    self.dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)

  def __call__(self, x, mask, *, hooks: AttentionHooks, layer: int, deterministic: bool,
               segment_ids=None):
    """Returns the new hidden state, the attention (None off the explicit path) and the
    per-layer reduction's output (``SelfAttention``)."""
    x, probs, reduced = self.attention(x, mask, hooks=hooks, layer=layer,
                                       deterministic=deterministic, segment_ids=segment_ids)
    return self.feed_forward(x, deterministic), probs, reduced

  def feed_forward(self, x, deterministic: bool):
    """The feed-forward block with its residual and LayerNorm, ``[b, q, d]`` -> ``[b, q, d]``."""
    y = dense_activation(self.intermediate, self.cfg.hidden_act, x)
    return dropout_residual_norm(self.norm, self.dropout, self.output(y), x,
                                 deterministic=deterministic, bits=dropout_bits(self.cfg))


class BertModel(nnx.Module):
  """The encoder of every family (``transformers.BertModel``, ``RobertaModel``,
  ``XLMRobertaModel``, ``DistilBertModel``, ``ElectraModel``, ``AlbertModel``), with the pooler
  where the family has one.

  ``layers`` holds the distinct layers (``cfg.num_distinct_layers``); applied layer ``i`` runs
  ``layers[cfg.layer_schedule[i]]`` (ALBERT shares them; every other family has one per layer).
  """

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.embeddings = Embeddings(cfg, rngs=rngs)
    self.layers = nnx.List([Layer(cfg, rngs=rngs) for _ in range(cfg.num_distinct_layers)])
    self.pooler = dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs) if cfg.pooler else None

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, head_gate=None,
               gate_mode: str = "remove", return_attentions: bool = False,
               return_hidden_states: bool = False, deterministic: bool = True,
               segment_removal=None, renormalise_segments: bool = False,
               attention: str | None = None, attention_reduce=None, position_ids=None,
               segment_ids=None, hooks: AttentionHooks | None = None) -> dict:
    """Encodes ``input_ids`` ``[b, q]``.

    Args:
      attention_mask: ``[b, q]``, 1 on real tokens (default: all real).
      token_type_ids: ``[b, q]`` segment ids, 0 for the first segment and 1 for the second
        (default: zeros); families without token types ignore them (``Embeddings``).
      head_gate: optional float ``[l, h]`` (see the module docstring).
      gate_mode: ``"remove"`` or ``"uniform"``.
      return_attentions: add ``attentions`` float32 ``[b, l, h, q, k]``.
      return_hidden_states: add ``hidden_states`` ``[l + 1, b, q, d]`` (embeddings, then each layer).
      deterministic: False enables dropout.
      segment_removal: optional float ``[l, h, 2]``: share of each head's intra-segment (0) and
        inter-segment (1) attention removed (see the module docstring).
      renormalise_segments: renormalise rows after ``segment_removal`` (default: not; Guan et
        al. do not say, see the module docstring).
      attention: ``"auto"`` (fused whenever nothing needs the probabilities), ``"explicit"``,
        ``"xla"``, ``"cudnn"`` or ``"flash"`` (module docstring); None: the config's
        ``attention`` (``"auto"`` by default).
      attention_reduce: optional per-layer reduction ``fn(layer, probs, query, key, mask)``
        (module docstring); its outputs come back as ``attention_reduced``.
      position_ids: optional int ``[b, q]``: each token's position inside its own sequence,
        0-based, before the family's ``position_offset`` (default ``arange(q)``).
      segment_ids: optional int ``[b, q]``: packed rows, ``1, 2, ...`` per sequence of the
        row and 0 on padding; a query attends only the real keys of its own id (block-diagonal
        attention; a "uniform" gate is uniform over those keys). ``attention_mask`` stays the
        real-position mask (what ``attention_reduce`` receives). ``"cudnn"`` falls back to
        ``"xla"`` here.
      hooks: optional ``heads_jax.model.attention.AttentionHooks``: everything above that
        concerns the attention (path, gate, segment removal, reducer) in one object, plus the
        intervention points ``edit_probs`` and ``edit_context``; give either it or those
        keywords (``return_attentions`` and ``attention`` may be given beside it).

    Returns:
      dict with ``last_hidden_state`` ``[b, q, d]`` and, where the family has a pooler, ``pooled``
      ``[b, d]`` (float32), plus the
      optional entries above and ``attention_reduced`` (each leaf ``[b, l, ...]``) with
      ``attention_reduce``.
    """
    cfg = self.config
    input_ids, mask, types, hooks = call_inputs(
        cfg, hooks, input_ids, attention_mask, token_type_ids, position_ids=position_ids,
        segment_ids=segment_ids, attention=attention, return_attentions=return_attentions,
        attention_reduce=attention_reduce, head_gate=head_gate, gate_mode=gate_mode,
        segment_removal=segment_removal, renormalise_segments=renormalise_segments)
    if position_ids is not None:
      position_ids = jnp.asarray(position_ids, jnp.int32)
    if segment_ids is not None:
      segment_ids = jnp.asarray(segment_ids, jnp.int32)
    x = self.embeddings(input_ids, types, deterministic=deterministic, position_ids=position_ids)
    outputs = LayerOutputs(x, return_attentions=hooks.need_probs,
                           return_hidden_states=return_hidden_states,
                           attention_reduce=hooks.reduce)
    for i, which in enumerate(cfg.layer_schedule):
      x, probs, layer_reduced = self.layers[which](x, mask, hooks=hooks, layer=i,
                                                   deterministic=deterministic,
                                                   segment_ids=segment_ids)
      outputs.add(x, probs, layer_reduced)
    x = x.astype(jnp.float32)
    out = {"last_hidden_state": x}
    if self.pooler is not None:
      out["pooled"] = jnp.tanh(self.pooler(x[:, 0]).astype(jnp.float32))
    return outputs.stacked(out, mask)
