"""Properties that hold for every input, checked with hypothesis over random batches.

* the sieve bias of uniform attention is 1 for every role but ``block`` (whose entropy factor
  makes it ln n), NaN exactly where the sieve is empty for every query;
* the 21 distance features of a real query (and of a sequence) sum to 1;
* permuting the sequences of a batch permutes the scores;
* the scores do not depend on how far a batch is padded.

The last two are checked on the stand-alone functions (random attention) and through the
jitted analysis step with a tiny model. Shapes come from small fixed sets so that JAX compiles
few programs; examples are few and derandomized (the same inputs in every run, CI included).
"""

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heads_jax.data import vocabulary as B
from heads_jax.model.bert import BertModel
from heads_jax.model.config import config_for
from heads_jax.sieves import build_sieves
from heads_jax.stats.distance import distance_features
from heads_jax.stats.sieve_bias import sieve_bias, sieve_bias_per_query
from heads_jax.stats.step import make_analysis_step
from tests import reference_impl as ref

FAST = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SLOW = settings(FAST, max_examples=5)

seeds = st.integers(0, 2 ** 31 - 1)
batches = st.sampled_from([1, 3])
lengths = st.sampled_from([5, 8])
heads = st.sampled_from([(1, 2), (2, 1)])


def _case(seed, b, k, min_len=1):
  rng = np.random.default_rng(seed)
  return rng, ref.random_batch(rng, b, k, min_len=min_len)


@jax.jit
def _jit_scores(attn, batch):
  sieves = build_sieves(batch, B.ROLES)
  return (sieve_bias(attn, sieves, batch["attention_mask"], B.ROLES),
          distance_features(attn, batch["token_class"], batch["attention_mask"]),
          *sieve_bias_per_query(attn, sieves, batch["attention_mask"], B.ROLES))


_jit_distance = jax.jit(distance_features, static_argnames="per_query")


def _scores(attn, batch, per_query=False):
  """(sieve bias [b, l, h, r], distance [b, l, h, 21]) and with ``per_query`` also (beta
  [b, l, h, r, q], valid [b, r, q]); jitted: one compilation per shape, not one per op."""
  out = tuple(np.asarray(x) for x in _jit_scores(attn, batch))
  return out if per_query else out[:2]


def _pad(batch, attn, extra):
  """The same batch padded by ``extra`` more positions (attention 0 on the new keys and random
  junk on the new query rows, which must be ignored)."""
  b, k = batch["attention_mask"].shape
  out = B.empty_batch(b, k + extra)
  for f in B.BATCH_FIELDS:
    out[f][:, :k] = batch[f]
  if attn is None:
    return out, None
  big = np.random.default_rng(k).random(attn.shape[:3] + (k + extra, k + extra)).astype(np.float32)
  big[..., :k, :] = 0.0
  big[..., :k, :k] = attn
  return out, big


@pytest.mark.slow
@FAST
@given(seed=seeds, b=batches, k=lengths)
def test_uniform_attention_has_sieve_bias_one(seed, b, k):
  _, batch = _case(seed, b, k)
  mask = batch["attention_mask"].astype(bool)
  n = mask.sum(1)
  l, h = 2, 1
  uniform = np.where(mask[:, None, :], 1.0 / np.maximum(n, 1)[:, None, None], 0.0)   # [b, q, k]
  attn = np.broadcast_to(uniform[:, None, None], (b, l, h, k, k))
  attn = np.where(mask[:, None, None, :, None], attn, 0.7).astype(np.float32)  # junk on padding queries
  got, _, beta, valid = _scores(attn, batch, per_query=True)
  assert got.shape == (b, l, h, len(B.ROLES))
  for i in range(b):
    row = ref.row_of(batch, i)
    for j, role in enumerate(B.ROLES):
      defined = any(ref.sieve_sets(row, role))
      value = got[i, :, :, j]
      if not defined:
        assert np.isnan(value).all(), (i, role)
      elif role == "block":
        np.testing.assert_allclose(value, np.log(n[i]), rtol=1e-5, err_msg=role)
      else:
        np.testing.assert_allclose(value, 1.0, rtol=1e-5, err_msg=role)
  bare = [j for j, r in enumerate(B.ROLES) if r != "block"]
  beta = beta[:, :, :, bare]
  ok = np.broadcast_to(valid[:, None, None, bare], beta.shape)
  np.testing.assert_allclose(beta[ok], 1.0, rtol=1e-5)
  assert (beta[~ok] == 0).all()


