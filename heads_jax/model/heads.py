"""Task heads on the encoder: MLM + NSP for pre-training (BERT), a sequence classifier (every
family) for GLUE, a span head (every family) for SQuAD.

Shape legend: b batch, q positions, p masked positions, d hidden, v vocabulary, c classes.
Each model keeps the encoder as ``.bert`` (whatever the family) and forwards every encoder keyword
(``head_gate``, ``gate_mode``, ``return_attentions``, ...) to it.

The classifier follows the family (``Family.classifier``), as transformers does:

* ``"pooler"`` (BERT, ALBERT): dropout on the pooled ``[CLS]`` vector, then ``classifier``;
* ``"tanh"`` (RoBERTa, XLM-RoBERTa) and ``"gelu"`` (ELECTRA): dropout, ``pre_classifier`` on the
  first position, the activation, dropout, ``classifier`` (HF ``classifier.dense`` /
  ``classifier.out_proj``);
* ``"relu"`` (DistilBERT): ``pre_classifier`` on the first position, ReLU, dropout, ``classifier``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from heads_jax.model import fused_ops
from heads_jax.model.bert import BertModel, activation, dense, dense_activation, layer_norm
from heads_jax.model.config import BertConfig


MLM_LOGITS = ("float32", "padded")
VOCAB_MULTIPLE = 64   # the padded decoder's vocabulary is a multiple of this (tensor-core tiles)


def padded_vocab(v: int) -> int:
  """``v`` rounded up to a multiple of ``VOCAB_MULTIPLE`` (30,522 -> 30,528)."""
  return -(-v // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


class MLMHead(nnx.Module):
  """Transform (dense + activation + LayerNorm), then the decoder tied to the word embeddings.

  ``logits="float32"`` returns float32 ``[b, p, v]`` logits (transformers' output). ``"padded"``
  (the pre-training loss's fast form) returns them in the compute dtype over a vocabulary
  padded to ``padded_vocab(v)`` (the decoder's GEMM on whole 64-wide tiles): ``[b, p, v64]``,
  the padding columns ``-inf`` so that they never win an argmax and add nothing to a softmax.
  The parameters are the same either way (``bias`` ``[v]``; the padding is added per call).
  Under bfloat16 compute the decoder's backward products are bfloat16 with float32
  accumulation (``fused_ops.bf16_logits``).
  """

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.transform = dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs)
    self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
    self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,), jnp.float32))

  def __call__(self, x, word_embeddings, *, logits: str = "float32"):
    """x ``[b, p, d]``, word_embeddings ``[v, d]`` -> logits (class docstring)."""
    if logits not in MLM_LOGITS:
      raise ValueError(f"logits must be one of {MLM_LOGITS}, got {logits!r}")
    y = self.norm(dense_activation(self.transform, self.cfg.hidden_act, x))
    dt = jnp.bfloat16 if self.cfg.dtype == "bfloat16" else jnp.float32
    w, bias = word_embeddings.astype(dt), self.bias[...]
    if logits == "padded":
      v = w.shape[0]
      extra = padded_vocab(v) - v
      if extra:
        w = jnp.pad(w, ((0, extra), (0, 0)))
        bias = jnp.pad(bias, (0, extra), constant_values=-jnp.inf)
    if dt == jnp.bfloat16 and not fused_ops.is_plain():  # the backward in bf16, not TF32
      out = fused_ops.bf16_logits(y.astype(dt), w) + bias
    else:
      out = jnp.einsum("bpd,vd->bpv", y.astype(dt), w, preferred_element_type=jnp.float32) + bias
    return out.astype(dt) if logits == "padded" else out


class BertForPreTraining(nnx.Module):
  """BERT with the masked-language-model and next-sentence-prediction heads."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    if cfg.family != "bert":
      raise ValueError(f"pre-training heads (MLM + NSP) exist for the bert family only, not "
                       f"{cfg.family!r}; load the encoder or a classifier instead")
    self.config = cfg
    self.bert = BertModel(cfg, rngs=rngs)
    self.mlm = MLMHead(cfg, rngs=rngs)
    self.nsp = dense(cfg, cfg.hidden_size, 2, rngs)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               masked_positions=None, deterministic: bool = True, mlm_logits: str = "float32",
               **encoder_kw) -> dict:
    """Adds ``mlm_logits`` ``[b, p, v]`` (``[b, q, v]`` without ``masked_positions`` ``[b, p]``;
    ``mlm_logits="padded"``: in the compute dtype over the padded vocabulary, see ``MLMHead``)
    and ``nsp_logits`` ``[b, 2]`` to the encoder outputs."""
    out = self.bert(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                    **encoder_kw)
    x = out["last_hidden_state"]
    if masked_positions is not None:
      x = jnp.take_along_axis(x, jnp.asarray(masked_positions, jnp.int32)[..., None], axis=1)
    out["mlm_logits"] = self.mlm(x, self.bert.embeddings.word.embedding[...], logits=mlm_logits)
    out["nsp_logits"] = self.nsp(out["pooled"]).astype(jnp.float32)
    return out


class BertForSequenceClassification(nnx.Module):
  """The encoder with the family's sequence classifier (module docstring)."""

  def __init__(self, cfg: BertConfig, num_labels: int = 2, *, rngs: nnx.Rngs):
    self.config = cfg
    self.num_labels = num_labels
    self.style = cfg.info.classifier
    if self.style == "pooler" and not cfg.pooler:
      raise ValueError(f"the {cfg.family} classifier reads the pooled [CLS] vector; the config has "
                       "no pooler")
    # A classifier with its own dense layer does not use (nor have, as in transformers) a pooler.
    self.bert = BertModel(cfg if self.style == "pooler" else cfg.replace(pooler=False), rngs=rngs)
    rate = cfg.hidden_dropout if cfg.classifier_dropout is None else cfg.classifier_dropout
    self.dropout = nnx.Dropout(rate, rngs=rngs)
    self.pre_classifier = (None if self.style == "pooler"
                           else dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs))
    self.classifier = dense(cfg, cfg.hidden_size, num_labels, rngs)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               deterministic: bool = True, **encoder_kw) -> dict:
    """Adds ``logits`` float32 ``[b, c]`` to the encoder outputs."""
    out = self.bert(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                    **encoder_kw)
    drop = lambda x: self.dropout(x, deterministic=deterministic)  # noqa: E731
    if self.style == "pooler":
      x = drop(out["pooled"])
    else:
      x = out["last_hidden_state"][:, 0]
      if self.style != "relu":
        x = drop(x)
      x = self.pre_classifier(x)
      x = {"tanh": jnp.tanh, "relu": jax.nn.relu}.get(self.style, lambda y: activation("gelu", y))(x)
      x = drop(x)
    out["logits"] = self.classifier(x).astype(jnp.float32)
    return out


class BertForQuestionAnswering(nnx.Module):
  """The encoder (no pooler) with a span head: ``qa_outputs``, a linear map of every position
  to a start and an end logit, as transformers' ``*ForQuestionAnswering`` of every family
  (DistilBERT applies dropout before it: its ``qa_dropout``, 0.1 as its ``dropout`` by default,
  here ``hidden_dropout``)."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.bert = BertModel(cfg.replace(pooler=False), rngs=rngs)
    self.dropout = nnx.Dropout(cfg.hidden_dropout if cfg.family == "distilbert" else 0.0, rngs=rngs)
    self.qa_outputs = dense(cfg, cfg.hidden_size, 2, rngs)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               deterministic: bool = True, **encoder_kw) -> dict:
    """Adds ``start_logits`` and ``end_logits`` float32 ``[b, k]`` to the encoder outputs."""
    out = self.bert(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                    **encoder_kw)
    x = self.dropout(out["last_hidden_state"], deterministic=deterministic)
    logits = self.qa_outputs(x).astype(jnp.float32)                     # [b, k, 2]
    out["start_logits"], out["end_logits"] = logits[..., 0], logits[..., 1]
    return out
