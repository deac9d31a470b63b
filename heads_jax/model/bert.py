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
  stream, the very mask the explicit path draws). The masks are therefore a function of the
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
the same model.

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

**Long sequences**: the ``"xla"`` path runs in chunks of 512 queries (``lax.map``) once
``b * h * q * k`` exceeds 2^26, so that memory grows linearly in the length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from heads_jax.model.config import ATTENTION_SETTINGS, LAYER_NORM_DTYPES, BertConfig
from heads_jax.model.encoder_io import LayerOutputs, check_inputs, remove_segments
from heads_jax.model.flash_attention import flash_attention

GATE_MODES = ("remove", "uniform")
ATTENTION_PATHS = ATTENTION_SETTINGS  # ("auto", "explicit", "xla", "cudnn", "flash")


def fused_implementation(dtype, head_dim: int) -> str:
  """``"cudnn"`` on a GPU for bfloat16/float16 compute with a head dimension cuDNN's flash
  attention takes (multiple of 8, at most 128), else ``"xla"``."""
  if (jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
      and head_dim % 8 == 0 and head_dim <= 128):
    return "cudnn"
  return "xla"


def flash_preferred(dtype, head_dim: int) -> bool:
  """Whether ``"auto"`` takes the Pallas flash kernel for dropout-active attention: on a GPU
  for bfloat16/float16 compute and head dimensions up to 128 (float32 keeps the explicit path,
  whose float32 products Triton would round to TF32)."""
  return (jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
          and head_dim <= 128)


def attention_path(attention: str, *, needs_probs: bool, dropout_active: bool, dtype,
                   head_dim: int, supports_flash: bool = False) -> str:
  """``"explicit"``, ``"xla"``, ``"cudnn"`` or ``"flash"`` for the ``attention`` setting
  (module docstring).

  ``needs_probs``: something reads the probabilities (returned attentions, a ``"uniform"``
  gate, segment removal, a reduction that asks for them); ``dropout_active``: attention
  dropout would change them; ``supports_flash``: the caller has a ``"flash"`` branch (BERT's
  ``SelfAttention``; another family gets the explicit path for dropout as before).
  """
  if attention not in ATTENTION_PATHS:
    raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
  if attention == "explicit":
    return "explicit"
  if attention == "flash" and not supports_flash:
    raise ValueError("attention='flash' (the Pallas flash kernel) is not available for this "
                     "model family; use 'auto', 'explicit' or 'xla'")
  if attention == "auto":
    if needs_probs:
      return "explicit"
    if dropout_active:
      return "flash" if supports_flash and flash_preferred(dtype, head_dim) else "explicit"
    return fused_implementation(dtype, head_dim)
  if needs_probs:
    raise ValueError(f"attention={attention!r} (fused) cannot return or edit the attention "
                     f"probabilities; use 'auto' or 'explicit'")
  if dropout_active and attention != "flash":
    raise ValueError(f"attention={attention!r} (fused) cannot apply attention dropout; use "
                     f"'auto', 'flash' or 'explicit'")
  return attention


def attention_keep(dropout: nnx.Dropout, shape) -> jax.Array:
  """bool ``shape``: the keep mask ``dropout`` would draw for an input of ``shape`` (the next
  key of its rng stream, ``jax.random.bernoulli`` with ``1 - rate``), so that the explicit and
  the flash paths drop exactly the same probabilities, and a step's masks depend only on the
  step's key (``heads_jax.training.steps``)."""
  return jax.random.bernoulli(dropout.rngs(), 1.0 - dropout.rate, shape)


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
    x = self.dropout(self.norm(x), deterministic=deterministic)
    if self.projection is not None:
      x = self.projection(x)
    return x


