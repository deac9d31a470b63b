"""ModernBERT (Warner et al. 2024) in Flax NNX, with every attention map: the ``modernbert``
family of the registry (``heads_jax.model.config``: ``Family.module``).

Shape legend: b batch, q query positions, k key positions, l layer, h head, d hidden,
e head dimension (d = h * e), f feed-forward width.

The encoder, as transformers' ``ModernBertModel`` (eager attention) computes it:

* embeddings: token embedding, LayerNorm (no bias unless ``norm_bias``), dropout; no position
  table: positions enter through rotary embeddings (RoPE) on queries and keys;
* ``num_layers`` pre-norm layers ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` (layer 0 has no
  attention norm: the embedding norm serves), with a fused ``Wqkv`` projection, no biases
  (``attention_bias``/``mlp_bias``), and a GeGLU feed-forward ``Wo(act(a) * g)`` where
  ``[a | g] = Wi(x)``;
* layer ``i`` is *global* (full attention, RoPE base ``global_rope_theta``) when
  ``i % global_every == 0``, else *local*: a sliding window where query ``i`` sees the keys
  ``j`` with ``|i - j| <= local_attention // 2`` (RoPE base ``local_rope_theta``);
* a final LayerNorm on the last hidden state.

``ModernBertModel.__call__`` has ``BertModel``'s signature and outputs (``return_attentions``,
``attention_reduce``, ``head_gate``, ``segment_removal``, ``return_hidden_states``, the attention
paths; see ``heads_jax.model.bert``), so the analysis, the ablations and fine-tuning use it
unchanged. What changes with the window: attention outside a local layer's window is exactly
0, and the ``"uniform"`` head gate is uniform over the keys the head *can see* (the real keys
inside its window), not over the whole sequence. ``visible_keys`` gives that set to the
analysis (``ModernBertConfig.windows``).

``tests/model/test_modernbert.py`` checks hidden states and every attention map against
transformers on sequences longer than the window and on pairs, and the conversion both ways.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

from heads_jax.errors import UserError
from heads_jax.model.attention import (ATTENTION_PATHS, AttentionHooks, attend, call_inputs,
                                       visible)
from heads_jax.model.bert import activation
from heads_jax.model.config import ALL_FAMILIES, ConfigMethods, check_activation
from heads_jax.model.encoder_io import LayerOutputs

FAMILY = "modernbert"
_PATHS = tuple(p for p in ATTENTION_PATHS if p != "flash")


@dataclasses.dataclass(frozen=True)
class ModernBertConfig(ConfigMethods):
  """Hyper-parameters of a ModernBERT encoder (defaults: ModernBERT-base)."""
  vocab_size: int = 50368
  hidden_size: int = 768
  num_layers: int = 22               # Hugging Face: num_hidden_layers
  num_heads: int = 12                # Hugging Face: num_attention_heads
  intermediate_size: int = 1152
  max_position_embeddings: int = 8192
  norm_eps: float = 1e-5
  norm_bias: bool = False
  attention_bias: bool = False
  mlp_bias: bool = False
  hidden_act: str = "gelu"
  local_attention: int = 128         # the window's full width: |i - j| <= local_attention // 2
  global_every: int = 3              # layer i is global when i % global_every == 0
  global_rope_theta: float = 160000.0  # RoPE base of the global layers
  local_rope_theta: float = 10000.0    # RoPE base of the local layers
  embedding_dropout: float = 0.0
  attention_dropout: float = 0.0
  mlp_dropout: float = 0.0
  classifier_dropout: float = 0.0
  classifier_pooling: str = "cls"    # "cls" (first position) or "mean" (over real tokens)
  classifier_activation: str = "gelu"
  classifier_bias: bool = False
  initializer_range: float = 0.02
  pad_token_id: int = 50283
  cls_token_id: int = 50281
  sep_token_id: int = 50282
  dtype: str = "float32"
  attention: str = "auto"            # the default attention path (not a Hugging Face field)
  family: str = FAMILY

  def __post_init__(self):
    if self.family != FAMILY:
      raise ValueError(f"ModernBertConfig is the {FAMILY} family's, not {self.family!r}")
    self.check_sizes()
    if self.head_dim % 2:
      raise ValueError(f"rotary embeddings need an even head dimension, got {self.head_dim}")
    check_activation("classifier_activation", self.classifier_activation)
    if self.classifier_pooling not in ("cls", "mean"):
      raise ValueError(f"classifier_pooling must be 'cls' or 'mean', got {self.classifier_pooling!r}")
    if self.attention not in _PATHS:
      raise ValueError(f"attention must be one of {_PATHS} for ModernBERT (the flash kernel has "
                       f"no sliding window), got {self.attention!r}")
    if self.global_every < 1 or self.local_attention < 2:
      raise ValueError("global_every must be >= 1 and local_attention >= 2")

  # --- the interface every family's config presents (heads_jax.model.config, "The registry")
  @property
  def info(self):
    return ALL_FAMILIES[self.family]

  @property
  def max_positions(self) -> int:
    """The longest sequence the model was built for (``max_position_embeddings``); RoPE has no
    table, but longer inputs are outside what the model was trained on."""
    return self.max_position_embeddings

  @property
  def layer_schedule(self) -> tuple[int, ...]:
    return tuple(range(self.num_layers))

  @property
  def window(self) -> int:
    """Half-width of a local layer's window: query ``i`` sees keys ``|i - j| <= window``."""
    return self.local_attention // 2

  @property
  def windows(self) -> tuple[int | None, ...]:
    """For each layer, its half window (local layers) or None (global layers)."""
    return tuple(None if i % self.global_every == 0 else self.window for i in range(self.num_layers))

  @property
  def layer_types(self) -> tuple[str, ...]:
    """transformers' names: ``"full_attention"`` (global) or ``"sliding_attention"`` (local)."""
    return tuple("full_attention" if w is None else "sliding_attention" for w in self.windows)

  def check_max_length(self, max_length: int) -> None:
    if max_length > self.max_positions:
      raise UserError(f"--max-length {max_length} exceeds the model's {self.max_positions} "
                      f"positions (max_position_embeddings); use --max-length "
                      f"{self.max_positions} or less")

  @classmethod
  def from_hf_dict(cls, d: dict) -> "ModernBertConfig":
    """Reads a Hugging Face ``config.json`` dictionary of ``model_type`` ``"modernbert"`` (the
    older ``global_rope_theta``/``local_rope_theta``/``global_attn_every_n_layers`` keys, or
    transformers 5's ``rope_parameters`` and ``layer_types``)."""
    if d.get("model_type") != FAMILY:
      raise ValueError(f"model_type is {d.get('model_type')!r}, not {FAMILY!r}")
    layers = d["num_hidden_layers"]
    every = d.get("global_attn_every_n_layers", 3)
    types = d.get("layer_types")
    if types is not None:
      expected = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
      if list(types) != expected:
        every = _period(types)
    rope = d.get("rope_parameters") or {}
    theta = lambda kind, key, default: (rope.get(kind) or {}).get("rope_theta", d.get(key, default))  # noqa: E731
    for kind in ("full_attention", "sliding_attention"):
      rt = (rope.get(kind) or {}).get("rope_type", "default")
      if rt != "default":
        raise ValueError(f"rope_type {rt!r} is not supported (only 'default')")
    ids = lambda key, default: default if d.get(key) is None else int(d[key])  # noqa: E731
    return cls(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], num_layers=layers,
        num_heads=d["num_attention_heads"], intermediate_size=d["intermediate_size"],
        max_position_embeddings=d.get("max_position_embeddings", 8192),
        norm_eps=d.get("norm_eps", 1e-5), norm_bias=bool(d.get("norm_bias", False)),
        attention_bias=bool(d.get("attention_bias", False)), mlp_bias=bool(d.get("mlp_bias", False)),
        hidden_act=d.get("hidden_activation", "gelu"),
        local_attention=d.get("local_attention", 128), global_every=every,
        global_rope_theta=float(theta("full_attention", "global_rope_theta", 160000.0)),
        local_rope_theta=float(theta("sliding_attention", "local_rope_theta", 10000.0)),
        embedding_dropout=d.get("embedding_dropout", 0.0),
        attention_dropout=d.get("attention_dropout", 0.0), mlp_dropout=d.get("mlp_dropout", 0.0),
        classifier_dropout=d.get("classifier_dropout", 0.0),
        classifier_pooling=d.get("classifier_pooling", "cls"),
        classifier_activation=d.get("classifier_activation", "gelu"),
        classifier_bias=bool(d.get("classifier_bias", False)),
        initializer_range=d.get("initializer_range", 0.02),
        pad_token_id=ids("pad_token_id", 50283), cls_token_id=ids("cls_token_id", 50281),
        sep_token_id=ids("sep_token_id", 50282))

  def to_hf_dict(self) -> dict:
    """The Hugging Face ``config.json`` dictionary (``ModernBertModel``)."""
    return {
        "architectures": ["ModernBertModel"], "model_type": FAMILY,
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
        "intermediate_size": self.intermediate_size,
        "max_position_embeddings": self.max_position_embeddings, "norm_eps": self.norm_eps,
        "norm_bias": self.norm_bias, "attention_bias": self.attention_bias,
        "mlp_bias": self.mlp_bias, "hidden_activation": self.hidden_act,
        "local_attention": self.local_attention, "global_attn_every_n_layers": self.global_every,
        "layer_types": list(self.layer_types),
        "rope_parameters": {"full_attention": {"rope_type": "default",
                                               "rope_theta": self.global_rope_theta},
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": self.local_rope_theta}},
        "global_rope_theta": self.global_rope_theta, "local_rope_theta": self.local_rope_theta,
        "embedding_dropout": self.embedding_dropout, "attention_dropout": self.attention_dropout,
        "mlp_dropout": self.mlp_dropout, "classifier_dropout": self.classifier_dropout,
        "classifier_pooling": self.classifier_pooling,
        "classifier_activation": self.classifier_activation,
        "classifier_bias": self.classifier_bias, "initializer_range": self.initializer_range,
        "pad_token_id": self.pad_token_id, "cls_token_id": self.cls_token_id,
        "sep_token_id": self.sep_token_id, "bos_token_id": self.cls_token_id,
        "eos_token_id": self.sep_token_id}


def _period(types) -> int:
  """The period ``n`` of a ``layer_types`` list that is global exactly at multiples of ``n``."""
  for n in range(1, len(types) + 1):
    if list(types) == ["sliding_attention" if i % n else "full_attention" for i in range(len(types))]:
      return n
  raise ValueError(f"layer_types {list(types)} is not 'global every n layers, starting at 0'; "
                   "heads_jax reads ModernBERT's own pattern only")


Config = ModernBertConfig  # the registry's name (heads_jax.model.config)


# ---------------------------------------------------------------------------------------------
# Modules.


def _dtype(cfg):
  return jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32


def _linear(cfg, din: int, dout: int, bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(din, dout, use_bias=bias, dtype=_dtype(cfg), param_dtype=jnp.float32,
                    kernel_init=nnx.initializers.truncated_normal(cfg.initializer_range, lower=-2.0, upper=2.0),
                    bias_init=nnx.initializers.zeros_init(), rngs=rngs)


def _norm(cfg, rngs: nnx.Rngs) -> nnx.LayerNorm:
  return nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.norm_eps, use_bias=cfg.norm_bias,
                       dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs)


def rotary_tables(positions, head_dim: int, theta: float):
  """RoPE's ``cos``, ``sin`` float32 ``[b, q, e]`` for int ``positions`` ``[b, q]`` (the two
  halves of the head dimension share the frequencies ``theta^(-2i/e)``, as transformers'
  ``rotate_half``)."""
  inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = jnp.asarray(positions, jnp.float32)[..., None] * inv
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rotary(x, cos, sin):
  """``x`` ``[b, q, h, e]`` rotated (float32): ``x cos + rotate_half(x) sin``."""
  x = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos[:, :, None] + rotated * sin[:, :, None]


def visible_keys(mask, window: int | None, segment_ids=None):
  """Which keys each query sees, bool ``[b, 1, q, k]``: the real keys (``mask`` ``[b, k]``),
  of the query's own sequence in a packed row (``segment_ids`` ``[b, q]``), within
  ``|i - j| <= window`` when ``window`` is not None (a local layer);
  ``heads_jax.model.attention.visible`` broadcast to every query."""
  seen = visible(mask, segment_ids, window)
  k = seen.shape[-1]
  return jnp.broadcast_to(seen, (seen.shape[0], 1, k, k))


class Attention(nnx.Module):
  """Multi-head self-attention with rotary positions and, in local layers, a sliding window."""

  def __init__(self, cfg: ModernBertConfig, window: int | None, *, rngs: nnx.Rngs):
    d = cfg.hidden_size
    self.cfg = cfg
    self.window = window
    self.theta = cfg.global_rope_theta if window is None else cfg.local_rope_theta
    self.qkv = _linear(cfg, d, 3 * d, cfg.attention_bias, rngs)
    self.output = _linear(cfg, d, d, cfg.attention_bias, rngs)
    self.attention_dropout = nnx.Dropout(cfg.attention_dropout, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.attention_dropout, rngs=rngs)  # transformers' out_drop

  def split(self, x):
    """``x`` ``[b, q, d]`` (normed) -> query, key, value ``[b, q, h, e]``, before RoPE."""
    cfg = self.cfg
    b, q, _ = x.shape
    qkv = self.qkv(x).reshape(b, q, 3, cfg.num_heads, cfg.head_dim)
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

  def __call__(self, x, mask, *, hooks: AttentionHooks, layer: int, deterministic: bool,
               positions=None, segment_ids=None):
    """x ``[b, q, d]`` (already normed) -> the attention block's output ``[b, q, d]`` (before the
    residual), the attention ``[b, h, q, k]`` float32 (None off the explicit path) and the
    reduction's output; the arguments as ``heads_jax.model.bert.SelfAttention``, ``positions``
    int ``[b, q]`` (RoPE's) and packed ``segment_ids`` ``[b, q]`` or None."""
    cfg = self.cfg
    b, q, _ = x.shape
    qh, kh, vh = self.split(x)
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(q), (b, q))
    cos, sin = rotary_tables(positions, cfg.head_dim, self.theta)
    dt = vh.dtype
    qh, kh = apply_rotary(qh, cos, sin).astype(dt), apply_rotary(kh, cos, sin).astype(dt)
    ctx, probs, reduced = attend(qh, kh, vh, mask, hooks=hooks, layer=layer,
                                 dropout=self.attention_dropout, deterministic=deterministic,
                                 scale=1.0 / jnp.sqrt(jnp.float32(cfg.head_dim)),
                                 window=self.window, segment_ids=segment_ids,
                                 query_key_logits=self.window is None)
    out = self.output(ctx.reshape(b, q, cfg.hidden_size))
    return self.dropout(out, deterministic=deterministic), probs, reduced


