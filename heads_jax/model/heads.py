"""Task heads on the BERT encoder: MLM + NSP for pre-training, a pooled classifier for GLUE.

Shape legend: b batch, q positions, p masked positions, d hidden, v vocabulary, c classes.
Each model keeps the encoder as ``.bert`` and forwards every encoder keyword
(``head_gate``, ``gate_mode``, ``return_attentions``, ...) to it.
"""

from __future__ import annotations

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
  """BERT with dropout + a linear classifier on the pooled ``[CLS]`` vector."""

  def __init__(self, cfg: BertConfig, num_labels: int = 2, *, rngs: nnx.Rngs):
    self.config = cfg
    self.num_labels = num_labels
    self.bert = BertModel(cfg, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)
    self.classifier = dense(cfg, cfg.hidden_size, num_labels, rngs)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               deterministic: bool = True, **encoder_kw) -> dict:
    """Adds ``logits`` float32 ``[b, c]`` to the encoder outputs."""
    out = self.bert(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                    **encoder_kw)
    pooled = self.dropout(out["pooled"], deterministic=deterministic)
    out["logits"] = self.classifier(pooled).astype(jnp.float32)
    return out
