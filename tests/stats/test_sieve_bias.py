"""On-device statistics (sieve bias, distance features) against the loop reference and by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import reference_impl as ref
from heads_jax.data import vocabulary as B
from heads_jax.sieves import build_sieves
from heads_jax.stats.distance import distance_features
from heads_jax.stats.sieve_bias import sieve_bias, sieve_bias_per_query


@jax.jit
def _stats(attn, batch):
  return (sieve_bias(attn, build_sieves(batch, B.ROLES), batch["attention_mask"], B.ROLES),
          distance_features(attn, batch["token_class"], batch["attention_mask"]))


def _stats_both(attn, batch):
  sieves = build_sieves(batch, B.ROLES, "both")
  return sieve_bias(attn, sieves, batch["attention_mask"], B.ROLES)


@pytest.fixture(scope="module")
def random_case():
  rng = np.random.default_rng(0)
  batch = ref.random_batch(rng, 6, 12)
  attn = ref.random_attention(rng, batch["attention_mask"], 2, 3)
  return batch, attn


def test_sieve_bias_matches_reference(random_case):
  batch, attn = random_case
  got, _ = _stats(attn, batch)
  want = ref.sieve_bias(attn.astype(np.float64), batch, B.ROLES)
  assert got.shape == (6, 2, 3, len(B.ROLES)) and got.dtype == jnp.float32
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  got_both = jax.jit(_stats_both)(attn, batch)
  want_both = ref.sieve_bias(attn.astype(np.float64), batch, B.ROLES, "both")
  np.testing.assert_allclose(np.asarray(got_both), want_both, rtol=1e-5, atol=1e-6)


def test_distance_features_match_reference_and_sum_to_one(random_case):
  batch, attn = random_case
  _, got = _stats(attn, batch)
  want = ref.distance_features(attn.astype(np.float64), batch)
  assert got.shape == (6, 2, 3, 21)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got).sum(-1), 1.0, atol=1e-5)
  per_query = np.asarray(jax.jit(distance_features, static_argnums=3)(
      attn, batch["token_class"], batch["attention_mask"], True))
  real = batch["attention_mask"].astype(bool)
  sums = per_query.sum(-1)                                            # [b, l, h, q]
  np.testing.assert_allclose(sums[np.broadcast_to(real[:, None, None], sums.shape)], 1.0, atol=1e-5)
  assert (sums[np.broadcast_to(~real[:, None, None], sums.shape)] == 0).all()


def test_padding_rows_and_junk_do_not_leak():
  """Junk on padding query rows and a padded copy of a batch give the same numbers."""
  rng = np.random.default_rng(3)
  batch = ref.random_batch(rng, 3, 8, min_len=5)
  attn = ref.random_attention(rng, batch["attention_mask"], 1, 2, junk=False)
  wide = {f: np.concatenate([v, B.empty_batch(3, 4)[f]], axis=1) for f, v in batch.items()}
  attn_wide = np.zeros((3, 1, 2, 12, 12), np.float32)
  attn_wide[..., :8, :8] = attn
  attn_wide[..., 8:, :] = rng.random((3, 1, 2, 4, 12))  # junk rows for padding queries
  attn_wide[..., :8, 8:] = rng.random((3, 1, 2, 8, 4))  # and junk mass on padding keys
  a, d = _stats(attn, batch)
  aw, dw = _stats(attn_wide, wide)
  np.testing.assert_allclose(np.asarray(aw), np.asarray(a), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(dw), np.asarray(d), rtol=1e-6, atol=1e-7)


def test_sieve_bias_ignores_row_scale_like_the_formula(random_case):
  """beta(t) is a ratio of two sums over the same row (and the block entropy normalises the
  row), so rows that do not sum to 1 give the formula's value, not a renormalised guess."""
  batch, attn = random_case
  scale = np.random.default_rng(1).uniform(0.2, 3.0, attn.shape[:4] + (1,)).astype(np.float32)
  got, _ = _stats(attn * scale, batch)
  want = ref.sieve_bias((attn * scale).astype(np.float64), batch, B.ROLES)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got), np.asarray(_stats(attn, batch)[0]), rtol=1e-5)


def _uniform_attention(mask, l=1, h=1):
  m = mask.astype(np.float32)
  row = m / m.sum(-1, keepdims=True)
  a = np.broadcast_to(row[:, None, None, None, :], (len(m), l, h, m.shape[1], m.shape[1])).copy()
  return a * m[:, None, None, :, None]