def visible(mask, segment_ids=None):
  """bool ``[b, 1, 1, k]`` (the real keys) or, with packed ``segment_ids`` ``[b, q]``,
  ``[b, 1, q, k]``: key ``k`` is visible to query ``q`` iff it is real and has the query's
  nonzero id (padding positions have id 0 and see nothing)."""
  real = mask[:, None, None, :] > 0
  if segment_ids is None:
    return real
  seg = segment_ids
  return real & (seg[:, None, :, None] == seg[:, None, None, :]) & (seg[:, None, None, :] > 0)


CHUNK_ELEMENTS = 2 ** 26  # b * h * q * k above which the XLA path runs in query chunks
QUERY_CHUNK = 512


def xla_attention(qh, kh, vh, key_real):
  """``jax.nn.dot_product_attention`` (XLA) with the boolean ``key_real`` ``[b, 1, q|1, k]``;
  in chunks of ``QUERY_CHUNK`` queries (``lax.map``) when ``b * h * q * k`` exceeds
  ``CHUNK_ELEMENTS``, so that memory grows linearly in the length (same numbers: the softmax is
  per query row)."""
  b, q, h, _ = qh.shape
  k = kh.shape[1]
  if b * h * q * k <= CHUNK_ELEMENTS or q <= QUERY_CHUNK:
    return jax.nn.dot_product_attention(qh, kh, vh, mask=key_real, implementation="xla")
  n = -(-q // QUERY_CHUNK)
  pad = n * QUERY_CHUNK - q
  qc = jnp.pad(qh, ((0, 0), (0, pad), (0, 0), (0, 0)))
  qc = jnp.moveaxis(qc.reshape(b, n, QUERY_CHUNK, h, qh.shape[-1]), 1, 0)
  if key_real.shape[2] == 1:
    ctx = jax.lax.map(lambda qb: jax.nn.dot_product_attention(qb, kh, vh, mask=key_real,
                                                              implementation="xla"), qc)
  else:
    mc = jnp.pad(key_real, ((0, 0), (0, 0), (0, pad), (0, 0)))
    mc = jnp.moveaxis(mc.reshape(b, 1, n, QUERY_CHUNK, k), 2, 0)
    ctx = jax.lax.map(lambda a: jax.nn.dot_product_attention(a[0], kh, vh, mask=a[1],
                                                             implementation="xla"), (qc, mc))
  return jnp.moveaxis(ctx, 0, 1).reshape(b, n * QUERY_CHUNK, h, vh.shape[-1])[:, :q]


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
               segment_removal=None, segments=None, renormalise_segments: bool = False,
               attention: str = "auto", need_probs: bool = False, reduce=None, layer: int = 0,
               segment_ids=None):
    """x ``[b, q, d]``, mask ``[b, k]`` (1 real) , gate ``[h]`` or None; ``segment_removal``
    ``[h, 2]`` or None with ``segments`` ``[b, k]`` (token types; see the module docstring);
    ``attention`` the path setting, ``need_probs`` whether the caller reads the probabilities,
    ``reduce`` the per-layer reduction (called with ``layer``); ``segment_ids`` ``[b, q]`` or
    None: packed sequences (a query attends only the real keys of its own nonzero id).

    Returns the new hidden state ``[b, q, d]``, the attention ``[b, h, q, k]`` float32 (None on
    the fused path) and the reduction's output (None without ``reduce``).
    """
    cfg = self.cfg
    b, q, _ = x.shape
    split = lambda y: y.reshape(b, q, cfg.num_heads, cfg.head_dim)
    qh, kh, vh = split(self.query(x)), split(self.key(x)), split(self.value(x))
    reduce_probs = reduce is not None and getattr(reduce, "needs_probs", True)
    edits = (gate is not None and gate_mode == "uniform") or segment_removal is not None
    dropout_active = not deterministic and self.attention_dropout.rate > 0
    path = attention_path(attention, needs_probs=need_probs or edits or reduce_probs,
                          dropout_active=dropout_active, dtype=qh.dtype, head_dim=cfg.head_dim,
                          supports_flash=True)
    key_real = visible(mask, segment_ids)                                    # [b, 1, q|1, k]
    h = cfg.num_heads
    keep = attention_keep(self.attention_dropout, (b, h, q, q)) if dropout_active else None
    columns_in = None if reduce is None else getattr(reduce, "value_columns", None)
    wants_entropy = reduce is not None and getattr(reduce, "wants_entropy", False)
    probs = columns = entropy = None
    if path == "explicit":
      scale = 1.0 / jnp.sqrt(jnp.float32(cfg.head_dim))
      scores = jnp.einsum("bqhe,bkhe->bhqk", qh, kh, preferred_element_type=jnp.float32) * scale
      scores = jnp.where(key_real, scores, jnp.finfo(jnp.float32).min)
      probs = jax.nn.softmax(scores, axis=-1)
      if wants_entropy and not edits:
        # H = ln Z - sum_k p_k (s_k - m), natural log, over the visible keys, with ln Z = -ln p
        # of the largest score's key (its p is exp(0) / Z): no logarithm per element, and the
        # probabilities stay jax.nn.softmax's (same bits as without the hook; keeping its
        # exponentials for the sum instead cost a pass over them)
        m = jnp.max(scores, axis=-1, keepdims=True)
        spread = jnp.sum(jnp.where(key_real, probs * (scores - m), 0.0), -1)
        entropy = -jnp.log(jnp.max(probs, axis=-1)) - spread
        entropy = entropy * mask[:, None, :].astype(entropy.dtype)          # padding queries 0
      probs = jnp.where(key_real, probs, 0.0)  # exact zeros on padding keys
      if gate is not None and gate_mode == "uniform":
        # uniform over the keys the query may attend (its segment's real keys when packed)
        n = jnp.maximum(jnp.sum(key_real, axis=-1, keepdims=True), 1).astype(jnp.float32)
        uniform = key_real.astype(jnp.float32) / n
        g = gate.astype(jnp.float32)[None, :, None, None]
        probs = g * probs + (1.0 - g) * uniform
      if segment_removal is not None:
        probs = remove_segments(probs, segments, segment_removal, renormalise_segments)
      dropped, rate = probs, self.attention_dropout.rate
      if keep is not None:  # as nnx.Dropout: select(keep, x / (1 - rate), 0)
        dropped = (jax.lax.select(keep, probs / (1.0 - rate), jnp.zeros_like(probs)) if rate < 1
                   else jnp.zeros_like(probs))
      if columns_in is not None and vh.dtype == jnp.float32 and keep is None:
        # P @ [V | E]: the extra columns ride in the same product as the values
        cols = jnp.broadcast_to(columns_in[:, :, None, :].astype(vh.dtype),
                                (b, q, h, columns_in.shape[-1]))
        both = jnp.einsum("bhqk,bkhf->bqhf", dropped, jnp.concatenate([vh, cols], axis=-1))
        ctx, columns = both[..., :cfg.head_dim], jnp.transpose(both[..., cfg.head_dim:], (0, 2, 1, 3))
      else:
        ctx = jnp.einsum("bhqk,bkhe->bqhe", dropped.astype(vh.dtype), vh)
        if columns_in is not None:  # float32 columns under bfloat16 compute (or dropout)
          columns = jnp.einsum("bhqk,bkc->bhqc", probs, columns_in.astype(jnp.float32))
      if columns is not None:
        columns = columns * mask[:, None, :, None].astype(columns.dtype)    # padding queries 0
    elif path == "flash":
      if segment_ids is None:
        # a query attends the real keys of its row (padding queries too, as the explicit path)
        q_ids, kv_ids = jnp.ones_like(mask), mask
      else:
        q_ids = segment_ids
        kv_ids = jnp.where((mask > 0) & (segment_ids > 0), segment_ids, -1)
      ctx = flash_attention(qh, kh, vh, q_ids, kv_ids, keep, rate=self.attention_dropout.rate)
    elif path == "cudnn" and segment_ids is None:
      # right-padded batches: key lengths; at least 1 so that a filler row stays finite
      lengths = jnp.maximum(jnp.sum(mask > 0, axis=-1), 1).astype(jnp.int32)
      ctx = jax.nn.dot_product_attention(qh, kh, vh, key_value_seq_lengths=lengths,
                                         implementation="cudnn")
    else:  # "xla" (and "cudnn" with packed segments, which key lengths cannot express)
      ctx = xla_attention(qh, kh, vh, key_real)
    reduced = None
    if reduce is not None:
      shown = probs
      if probs is not None and not getattr(reduce, "masks_padding_queries", False):
        shown = probs * mask[:, None, :, None].astype(probs.dtype)           # padding queries 0
      extra = {}
      if columns_in is not None:
        extra["columns"] = columns
      if wants_entropy:
        extra["entropy"] = entropy
      reduced = reduce(layer, shown, qh, kh, mask, **extra)
    if gate is not None and gate_mode == "remove":
      ctx = ctx * gate.astype(ctx.dtype)[None, None, :, None]
    out = self.dropout(self.output(ctx.reshape(b, q, cfg.hidden_size)), deterministic=deterministic)
    return self.norm(out + x), probs, reduced


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

  def __call__(self, x, mask, *, gate, gate_mode, deterministic, **attention_kw):
    """Returns the new hidden state, the attention (None on the fused path) and the per-layer
    reduction's output (``SelfAttention``)."""
    x, probs, reduced = self.attention(x, mask, gate=gate, gate_mode=gate_mode,
                                       deterministic=deterministic, **attention_kw)
    y = activation(self.cfg.hidden_act, self.intermediate(x))
    y = self.dropout(self.output(y), deterministic=deterministic)
    return self.norm(y + x), probs, reduced


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
               segment_ids=None) -> dict:
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

    Returns:
      dict with ``last_hidden_state`` ``[b, q, d]`` and, where the family has a pooler, ``pooled``
      ``[b, d]`` (float32), plus the
      optional entries above and ``attention_reduced`` (each leaf ``[b, l, ...]``) with
      ``attention_reduce``.
    """
    cfg = self.config
    if gate_mode not in GATE_MODES:
      raise ValueError(f"gate_mode must be one of {GATE_MODES}, got {gate_mode!r}")
    if attention is None:
      attention = getattr(cfg, "attention", "auto")
    if attention not in ATTENTION_PATHS:
      raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
    input_ids, mask, types, head_gate, segment_removal = check_inputs(
        cfg, input_ids, attention_mask, token_type_ids, head_gate=head_gate,
        segment_removal=segment_removal, position_ids=position_ids, segment_ids=segment_ids)
    if position_ids is not None:
      position_ids = jnp.asarray(position_ids, jnp.int32)
    x = self.embeddings(input_ids, types, deterministic=deterministic, position_ids=position_ids)
    outputs = LayerOutputs(x, return_attentions=return_attentions,
                           return_hidden_states=return_hidden_states,
                           attention_reduce=attention_reduce)
    for i, which in enumerate(cfg.layer_schedule):
      layer = self.layers[which]
      gate = None if head_gate is None else head_gate[i]
      attention_kw = {"attention": attention, "need_probs": return_attentions,
                      "reduce": attention_reduce, "layer": i}
      if segment_ids is not None:
        attention_kw["segment_ids"] = jnp.asarray(segment_ids, jnp.int32)
      if segment_removal is not None:
        attention_kw.update(segment_removal=segment_removal[i], segments=types,
                            renormalise_segments=renormalise_segments)
      x, probs, layer_reduced = layer(x, mask, gate=gate, gate_mode=gate_mode,
                                      deterministic=deterministic, **attention_kw)
      outputs.add(x, probs, layer_reduced)
    x = x.astype(jnp.float32)
    out = {"last_hidden_state": x}
    if self.pooler is not None:
      out["pooled"] = jnp.tanh(self.pooler(x[:, 0]).astype(jnp.float32))
    return outputs.stacked(out, mask)
