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

from heads_jax.model.bert import BertModel, activation, dense, layer_norm
from heads_jax.model.config import BertConfig


class MLMHead(nnx.Module):
  """Transform (dense + activation + LayerNorm), then the decoder tied to the word embeddings."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.transform = dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs)
    self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
    self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,), jnp.float32))

  def __call__(self, x, word_embeddings):
    """x ``[b, p, d]``, word_embeddings ``[v, d]`` -> logits float32 ``[b, p, v]``."""
    y = self.norm(activation(self.cfg.hidden_act, self.transform(x)))
    dt = jnp.bfloat16 if self.cfg.dtype == "bfloat16" else jnp.float32
    logits = jnp.einsum("bpd,vd->bpv", y.astype(dt), word_embeddings.astype(dt),
                        preferred_element_type=jnp.float32)
    return logits + self.bias[...]


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
               masked_positions=None, deterministic: bool = True, **encoder_kw) -> dict:
    """Adds ``mlm_logits`` ``[b, p, v]`` (``[b, q, v]`` without ``masked_positions`` ``[b, p]``)
    and ``nsp_logits`` ``[b, 2]`` to the encoder outputs."""
    out = self.bert(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                    **encoder_kw)
    x = out["last_hidden_state"]
    if masked_positions is not None:
      x = jnp.take_along_axis(x, jnp.asarray(masked_positions, jnp.int32)[..., None], axis=1)
    out["mlm_logits"] = self.mlm(x, self.bert.embeddings.word.embedding[...])
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