class MLP(nnx.Module):
  """GeGLU: ``wo(act(a) * g)`` with ``[a | g] = wi(x)``."""

  def __init__(self, cfg: ModernBertConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.wi = _linear(cfg, cfg.hidden_size, 2 * cfg.intermediate_size, cfg.mlp_bias, rngs)
    self.wo = _linear(cfg, cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias, rngs)
    self.dropout = nnx.Dropout(cfg.mlp_dropout, rngs=rngs)

  def __call__(self, x, *, deterministic: bool):
    a, g = jnp.split(self.wi(x), 2, axis=-1)
    y = activation(self.cfg.hidden_act, a) * g
    return self.wo(self.dropout(y, deterministic=deterministic))


class Layer(nnx.Module):
  """One pre-norm layer: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

  def __init__(self, cfg: ModernBertConfig, index: int, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.attn_norm = None if index == 0 else _norm(cfg, rngs)
    self.attention = Attention(cfg, cfg.windows[index], rngs=rngs)
    self.mlp_norm = _norm(cfg, rngs)
    self.mlp = MLP(cfg, rngs=rngs)

  def normed(self, x):
    return x if self.attn_norm is None else self.attn_norm(x).astype(x.dtype)

  def values(self, x):
    """The value vectors ``[b, k, h, e]`` float32 from the layer's input ``x`` ``[b, k, d]``
    (the norm pass, ``heads_jax.stats.norms``)."""
    return self.attention.split(self.normed(x))[2].astype(jnp.float32)

  def __call__(self, x, mask, *, hooks: AttentionHooks, layer: int, deterministic: bool,
               positions=None, segment_ids=None):
    a, probs, reduced = self.attention(self.normed(x), mask, hooks=hooks, layer=layer,
                                       deterministic=deterministic, positions=positions,
                                       segment_ids=segment_ids)
    x = x + a.astype(x.dtype)
    x = x + self.mlp(self.mlp_norm(x).astype(x.dtype), deterministic=deterministic).astype(x.dtype)
    return x, probs, reduced


class ModernBertModel(nnx.Module):
  """transformers' ``ModernBertModel``: embeddings, ``num_layers`` layers, the final norm.

  ``__call__`` as ``heads_jax.model.bert.BertModel.__call__`` (``token_type_ids`` are accepted
  and ignored, as ModernBERT has no token types; segment removal still reads them). No pooler:
  the outputs have no ``pooled``.
  """

  def __init__(self, cfg: ModernBertConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.embeddings = Embeddings(cfg, rngs=rngs)
    self.layers = nnx.List([Layer(cfg, i, rngs=rngs) for i in range(cfg.num_layers)])
    self.final_norm = _norm(cfg, rngs)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, head_gate=None,
               gate_mode: str = "remove", return_attentions: bool = False,
               return_hidden_states: bool = False, deterministic: bool = True,
               segment_removal=None, renormalise_segments: bool = False,
               attention: str | None = None, attention_reduce=None, position_ids=None,
               segment_ids=None, hooks: AttentionHooks | None = None) -> dict:
    """Encodes ``input_ids`` ``[b, q]``; see ``BertModel.__call__`` (``attention`` None: the
    config's; packed rows: ``position_ids`` restart RoPE's positions and ``segment_ids`` keep
    attention inside each sequence, within its window in local layers). ``hidden_states``
    ``[l + 1, b, q, d]`` are the embeddings and each layer's output (before the final norm:
    entry ``i`` is layer ``i``'s input); ``last_hidden_state`` is after the final norm."""
    cfg = self.config
    input_ids, mask, types, hooks = call_inputs(
        cfg, hooks, input_ids, attention_mask, token_type_ids, position_ids=position_ids,
        segment_ids=segment_ids, attention=attention, return_attentions=return_attentions,
        attention_reduce=attention_reduce, head_gate=head_gate, gate_mode=gate_mode,
        segment_removal=segment_removal, renormalise_segments=renormalise_segments)
    positions = None if position_ids is None else jnp.asarray(position_ids, jnp.int32)
    segment_ids = None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
    x = self.embeddings(input_ids, deterministic=deterministic)
    outputs = LayerOutputs(x, return_attentions=hooks.need_probs,
                           return_hidden_states=return_hidden_states,
                           attention_reduce=hooks.reduce)
    for i, layer in enumerate(self.layers):
      x, probs, layer_reduced = layer(x, mask, hooks=hooks, layer=i, deterministic=deterministic,
                                      positions=positions, segment_ids=segment_ids)
      outputs.add(x, probs, layer_reduced)
    return outputs.stacked({"last_hidden_state": self.final_norm(x).astype(jnp.float32)}, mask)


class Embeddings(nnx.Module):
  """Token embedding, LayerNorm, dropout (no positions: RoPE), ``[b, q]`` -> ``[b, q, d]``."""

  def __init__(self, cfg: ModernBertConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.word = nnx.Embed(cfg.vocab_size, cfg.hidden_size, param_dtype=jnp.float32,
                          embedding_init=nnx.initializers.truncated_normal(
                              cfg.initializer_range, lower=-2.0, upper=2.0), rngs=rngs)
    self.norm = _norm(cfg, rngs)
    self.dropout = nnx.Dropout(cfg.embedding_dropout, rngs=rngs)

  def __call__(self, input_ids, *, deterministic: bool):
    x = self.dropout(self.norm(self.word(input_ids)), deterministic=deterministic)
    return x.astype(_dtype(self.cfg))


class PredictionHead(nnx.Module):
  """transformers' ``ModernBertPredictionHead``: dense (bias ``classifier_bias``), activation,
  LayerNorm."""

  def __init__(self, cfg: ModernBertConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.dense = _linear(cfg, cfg.hidden_size, cfg.hidden_size, cfg.classifier_bias, rngs)
    self.norm = _norm(cfg, rngs)

  def __call__(self, x):
    return self.norm(activation(self.cfg.classifier_activation, self.dense(x)))


class ModernBertForSequenceClassification(nnx.Module):
  """transformers' ``ModernBertForSequenceClassification``: pooling (``classifier_pooling``:
  the first position, or the mean over real tokens), the prediction head, dropout, a linear
  classifier (with bias)."""

  def __init__(self, cfg: ModernBertConfig, num_labels: int = 2, *, rngs: nnx.Rngs):
    self.config = cfg
    self.num_labels = num_labels
    self.bert = ModernBertModel(cfg, rngs=rngs)
    self.pre_classifier = PredictionHead(cfg, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.classifier_dropout, rngs=rngs)
    self.classifier = nnx.Linear(cfg.hidden_size, num_labels, dtype=_dtype(cfg),
                                 param_dtype=jnp.float32,
                                 kernel_init=nnx.initializers.truncated_normal(
                                     cfg.hidden_size ** -0.5, lower=-2.0, upper=2.0),
                                 bias_init=nnx.initializers.zeros_init(), rngs=rngs)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               deterministic: bool = True, **encoder_kw) -> dict:
    """Adds ``logits`` float32 ``[b, c]`` to the encoder outputs."""
    out = self.bert(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                    **encoder_kw)
    x = out["last_hidden_state"]
    if self.config.classifier_pooling == "cls":
      x = x[:, 0]
    else:
      m = (jnp.ones(x.shape[:2]) if attention_mask is None
           else jnp.asarray(attention_mask)).astype(jnp.float32)[..., None]
      x = jnp.sum(x * m, axis=1) / jnp.sum(m, axis=1)
    x = self.dropout(self.pre_classifier(x), deterministic=deterministic)
    out["logits"] = self.classifier(x).astype(jnp.float32)
    return out


ARCHITECTURES = {"BertModel": ModernBertModel,
                 "BertForSequenceClassification": ModernBertForSequenceClassification}


# ---------------------------------------------------------------------------------------------
# Hugging Face names.

_MODULES = {"embeddings/word": "embeddings.tok_embeddings", "embeddings/norm": "embeddings.norm",
            "final_norm": "final_norm", "attn_norm": "attn_norm", "attention/qkv": "attn.Wqkv",
            "attention/output": "attn.Wo", "mlp_norm": "mlp_norm", "mlp/wi": "mlp.Wi",
            "mlp/wo": "mlp.Wo", "pre_classifier/dense": "head.dense",
            "pre_classifier/norm": "head.norm", "classifier": "classifier"}
_LEAF = {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}


def hf_key(path: str, cfg: ModernBertConfig) -> tuple[str, bool]:
  """``(Hugging Face key, transpose)`` of a heads_jax parameter path (``"bert/"``: the encoder
  inside a task model, HF's ``model.`` prefix)."""
  prefix = ""
  if path.startswith("bert/"):
    path, prefix = path[len("bert/"):], "model."
  module, _, leaf = path.rpartition("/")
  layer = ""
  if module.startswith("layers/"):
    _, i, module = module.split("/", 2)
    layer = f"layers.{i}."
  name = _MODULES.get(module)
  if leaf not in _LEAF or name is None or (layer == "") == (module in ("attn_norm", "attention/qkv",
                                                                       "attention/output", "mlp_norm",
                                                                       "mlp/wi", "mlp/wo")):
    raise KeyError(f"no Hugging Face name for heads_jax parameter {path!r} ({FAMILY})")
  if name.startswith(("head.", "classifier")):
    prefix = ""
  return prefix + layer + name + "." + _LEAF[leaf], leaf == "kernel"


def window_mask(cfg: ModernBertConfig, length: int) -> np.ndarray:
  """bool ``[l, q, k]``: which keys each layer's queries can see in a sequence of ``length``
  real tokens (all of them in global layers, the window in local ones)."""
  pos = np.arange(length)
  near = np.abs(pos[:, None] - pos[None, :])
  return np.stack([np.ones((length, length), bool) if w is None else near <= w for w in cfg.windows])
