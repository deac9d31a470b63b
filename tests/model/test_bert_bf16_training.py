"""bf16 between kernels (issue 39 item 2) and fewer passes over the activations (issue 49 item 4):
a tiny pre-training (MLM + NSP, bfloat16 compute, dropout 0.1, AdamW) whose LayerNorm outputs and
residual stream are bfloat16 (``layer_norm_dtype="compute"``, the default), whose block ends are
the fused residual + dropout + LayerNorm (``fused_ops.residual_dropout_norm``) follows the loss
curve of the run as it was before both issues (float32 LayerNorm outputs, ``fused_ops.plain()``:
autodiff's gradients) over 200 steps on the CPU, with the same dropout masks. (Masks from 8 bits
an element, ``dropout_bits=8``, are another draw: their batch noise alone moves the 25-step means
by up to 0.16 nats here, so they are checked by their statistics and by the exact resume tests,
``tests/model/test_fused_ops.py``, ``tests/training``.)

The task is learnable in 200 steps without positional skill: each row repeats one "topic" token
(Zipf-distributed) with 20% noise tokens, so the MLM loss falls from ln(56) ~ 4.0 towards the
noise floor as attention learns to average the row. Tolerance: every 25-step mean of the loss
within 0.15 nats of the float32 run's (measured: at most 0.06; the per-step losses differ by up
to 0.23 from batch noise once the runs' rounding differs), and both curves fall by more than
2 nats (measured: 4.24 -> 1.97 and 4.24 -> 1.92)."""

import contextlib

import numpy as np

import jax
import pytest
import optax
from flax import nnx

from heads_jax.model import fused_ops
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForPreTraining
from heads_jax.parallel import data_mesh
from heads_jax.training import steps

V, B, Q, P, STEPS, WINDOW = 61, 32, 16, 4, 200, 25


def _batches():
  rng = np.random.default_rng(0)
  zipf = 1.0 / np.arange(1, V - 4)
  zipf /= zipf.sum()
  for _ in range(STEPS):
    ids = np.repeat(5 + rng.choice(V - 5, (B, 1), p=zipf), Q, axis=1)
    ids = np.where(rng.random((B, Q)) < 0.2, rng.integers(5, V, (B, Q)), ids).astype(np.int32)
    ids[:, 0] = 2                                                          # [CLS]
    pos = np.stack([rng.choice(np.arange(1, Q), P, replace=False) for _ in range(B)])
    pos = pos.astype(np.int32)
    masked = np.take_along_axis(ids, pos, 1)
    np.put_along_axis(ids, pos, 3, 1)                                      # [MASK]
    yield {"input_ids": ids, "attention_mask": np.ones((B, Q), np.int32),
           "token_type_ids": np.zeros((B, Q), np.int32), "masked_positions": pos,
           "masked_ids": masked, "masked_weights": np.ones((B, P), np.float32),
           "next_sentence_label": (ids[:, 1] % 2).astype(np.int32)}


def _curve(layer_norm_dtype: str, dropout_bits: int = 32, plain: bool = False) -> np.ndarray:
  cfg = config_for("tiny", vocab_size=V, max_position_embeddings=Q, dtype="bfloat16",
                   layer_norm_dtype=layer_norm_dtype, dropout_bits=dropout_bits)
  parts, params = steps.split_model(BertForPreTraining(cfg, rngs=nnx.Rngs(0)))
  tx = optax.adamw(3e-3)
  step = steps.make_train_step(parts, tx, steps.pretraining_loss, mesh=data_mesh(jax.devices()[:1]),
                               dropout_seed=1, donate=False)
  batches = jax.tree.map(lambda *xs: np.stack(xs), *_batches())           # [steps, ...]

  def one(state, batch):
    state, metrics = step(state, batch)
    return state, metrics["loss"]

  # the 200 steps as one scan: one compilation and one dispatch (the same losses as a loop)
  with fused_ops.plain() if plain else contextlib.nullcontext():   # read while tracing
    _, losses = jax.jit(lambda s, b: jax.lax.scan(one, s, b))(steps.init_train_state(params, tx),
                                                              batches)
  return np.asarray(losses, np.float64)


@pytest.mark.slow
def test_bf16_layer_norm_follows_the_float32_layer_norm_loss_curve():
  bf16, f32 = _curve("compute"), _curve("float32", plain=True)
  assert np.all(np.isfinite(bf16)) and np.all(np.isfinite(f32))
  windows = lambda x: x.reshape(-1, WINDOW).mean(axis=1)  # noqa: E731
  a, b = windows(bf16), windows(f32)
  assert np.max(np.abs(a - b)) < 0.15, (a.round(3), b.round(3))
  assert a[0] - a[-1] > 2.0 and b[0] - b[-1] > 2.0, (a.round(3), b.round(3))
  assert not np.array_equal(bf16, f32)  # the setting changed the arithmetic
