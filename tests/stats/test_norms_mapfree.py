"""The second pass without maps (heads_jax.stats.norms, issue 52 item 2): packed rows give every
sequence's unpacked outputs; the streaming arg-max over key blocks equals ``predicted_heads``; the
lowered map-free program holds no array of the map's size. (``tests/stats/test_norms.py`` checks
both paths, per-layer maps and map-free, against a loop over transformers' model.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from heads_jax.data import vocabulary as B
from heads_jax.data.encoding import pack_batches
from heads_jax.model.checkpoint import build_model
from heads_jax.model.config import config_for
from heads_jax.stats import norms, parsing
from tests import reference_impl as ref

ROLES = B.ROLES
KEYS = ("norm_sieve_bias", "first_attention", "sep_attention", "norm_ratio", "hidden_norms")


def _tiny(layers=2, heads=2, hidden=16, seed=0):
  cfg = config_for("base", num_layers=layers, num_heads=heads, hidden_size=hidden,
                   intermediate_size=2 * hidden, vocab_size=64, max_position_embeddings=160)
  return build_model("BertModel", cfg, seed=seed)


def _batch(rng, b, k, min_len=4):
  batch = ref.random_batch(rng, b, k, min_len=min_len)
  real = batch["attention_mask"] > 0
  batch["input_ids"] = np.where(real, batch["input_ids"] % 60 + 3, 0).astype(np.int32)
  return batch


def _check(got, want):
  for name in KEYS:
    g, w = got[name], want[name]
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=name)
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-6, equal_nan=True, err_msg=name)
  g, w = got["parse_pred"], want["parse_pred"]
  np.testing.assert_array_equal(g[..., :w.shape[-1]], w)
  assert (g[..., w.shape[-1]:] == -1).all()


@pytest.mark.slow   # two programs per path on a 1-layer model (about 20 s each on 2 idle cores)
@pytest.mark.parametrize("map_free", [False, True])
def test_packed_second_pass_equals_the_unpacked_one(map_free):
  """Six sequences packed several to a row (``pack_batches``, as the first pass packs), on each
  layer's map and map-free: every output of every slot equals the unpacked pass's row of that
  sequence."""
  model = _tiny(layers=1, seed=2)
  single = _batch(np.random.default_rng(5), 6, 12, min_len=3)
  step = norms.make_norm_step(model, roles=ROLES, map_free=map_free)
  want = step(single)
  packed = list(pack_batches(iter([(np.arange(6), single)]), length=24, rows=2, slots=4))
  seen = 0
  for indices, batch in packed:
    idx = np.asarray(indices)
    got = step(batch, slots=len(idx) // batch["input_ids"].shape[0])
    for row, i in enumerate(idx):
      if i >= 0:
        _check({k: v[row:row + 1] for k, v in got.items()},
               {k: v[i:i + 1] for k, v in want.items()})
        seen += 1
  assert seen == 6


def test_map_free_second_pass_holds_no_map_sized_buffer():
  """One 8,192-position sequence, map-free: no array of the lowered second pass (the forward's
  query chunks, the kernel on the augmented queries and keys, key blocks of 128 for the sinks
  and the parse) comes near ``h * q * k`` elements: memory linear in the length. (Lowered, not
  compiled: every buffer XLA could make is an array of the program.)"""
  import re
  from heads_jax.parallel import data_mesh
  k = 8192
  cfg = config_for("tiny", vocab_size=128, max_position_embeddings=k)
  model = build_model("BertModel", cfg, seed=0)
  step = norms.make_norm_step(model, roles=ROLES, map_free=True,
                              mesh=data_mesh(jax.devices()[:1]))
  text = step.program(True).lower(step._state, step.input_specs(1, k)).as_text()
  sizes = [int(np.prod([int(d) for d in m.split("x")]))
           for m in re.findall(r"tensor<((?:\d+x)+)[a-z]", text)
           for m in [m.rstrip("x")]]
  map_elements = cfg.num_heads * k * k
  assert max(sizes) <= map_elements // 16, (max(sizes), map_elements)
  # the maps path's program does hold maps (the check can fail)
  maps = norms.make_norm_step(model, roles=ROLES, map_free=False,
                              mesh=data_mesh(jax.devices()[:1]))
  text = maps.program(False).lower(maps._state, maps.input_specs(1, k)).as_text()
  assert f"{k}x{k}x" in text


@pytest.mark.slow
def test_streaming_argmax_equals_predicted_heads():
  """Random maps, key blocks of 4 over 13 keys (words straddle blocks), queries with no other
  word, padding."""
  rng = np.random.default_rng(3)
  batch = _batch(rng, 4, 13, min_len=2)
  b, k = batch["input_ids"].shape
  logits = rng.normal(size=(b, 3, k, k)).astype(np.float32) * 3
  real = batch["attention_mask"] > 0
  probs = np.where(real[:, None, None, :], np.exp(logits), 0.0)
  probs = probs / probs.sum(-1, keepdims=True) * real[:, None, :, None]
  want = np.asarray(parsing.predicted_heads(jnp.asarray(probs), batch["word_ids"]))
  bk, blocks = 4, 4
  padded = np.pad(probs, ((0, 0), (0, 0), (0, 0), (0, bk * blocks - k)))

  @jax.jit
  def stream(p, word_ids, real):
    layout = parsing.word_layout(word_ids, real.astype(jnp.int32))
    tiles = lambda i: jax.lax.dynamic_slice_in_dim(p, i * bk, bk, axis=3)  # noqa: E731
    mass, arg = parsing.key_block_loop(tiles, blocks, bk, layout, real.astype(jnp.float32))
    return mass, parsing.run_predictions(arg, layout, 0, k)

  mass, got = stream(jnp.asarray(padded), batch["word_ids"], jnp.asarray(real))
  got = np.asarray(got)[:, :, 0]
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(np.asarray(mass)[..., :k], probs.sum(2), rtol=1e-5)
