"""Sink rate and head summaries (heads_jax.hoststats.sinks) from hand-made per-sequence values."""

from __future__ import annotations

import numpy as np
import pytest

from heads_jax.hoststats.sinks import head_sinks, sink_summary


def test_sink_rate_and_layer_means_by_hand():
  N, L, H = 4, 2, 2
  first = np.zeros((N, L, H))
  first[:, 0, 0] = [0.2, 0.4, 0.5, 0.5]     # mean 0.4 > 0.3: a sink
  first[:, 1, 1] = 0.3                      # exactly 0.3: not a sink (strictly above)
  first[:, 1, 0] = 0.9
  sep = np.full((N, L, H, 2), 0.1)
  sep[:2, ..., 1] = np.nan                  # single texts: no second [SEP]
  ratio = np.ones((N, L, H))
  ratio[:, 1] = 0.25
  heads = head_sinks(first, sep, ratio)
  assert heads["sink"].tolist() == [True, False, True, False]
  assert heads["sep2_attention"].tolist() == pytest.approx([0.1] * 4)
  s = sink_summary(first, sep, ratio)
  assert s["sink_rate"] == 0.5 and s["sink_heads"] == ["0:0", "1:0"]
  assert s["sink_rate_by_layer"] == [0.5, 0.5]
  assert s["norm_ratio_by_layer"] == pytest.approx([1.0, 0.25])
  assert s["first_attention_by_layer"] == pytest.approx([0.2, 0.6])
  assert s["sep_attention_by_layer"] == pytest.approx([0.2, 0.2])
  assert sink_summary(first, sep, ratio, threshold=0.35)["sink_heads"] == ["0:0", "1:0"]
  assert sink_summary(first, sep, ratio, threshold=0.25)["sink_rate"] == 0.75


def test_shapes_are_checked():
  with pytest.raises(ValueError, match="sep_attention"):
    head_sinks(np.zeros((2, 1, 1)), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)))


def test_massive_activation_ratios_by_hand():
  from heads_jax.hoststats.sinks import activation_summary
  x = np.array([[[2.0, 1.0, 1.0], [40.0, 2.0, 2.0]],        # sequence 0: first 20x the others
                [[2.0, np.nan, 1.0], [20.0, np.nan, 4.0]]])  # sequence 1: no [SEP], first 5x
  s = activation_summary(x)
  assert s["first_norm_ratio_by_layer"] == [2.0, 12.5]
  assert s["sep_norm_ratio_by_layer"] == [1.0, 1.0]          # NaN-aware: sequence 0 only
  assert s["hidden_norm_by_layer"]["first"] == [2.0, 30.0] and s["max_first_norm_ratio"] == 12.5
  with pytest.raises(ValueError, match=r"\[N, l \+ 1, 3\]"):
    activation_summary(np.ones((2, 3)))