def test_uniform_attention_by_hand():
  """Uniform attention: beta(t) = 1 for every role, block = 1 x ln(n); NaN where no sieve."""
  rng = np.random.default_rng(5)
  batch = ref.random_batch(rng, 4, 10, min_len=6, pair_prob=1.0, rel_prob=0.0)
  attn = _uniform_attention(batch["attention_mask"])
  sb, dist = _stats(attn, batch)
  sb = np.asarray(sb)[:, 0, 0]
  n = batch["attention_mask"].sum(-1)
  for role in ("local", "prev_local", "next_local", "block_plain", "cls", "sep", "delimiter"):
    np.testing.assert_allclose(sb[:, B.ROLES.index(role)], 1.0, rtol=1e-6)
  np.testing.assert_allclose(sb[:, B.ROLES.index("block")], np.log(n), rtol=1e-6)
  # rel_prob=0: no arc has one of the four relations -> the syntactic roles are NaN
  for role in B.SYNTACTIC_ROLES:
    assert np.isnan(sb[:, B.ROLES.index(role)]).all()
  # distance by hand: each query puts 1/n on itself and 1/n on [CLS] except [CLS] itself
  dist = np.asarray(dist)[:, 0, 0]
  np.testing.assert_allclose(dist[:, 16], 1 / n, rtol=1e-6)
  np.testing.assert_allclose(dist[:, 17], (n - 1) / n / n, rtol=1e-6)


def test_block_is_nan_for_single_texts():
  rng = np.random.default_rng(6)
  batch = ref.random_batch(rng, 3, 8, pair_prob=0.0)
  sb, _ = _stats(ref.random_attention(rng, batch["attention_mask"], 1, 1), batch)
  assert np.isnan(np.asarray(sb)[..., [B.ROLES.index("block"), B.ROLES.index("block_plain")]]).all()
  assert not np.isnan(np.asarray(sb)[..., B.ROLES.index("local")]).any()


def test_all_padding_row_gives_nan_and_zero_distance():
  rng = np.random.default_rng(7)
  batch = ref.random_batch(rng, 2, 6)
  batch = {f: np.concatenate([v, B.empty_batch(1, 6)[f]]) for f, v in batch.items()}
  attn = ref.random_attention(rng, batch["attention_mask"], 1, 2)
  sb, dist = _stats(attn, batch)
  assert np.isnan(np.asarray(sb)[2]).all() and (np.asarray(dist)[2] == 0).all()


def _planted(batch, follow):
  """One head per row whose query t puts all its mass on ``follow(t, row)`` (a key)."""
  b, k = batch["attention_mask"].shape
  attn = np.zeros((b, 1, 1, k, k), np.float32)
  for i in range(b):
    n = int(batch["attention_mask"][i].sum())
    for t in range(n):
      attn[i, 0, 0, t, follow(t, batch["token_class"][i], n)] = 1.0
  return attn


def test_planted_previous_token_head():
  rng = np.random.default_rng(8)
  batch = ref.random_batch(rng, 4, 24, min_len=16)
  attn = _planted(batch, lambda t, tc, n: max(t - 1, 0))
  sb = np.asarray(_stats(attn, batch)[0])[:, 0, 0]
  n = batch["attention_mask"].sum(-1)
  prev = sb[:, B.ROLES.index("prev_local")]
  # beta(t) = n/2 for t >= 2, n for t = 1 (S = {0}); t = 0 has an empty sieve
  np.testing.assert_allclose(prev, (n + (n - 2) * n / 2) / (n - 1), rtol=1e-5)
  assert (prev > 3).all()
  assert (sb[:, B.ROLES.index("next_local")] == 0).all()
  dist = np.asarray(_stats(attn, batch)[1])[:, 0, 0]
  np.testing.assert_allclose(dist[:, 16], 1 / n, rtol=1e-6)  # only query 0 attends to itself


