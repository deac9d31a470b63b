"""DeBERTa-v3 (Hugging Face ``model_type`` ``deberta-v2``) in Flax NNX: disentangled attention
over bucketed relative positions, with the call interface of ``heads_jax.model.bert.BertModel``
(attention maps, per-layer reductions, head gates, hidden states), so that every analysis runs
on it unchanged.

Shape legend: b batch, q query positions, k key positions (q == k), l layer, h head, d hidden,
e head dimension, r relative-position rows (``2 * span``), t the three score terms.

**Attention** (He et al. 2021, "DeBERTa: decoding-enhanced BERT with disentangled attention", as
transformers' ``DisentangledSelfAttention`` computes it).
Head h's logit of query i on key j is the sum of three terms::

    c2c[i, j] = Q_i . K_j / sqrt(e s)                     content to content
    c2p[i, j] = Q_i . Kr_{d(i, j)} / sqrt(e s)            content to position
    p2c[i, j] = K_j . Qr_{d(i, j)} / sqrt(e s)            position to content

with ``s = 1 + [c2p in pos_att_type] + [p2c in pos_att_type]`` (3 for DeBERTa-v3), the relative
row ``d(i, j) = clamp(bucket(i - j) + span, 0, 2 span - 1)`` and ``Qr, Kr`` the relative
embeddings (``rel_embeddings``, LayerNorm'ed when ``norm_rel_ebd`` says ``layer_norm``) through
the query and key projections (``share_att_key``) or through their own ``pos_query`` /
``pos_key`` projections. ``bucket`` (``log_bucket_position``) keeps offsets below
``position_buckets / 2`` exact and maps larger ones to logarithmic buckets up to
``max_relative_positions``; ``span`` is ``position_buckets`` (or ``max_relative_positions``
without buckets). There is no absolute position embedding unless ``position_biased_input``
(DeBERTa-v3: none), and no token types unless ``type_vocab_size > 0`` (DeBERTa-v3: 0). The
enhanced mask decoder belongs to the MLM head, not to the encoder, and is not built.

**Term shares** (``return_term_shares=True``): for each sequence, layer and head, the share of
the variance of its attention logits over the keys that comes from each term, float32
``[b, l, h, 3]`` in the order ``TERMS``. Softmax ignores what is constant over a row's keys, so
what shapes a head's attention is the variation of its logits across the keys of each query:
with ``s = c2c + c2p + p2c`` and centred values (mean over the real keys of each real query),
the share of term ``t`` is ``sum_q Cov_k(t, s) / sum_q Var_k(s)`` (sums over the real queries).
The three shares sum to 1; a term that works against the others has a negative share.
``docs/DESIGN.md`` says why this reading and not attention mass.

**Attention paths**: ``"explicit"`` (scores, masked softmax, the probabilities) and ``"xla"``
(``jax.nn.dot_product_attention`` with the two positional terms as its ``bias``); ``"auto"``
takes ``"xla"`` whenever nothing needs the probabilities, as ``BertModel`` does. cuDNN's flash
attention takes no such bias here: ``attention="cudnn"`` is refused. A per-layer reduction
must read the probabilities (``needs_probs``): the query and key vectors alone do not give a
DeBERTa head's logits, so a reduction that recomputes them (``heads_jax.stats.fused`` and
``heads_jax.stats.kernel``) is refused with a clear error; the analysis step knows it from
``DebertaModel.logits_from_query_key`` (False) and takes the layerwise path.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

from heads_jax.contract import TERM_NAMES
from heads_jax.model.attention import AttentionHooks, attend, call_inputs
from heads_jax.model.bert import Layer as BertLayer, SelfAttention, activation, dense, layer_norm
from heads_jax.model.config import ACTIVATIONS, BertConfig, check_activation, hf_encoder_fields
from heads_jax.model.encoder_io import LayerOutputs

TERMS = TERM_NAMES  # the order of term_shares (measures.npz: term_names)
ATTENTION_PATHS = ("auto", "explicit", "xla")
POS_ATT_TYPES = ("c2p", "p2c")


@dataclasses.dataclass(frozen=True)
class DebertaConfig(BertConfig):
  """A DeBERTa-v2/v3 encoder (defaults: ``microsoft/deberta-v3-base``)."""
  vocab_size: int = 128100
  type_vocab_size: int = 0
  layer_norm_eps: float = 1e-7
  pad_token_id: int = 0
  family: str = "deberta-v2"
  pooler: bool = False
  relative_attention: bool = True
  max_relative_positions: int = -1       # < 1: max_position_embeddings
  position_buckets: int = 256            # <= 0: no buckets
  pos_att_type: tuple = ("p2c", "c2p")
  share_att_key: bool = True
  position_biased_input: bool = False
  norm_rel_ebd: str = "layer_norm"
  pooler_hidden_size: int = 0            # 0: hidden_size (the classifier's ContextPooler)
  pooler_hidden_act: str = "gelu"
  pooler_dropout: float = 0.0

  def __post_init__(self):
    # BertConfig's own checks are for its switches (families of heads_jax.model.bert); these
    # are the ones that apply here.
    object.__setattr__(self, "pos_att_type", tuple(self.pos_att_type))
    if self.family != "deberta-v2":
      raise ValueError(f"DebertaConfig is the deberta-v2 family's config, got {self.family!r}")
    self.check_sizes()
    if self.num_hidden_groups or self.inner_group_num != 1 or self.position_offset:
      raise ValueError("DeBERTa has no shared layers nor position offset")
    unknown = [t for t in self.pos_att_type if t not in POS_ATT_TYPES]
    if unknown:
      raise ValueError(f"pos_att_type {unknown} is not supported; use 'c2p' and/or 'p2c'")
    if self.pos_att_type and not self.relative_attention:
      raise ValueError("pos_att_type needs relative_attention=True")
    if self.embedding_projection:
      raise ValueError("DeBERTa projects embeddings whenever embedding_size differs from "
                       "hidden_size (without a bias); leave embedding_projection False")
    check_activation("pooler_hidden_act", self.pooler_hidden_act, _POOLER_ACTS)

  @property
  def info(self):
    from heads_jax.model import config as configlib
    return getattr(configlib, "ALL_FAMILIES", configlib.FAMILIES)[self.family]

  @property
  def embed_dim(self) -> int:
    return self.embedding_size or self.hidden_size

  @property
  def relative_max(self) -> int:
    """The largest relative position the buckets reach (``max_relative_positions``)."""
    return self.max_relative_positions if self.max_relative_positions > 0 else self.max_position_embeddings

  @property
  def span(self) -> int:
    """Half the rows of the relative-embedding table (``att_span`` in transformers)."""
    return self.position_buckets if self.position_buckets > 0 else self.relative_max

  @property
  def scale_factor(self) -> int:
    return 1 + len(self.pos_att_type)

  @property
  def pooler_size(self) -> int:
    return self.pooler_hidden_size or self.hidden_size

  def to_hf_dict(self) -> dict:
    """The ``config.json`` of ``transformers.DebertaV2Model``."""
    out = {"architectures": ["DebertaV2Model"], "model_type": "deberta-v2",
           "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
           "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
           "intermediate_size": self.intermediate_size, "hidden_act": self.hidden_act,
           "hidden_dropout_prob": self.hidden_dropout,
           "attention_probs_dropout_prob": self.attention_dropout,
           "max_position_embeddings": self.max_position_embeddings,
           "type_vocab_size": self.type_vocab_size, "initializer_range": self.initializer_range,
           "layer_norm_eps": self.layer_norm_eps, "pad_token_id": self.pad_token_id,
           "relative_attention": self.relative_attention,
           "max_relative_positions": self.max_relative_positions,
           "position_buckets": self.position_buckets,
           "pos_att_type": "|".join(self.pos_att_type) if self.pos_att_type else None,
           "share_att_key": self.share_att_key,
           "position_biased_input": self.position_biased_input,
           "norm_rel_ebd": self.norm_rel_ebd, "pooler_hidden_size": self.pooler_size,
           "pooler_hidden_act": self.pooler_hidden_act, "pooler_dropout": self.pooler_dropout}
    if self.embedding_size and self.embedding_size != self.hidden_size:
      out["embedding_size"] = self.embedding_size
    if self.classifier_dropout is not None:
      out["cls_dropout"] = self.classifier_dropout
    return out

  @classmethod
  def from_hf_dict(cls, d: dict) -> "DebertaConfig":
    """Reads a ``deberta-v2`` ``config.json`` (DeBERTa-v2 and -v3). Refuses what the encoder
    here does not build: the convolution of DeBERTa-v2-xlarge (``conv_kernel_size``) and a
    head size other than ``hidden_size / num_attention_heads``."""
    if d.get("conv_kernel_size", 0):
      raise ValueError(f"conv_kernel_size {d['conv_kernel_size']} (DeBERTa-v2's convolution "
                       "layer) is not supported; DeBERTa-v3 models have none")
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    if d.get("attention_head_size", hidden // heads) != hidden // heads:
      raise ValueError(f"attention_head_size {d['attention_head_size']} differs from hidden_size "
                       f"/ num_attention_heads = {hidden // heads}; not supported")
    pos = d.get("pos_att_type") or ()
    if isinstance(pos, str):
      pos = [x.strip() for x in pos.lower().split("|") if x.strip()]
    if not d.get("relative_attention", False):
      pos = ()
    e = d.get("embedding_size") or hidden
    return cls(**hf_encoder_fields(d, type_vocab_size=0, layer_norm_eps=1e-7),
               embedding_size=e if e != hidden else 0,
               relative_attention=bool(d.get("relative_attention", False)),
               max_relative_positions=d.get("max_relative_positions", -1),
               position_buckets=d.get("position_buckets", -1), pos_att_type=tuple(pos),
               share_att_key=bool(d.get("share_att_key", False)),
               position_biased_input=bool(d.get("position_biased_input", True)),
               norm_rel_ebd=d.get("norm_rel_ebd", "none") or "none",
               pooler_hidden_size=0 if d.get("pooler_hidden_size", hidden) == hidden
               else d["pooler_hidden_size"],
               pooler_hidden_act=d.get("pooler_hidden_act", "gelu"),
               pooler_dropout=d.get("pooler_dropout", 0.0),
               classifier_dropout=d.get("cls_dropout"))


_POOLER_ACTS = ACTIVATIONS + ("tanh",)


def log_bucket_position(relative: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
  """transformers' ``make_log_bucket_position`` (float32 arithmetic as there): offsets with
  ``|x| <= bucket_size // 2`` (exactly: inside the half-open band) stay, larger ones become
  ``sign(x) * (mid + ceil(log(|x| / mid) / log((max_position - 1) / mid) * (mid - 1)))``."""
  rel = np.asarray(relative, np.int64)
  sign = np.sign(rel).astype(np.float32)
  mid = bucket_size // 2
  abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
  ratio = np.log(abs_pos.astype(np.float32) / np.float32(mid), dtype=np.float32)
  denom = np.log(np.float32((max_position - 1) / mid), dtype=np.float32)
  log_pos = np.ceil(ratio / denom * np.float32(mid - 1)).astype(np.float32) + np.float32(mid)
  return np.where(abs_pos <= mid, rel.astype(np.float32), log_pos * sign).astype(np.int64)


def relative_rows(cfg: DebertaConfig, length: int) -> np.ndarray:
  """int32 ``[q, k]``: the relative-embedding row ``d(i, j)`` of query ``i`` and key ``j``
  (``clamp(bucket(i - j) + span, 0, 2 span - 1)``; module docstring)."""
  pos = np.arange(length)
  rel = pos[:, None] - pos[None, :]
  if cfg.position_buckets > 0 and cfg.relative_max > 0:
    rel = log_bucket_position(rel, cfg.position_buckets, cfg.relative_max)
  return np.clip(rel + cfg.span, 0, 2 * cfg.span - 1).astype(np.int32)


def _dtype(cfg):
  return jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32


class Embeddings(nnx.Module):
  """Word (+ absolute position) (+ token type) embeddings, projection (no bias) when
  ``embedding_size`` differs, LayerNorm, padding positions zeroed, dropout."""

  def __init__(self, cfg: DebertaConfig, *, rngs: nnx.Rngs):
    e = cfg.embed_dim
    init = nnx.initializers.normal(stddev=cfg.initializer_range)
    embed = lambda n: nnx.Embed(n, e, embedding_init=init, param_dtype=jnp.float32,  # noqa: E731
                                rngs=rngs)
    self.cfg = cfg
    self.word = embed(cfg.vocab_size)
    self.position = embed(cfg.max_position_embeddings) if cfg.position_biased_input else None
    self.token_type = embed(cfg.type_vocab_size) if cfg.type_vocab_size > 0 else None
    self.projection = (nnx.Linear(e, cfg.hidden_size, use_bias=False, kernel_init=init,
                                  dtype=_dtype(cfg), param_dtype=jnp.float32, rngs=rngs)
                       if e != cfg.hidden_size else None)
    self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
    self.dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)

  def __call__(self, input_ids, token_type_ids, mask, *, deterministic: bool):
    """ids ``[b, q]``, mask ``[b, q]`` -> float32 ``[b, q, d]``."""
    x = self.word(input_ids)
    if self.position is not None:
      x = x + self.position(jnp.arange(input_ids.shape[1]))[None]
    if self.token_type is not None:
      x = x + self.token_type(token_type_ids)
    if self.projection is not None:
      x = self.projection(x)
    x = self.norm(x) * mask[..., None].astype(jnp.float32)
    return self.dropout(x, deterministic=deterministic)


class DisentangledAttention(SelfAttention):
  """DeBERTa's self-attention (module docstring) with output projection, residual and
  LayerNorm: ``bert.SelfAttention``'s parameters (``query``, ``key``, ``value``, ``output``,
  ``norm``) and dropouts, plus ``pos_key`` / ``pos_query`` without ``share_att_key``; its own
  ``__call__``."""

  def __init__(self, cfg: DebertaConfig, *, rngs: nnx.Rngs):
    super().__init__(cfg, rngs=rngs)
    d = cfg.hidden_size
    separate = cfg.relative_attention and not cfg.share_att_key
    self.pos_key = dense(cfg, d, d, rngs) if separate and "c2p" in cfg.pos_att_type else None
    self.pos_query = dense(cfg, d, d, rngs) if separate and "p2c" in cfg.pos_att_type else None

  def terms(self, qh, kh, rel, rows):
    """The positional terms float32 ``[b, h, q, k]`` each (``c2p``, ``p2c``; None where
    ``pos_att_type`` lacks one), already divided by ``sqrt(e s)``.

    qh, kh ``[b, q, h, e]``; rel ``[2 span, d]`` the relative embeddings; rows ``[q, k]``
    (``relative_rows``)."""
    cfg = self.cfg
    r = rel.shape[0]
    heads = lambda y: y.reshape(r, cfg.num_heads, cfg.head_dim)  # noqa: E731
    scale = 1.0 / np.sqrt(np.float32(cfg.head_dim * cfg.scale_factor))
    c2p = p2c = None
    idx = jnp.asarray(rows)
    if "c2p" in cfg.pos_att_type:
      pos_k = heads((self.key if cfg.share_att_key else self.pos_key)(rel))
      full = jnp.einsum("bqhe,rhe->bhqr", qh, pos_k, preferred_element_type=jnp.float32)
      c2p = jnp.take_along_axis(full, jnp.broadcast_to(idx, full.shape[:2] + idx.shape), axis=-1)
      c2p = c2p * scale
    if "p2c" in cfg.pos_att_type:
      pos_q = heads((self.query if cfg.share_att_key else self.pos_query)(rel))
      full = jnp.einsum("bkhe,rhe->bhkr", kh, pos_q, preferred_element_type=jnp.float32)
      # p2c[i, j] = K_j . Qr_{d(i, j)}: gather row j at d(i, j), i.e. the transposed rows
      p2c = jnp.take_along_axis(full, jnp.broadcast_to(idx.T, full.shape[:2] + idx.shape), axis=-1)
      p2c = jnp.swapaxes(p2c, -1, -2) * scale
    return c2p, p2c

  def __call__(self, x, mask, rel, rows, *, hooks: AttentionHooks, layer: int,
               deterministic: bool, term_shares: bool = False):
    """x ``[b, q, d]``, mask ``[b, k]``, rel ``[2 span, d]`` (None without relative
    attention), rows ``[q, k]``; ``hooks`` and ``layer`` as in ``bert.SelfAttention``.

    Returns the new hidden state ``[b, q, d]``, the attention ``[b, h, q, k]`` float32 (None off
    the explicit path), the reduction's output (None without ``hooks.reduce``) and, with
    ``term_shares``, the shares ``[b, h, 3]`` (else None)."""
    cfg = self.cfg
    b, q, _ = x.shape
    split = lambda y: y.reshape(b, q, cfg.num_heads, cfg.head_dim)  # noqa: E731
    qh, kh, vh = split(self.query(x)), split(self.key(x)), split(self.value(x))
    scale = 1.0 / np.sqrt(np.float32(cfg.head_dim * cfg.scale_factor))
    c2p = p2c = None
    if rel is not None:
      c2p, p2c = self.terms(qh, kh, rel, rows)
    positional = None
    for t in (c2p, p2c):
      if t is not None:
        positional = t if positional is None else positional + t
    shares = None
    if term_shares:
      c2c = jnp.einsum("bqhe,bkhe->bhqk", qh, kh, preferred_element_type=jnp.float32) * scale
      shares = term_variance_shares([c2c, c2p, p2c], mask)
    # a DeBERTa head's logits are not query . key (disentangled attention): a reducer that
    # recomputes them from the query and key vectors is refused
    ctx, probs, reduced = attend(qh, kh, vh, mask, hooks=hooks, layer=layer,
                                 dropout=self.attention_dropout, deterministic=deterministic,
                                 scale=scale, bias=positional, query_key_logits=False)
    out = self.dropout(self.output(ctx.reshape(b, q, cfg.hidden_size)), deterministic=deterministic)
    return self.norm(out + x), probs, reduced, shares


def term_variance_shares(terms, mask) -> jnp.ndarray:
  """float32 ``[b, h, len(terms)]``: each term's share of the logits' variance over the keys
  (module docstring), pooled over the real queries. ``terms``: float32 ``[b, h, q, k]`` each,
  None for an absent term (share 0); mask ``[b, k]``. NaN where the logits never vary (a
  sequence of one token)."""
  m = mask.astype(jnp.float32)
  keys = m[:, None, None, :]                                               # [b, 1, 1, k]
  n = jnp.maximum(m.sum(-1), 1.0)[:, None, None, None]
  present = [t for t in terms if t is not None]
  centred = [(t - jnp.sum(t * keys, -1, keepdims=True) / n) * keys for t in present]
  total = sum(centred)
  queries = m[:, None, :]                                                  # [b, 1, q]
  var = jnp.sum(jnp.sum(total * total, -1) * queries, -1)                  # [b, h]
  covs = iter([jnp.sum(jnp.sum(c * total, -1) * queries, -1) for c in centred])
  cols = [next(covs) if t is not None else jnp.zeros_like(var) for t in terms]
  safe = jnp.where(var > 0, var, 1.0)
  return jnp.where(var[..., None] > 0, jnp.stack(cols, -1) / safe[..., None], jnp.nan)


class Layer(BertLayer):
  """One post-LN layer: disentangled attention block, then the feed-forward block
  (``bert.Layer``'s parameters, built by its ``__init__`` with ``attention_class``)."""

  attention_class = DisentangledAttention

  def __call__(self, x, mask, rel, rows, *, hooks: AttentionHooks, layer: int,
               deterministic: bool, term_shares: bool = False):
    x, probs, reduced, shares = self.attention(x, mask, rel, rows, hooks=hooks, layer=layer,
                                               deterministic=deterministic,
                                               term_shares=term_shares)
    return self.feed_forward(x, deterministic), probs, reduced, shares

  def values(self, x) -> jnp.ndarray:
    """The value vectors float32 ``[b, k, h, e]`` (bias included) of the layer's input ``x``
    ``[b, k, d]`` (the norm-weighted pass, ``heads_jax.stats.norms``)."""
    cfg = self.cfg
    b, k, _ = x.shape
    return self.attention.value(x).astype(jnp.float32).reshape(b, k, cfg.num_heads, cfg.head_dim)


class DebertaModel(nnx.Module):
  """The DeBERTa-v2/v3 encoder (``transformers.DebertaV2Model``), with ``BertModel``'s call
  interface (its docstring).

  ``rel_embeddings`` ``[2 span, d]`` and ``rel_norm`` are transformers' encoder-level
  ``rel_embeddings`` and ``LayerNorm``; ``pooler`` is None (the classifier's ``ContextPooler``
  belongs to the classification head)."""

  # The analysis' kernels that recompute each head's logits from its query and key vectors
  # (heads_jax.stats.fused, heads_jax.stats.kernel) cannot serve this model: stats/step.py
  # takes the layerwise path instead.
  logits_from_query_key = False

  def __init__(self, cfg: DebertaConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.embeddings = Embeddings(cfg, rngs=rngs)
    self.layers = nnx.List([Layer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    init = nnx.initializers.normal(stddev=cfg.initializer_range)
    self.rel_embeddings = (nnx.Embed(2 * cfg.span, cfg.hidden_size, embedding_init=init,
                                     param_dtype=jnp.float32, rngs=rngs)
                           if cfg.relative_attention else None)
    norm = "layer_norm" in [x.strip() for x in cfg.norm_rel_ebd.lower().split("|")]
    self.rel_norm = layer_norm(cfg, cfg.hidden_size, rngs) if cfg.relative_attention and norm else None
    self.rel_dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)
    self.pooler = None

  def relative_embeddings(self, deterministic: bool = True):
    """float32 ``[2 span, d]`` as the layers read them (LayerNorm, dropout), or None."""
    if self.rel_embeddings is None:
      return None
    rel = self.rel_embeddings.embedding[...]
    if self.rel_norm is not None:
      rel = self.rel_norm(rel)
    return self.rel_dropout(rel, deterministic=deterministic)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, head_gate=None,
               gate_mode: str = "remove", return_attentions: bool = False,
               return_hidden_states: bool = False, deterministic: bool = True,
               segment_removal=None, renormalise_segments: bool = False,
               attention: str | None = None, attention_reduce=None,
               return_term_shares: bool = False, hooks: AttentionHooks | None = None) -> dict:
    """Encodes ``input_ids`` ``[b, q]``; arguments and outputs as ``BertModel.__call__``
    (``attention`` None: the config's ``attention`` where it has one, else ``"auto"``), plus ``return_term_shares``: add ``term_shares`` float32
    ``[b, l, h, 3]`` (``TERMS``; module docstring)."""
    cfg = self.config
    input_ids, mask, types, hooks = call_inputs(
        cfg, hooks, input_ids, attention_mask, token_type_ids, attention=attention,
        return_attentions=return_attentions, attention_reduce=attention_reduce,
        head_gate=head_gate, gate_mode=gate_mode, segment_removal=segment_removal,
        renormalise_segments=renormalise_segments)
    if hooks.path not in ATTENTION_PATHS:
      raise ValueError(f"attention must be one of {ATTENTION_PATHS} for DeBERTa (cuDNN's flash "
                       f"attention takes no relative-position bias here), got {hooks.path!r}")
    q = input_ids.shape[1]

    x = self.embeddings(input_ids, types, mask, deterministic=deterministic)
    rel = self.relative_embeddings(deterministic)
    rows = None
    if rel is not None:
      # Only the rows a sequence of q tokens reaches (255 of 512 for q = 128): the positional
      # terms' matmuls then cost about what c2c costs.
      rows = relative_rows(cfg, q)
      lo, hi = int(rows.min()), int(rows.max()) + 1
      rel, rows = rel[lo:hi], rows - lo
    outputs = LayerOutputs(x, return_attentions=hooks.need_probs,
                           return_hidden_states=return_hidden_states,
                           attention_reduce=hooks.reduce)
    shares = []
    for i, layer in enumerate(self.layers):
      x, probs, layer_reduced, layer_shares = layer(
          x, mask, rel, rows, hooks=hooks, layer=i, deterministic=deterministic,
          term_shares=return_term_shares)
      outputs.add(x, probs, layer_reduced)
      if return_term_shares:
        shares.append(layer_shares)
    out = outputs.stacked({"last_hidden_state": x.astype(jnp.float32)}, mask)
    if return_term_shares:
      out["term_shares"] = jnp.stack(shares, axis=1)                     # [b, l, h, 3]
    return out


# ---------------------------------------------------------------------------------------------
# Hugging Face names (``heads_jax.model.convert``): heads_jax path -> transformers' name under
# ``deberta.`` (transposed for kernels).

_LAYER_PARTS = {"attention/query": "attention.self.query_proj",
                "attention/key": "attention.self.key_proj",
                "attention/value": "attention.self.value_proj",
                "attention/pos_key": "attention.self.pos_key_proj",
                "attention/pos_query": "attention.self.pos_query_proj",
                "attention/output": "attention.output.dense",
                "attention/norm": "attention.output.LayerNorm",
                "intermediate": "intermediate.dense", "output": "output.dense",
                "norm": "output.LayerNorm"}
_ENCODER_PARTS = {"embeddings/word": "embeddings.word_embeddings",
                  "embeddings/position": "embeddings.position_embeddings",
                  "embeddings/token_type": "embeddings.token_type_embeddings",
                  "embeddings/projection": "embeddings.embed_proj",
                  "embeddings/norm": "embeddings.LayerNorm",
                  "rel_embeddings": "encoder.rel_embeddings",
                  "rel_norm": "encoder.LayerNorm"}


def encoder_module(module: str) -> str | None:
  """transformers' name (no ``deberta.`` prefix, no leaf) of an encoder module path, or None."""
  if module in _ENCODER_PARTS:
    return _ENCODER_PARTS[module]
  parts = module.split("/", 2)
  if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit():
    name = _LAYER_PARTS.get(parts[2])
    return None if name is None else f"encoder.layer.{parts[1]}.{name}"
  return None


def hf_key(path: str, cfg: DebertaConfig) -> tuple[str, bool]:
  """``(transformers key, transpose)`` of a heads_jax parameter path (``a/b/leaf``) of a DeBERTa
  model. Encoder paths under ``bert/`` (the encoder inside a task model) get the ``deberta.``
  prefix; the classifier's ``pooler`` and ``classifier`` are transformers' ``pooler.dense`` and
  ``classifier``."""
  del cfg
  prefix = ""
  if path.startswith("bert/"):
    path, prefix = path[len("bert/"):], "deberta."
  module, _, leaf = path.rpartition("/")
  if leaf not in _LEAF:
    raise KeyError(f"no Hugging Face name for heads_jax parameter {path!r} (deberta-v2)")
  name = encoder_module(module)
  if name is None:
    prefix, name = "", _HEADS.get(module)
  if name is None:
    raise KeyError(f"no Hugging Face name for heads_jax parameter {path!r} (deberta-v2)")
  return prefix + name + "." + _LEAF[leaf], leaf == "kernel"


_LEAF = {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}
_HEADS = {"pooler": "pooler.dense", "classifier": "classifier"}


class DebertaForSequenceClassification(nnx.Module):
  """transformers' ``DebertaV2ForSequenceClassification``: the encoder (``.bert``), its
  ``ContextPooler`` (dropout ``pooler_dropout`` on the first position, ``pooler`` dense,
  ``pooler_hidden_act``) and ``classifier`` after dropout (``cls_dropout``, else
  ``hidden_dropout``)."""

  def __init__(self, cfg: DebertaConfig, num_labels: int = 2, *, rngs: nnx.Rngs):
    if cfg.pooler_size != cfg.hidden_size:
      raise ValueError(f"pooler_hidden_size {cfg.pooler_size} must equal hidden_size "
                       f"{cfg.hidden_size} (transformers' classifier reads hidden_size features)")
    self.config = cfg
    self.num_labels = num_labels
    self.bert = DebertaModel(cfg, rngs=rngs)
    self.pooler_dropout = nnx.Dropout(cfg.pooler_dropout, rngs=rngs)
    self.pooler = dense(cfg, cfg.hidden_size, cfg.pooler_size, rngs)
    rate = cfg.hidden_dropout if cfg.classifier_dropout is None else cfg.classifier_dropout
    self.dropout = nnx.Dropout(rate, rngs=rngs)
    self.classifier = dense(cfg, cfg.pooler_size, num_labels, rngs)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               deterministic: bool = True, **encoder_kw) -> dict:
    """Adds ``pooled`` float32 ``[b, d]`` and ``logits`` float32 ``[b, c]`` to the encoder's
    outputs."""
    out = self.bert(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                    **encoder_kw)
    x = self.pooler_dropout(out["last_hidden_state"][:, 0], deterministic=deterministic)
    pooled = self.pooler(x)
    name = self.config.pooler_hidden_act
    pooled = jnp.tanh(pooled) if name == "tanh" else activation(name, pooled)
    out["pooled"] = pooled.astype(jnp.float32)
    x = self.dropout(pooled, deterministic=deterministic)
    out["logits"] = self.classifier(x).astype(jnp.float32)
    return out


# The registry's names (heads_jax.model.config: Family.module).
Config = DebertaConfig
ARCHITECTURES = {"BertModel": DebertaModel,
                 "BertForSequenceClassification": DebertaForSequenceClassification}
