"""Packed batches (issue 38 item 2): several sequences per row, statistics per sequence.

Every statistic of a packed row's sequence must equal the same sequence's unpacked one (the
packed attention is block-diagonal: each sequence's own map at its offset), and the host packing
must place every sequence exactly once."""

import jax
import numpy as np
import pytest

from tests import reference_impl as ref
from heads_jax.data import encoding
from heads_jax.data import vocabulary as B
from heads_jax.sieves import build_sieves, distance_bins, segment_positions
from heads_jax.stats import layerwise

ALL = ("sieve_bias", "distance", "entropy", "cls_entropy", "token_attention")
_stack = jax.jit(layerwise.reduce_stack, static_argnums=(2, 3),
                 static_argnames=("measures", "js", "slots"))
_sieves = jax.jit(build_sieves, static_argnums=(1, 2))
_bins = jax.jit(distance_bins)


def _packed(batch, length=40, rows=4, slots=4):
  """The sequences of ``batch`` packed: a list of ``(indices [rows * slots], packed batch)``."""
  indices = np.arange(len(batch["input_ids"]))
  return list(encoding.pack_batches([(indices, batch)], length=length, rows=rows, slots=slots,
                                    window=4, tail_rows=2))


def _packed_attention(attn, indices, packed, slots):
  """float32 ``[b, l, h, K, K]``: each packed sequence's own unpacked map ``attn[i]`` placed at its
  offset (zero across sequences and on padding)."""
  b, k = packed["input_ids"].shape
  out = np.zeros((b,) + attn.shape[1:3] + (k, k), np.float32)
  seg = packed["segment_ids"]
  for row in range(b):
    for j in range(slots):
      i = indices[row * slots + j]
      if i < 0:
        continue
      at = np.flatnonzero(seg[row] == j + 1)
      n = len(at)
      out[row][..., at[0]:at[0] + n, at[0]:at[0] + n] = attn[i][..., :n, :n]
  return out


def test_pack_lengths_first_fit_decreasing_places_each_sequence_once():
  rows = encoding.pack_lengths([5, 9, 3, 7, 2, 2, 8], capacity=10, slots=2)
  assert sorted(i for r in rows for i in r) == list(range(7))
  assert all(len(r) <= 2 and sum([5, 9, 3, 7, 2, 2, 8][i] for i in r) <= 10 for r in rows)
  # by hand: 9 | 8+2 | 7+3 | 5+2
  assert rows == [[1], [6, 4], [3, 2], [0, 5]]
  with pytest.raises(ValueError, match="more than the packed row's 10"):
    encoding.pack_lengths([11], capacity=10)


def _placed(batch, out, length, slots):
  """Checks every packed sequence against its unpacked row (fields, contiguous segment, restarted
  positions, rows of ``row_slots`` slots); returns ``{index: row length it was packed in}``."""
  where = {}
  for indices, packed in out:
    b, k = packed["input_ids"].shape
    per_row = encoding.row_slots(k, length, slots)
    assert len(indices) == b * per_row
    for pos, i in enumerate(indices):
      if i < 0:
        continue
      row, j = divmod(pos, per_row)
      at = np.flatnonzero(packed["segment_ids"][row] == j + 1)
      n = int(batch["attention_mask"][i].sum())
      assert len(at) == n and np.all(np.diff(at) == 1)
      for f in B.BATCH_FIELDS:
        np.testing.assert_array_equal(packed[f][row, at], batch[f][i, :n])
      np.testing.assert_array_equal(np.asarray(segment_positions(packed["segment_ids"]))[row, at],
                                    np.arange(n))
      assert int(i) not in where
      where[int(i)] = k
  return where


