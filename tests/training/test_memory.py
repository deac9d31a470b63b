"""The on-paper memory estimate of heads_jax.training.memory (configs/pretrain.py's docstring):
hand-derived numbers, the real model's parameter count, and the TPU v3-8 verdicts."""

import math

import jax
import pytest
from flax import nnx

from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForPreTraining
from heads_jax.training import configlib, memory


@pytest.mark.slow
def test_parameter_count_matches_the_model():
  for size in ("tiny", "mini"):
    cfg = config_for(size, vocab_size=30522)
    model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
    n = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert memory.bert_pretraining_params(30522, cfg.hidden_size, cfg.num_layers,
                                          cfg.intermediate_size) == n, size
  # BERT-base with its pre-training heads: Hugging Face's BertForPreTraining count
  assert memory.bert_pretraining_params(30522, 768, 12, 3072) == 110_106_428


def test_activation_formula_by_hand():
  # s=512, b=32, h=768, a=12: 34 s b h + 5 a s^2 b bytes per layer
  per_layer = 34 * 512 * 32 * 768 + 5 * 12 * 512 * 512 * 32
  assert memory.activation_bytes_per_layer(512, 32, 768, 12) == per_layer == 931_135_488
  assert memory.activation_bytes_per_layer(512, 32, 768, 12, attention_dropout=False) == 34 * 512 * 32 * 768
  assert memory.activation_bytes_per_layer(128, 32, 768, 12, bytes_per_value=4) == 2 * (
      34 * 128 * 32 * 768 + 5 * 12 * 128 * 128 * 32)


def test_paper_presets_on_a_tpu_v3_8():
  gib = memory.GIB
  p1 = memory.estimate_config(configlib.load_config("configs/pretrain.py:bert_base_phase1"), 8)
  p2 = memory.estimate_config(configlib.load_config("configs/pretrain.py:bert_base_phase2"), 8)
  n = 110_106_428
  assert p2.params == 4 * n and p2.optimizer == 8 * n and p2.gradients == 4 * n
  assert p2.activations == 12 * 931_135_488
  assert p2.mlm_logits == 2 * 4 * 32 * 80 * 30522
  # the figures of configs/pretrain.py's docstring
  assert round(p1.total / gib, 2) == 3.33 and round(p2.total / gib, 2) == 12.63
  assert round(p2.activations / gib, 2) == 10.41
  assert p2.total < memory.TPU_V3_HBM_PER_CORE - 3 * gib
  fused = memory.estimate_config(configlib.load_config(
      "configs/pretrain.py:bert_base_phase2", ["model.attention_dropout=0.0"]), 8)
  assert round(fused.total / gib, 2) == 7.0
  # the accumulation fallback halves the activations
  acc = memory.estimate_config(configlib.load_config(
      "configs/pretrain.py:bert_base_phase2", ["batch_size=128", "optimizer.accumulate_steps=2"]), 8)
  assert acc.activations * 2 == p2.activations
  assert "total" in p2.table()