def test_planted_sep_head():
  rng = np.random.default_rng(9)
  batch = ref.random_batch(rng, 4, 24, min_len=16)

  def last_sep(t, tc, n):
    return int(np.flatnonzero(tc[:n] == B.TOKEN_SEP)[-1])
  sb = np.asarray(_stats(_planted(batch, last_sep), batch)[0])[:, 0, 0]
  n = batch["attention_mask"].sum(-1)
  num_sep = (batch["token_class"] == B.TOKEN_SEP).sum(-1)
  np.testing.assert_allclose(sb[:, B.ROLES.index("sep")], n / num_sep, rtol=1e-5)
  assert (sb[:, B.ROLES.index("sep")] > 3).all()
  assert (sb[:, B.ROLES.index("cls")] == 0).all()
  np.testing.assert_allclose(sb[:, B.ROLES.index("delimiter")], n / (num_sep + 1), rtol=1e-5)


def test_per_query_values_match_reference():
  rng = np.random.default_rng(10)
  batch = ref.random_batch(rng, 2, 9, min_len=6, pair_prob=1.0)
  attn = ref.random_attention(rng, batch["attention_mask"], 1, 1)
  roles = ("block", "local", "syntactic")
  per_query = jax.jit(lambda a, bt: sieve_bias_per_query(a, build_sieves(bt, roles),
                                                          bt["attention_mask"], roles))
  beta, valid = per_query(attn, batch)
  for i in range(2):
    for j, role in enumerate(roles):
      want = ref.token_biases(attn[i, 0, 0].astype(np.float64),
                              ref.sieve_sets(ref.row_of(batch, i), role), role == "block")
      n = len(want)
      assert np.asarray(valid)[i, j, :n].tolist() == [w is not None for w in want]
      got = np.asarray(beta)[i, 0, 0, j, :n]
      np.testing.assert_allclose(got, [0.0 if w is None else w for w in want], rtol=1e-5, atol=1e-7)


def test_shape_errors_are_clear():
  rng = np.random.default_rng(11)
  batch = ref.random_batch(rng, 2, 6)
  attn = ref.random_attention(rng, batch["attention_mask"], 1, 1)
  sieves = build_sieves(batch, ("local",))
  with pytest.raises(ValueError, match=r"\[b, r, q, k\]"):
    sieve_bias(attn, sieves, batch["attention_mask"], ("local", "cls"))
  with pytest.raises(ValueError, match=r"\[b, l, h, q, k\]"):
    distance_features(attn[:, 0], batch["token_class"], batch["attention_mask"])


def test_one_row_entropy_definition_for_both_paths():
  """row_entropy and the per-layer path use the one helper, row_mass_entropy, which equals
  scipy.stats.entropy of each real row (normalised over the real keys) and the row's mass."""
  import scipy.stats

  from heads_jax.stats import layerwise
  from heads_jax.stats import sieve_bias as sb
  assert layerwise.row_mass_entropy is sb.row_mass_entropy
  rng = np.random.default_rng(5)
  mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], np.int32)
  a = rng.uniform(0.01, 1.0, size=(2, 3, 5, 5)).astype(np.float32)       # [b, h, q, k], unnormalised
  a[1, :, :, 1] = 0.0                                                    # a zero (0 ln 0 = 0)
  total, ent = (np.asarray(x) for x in sb.row_mass_entropy(a, mask))
  for i, n in enumerate(mask.sum(1)):
    np.testing.assert_allclose(total[i], a[i, :, :, :n].sum(-1), rtol=1e-6)
    np.testing.assert_allclose(ent[i], scipy.stats.entropy(a[i, :, :, :n], axis=-1), rtol=1e-5,
                               atol=1e-6)
  # any axes between b and q; row_entropy is the same numbers
  np.testing.assert_array_equal(np.asarray(sb.row_entropy(a[:, None], mask))[:, 0], ent)
  # an empty row has entropy 0
  _, e0 = sb.row_mass_entropy(np.zeros((1, 1, 2, 3), np.float32), np.ones((1, 3), np.int32))
  np.testing.assert_array_equal(np.asarray(e0), 0.0)


def test_entropy_weighting_follows_the_registry():
  from heads_jax.stats import sieve_bias as sb
  mask = sb.entropy_weighted_mask(B.ROLES)
  assert [r for r, m in zip(B.ROLES, mask) if m] == [r.name for r in B.REGISTRY
                                                      if r.entropy_weighted] == ["block"]
  assert sb.entropy_weighted_mask(()).shape == (0,)
  with pytest.raises(ValueError, match="unknown role 'nope'"):
    sb.entropy_weighted_mask(("nope",))
