"""heads_jax.model.encoder_io: the input checks, the segment removal and the stacked layer outputs
the encoder families share, against values derived by hand."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from heads_jax.model import encoder_io

CFG = types.SimpleNamespace(num_layers=2, num_heads=3, max_positions=6)


def test_check_inputs_fills_the_defaults_and_names_a_bad_shape():
  ids, mask, tt, gate, removal = encoder_io.check_inputs(CFG, [[5, 6, 7]])
  assert ids.dtype == jnp.int32 and mask.tolist() == [[1, 1, 1]] and tt.tolist() == [[0, 0, 0]]
  assert gate is None and removal is None
  with pytest.raises(ValueError, match=r"input_ids must be \[batch, length\]"):
    encoder_io.check_inputs(CFG, [1, 2])
  with pytest.raises(ValueError, match="sequence length 7 exceeds the model's 6 positions"):
    encoder_io.check_inputs(CFG, [[1] * 7])
  with pytest.raises(ValueError, match=r"head_gate must have shape \[layers, heads\] = \(2, 3\)"):
    encoder_io.check_inputs(CFG, [[1, 2]], head_gate=np.ones((3, 2)))
  with pytest.raises(ValueError, match=r"segment_removal must have shape .* = \(2, 3, 2\)"):
    encoder_io.check_inputs(CFG, [[1, 2]], segment_removal=np.ones((2, 3)))
  with pytest.raises(ValueError, match="segment_ids must have the shape of input_ids"):
    encoder_io.check_inputs(CFG, [[1, 2]], segment_ids=[[1, 1, 1]])


def test_remove_segments_scales_intra_and_inter_weights_by_hand():
  probs = jnp.full((1, 1, 3, 3), 1 / 3, jnp.float32)  # [b, h, q, k]
  segments = jnp.array([[0, 0, 1]])
  removal = jnp.array([[1.0, 0.0]])                  # intra removed, inter kept
  out = np.asarray(encoder_io.remove_segments(probs, segments, removal, False))[0, 0]
  np.testing.assert_allclose(out, [[0, 0, 1 / 3], [0, 0, 1 / 3], [1 / 3, 1 / 3, 0]], atol=1e-7)
  renorm = np.asarray(encoder_io.remove_segments(probs, segments, removal, True))[0, 0]
  np.testing.assert_allclose(renorm, [[0, 0, 1], [0, 0, 1], [0.5, 0.5, 0]], atol=1e-6)
  nothing = encoder_io.remove_segments(probs, segments, jnp.ones((1, 2)), True)
  assert np.all(np.asarray(nothing) == 0)  # a row with nothing left stays 0


def test_layer_outputs_stack_only_what_was_asked_and_zero_padded_queries():
  x0, x1 = jnp.zeros((1, 2, 4)), jnp.ones((1, 2, 4))
  probs = jnp.ones((1, 3, 2, 2))
  out = encoder_io.LayerOutputs(x0, return_attentions=True, return_hidden_states=True,
                                attention_reduce=lambda *a: None)
  out.add(x1, probs, {"m": jnp.full((1, 3), 2.0)})
  got = out.stacked({"last_hidden_state": x1}, jnp.array([[1, 0]]))
  assert got["attentions"].shape == (1, 1, 3, 2, 2)
  assert np.asarray(got["attentions"])[0, 0, :, 1].sum() == 0       # padded query's row
  assert np.asarray(got["attentions"])[0, 0, :, 0].sum() == 6
  assert got["hidden_states"].shape == (2, 1, 2, 4)
  assert got["attention_reduced"]["m"].shape == (1, 1, 3)
  bare = encoder_io.LayerOutputs(x0, return_attentions=False, return_hidden_states=False,
                                 attention_reduce=None)
  bare.add(x1, None, None)
  assert set(bare.stacked({"last_hidden_state": x1}, jnp.ones((1, 2)))) == {"last_hidden_state"}