@FAST
@given(seed=seeds, b=batches, k=lengths, lh=heads)
def test_distance_features_sum_to_one(seed, b, k, lh):
  rng, batch = _case(seed, b, k)
  attn = ref.random_attention(rng, batch["attention_mask"], *lh)
  mask = batch["attention_mask"]
  feats = np.asarray(_jit_distance(attn, batch["token_class"], mask))        # [b, l, h, 21]
  assert (feats >= 0).all()
  real = mask.sum(1) > 0
  np.testing.assert_allclose(feats[real].sum(-1), 1.0, rtol=1e-5)
  per_query = np.asarray(_jit_distance(attn, batch["token_class"], mask, per_query=True))
  q_real = np.broadcast_to(mask[:, None, None, :] > 0, per_query.shape[:-1])
  np.testing.assert_allclose(per_query.sum(-1)[q_real], 1.0, rtol=1e-5)
  assert (per_query[~q_real] == 0).all()                           # padding queries: nothing
  np.testing.assert_allclose(per_query.sum(3) / mask.sum(1)[:, None, None, None], feats,
                             rtol=1e-5, atol=1e-7)


@pytest.mark.slow
@FAST
@given(seed=seeds, b=st.sampled_from([2, 3]), k=lengths, data=st.data())
def test_scores_permute_with_the_batch_and_ignore_padding(seed, b, k, data):
  extra = 3                                                          # 5 -> 8, 8 -> 11
  rng, batch = _case(seed, b, k)
  attn = ref.random_attention(rng, batch["attention_mask"], 1, 2)
  perm = np.array(data.draw(st.permutations(range(b))))
  sb, dist = _scores(attn, batch)
  psb, pdist = _scores(attn[perm], {f: v[perm] for f, v in batch.items()})
  np.testing.assert_allclose(psb, sb[perm], rtol=1e-6, atol=1e-6, equal_nan=True)
  np.testing.assert_allclose(pdist, dist[perm], rtol=1e-6, atol=1e-7)
  padded, big = _pad(batch, attn, extra)
  lsb, ldist = _scores(big, padded)
  np.testing.assert_allclose(lsb, sb, rtol=1e-5, atol=1e-6, equal_nan=True)
  np.testing.assert_allclose(ldist, dist, rtol=1e-5, atol=1e-7)


# A large initialisation makes the attention peaked and input-dependent (at the default 0.02
# it is nearly uniform, and a model that let padding into the softmax would still pass).
CFG = config_for("tiny", vocab_size=2048, max_position_embeddings=32, initializer_range=0.5)


@pytest.fixture(scope="module")
def step():
  return make_analysis_step(BertModel(CFG, rngs=nnx.Rngs(3)))


@SLOW
@given(seed=seeds, b=st.sampled_from([3, 5]), data=st.data())
def test_analysis_step_permutes_with_the_batch_and_ignores_padding(step, seed, b, data):
  """Through the model: attention is masked, so a sequence's scores do not depend on the other
  rows of its batch nor on the padded length (k 10 -> 16)."""
  k, extra = 10, 6
  _, batch = _case(seed, b, k, min_len=3)
  perm = np.array(data.draw(st.permutations(range(b))))
  base = step(batch)
  shuffled = step({f: v[perm] for f, v in batch.items()})
  padded = step(_pad(batch, None, extra)[0])
  for key in ("sieve_bias", "distance"):
    assert base[key].shape[0] == b
    np.testing.assert_allclose(shuffled[key], base[key][perm], rtol=2e-5, atol=2e-6,
                               equal_nan=True, err_msg=key)
    np.testing.assert_allclose(padded[key], base[key], rtol=2e-5, atol=2e-6, equal_nan=True,
                               err_msg=key)
