"""Word-level attention and each head's predicted word (heads_jax.stats.parsing) against loops."""

from __future__ import annotations

import numpy as np

from heads_jax.stats.parsing import predicted_heads, word_attention
from tests import reference_impl as ref


def _loop_word_attention(alpha, words, n):
  """One head: from word i (mean over its pieces) to word j (sum over its pieces)."""
  ids = sorted({w for w in words[:n] if w >= 0})
  out = {}
  for i in ids:
    qs = [t for t in range(n) if words[t] == i]
    for j in ids:
      ks = [s for s in range(n) if words[s] == j]
      out[i, j] = np.mean([sum(alpha[t, s] for s in ks) for t in qs])
  return ids, out


def test_word_attention_and_prediction_match_a_loop():
  rng = np.random.default_rng(0)
  batch = ref.random_batch(rng, 5, 14, min_len=4)
  attn = ref.random_attention(rng, batch["attention_mask"], 1, 3, junk=False)[:, 0]  # [b, h, q, k]
  att = np.asarray(word_attention(attn, batch["word_ids"], 14))
  pred = np.asarray(predicted_heads(attn, batch["word_ids"]))
  assert pred.shape == (5, 3, 14)
  for b in range(5):
    n = int(batch["attention_mask"][b].sum())
    for h in range(3):
      ids, loop = _loop_word_attention(attn[b, h], batch["word_ids"][b], n)
      for (i, j), v in loop.items():
        np.testing.assert_allclose(att[b, h, i, j], v, rtol=1e-5, atol=1e-6)
      for i in range(14):
        others = [j for j in ids if j != i]
        if i not in ids or not others:
          assert pred[b, h, i] == -1
        else:
          assert pred[b, h, i] == max(others, key=lambda j: loop[i, j])


def test_previous_word_head_predicts_the_previous_word():
  """Pieces of word i attend to the last piece of word i-1 (word 0 to [CLS]): every word but the
  first predicts the previous word, whatever the pieces per word."""
  rng = np.random.default_rng(1)
  batch = ref.random_batch(rng, 4, 16, min_len=8, pair_prob=0.0)
  b, k = batch["word_ids"].shape
  probs = np.zeros((b, 1, k, k), np.float32)
  for i in range(b):
    words = batch["word_ids"][i]
    n = int(batch["attention_mask"][i].sum())
    for t in range(n):
      w = words[t]
      prev = [s for s in range(n) if words[s] == w - 1] if w > 0 else [0]
      target = prev[-1] if prev else 0
      probs[i, 0, t, :n] = 0.1 / n
      probs[i, 0, t, target] += 0.9
  pred = np.asarray(predicted_heads(probs, batch["word_ids"]))[:, 0]
  for i in range(b):
    num = int(batch["word_ids"][i].max()) + 1
    assert num >= 2
    np.testing.assert_array_equal(pred[i, 1:num], np.arange(num - 1))
    assert np.all(pred[i, num:] == -1)
