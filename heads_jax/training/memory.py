"""Device memory of data-parallel BERT training, estimated on paper (no device needed).

``estimate(model_config, batch_per_device, seq_len, max_predictions, ...)`` counts what each
device holds when every device keeps the whole model (the one-axis ``data`` mesh):

* parameters, float32 (the master weights), and their gradients, float32;
* the optimizer state: LAMB and AdamW keep two float32 moments per parameter;
* the activations kept for the backward pass, per layer (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", eq. 1 without tensor parallelism):
  ``s b h (34 + 5 a s / h)`` bytes for 16-bit activations (s sequence length, b sequences per
  device, h hidden size, a heads): the ``34 s b h`` of the matmul inputs, LayerNorm, GELU and
  dropout masks, and ``5 a s^2 b`` of the attention scores, the softmax output and its dropout
  mask. Without attention dropout the fused attention stores none of the last (``attention_dropout
  = 0``), and float32 compute doubles the 16-bit terms;
* the MLM output: float32 logits over the vocabulary at ``max_predictions`` positions per
  sequence, and their gradient.

XLA's temporaries (fusion buffers, the all-reduce of the gradients) come on top: the estimate
is a lower bound that should leave a few GiB free. ``tests/training/test_memory.py`` checks the arithmetic
by hand and against the parameter count of the real model.
"""

from __future__ import annotations

import dataclasses

from heads_jax.model.config import config_for

GIB = 1024 ** 3
TPU_V3_HBM_PER_CORE = 16 * GIB


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
  """Bytes per device (see the module docstring)."""
  params: int
  gradients: int
  optimizer: int
  activations: int
  mlm_logits: int

  @property
  def total(self) -> int:
    return self.params + self.gradients + self.optimizer + self.activations + self.mlm_logits

  def table(self) -> str:
    rows = [("parameters (float32)", self.params), ("gradients (float32)", self.gradients),
            ("optimizer state (2 float32 moments)", self.optimizer),
            ("activations kept for the backward pass", self.activations),
            ("MLM logits and their gradient (float32)", self.mlm_logits),
            ("total", self.total)]
    return "\n".join(f"{name:42s}{b / GIB:7.2f} GiB" for name, b in rows)


def bert_pretraining_params(vocab: int, hidden: int, layers: int, intermediate: int,
                            positions: int = 512, type_vocab: int = 2) -> int:
  """Parameters of BERT with its pre-training heads (MLM transform + output bias, NSP, pooler;
  the MLM decoder is tied to the word embeddings)."""
  embeddings = (vocab + positions + type_vocab) * hidden + 2 * hidden
  layer = (4 * hidden * hidden + 4 * hidden          # q, k, v, attention output
           + 2 * hidden                              # LayerNorm
           + 2 * hidden * intermediate + intermediate + hidden  # feed-forward
           + 2 * hidden)                             # LayerNorm
  pooler = hidden * hidden + hidden
  mlm = hidden * hidden + hidden + 2 * hidden + vocab
  nsp = 2 * hidden + 2
  return embeddings + layers * layer + pooler + mlm + nsp


def activation_bytes_per_layer(seq_len: int, batch: int, hidden: int, heads: int, *,
                               attention_dropout: bool = True, bytes_per_value: int = 2) -> int:
  """``34 s b h + 5 a s^2 b`` bytes (16-bit values; module docstring), scaled by
  ``bytes_per_value / 2``. ``attention_dropout=False``: the fused attention, which keeps no
  ``[s, s]`` tensor for the backward pass (it recomputes the scores), so only ``34 s b h``."""
  base = 34 * seq_len * batch * hidden
  attention = 5 * heads * seq_len * seq_len * batch if attention_dropout else 0
  return (base + attention) * bytes_per_value // 2


def estimate(*, vocab: int, hidden: int, layers: int, heads: int, intermediate: int,
             batch_per_device: int, seq_len: int, max_predictions: int,
             attention_dropout: bool = True, compute_bytes: int = 2) -> MemoryEstimate:
  """The per-device memory of one data-parallel BERT pre-training step (module docstring)."""
  n = bert_pretraining_params(vocab, hidden, layers, intermediate)
  acts = layers * activation_bytes_per_layer(seq_len, batch_per_device, hidden, heads,
                                             attention_dropout=attention_dropout,
                                             bytes_per_value=compute_bytes)
  logits = 2 * 4 * batch_per_device * max_predictions * vocab
  return MemoryEstimate(params=4 * n, gradients=4 * n, optimizer=8 * n, activations=acts,
                        mlm_logits=logits)


def estimate_config(config, num_devices: int) -> MemoryEstimate:
  """``estimate`` for a pre-training config (``configs/pretrain.py``) on ``num_devices`` devices
  (the vocabulary of the embedded bert-base-uncased tokenizer: 30,522)."""
  m = config_for(config.model.size, vocab_size=30522)
  per_device = config.batch_size // num_devices
  return estimate(vocab=m.vocab_size, hidden=m.hidden_size, layers=m.num_layers,
                  heads=m.num_heads, intermediate=m.intermediate_size,
                  batch_per_device=per_device, seq_len=config.data.max_seq_length,
                  max_predictions=config.data.max_predictions,
                  attention_dropout=config.model.attention_dropout > 0,
                  compute_bytes=2 if config.model.dtype == "bfloat16" else 4)
