"""The per-layer reduction's own parts (``heads_jax.stats.layerwise``): the diagonals, the padded
pair table, padding query rows left as the softmax made them, and the entropy pass skipped for a
batch without pair sequences; each against the loop reference (tests/reference_impl.py) or an
explicit index."""

import jax
import numpy as np
import pytest

from tests import reference_impl as ref
from heads_jax.data import vocabulary as B
from heads_jax.stats import layerwise


def _softmax_rows(rng, mask, h, junk_padding_rows):
  """float32 ``[b, h, q, k]``: rows normalised over the real keys, padding keys 0; padding query
  rows 0, or (``junk_padding_rows``) random positive values there, as a softmax over no visible
  key leaves them."""
  b, k = mask.shape
  x = np.exp(2.0 * rng.normal(size=(b, h, k, k)))
  x = np.where(mask[:, None, None, :] > 0, x, 0.0)
  p = x / np.maximum(x.sum(-1, keepdims=True), 1e-300)
  junk = rng.random((b, h, k, k)) if junk_padding_rows else 0.0
  return np.where(mask[:, None, :, None] > 0, p, junk).astype(np.float32)


def _reduce(p, batch, direction="dep2head", measures=True, roles=B.ROLES):
  tables = layerwise.batch_tables(batch, roles, direction, measures)
  out = jax.jit(lambda p, t: layerwise.reduce_layer(p, t, roles, batch["attention_mask"],
                                                    measures))(p, tables)
  stacked = {key: v[:, None] for key, v in out.items()}
  return {key: np.asarray(v)[:, 0] for key, v in layerwise.finish(stacked, tables).items()}


def test_diagonals_are_the_shifted_entries():
  rng = np.random.default_rng(0)
  p = rng.random((2, 3, 7, 7)).astype(np.float32)
  offsets = (-2, -1, 0, 1, 2)
  got = np.asarray(layerwise.diagonals(p, offsets))
  want = np.zeros(p.shape[:-1] + (len(offsets),), np.float32)
  for t in range(7):
    for j, o in enumerate(offsets):
      if 0 <= t + o < 7:
        want[..., t, j] = p[..., t, t + o]
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("measures,width", [(False, 32), (True, 32)])
def test_the_pair_table_is_padded_to_16_columns(measures, width):
  """9 roles (all but the offsets roles and the entropy-weighted ``block``) + 20 distance
  features (+ 3 token masses) per pair, padded to a multiple of 16 (XLA:CPU's fast widths)."""
  rng = np.random.default_rng(1)
  batch = ref.random_batch(rng, 3, 10)
  tables = layerwise.batch_tables(batch, B.ROLES, "dep2head", measures)
  assert tables["weights"].shape == (3, 100, width)
  used = 9 + 20 + 3 * measures
  assert not np.asarray(tables["weights"])[..., used:].any()


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["dep2head", "both"])
def test_padding_query_rows_may_hold_anything(direction):
  """``masks_padding_queries``: the model passes padding query rows as its softmax leaves them
  (a packed row's padding sees no key); every weight of such a query is 0."""
  rng = np.random.default_rng(2)
  batch = ref.random_batch(rng, 6, 11, min_len=1)
  assert (batch["attention_mask"] == 0).any()
  mask = batch["attention_mask"]
  zero = _reduce(_softmax_rows(np.random.default_rng(3), mask, 2, False), batch, direction)
  junk = _reduce(_softmax_rows(np.random.default_rng(3), mask, 2, True), batch, direction)
  for key in zero:
    np.testing.assert_allclose(junk[key], zero[key], rtol=1e-6, atol=1e-7, err_msg=key)
  assert layerwise.layer_reducer(layerwise.batch_tables(batch, B.ROLES), B.ROLES,
                                 mask).masks_padding_queries


@pytest.mark.slow
def test_single_texts_skip_the_entropy_and_equal_the_reference():
  """Without the measures the row entropy only weights ``block``, whose sieve is empty outside
  pair sequences: a batch of single texts skips that pass (``lax.cond``), a batch with a pair
  takes it, and both equal the loop reference (NaN pattern included)."""
  rng = np.random.default_rng(4)
  for singles in (True, False):
    batch = ref.random_batch(rng, 5, 12, min_len=6, pair_prob=0.0 if singles else 0.5)
    assert (batch["token_type_ids"] == 1).any() != singles
    p = _softmax_rows(rng, batch["attention_mask"], 3, False)
    got = _reduce(p, batch, measures=False)
    want = ref.sieve_bias(p[:, None].astype(np.float64), batch, B.ROLES)[:, 0]
    block = B.ROLES.index("block")
    assert np.isnan(got["sieve_bias"][:, :, block]).all() == singles
    np.testing.assert_array_equal(np.isnan(got["sieve_bias"]), np.isnan(want))
    np.testing.assert_allclose(got["sieve_bias"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["distance"], ref.distance_features(p[:, None], batch)[:, 0],
                               rtol=1e-5, atol=1e-6)
