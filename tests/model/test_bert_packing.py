"""BertModel's packing and analysis hooks (heads_jax/model/bert.py): packed rows
(``position_ids``, ``segment_ids``) against each sequence alone, the ``value_columns`` and
``wants_entropy`` reduction hooks against direct computations, and the query-chunked XLA path."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

from heads_jax.model import attention as attention_lib
from heads_jax.model.bert import BertModel
from heads_jax.model.config import config_for

CFG = config_for("tiny", vocab_size=97, max_position_embeddings=32)


@pytest.fixture(scope="module")
def model():
  return BertModel(CFG, rngs=nnx.Rngs(0))


def _two_sequences():
  rng = np.random.default_rng(4)
  a, b = rng.integers(5, 97, 6), rng.integers(5, 97, 5)
  ids = np.zeros((1, 14), np.int32)
  ids[0, :6], ids[0, 6:11] = a, b
  seg = np.array([[1] * 6 + [2] * 5 + [0] * 3])
  pos = np.array([list(range(6)) + list(range(5)) + [0] * 3])
  return a, b, ids, (seg > 0).astype(np.int32), seg, pos


@pytest.mark.slow
@pytest.mark.parametrize("path", ["explicit", "xla", "flash"])
def test_packed_row_equals_each_sequence_alone(model, path):
  a, b, ids, mask, seg, pos = _two_sequences()
  out = model(ids, mask, position_ids=pos, segment_ids=seg, attention=path,
              return_attentions=path == "explicit")
  for sl, tokens in ((slice(0, 6), a), (slice(6, 11), b)):
    alone = model(tokens[None], attention=path, return_attentions=path == "explicit")
    np.testing.assert_allclose(out["last_hidden_state"][0, sl], alone["last_hidden_state"][0],
                               atol=1e-5)
    if path == "explicit":
      np.testing.assert_allclose(out["attentions"][0, :, :, sl, sl], alone["attentions"][0],
                                 atol=1e-6)
      # and nothing across sequences
      other = np.ones(14, bool)
      other[sl] = False
      assert float(np.abs(np.asarray(out["attentions"])[0, :, :, sl][..., other]).max()) == 0.0


def test_packed_uniform_gate_is_uniform_over_own_segment(model):
  _, _, ids, mask, seg, pos = _two_sequences()
  gate = jnp.zeros((CFG.num_layers, CFG.num_heads))
  att = model(ids, mask, position_ids=pos, segment_ids=seg, head_gate=gate, gate_mode="uniform",
              return_attentions=True)["attentions"][0, 0, 0]          # [q, k]
  np.testing.assert_allclose(att[2, :6], 1 / 6, atol=1e-7)
  np.testing.assert_allclose(att[8, 6:11], 1 / 5, atol=1e-7)
  assert float(att[2, 6:].sum() + att[8, :6].sum()) == 0.0


@pytest.mark.slow
def test_value_columns_and_entropy_hooks(model):
  rng = np.random.default_rng(5)
  ids = rng.integers(5, 97, (2, 9)).astype(np.int32)
  mask = np.ones((2, 9), np.int32)
  mask[1, 6:] = 0
  cols = jnp.asarray(rng.normal(size=(2, 9, 3)), jnp.float32)

  def reduce(layer, probs, query, key, m, columns, entropy):
    return {"probs": probs, "columns": columns, "entropy": entropy}

  reduce.value_columns = cols
  reduce.wants_entropy = True
  out = model(ids, mask, attention_reduce=reduce)
  red = out["attention_reduced"]
  p = np.asarray(red["probs"], np.float64)                               # [b, l, h, q, k]
  np.testing.assert_allclose(red["columns"], np.einsum("blhqk,bkc->blhqc", p, cols), atol=1e-6)
  with np.errstate(divide="ignore", invalid="ignore"):
    h = -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=-1)
  np.testing.assert_allclose(red["entropy"], h, atol=1e-5)
  assert float(np.abs(np.asarray(red["entropy"])[1, :, :, 6:]).max()) == 0.0  # padding queries
  # the hooks do not change the model's output
  plain = model(ids, mask, attention="explicit")["last_hidden_state"]
  np.testing.assert_array_equal(out["last_hidden_state"], plain)
  # bfloat16 compute: float32 columns from the float32 probabilities
  m16 = BertModel(CFG.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
  red16 = m16(ids, mask, attention_reduce=reduce)["attention_reduced"]
  assert red16["columns"].dtype == jnp.float32
  np.testing.assert_allclose(red16["columns"], np.einsum(
      "blhqk,bkc->blhqc", np.asarray(red16["probs"], np.float64), cols), atol=1e-6)


@pytest.mark.slow
def test_query_chunked_xla_path_equals_unchunked(monkeypatch):
  rng = np.random.default_rng(6)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 37, 3, 8)), jnp.float32) for _ in range(3))
  real = jnp.asarray(rng.random((2, 1, 1, 37)) > 0.2)
  packed = jnp.asarray(rng.random((2, 1, 37, 37)) > 0.3)
  ref = [attention_lib.xla_attention(q, k, v, m) for m in (real, packed)]
  monkeypatch.setattr(attention_lib, "CHUNK_ELEMENTS", 0)
  monkeypatch.setattr(attention_lib, "QUERY_CHUNK", 16)   # 3 chunks, the last padded
  for m, r in zip((real, packed), ref):
    np.testing.assert_allclose(attention_lib.xla_attention(q, k, v, m), r, atol=1e-6)
  jaxpr = str(jax.make_jaxpr(attention_lib.xla_attention)(q, k, v, real))
  assert "scan" in jaxpr or "while" in jaxpr
