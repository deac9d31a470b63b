"""The one attention computation every encoder family calls (levanter's pattern): the choice of
path, the masks, the dropout keep mask, the softmax and every edit of the probabilities, the
statistics reducer's call and the context product live here once; a family computes only its
own inputs (projections, RoPE, DeBERTa's relative-position terms) and calls `attend`.

Shape legend: b batch, q query positions, k key positions (q == k), l layer, h head,
e head dimension, c key-column features.

What the caller wants of the attention travels down the model as one typed argument,
`AttentionHooks` (as flax's ``examples/gemma/sow_lib.py`` hands down what to collect): the
path setting, whether the probabilities are read, the statistics reducer, the head gate and
its mode, Guan et al.'s segment removal, and two generic intervention points:

* ``edit_probs(layer, probs) -> probs``: float32 ``[b, h, q, k]``, called on each layer's
  probabilities after the gate and the segment removal, before dropout and the value product
  (self-attention attribution scales them by ``alpha`` and adds a zero perturbation whose
  gradient is ``dF/dA``). Its presence forces the explicit path; the returned ``attentions``
  and the reducer see the edited probabilities (the attention actually used).
* ``edit_context(layer, ctx) -> ctx``: ``[b, q, h, e]`` (compute dtype), each head's context
  vector after the ``"remove"`` gate, before the output projection (activation patching
  writes another run's head outputs here). It works on every path (flash and the fused paths
  included), since the context exists on all of them.

``layer`` is the applied layer's index (ALBERT's shared layers get 0..l-1 as applied). The
hooks are plain Python: jit traces through them; an edit closes over arrays (alpha, the
patched outputs) as constants or takes them from an enclosing traced function.

**Paths** (`attention_path`): *explicit* (scores, masked float32 softmax, edits, dropout, the
value product: yields the probabilities), *flash* (``heads_jax.model.flash_attention``, a
Pallas Triton kernel with BERT's exact dropout mask; families without a bias or a window),
*cudnn* (``jax.nn.dot_product_attention``'s cuDNN flash attention: key lengths, ModernBERT's
sliding window; not with a bias or packed rows, which fall back to XLA) and *xla*
(``jax.nn.dot_product_attention`` with a boolean mask and an optional bias, in query chunks
for long sequences). ``heads_jax.model.bert``'s module docstring says when ``"auto"`` takes
which.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from heads_jax.model import fused_ops
from heads_jax.model.config import ATTENTION_SETTINGS
from heads_jax.model.encoder_io import check_inputs, remove_segments
from heads_jax.model.flash_attention import flash_attention

GATE_MODES = ("remove", "uniform")
ATTENTION_PATHS = ATTENTION_SETTINGS  # ("auto", "explicit", "xla", "cudnn", "flash")


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionHooks:
  """What the caller wants of every layer's attention (module docstring).

  Attributes:
    path: the attention setting (``ATTENTION_PATHS``); None: the model config's ``attention``.
    need_probs: the caller reads the probabilities (``return_attentions``).
    reduce: the per-layer statistics reducer ``fn(layer, probs, query, key, mask, **extra)``
      with its protocol attributes ``needs_probs`` (default True), ``value_columns``,
      ``wants_entropy``, ``wants_values``, ``masks_padding_queries``
      (``heads_jax.model.bert``'s docstring).
    gate: float ``[l, h]`` or None, with ``gate_mode`` ``"remove"`` or ``"uniform"``.
    segment_removal: float ``[l, h, 2]`` or None, with ``renormalise_segments``; ``segments``
      int ``[b, k]`` (the token types) is filled in by the model.
    edit_probs, edit_context: the intervention points (module docstring), or None.
  """
  path: str | None = None
  need_probs: bool = False
  reduce: Callable | None = None
  gate: Any = None
  gate_mode: str = "remove"
  segment_removal: Any = None
  segments: Any = None
  renormalise_segments: bool = False
  edit_probs: Callable | None = None
  edit_context: Callable | None = None

  def __post_init__(self):
    if self.path is not None and self.path not in ATTENTION_PATHS:
      raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {self.path!r}")
    if self.gate_mode not in GATE_MODES:
      raise ValueError(f"gate_mode must be one of {GATE_MODES}, got {self.gate_mode!r}")

  @property
  def edits_probs(self) -> bool:
    """Whether the probabilities are changed after the softmax (``"uniform"`` gate, segment
    removal, ``edit_probs``)."""
    return ((self.gate is not None and self.gate_mode == "uniform")
            or self.segment_removal is not None or self.edit_probs is not None)

  @property
  def reducer_needs_probs(self) -> bool:
    return self.reduce is not None and getattr(self.reduce, "needs_probs", True)

  @property
  def needs_probs(self) -> bool:
    """Whether some layer must take the explicit path."""
    return self.need_probs or self.edits_probs or self.reducer_needs_probs

  def layer_gate(self, layer: int):
    """float ``[h]`` or None: applied layer ``layer``'s gate."""
    return None if self.gate is None else self.gate[layer]


def resolve_hooks(cfg, hooks: AttentionHooks | None = None, *, attention: str | None = None,
                  return_attentions: bool = False, attention_reduce=None, head_gate=None,
                  gate_mode: str = "remove", segment_removal=None,
                  renormalise_segments: bool = False) -> AttentionHooks:
  """The `AttentionHooks` of one model call: ``hooks`` as given, or built from the models'
  keyword arguments (``BertModel.__call__``); ``return_attentions`` and ``attention`` may be
  given beside ``hooks`` (they set ``need_probs`` and ``path``), the others only one way. The
  path defaults to ``cfg.attention`` (``"auto"`` where the config has none)."""
  if hooks is None:
    hooks = AttentionHooks(path=attention, need_probs=return_attentions, reduce=attention_reduce,
                           gate=head_gate, gate_mode=gate_mode, segment_removal=segment_removal,
                           renormalise_segments=renormalise_segments)
  else:
    both = [name for name, value, default in (
        ("attention_reduce", attention_reduce, None), ("head_gate", head_gate, None),
        ("gate_mode", gate_mode, "remove"), ("segment_removal", segment_removal, None),
        ("renormalise_segments", renormalise_segments, False))
        if (value is not None if default is None else value != default)]
    if both:
      raise ValueError(f"give {', '.join(both)} inside hooks= (AttentionHooks), not beside it")
    hooks = dataclasses.replace(hooks, need_probs=hooks.need_probs or return_attentions,
                                path=hooks.path if attention is None else attention)
  if hooks.path is None:
    hooks = dataclasses.replace(hooks, path=getattr(cfg, "attention", "auto"))
  return hooks


def call_inputs(cfg, hooks: AttentionHooks | None, input_ids, attention_mask=None,
                token_type_ids=None, *, position_ids=None, segment_ids=None, **keywords):
  """One model call's checked inputs and hooks, as every family's ``__call__`` starts:
  `resolve_hooks` with the call's ``keywords``, the inputs checked against ``cfg``
  (`encoder_io.check_inputs`), the checked gate and segment removal put back into the hooks
  with the token types as ``segments``. Returns ``(input_ids, mask, types, hooks)``: int32
  ``[b, q]`` each, then the `AttentionHooks`."""
  hooks = resolve_hooks(cfg, hooks, **keywords)
  input_ids, mask, types, gate, removal = check_inputs(
      cfg, input_ids, attention_mask, token_type_ids, head_gate=hooks.gate,
      segment_removal=hooks.segment_removal, position_ids=position_ids, segment_ids=segment_ids)
  return input_ids, mask, types, dataclasses.replace(hooks, gate=gate, segment_removal=removal,
                                                     segments=types)


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
  """``"explicit"``, ``"xla"``, ``"cudnn"`` or ``"flash"`` for the ``attention`` setting.

  ``needs_probs``: something reads or edits the probabilities; ``dropout_active``: attention
  dropout would change them; ``supports_flash``: the family can take the flash kernel (no
  bias, no window: BERT's families).
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


def attention_keep(dropout: nnx.Dropout, shape, bits: int = 32) -> jax.Array:
  """bool ``shape``: the keep mask ``dropout`` would draw for an input of ``shape`` (the next
  key of its rng stream; with 32 bits ``jax.random.bernoulli`` with ``1 - rate``, as
  ``nnx.Dropout``; 8 or 16 bits an element: ``fused_ops.dropout_keep``, kept with probability
  ``fused_ops.keep_probability(rate, bits)``), so that the explicit and the flash paths drop
  exactly the same probabilities, and a step's masks depend only on the step's key
  (``heads_jax.training.steps``)."""
  return fused_ops.dropout_keep(dropout.rngs(), dropout.rate, shape, bits)[0]


def visible(mask, segment_ids=None, window: int | None = None):
  """Which keys each query sees: bool ``[b, 1, 1, k]`` (the real keys of ``mask`` ``[b, k]``)
  or ``[b, 1, q, k]`` with packed ``segment_ids`` ``[b, q]`` (key and query of the same
  nonzero id; padding positions have id 0 and see nothing) and/or a local ``window`` (keys with
  ``|i - j| <= window``; a packed sequence's positions are contiguous, so row offsets are its
  token offsets)."""
  mask = jnp.asarray(mask)
  seen = mask[:, None, None, :] > 0
  if segment_ids is not None:
    seg = jnp.asarray(segment_ids)
    seen = seen & (seg[:, None, :, None] == seg[:, None, None, :]) & (seg[:, None, None, :] > 0)
  if window is not None:
    k = mask.shape[-1]
    pos = jnp.arange(k)
    seen = seen & (jnp.abs(pos[:, None] - pos[None, :]) <= window)[None, None]
  return seen


CHUNK_ELEMENTS = 2 ** 26  # b * h * q * k above which the XLA path runs in query chunks
QUERY_CHUNK = 512


def xla_attention(qh, kh, vh, key_real, bias=None, scale=None):
  """``jax.nn.dot_product_attention`` (XLA) with the boolean ``key_real`` ``[b, 1, q|1, k]``
  (and an optional ``bias`` ``[b, h, q, k]``, ``scale``); without a bias, in chunks of
  ``QUERY_CHUNK`` queries (``lax.map``) when ``b * h * q * k`` exceeds ``CHUNK_ELEMENTS``, so
  that memory grows linearly in the length (same numbers: the softmax is per query row; a
  bias is itself ``[b, h, q, k]``, so chunking would not save that memory)."""
  b, q, h, _ = qh.shape
  k = kh.shape[1]
  if bias is not None or b * h * q * k <= CHUNK_ELEMENTS or q <= QUERY_CHUNK:
    return jax.nn.dot_product_attention(qh, kh, vh, bias=bias, mask=key_real, scale=scale,
                                        implementation="xla")
  n = -(-q // QUERY_CHUNK)
  pad = n * QUERY_CHUNK - q
  qc = jnp.pad(qh, ((0, 0), (0, pad), (0, 0), (0, 0)))
  qc = jnp.moveaxis(qc.reshape(b, n, QUERY_CHUNK, h, qh.shape[-1]), 1, 0)
  if key_real.shape[2] == 1:
    ctx = jax.lax.map(lambda qb: jax.nn.dot_product_attention(qb, kh, vh, mask=key_real,
                                                              scale=scale,
                                                              implementation="xla"), qc)
  else:
    mc = jnp.pad(key_real, ((0, 0), (0, 0), (0, pad), (0, 0)))
    mc = jnp.moveaxis(mc.reshape(b, 1, n, QUERY_CHUNK, k), 2, 0)
    ctx = jax.lax.map(lambda a: jax.nn.dot_product_attention(a[0], kh, vh, mask=a[1],
                                                             scale=scale,
                                                             implementation="xla"), (qc, mc))
  return jnp.moveaxis(ctx, 0, 1).reshape(b, n * QUERY_CHUNK, h, vh.shape[-1])[:, :q]


class Attended(NamedTuple):
  """`attend`'s result: ``context`` ``[b, q, h, e]`` (compute dtype), ``probs`` float32
  ``[b, h, q, k]`` (None off the explicit path) and the reducer's output (None without one)."""
  context: jax.Array
  probs: jax.Array | None
  reduced: Any


def attend(qh, kh, vh, mask, *, hooks: AttentionHooks, layer: int, dropout: nnx.Dropout,
           deterministic: bool, scale, bias=None, window: int | None = None,
           segment_ids=None, supports_flash: bool = False,
           query_key_logits: bool = True, dropout_bits: int = 32) -> Attended:
  """One layer's multi-head attention.

  Args:
    qh, kh, vh: ``[b, q, h, e]`` (compute dtype; RoPE already applied where the family has it).
    mask: int ``[b, k]``, 1 on real positions.
    hooks: what the caller wants (`AttentionHooks`); ``layer`` the applied layer's index.
    dropout: the attention-dropout module (its rate and rng stream); ``deterministic`` as
      ``nnx.Dropout``.
    scale: the factor of ``q . k`` (``1 / sqrt(e)``; DeBERTa ``1 / sqrt(3 e)``).
    bias: float32 ``[b, h, q, k]`` added to the scaled scores (DeBERTa's positional terms,
      already scaled), or None.
    window: half-width of a local layer's sliding window (ModernBERT), or None.
    segment_ids: int ``[b, q]`` packed rows (``1, 2, ...`` per sequence, 0 on padding), or None.
    supports_flash: the family can take the flash kernel.
    query_key_logits: a head's logits are ``q . k * scale`` over the visible keys, so a reducer
      that recomputes them from ``qh``, ``kh`` (``needs_probs`` False) can serve; False
      refuses such a reducer (``ValueError``).

    dropout_bits: random bits per element of the attention-dropout mask (32, 16 or 8:
      ``attention_keep``); kept probabilities are scaled by the inverse of the probability of
      keeping (``fused_ops.keep_probability``).
  """
  b, q, h, e = qh.shape
  reduce = hooks.reduce
  if reduce is not None and not hooks.reducer_needs_probs and not query_key_logits:
    raise ValueError("this layer's logits are not query . key over the real keys (DeBERTa's "
                     "disentangled attention, ModernBERT's sliding window): this per-layer "
                     "reduction recomputes them from the query and key vectors and cannot "
                     "serve it; use the 'layerwise' or 'stacked' statistics path")
  gate = hooks.layer_gate(layer)
  dropout_active = not deterministic and dropout.rate > 0
  path = attention_path(hooks.path, needs_probs=hooks.needs_probs, dropout_active=dropout_active,
                        dtype=qh.dtype, head_dim=e, supports_flash=supports_flash)
  if path == "cudnn" and (bias is not None or segment_ids is not None):
    path = "xla"  # a bias or packed rows: XLA (key lengths cannot express segments)
  seen = visible(mask, segment_ids, window)                                # [b, 1, q|1, k]
  keep = attention_keep(dropout, (b, h, q, q), dropout_bits) if dropout_active else None
  rate = (dropout.rate if dropout_bits == 32 else   # the mask's own rate (nnx's for 32 bits)
          1.0 - fused_ops.keep_probability(dropout.rate, dropout_bits))
  columns_in = None if reduce is None else getattr(reduce, "value_columns", None)
  wants_entropy = reduce is not None and getattr(reduce, "wants_entropy", False)
  probs = columns = entropy = None
  if path == "explicit":
    if qh.dtype == jnp.bfloat16 and not fused_ops.is_plain():  # its backward in bf16 too
      scores = fused_ops.bf16_einsum("bqhe,bkhe->bhqk", qh, kh) * scale
    else:
      scores = jnp.einsum("bqhe,bkhe->bhqk", qh, kh, preferred_element_type=jnp.float32) * scale
    if bias is not None:
      scores = scores + bias
    scores = jnp.where(seen, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    if wants_entropy and not hooks.edits_probs:
      # H = ln Z - sum_k p_k (s_k - m), natural log, over the visible keys, with ln Z = -ln p
      # of the largest score's key (its p is exp(0) / Z): no logarithm per element, and the
      # probabilities stay jax.nn.softmax's (same bits as without the hook)
      m = jnp.max(scores, axis=-1, keepdims=True)
      spread = jnp.sum(jnp.where(seen, probs * (scores - m), 0.0), -1)
      entropy = -jnp.log(jnp.max(probs, axis=-1)) - spread
      entropy = entropy * mask[:, None, :].astype(entropy.dtype)            # padding queries 0
    probs = jnp.where(seen, probs, 0.0)  # exact zeros on keys the query does not see
    if gate is not None and hooks.gate_mode == "uniform":
      # uniform over the keys the query may see (its segment's, its window's real keys)
      n = jnp.maximum(jnp.sum(seen, axis=-1, keepdims=True), 1).astype(jnp.float32)
      g = gate.astype(jnp.float32)[None, :, None, None]
      probs = g * probs + (1.0 - g) * (seen.astype(jnp.float32) / n)
    if hooks.segment_removal is not None:
      probs = remove_segments(probs, hooks.segments, hooks.segment_removal[layer],
                              hooks.renormalise_segments)
    if hooks.edit_probs is not None:
      probs = hooks.edit_probs(layer, probs)
    dropped = probs
    if keep is not None:  # as nnx.Dropout: select(keep, x / (1 - rate), 0)
      dropped = (jax.lax.select(keep, probs / (1.0 - rate), jnp.zeros_like(probs)) if rate < 1
                 else jnp.zeros_like(probs))
    if columns_in is not None and vh.dtype == jnp.float32 and keep is None:
      # P @ [V | E]: the extra columns ride in the same product as the values
      cols = jnp.broadcast_to(columns_in[:, :, None, :].astype(vh.dtype),
                              (b, q, h, columns_in.shape[-1]))
      both = jnp.einsum("bhqk,bkhf->bqhf", dropped, jnp.concatenate([vh, cols], axis=-1))
      ctx, columns = both[..., :e], jnp.transpose(both[..., e:], (0, 2, 1, 3))
    else:
      ctx = jnp.einsum("bhqk,bkhe->bqhe", dropped.astype(vh.dtype), vh)
      if columns_in is not None:  # float32 columns under bfloat16 compute (or dropout)
        columns = jnp.einsum("bhqk,bkc->bhqc", probs, columns_in.astype(jnp.float32))
    if columns is not None:
      columns = columns * mask[:, None, :, None].astype(columns.dtype)      # padding queries 0
  elif path == "flash":
    if segment_ids is None:
      # a query attends the real keys of its row (padding queries too, as the explicit path)
      q_ids, kv_ids = jnp.ones_like(mask), mask
    else:
      q_ids = segment_ids
      kv_ids = jnp.where((mask > 0) & (segment_ids > 0), segment_ids, -1)
    ctx = flash_attention(qh, kh, vh, q_ids, kv_ids, keep, rate=rate)
  elif path == "cudnn":
    # right-padded batches: key lengths; at least 1 so that a filler row stays finite
    lengths = jnp.maximum(jnp.sum(mask > 0, axis=-1), 1).astype(jnp.int32)
    ctx = jax.nn.dot_product_attention(
        qh, kh, vh, key_value_seq_lengths=lengths, implementation="cudnn",
        local_window_size=None if window is None else (window, window))
  else:  # "xla"
    ctx = xla_attention(qh, kh, vh, seen, None if bias is None else bias.astype(qh.dtype),
                        None if bias is None else float(scale))
  reduced = None
  if reduce is not None:
    shown = probs
    if probs is not None and not getattr(reduce, "masks_padding_queries", False):
      shown = probs * mask[:, None, :, None].astype(probs.dtype)            # padding queries 0
    extra = {}
    if columns_in is not None:
      extra["columns"] = columns
    if wants_entropy:
      extra["entropy"] = entropy
    if getattr(reduce, "wants_values", False):
      extra["values"], extra["context"] = vh, ctx
    reduced = reduce(layer, shown, qh, kh, mask, **extra)
  if gate is not None and hooks.gate_mode == "remove":
    ctx = ctx * gate.astype(ctx.dtype)[None, None, :, None]
  if hooks.edit_context is not None:
    ctx = hooks.edit_context(layer, ctx)
  return Attended(ctx, probs, reduced)