def test_pack_batches_keeps_every_field_and_numbers_segments():
  rng = np.random.default_rng(0)
  batch = ref.random_batch(rng, 11, 12, min_len=2)
  out = _packed(batch)
  for indices, packed in out:
    assert packed["segment_ids"].shape == packed["input_ids"].shape == (len(indices) // 4, 40)
  assert sorted(_placed(batch, out, 40, 4)) == list(range(11))
  assert {len(ix) // 4 for ix, _ in out} <= {4, 2}       # at most two shapes: rows and tail rows


def test_short_rows_take_the_short_sequences_in_two_shapes(monkeypatch):
  """With ``short_length``: sequences longer than it go to full rows, the others fill those
  rows' room (first fit, longest first) and then short rows of half the slots; two shapes, a
  short batch holding the positions of a full one. Layout derived by hand (the long share rule
  lifted: its own test below)."""
  monkeypatch.setattr(encoding, "SHORT_ROWS_LONG_SHARE", 1.0)
  rng = np.random.default_rng(6)
  pool = ref.random_batch(rng, 300, 40, min_len=2)
  pool_lengths = pool["attention_mask"].sum(-1)
  want = [30, 25, 8, 8, 6, 5, 5, 4, 3]
  keep = []
  for n in want:
    keep.append(int(next(i for i in np.flatnonzero(pool_lengths == n) if i not in keep)))
  batch = {f: v[keep] for f, v in pool.items()}
  out = list(encoding.pack_batches([(np.arange(9), batch)], length=40, rows=1, slots=4,
                                   window=9, tail_rows=1, short_length=20))
  where = _placed(batch, out, 40, 4)
  assert sorted(where) == list(range(9))
  # by hand: full rows 30 | 25 (room 10, 15); 8 -> row 0, 8 -> row 1, 6 -> row 1; the rest
  # (5, 5, 4, 3) in short rows of 20 positions and 2 slots: 5+5 | 4+3, one batch of 2 rows
  layout = [(p["input_ids"].shape, [[want[i] for i in ix[r * len(ix) // len(p["input_ids"]):
                                                         (r + 1) * len(ix) // len(p["input_ids"])]
                                    if i >= 0] for r in range(len(p["input_ids"]))])
            for ix, p in out]
  assert layout == [((2, 20), [[5, 5], [4, 3]]), ((1, 40), [[30, 8]]), ((1, 40), [[25, 8, 6]])]
  assert encoding.row_slots(20, 40, 4) == 2


def test_short_rows_left_over_are_packed_again_at_full_length():
  """Short rows too few for a batch at the end: their sequences go, with the long rows', into
  rows of the full length (the tail's shape), each exactly once."""
  rng = np.random.default_rng(8)
  batch = ref.random_batch(rng, 30, 16, min_len=2)
  out = list(encoding.pack_batches([(np.arange(30), batch)], length=32, rows=16, slots=4,
                                   window=30, tail_rows=2, short_length=16))
  assert {p["input_ids"].shape for _, p in out} == {(2, 32)}     # 32 short rows never filled
  assert sorted(_placed(batch, out, 32, 4)) == list(range(30))


def test_short_rows_are_refused_for_mostly_long_data():
  """More than SHORT_ROWS_LONG_SHARE of the first window's positions in longer sequences (e.g.
  sentence pairs): every row has the full length, as without ``short_length``."""
  rng = np.random.default_rng(7)
  batch = ref.random_batch(rng, 24, 40, min_len=25)
  out = list(encoding.pack_batches([(np.arange(24), batch)], length=40, rows=4, slots=4,
                                   window=24, short_length=20))
  plain = list(encoding.pack_batches([(np.arange(24), batch)], length=40, rows=4, slots=4,
                                     window=24))
  assert [p["input_ids"].shape for _, p in out] == [p["input_ids"].shape for _, p in plain]
  assert all(p["input_ids"].shape[1] == 40 for _, p in out)
  assert sorted(_placed(batch, out, 40, 4)) == list(range(24))


@pytest.mark.parametrize("direction", ["dep2head", "both"])
def test_packed_sieves_and_bins_are_each_sequences_own(direction):
  rng = np.random.default_rng(1)
  batch = ref.random_batch(rng, 9, 10, min_len=1)
  sieves = np.asarray(_sieves(batch, B.ROLES, direction))
  bins = np.asarray(_bins(batch["token_class"], batch["attention_mask"]))
  for indices, packed in _packed(batch, length=24):
    ps = np.asarray(_sieves(packed, B.ROLES, direction))
    pb = np.asarray(_bins(packed["token_class"], packed["attention_mask"], packed["segment_ids"]))
    for pos, i in enumerate(indices):
      if i < 0:
        continue
      row, j = divmod(pos, 4)
      at = np.flatnonzero(packed["segment_ids"][row] == j + 1)
      n, lo = len(at), at[0] if len(at) else 0
      np.testing.assert_array_equal(ps[row][:, lo:lo + n, lo:lo + n], sieves[i][:, :n, :n])
      np.testing.assert_array_equal(pb[row][lo:lo + n, lo:lo + n], bins[i][:n, :n])
      # nothing outside the sequence's own block
      assert not ps[row][:, lo:lo + n, :lo].any() and not ps[row][:, lo:lo + n, lo + n:].any()
      assert (pb[row][lo:lo + n, :lo] == -1).all() and (pb[row][lo:lo + n, lo + n:] == -1).all()


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["dep2head", "both"])
def test_packed_statistics_equal_unpacked(direction):
  rng = np.random.default_rng(2)
  batch = ref.random_batch(rng, 13, 12, min_len=1)
  attn = ref.random_attention(rng, batch["attention_mask"], 2, 3, junk=False)   # [b, l, h, q, k]
  want = _stack(attn, batch, B.ROLES, direction, measures=True)
  per_layer = jax.jit(lambda p, t: layerwise.reduce_layer(p, t, B.ROLES, t["mask"], True))
  for indices, packed in _packed(batch):
    pattn = _packed_attention(attn, indices, packed, 4)
    got = _stack(pattn, packed, B.ROLES, direction, measures=True, slots=4)
    # the per-layer path: reduce_layer per layer, stacked on axis 1, then finish
    tables = layerwise.batch_tables(packed, B.ROLES, direction, True, slots=4)
    layers = [per_layer(pattn[:, l], {**tables, "mask": packed["attention_mask"]})
              for l in range(pattn.shape[1])]
    stacked = {f: np.stack([np.asarray(x[f]) for x in layers], axis=1) for f in layers[0]}
    got_layerwise = layerwise.finish(stacked, tables)
    keep = indices >= 0
    for name in ALL:
      for result in (got, got_layerwise):
        assert np.asarray(result[name]).shape[0] == len(indices)
        np.testing.assert_allclose(np.asarray(result[name])[keep],
                                   np.asarray(want[name])[indices[keep]], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    # the NaN pattern of empty sieves is each sequence's own
    np.testing.assert_array_equal(np.isnan(np.asarray(got["sieve_bias"])[keep]),
                                  np.isnan(np.asarray(want["sieve_bias"])[indices[keep]]))


def test_reduce_stack_equals_loop_reference():
  """The new stacked path (one weight, one matmul, one entropy pass) against the loop reference."""
  rng = np.random.default_rng(3)
  batch = ref.random_batch(rng, 6, 11, min_len=1)
  attn = ref.random_attention(rng, batch["attention_mask"], 2, 2)
  got = _stack(attn, batch, B.ROLES, "dep2head")
  np.testing.assert_allclose(np.asarray(got["sieve_bias"]), ref.sieve_bias(attn, batch, B.ROLES),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got["distance"]), ref.distance_features(attn, batch),
                             rtol=1e-5, atol=1e-6)


FAMILIES = {  # tiny random encoders of each family's kind (positions, token types, shared layers)
    "bert": {},
    "roberta": {"family": "roberta", "position_offset": 2, "type_vocab_size": 1, "pad_token_id": 1},
    "distilbert": {"family": "distilbert", "type_vocab_size": 0, "sinusoidal_positions": True,
                   "pooler": False},
    "albert": {"family": "albert", "embedding_size": 16, "embedding_projection": True,
               "num_hidden_groups": 1},
}


def _model(family):
  from flax import nnx
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  cfg = config_for("tiny", vocab_size=2048, max_position_embeddings=64, hidden_dropout=0.0,
                   attention_dropout=0.0, **FAMILIES[family])
  return BertModel(cfg, rngs=nnx.Rngs(3))


def _requires_packing_model():
  """BertModel takes segment_ids and position_ids (packed rows): a regression fails here, not
  skips."""
  from heads_jax.stats.step import accepts_packing
  assert accepts_packing(_model("bert"))


@pytest.mark.slow
@pytest.mark.parametrize("family,paths", [("bert", ("layerwise", "stacked", "kernel")),
                                          ("roberta", ("layerwise",)),
                                          ("distilbert", ("layerwise",)),
                                          ("albert", ("stacked",))])
def test_packed_analysis_step_equals_unpacked(family, paths):
  """Through the analysis step on a real (tiny) encoder: the model restarts positions and attends
  within each packed sequence, so every score equals the unpacked run's within 1e-5."""
  _requires_packing_model()
  from heads_jax.stats.collector import collect
  from heads_jax.stats.step import make_analysis_step
  rng = np.random.default_rng(4)
  batch = ref.random_batch(rng, 10, 16, min_len=1)
  n = len(batch["input_ids"])
  model = _model(family)
  unpacked = [(np.arange(n), batch)]
  packed = list(encoding.pack_batches(unpacked, length=40, rows=8, slots=4, window=64,
                                      tail_rows=8))
  assert len(packed) == 1 and packed[0][1]["segment_ids"].max() > 1
  for path in paths:
    step = make_analysis_step(model, measures=True, stats_impl=path)
    assert step.packs
    want = collect(step, unpacked, n, progress=False)
    got = collect(step, packed, n, progress=False)
    np.testing.assert_array_equal(got["lengths"], want["lengths"])
    for name in ALL:
      np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5,
                                 err_msg=f"{family} {path} {name}")


def test_analysis_on_short_and_full_rows_equals_unpacked():
  """The pass's two shapes (short rows of half the length and half the slots, full rows) through
  the analysis step: every score equals the unpacked run's within 1e-5."""
  _requires_packing_model()
  from heads_jax.stats.collector import collect
  from heads_jax.stats.step import make_analysis_step
  rng = np.random.default_rng(9)
  batch = ref.random_batch(rng, 10, 16, min_len=1)
  n = len(batch["input_ids"])
  unpacked = [(np.arange(n), batch)]
  packed = list(encoding.pack_batches(unpacked, length=40, rows=2, slots=4, window=64,
                                      tail_rows=2, short_length=20))
  assert {p["input_ids"].shape for _, p in packed} == {(4, 20), (2, 40)}
  step = make_analysis_step(_model("bert"), measures=True, stats_impl="layerwise")
  want = collect(step, unpacked, n, progress=False)
  got = collect(step, packed, n, progress=False)
  np.testing.assert_array_equal(got["lengths"], want["lengths"])
  for name in ALL:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_step_that_cannot_pack_says_so():
  from heads_jax.stats.step import make_analysis_step
  _requires_packing_model()
  step = make_analysis_step(_model("bert"), js=True)
  assert not step.packs
  rng = np.random.default_rng(5)
  batch = ref.random_batch(rng, 3, 8)
  (_, packed), = encoding.pack_batches([(np.arange(3), batch)], length=24, rows=2, slots=4)
  with pytest.raises(ValueError, match="cannot take packed batches"):
    step(packed)
