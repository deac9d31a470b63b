"""The jitted, data-parallel analysis step and the streaming collector / scores.npz."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests import reference_impl as ref
from heads_jax.data import vocabulary as B
from heads_jax.parallel import data_mesh
from heads_jax.stats.collector import collect
from heads_jax.stats.step import make_analysis_step


class PlantedAttention(nnx.Module):
  """A stand-in with the model API: bilinear attention from token embeddings, masked softmax.

  Its attentions depend on parameters and input ids; ``gate_mode="uniform"`` mixes each head
  with uniform attention over real keys, as the model API says.
  """

  def __init__(self, l=2, h=3, d=4, vocab=2048, *, rngs: nnx.Rngs):
    self.l, self.h = l, h
    self.q = nnx.Param(jax.random.normal(rngs.params(), (vocab, l, h, d)))
    self.k = nnx.Param(jax.random.normal(rngs.params(), (vocab, l, h, d)))

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, head_gate=None,
               gate_mode="remove", return_attentions=False, deterministic=True):
    mask = jnp.asarray(attention_mask).astype(bool)
    scores = jnp.einsum("bqlhd,bklhd->blhqk", self.q[...][input_ids], self.k[...][input_ids])
    scores = jnp.where(mask[:, None, None, None, :], scores, -1e9)
    attn = jax.nn.softmax(scores, axis=-1)
    if head_gate is not None and gate_mode == "uniform":
      uniform = mask / mask.sum(-1, keepdims=True)
      g = head_gate[None, :, :, None, None]
      attn = g * attn + (1 - g) * uniform[:, None, None, None, :]
    attn = attn * mask[:, None, None, :, None]
    out = {"last_hidden_state": jnp.zeros(input_ids.shape + (4,))}
    if return_attentions:
      out["attentions"] = attn
    return out


@pytest.fixture(scope="module")
def case():
  rng = np.random.default_rng(0)
  return ref.random_batch(rng, 5, 12, min_len=3)


@pytest.fixture(scope="module")
def planted():
  return PlantedAttention(rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_step_matches_reference_on_8_devices(case, planted):
  assert len(jax.devices()) == 8
  step = make_analysis_step(planted)
  out = step(case)
  assert set(out) == {"sieve_bias", "distance"}  # no attention map comes back
  assert out["sieve_bias"].shape == (5, 2, 3, len(B.ROLES)) and out["distance"].shape == (5, 2, 3, 21)
  assert isinstance(out["sieve_bias"], np.ndarray) and out["sieve_bias"].dtype == np.float32
  attn = np.asarray(planted(case["input_ids"], case["attention_mask"], return_attentions=True)
                    ["attentions"], np.float64)
  np.testing.assert_allclose(out["sieve_bias"], ref.sieve_bias(attn, case, B.ROLES), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out["distance"], ref.distance_features(attn, case), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_8_devices_equal_1_device(case, planted):
  eight = make_analysis_step(planted, direction="both")(case)
  one = make_analysis_step(planted, direction="both", mesh=data_mesh(jax.devices()[:1]))(case)
  for key in eight:
    np.testing.assert_allclose(eight[key], one[key], rtol=1e-6, atol=1e-7)


def test_head_gate_passthrough(case, planted):
  step = make_analysis_step(planted, roles=("local", "block_plain", "cls"), gate_mode="uniform")
  gated = step(case, head_gate=np.zeros((2, 3), np.float32))
  # all heads uniform over real keys -> beta(t) = 1 for every role with a sieve
  sb = gated["sieve_bias"]
  np.testing.assert_allclose(sb[~np.isnan(sb)], 1.0, rtol=1e-5)
  kept = step(case, head_gate=np.ones((2, 3), np.float32))
  np.testing.assert_allclose(kept["sieve_bias"], step(case)["sieve_bias"], rtol=1e-6)
  assert not np.allclose(np.nan_to_num(kept["sieve_bias"]), np.nan_to_num(sb))


def test_plain_callable_model(case, planted):
  fn = lambda *a, **kw: planted(*a, **kw)  # noqa: E731  not an nnx.Module
  np.testing.assert_allclose(make_analysis_step(fn, roles=("sep",))(case)["sieve_bias"],
                             make_analysis_step(planted, roles=("sep",))(case)["sieve_bias"], rtol=1e-6)


@pytest.fixture(scope="module")
def tiny_bert():
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  cfg = config_for("tiny", vocab_size=2048, max_position_embeddings=32)
  return BertModel(cfg, rngs=nnx.Rngs(1))


@pytest.mark.slow
def test_real_tiny_bert_8_vs_1_device_and_reference(tiny_bert):
  batch = ref.random_batch(np.random.default_rng(2), 3, 16, min_len=4)
  eight = make_analysis_step(tiny_bert)(batch)
  one = make_analysis_step(tiny_bert, mesh=data_mesh(jax.devices()[:1]))(batch)
  for key in eight:
    np.testing.assert_allclose(eight[key], one[key], rtol=1e-5, atol=1e-6)
  graphdef, state = nnx.split(tiny_bert)
  forward = jax.jit(lambda st, ids, m, tt: nnx.merge(graphdef, st)(
      ids, m, tt, return_attentions=True)["attentions"])
  attn = np.asarray(forward(state, batch["input_ids"], batch["attention_mask"],
                            batch["token_type_ids"]), np.float64)
  np.testing.assert_allclose(eight["sieve_bias"], ref.sieve_bias(attn, batch, B.ROLES), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(eight["distance"], ref.distance_features(attn, batch), rtol=1e-4, atol=1e-6)


class _TaskModel(nnx.Module):
  """Like BertForSequenceClassification: the encoder is ``.bert``; its own call must not run."""

  def __init__(self, bert):
    self.bert = bert

  def __call__(self, *args, **kwargs):
    raise AssertionError("the analysis step must call the encoder, not the task model")


def test_task_model_is_analysed_through_its_encoder(case, planted):
  via_task = make_analysis_step(_TaskModel(planted), roles=("local",))(case)["sieve_bias"]
  direct = make_analysis_step(planted, roles=("local",))(case)["sieve_bias"]
  np.testing.assert_allclose(via_task, direct, rtol=1e-6)


def test_bad_batch_errors(case, planted):
  step = make_analysis_step(planted, roles=("local",))
  with pytest.raises(KeyError, match="token_class"):
    step({f: v for f, v in case.items() if f != "token_class"})
  with pytest.raises(ValueError, match="shape"):
    step(dict(case, dep_rel=case["dep_rel"][:, :3]))
  with pytest.raises(ValueError, match="gate_mode"):
    make_analysis_step(planted, gate_mode="zero")


# ---------------------------------------------------------------------------------------------
# collector and scores.npz


def _batches(data, order, size):
  for start in range(0, len(order), size):
    idx = order[start:start + size]
    yield idx, {f: v[idx] for f, v in data.items()}


@pytest.fixture(scope="module")
def dataset():
  return ref.random_batch(np.random.default_rng(4), 11, 12, min_len=2)


def test_collect_in_dataset_order(dataset, planted):
  step = make_analysis_step(planted, roles=("local", "cls", "obj"))
  order = np.random.default_rng(0).permutation(11)
  got = collect(step, _batches(dataset, order, 4), 11, progress=False)
  whole = step(dataset)
  assert got["roles"] == ("local", "cls", "obj")
  np.testing.assert_allclose(got["sieve_bias"], whole["sieve_bias"], rtol=1e-6)
  np.testing.assert_allclose(got["distance"], whole["distance"], rtol=1e-6)
  np.testing.assert_array_equal(got["lengths"], dataset["attention_mask"].sum(-1))
  # a plain callable step (no .submit) gives the same
  plain = collect(lambda b: step(b), _batches(dataset, order, 3), 11, roles=step.roles, progress=False)
  np.testing.assert_allclose(plain["sieve_bias"], got["sieve_bias"], rtol=1e-6)


def test_collect_skips_filler_rows(dataset, planted):
  """Index -1 marks a filler row (iter_batches with pad_to_batch_size): its results are dropped."""
  step = make_analysis_step(planted, roles=("local",))
  filler = B.empty_batch(2, 12)
  padded = {f: np.concatenate([v, filler[f]]) for f, v in dataset.items()}  # rows 11, 12: filler

  def batches():
    for idx in (np.array([3, 0, 11, 1]), np.array([2, 4, 5, 6]), np.array([7, 8, 9, 10]),
                np.array([12, 11, 12, 11])):
      yield np.where(idx >= 11, -1, idx), {f: v[idx] for f, v in padded.items()}
  got = collect(step, batches(), 11, progress=False)
  np.testing.assert_allclose(got["sieve_bias"], step(dataset)["sieve_bias"], rtol=1e-6)


def test_collect_rejects_missing_and_duplicate_indices(dataset, planted):
  step = make_analysis_step(planted, roles=("local",))
  with pytest.raises(ValueError, match="never came"):
    collect(step, _batches(dataset, np.arange(9), 4), 11, progress=False)
  partial = collect(step, _batches(dataset, np.arange(9), 4), 11, progress=False, allow_missing=True)
  assert np.isnan(partial["sieve_bias"][9:]).all() and (partial["lengths"][9:] == 0).all()
  with pytest.raises(ValueError, match="came twice"):
    collect(step, _batches(dataset, np.array([0, 1, 2, 3, 3, 4]), 3), 11, progress=False)
  with pytest.raises(ValueError, match=r"\[0, 5\)"):
    collect(step, _batches(dataset, np.arange(8), 4), 5, progress=False)


def test_collector_module_imports_no_jax():
  code = ("import sys; import heads_jax.stats.collector; "
          "assert 'jax' not in sys.modules, 'collector imported jax'")
  subprocess.run([sys.executable, "-c", code], check=True)


def test_sieves_never_import_the_model():
  code = ("import sys; import heads_jax.sieves; "
          "assert not [m for m in sys.modules if m.startswith('heads_jax.model')]")
  subprocess.run([sys.executable, "-c", code], check=True)
