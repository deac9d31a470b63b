"""Per-layer (XLA) and fused (Pallas, interpret mode) attention statistics against the loop
reference (tests/reference_impl.py) and the stand-alone statistics, and through the analysis
step on a real (tiny) BERT."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests import reference_impl as ref
from heads_jax.data import vocabulary as B
from heads_jax.errors import UserError
from heads_jax.model.bert import BertModel
from heads_jax.model.config import config_for
from heads_jax.parallel import data_mesh
from heads_jax.stats import fused, layerwise, measures
from heads_jax.stats.compiling import CompileLog
from heads_jax.stats import step as step_mod
from heads_jax.stats.step import (AUTO_STATS_IMPL, STACK_COPIES, STACK_MEMORY_SHARE,
                                  auto_stats_impl, default_stats_impl, make_analysis_step,
                                  stack_bytes)

ALL = ("sieve_bias", "distance", "entropy", "cls_entropy", "token_attention")


def _case(seed, b=7, k=12, h=3, e=8, min_len=1):
  """A reference batch (singles and pairs, padding, possibly an all-padding row) with random
  queries/keys and the probabilities of their masked softmax ``[b, h, q, k]`` (float64)."""
  rng = np.random.default_rng(seed)
  batch = ref.random_batch(rng, b, k, min_len=min_len)
  q = (1.5 * rng.normal(size=(b, k, h, e))).astype(np.float32)
  kk = (1.5 * rng.normal(size=(b, k, h, e))).astype(np.float32)
  mask = batch["attention_mask"] > 0
  s = np.einsum("bqhe,bkhe->bhqk", q.astype(np.float64), kk) / np.sqrt(e)
  s = np.where(mask[:, None, None, :], s, -np.inf)
  m = np.max(s, axis=-1, keepdims=True)
  ex = np.where(mask[:, None, None, :], np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
  p = ex / np.maximum(ex.sum(-1, keepdims=True), 1e-300)
  p = p * mask[:, None, :, None]
  return batch, q, kk, p


def _reference(batch, p, direction):
  """Loop reference for sieve bias / distance, stand-alone jnp functions for the measures."""
  attn = p[:, None]                                                    # [b, 1, h, q, k]
  out = {"sieve_bias": ref.sieve_bias(attn, batch, B.ROLES, direction)[:, 0],
         "distance": ref.distance_features(attn, batch)[:, 0]}
  got = measures.all_measures(attn.astype(np.float32), batch["token_class"], batch["attention_mask"])
  out.update({key: np.asarray(v)[:, 0] for key, v in got.items()})
  return out


def _finished(out, tables):
  """Per-layer output [b, h, ...] with the NaN of empty sieves (``layerwise.finish``)."""
  stacked = {key: v[:, None] for key, v in out.items()}
  return {key: np.asarray(v)[:, 0] for key, v in layerwise.finish(stacked, tables).items()}


def _check(got, want, rtol=1e-5, atol=1e-6):
  assert set(want) <= set(got)
  for key in want:
    np.testing.assert_array_equal(np.isnan(got[key]), np.isnan(want[key]), err_msg=key)
    np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=atol, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["dep2head", "both"])
def test_layerwise_equals_reference(direction):
  batch, _, _, p = _case(0)
  assert (batch["attention_mask"].sum(1) < batch["attention_mask"].shape[1]).any()  # padding
  assert (batch["token_type_ids"] == 1).any() and (batch["token_type_ids"].max(1) == 0).any()
  tables = layerwise.batch_tables(batch, B.ROLES, direction, measures=True)
  out = jax.jit(lambda p, t: layerwise.reduce_layer(p, t, B.ROLES, batch["attention_mask"], True))(
      p.astype(np.float32), tables)
  _check(_finished(out, tables), _reference(batch, p, direction))


@pytest.mark.parametrize("direction", ["dep2head", "both"])
def test_fused_kernel_equals_reference(direction):
  batch, q, kk, p = _case(1)
  tables = fused.fused_tables(batch, B.ROLES, direction, measures=True)
  out = jax.jit(lambda q, k, t: fused.fused_layer_stats(q, k, t, B.ROLES, direction, True,
                                                        interpret=True))(q, kk, tables)
  _check(_finished(out, tables), _reference(batch, p, direction))


@pytest.mark.slow
def test_fused_kernel_padded_to_power_of_two_in_query_blocks():
  """The GPU layout: sequence padded 12 -> 16, four programs of 4 queries per head."""
  batch, q, kk, p = _case(2, b=3, k=12, h=2)
  tables = fused.fused_tables(batch, B.ROLES, measures=True, pad_pow2=True)
  assert tables["info"].shape[-1] == 16 and tables["weights"].shape[1] == 64
  out = jax.jit(lambda q, k, t: fused.fused_layer_stats(q, k, t, B.ROLES, measures=True,
                                                        block_q=4, interpret=True))(q, kk, tables)
  _check(_finished(out, tables), _reference(batch, p, "dep2head"))


@pytest.mark.slow
def test_fused_kernel_role_subset_and_bfloat16_inputs():
  batch, q, kk, _ = _case(3, b=4, k=10, min_len=4)
  roles = ("sep", "block", "obj", "local")
  q16, k16 = q.astype(jnp.bfloat16), kk.astype(jnp.bfloat16)
  # the reference on the bfloat16-rounded inputs: the kernel accumulates the scores in float32
  _, _, _, p = _case(3, b=4, k=10, min_len=4)
  s = np.einsum("bqhe,bkhe->bhqk", np.asarray(q16, np.float64), np.asarray(k16, np.float64))
  mask = batch["attention_mask"] > 0
  s = np.where(mask[:, None, None, :], s / np.sqrt(q.shape[-1]), -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p = p / p.sum(-1, keepdims=True) * mask[:, None, :, None]
  tables = fused.fused_tables(batch, roles)
  out = fused.fused_layer_stats(q16, k16, tables, roles, interpret=True)
  assert set(out) == {"sieve_bias", "distance"} and out["sieve_bias"].shape == (4, 3, 4)
  want = ref.sieve_bias(p[:, None], batch, roles)[:, 0]
  _check(_finished(out, tables), {"sieve_bias": want})


@pytest.mark.slow
def test_filler_row_gives_nan_and_zeros():
  batch, q, kk, _ = _case(4, b=3, k=8, min_len=3)
  for f, v in B.empty_batch(1, 8).items():
    batch[f] = np.concatenate([batch[f], v])
  q = np.concatenate([q, q[:1]])
  kk = np.concatenate([kk, kk[:1]])
  tables = fused.fused_tables(batch, B.ROLES, measures=True)
  out = _finished(fused.fused_layer_stats(q, kk, tables, B.ROLES, measures=True,
                                          interpret=True), tables)
  assert np.isnan(out["sieve_bias"][3]).all()
  for key in ALL[1:]:
    assert np.all(np.isfinite(out[key][:3])) and np.all(out[key][3] == 0), key


# -- through the analysis step, with a real (tiny) BERT ------------------------------------------

@pytest.fixture(scope="module")
def tiny_bert():
  cfg = config_for("tiny", vocab_size=2048, max_position_embeddings=32)
  model = BertModel(cfg, rngs=nnx.Rngs(1))
  # sharper attention than the 0.02 initialisation gives (nearly uniform rows test little)
  for layer in model.layers:
    layer.attention.query.kernel[...] = layer.attention.query.kernel[...] * 40
  return model


@pytest.fixture(scope="module")
def step_batch():
  return ref.random_batch(np.random.default_rng(5), 6, 16, min_len=2)


@pytest.fixture(scope="module")
def stacked(tiny_bert, step_batch):
  return make_analysis_step(tiny_bert, measures=True, stats_impl="stacked")(step_batch)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["layerwise", "fused"])
def test_step_paths_equal_stacked_on_8_devices(tiny_bert, step_batch, stacked, impl):
  assert len(jax.devices()) == 8
  step = make_analysis_step(tiny_bert, measures=True, stats_impl=impl)
  assert step.stats_impl == impl
  got = step(step_batch)
  assert set(got) == set(stacked)
  _check(got, stacked, rtol=1e-5, atol=1e-6)
  # and the stand-alone path itself against the loop reference, on the model's attention
  graphdef, state = nnx.split(tiny_bert)
  attn = np.asarray(jax.jit(lambda st, b: nnx.merge(graphdef, st)(
      b["input_ids"], b["attention_mask"], b["token_type_ids"], return_attentions=True)
      ["attentions"])(state, step_batch), np.float64)
  assert attn.max() > 0.5  # some peaked rows
  np.testing.assert_allclose(got["sieve_bias"], ref.sieve_bias(attn, step_batch, B.ROLES),
                             rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_fused_step_one_device_and_gates(tiny_bert, step_batch, stacked):
  one = data_mesh(jax.devices()[:1])
  got = make_analysis_step(tiny_bert, measures=True, stats_impl="fused", mesh=one)(step_batch)
  _check(got, stacked)
  gate = np.ones((2, 4), np.float32)
  gate[1, 2] = 0.0
  for mode in ("remove", "uniform"):  # "uniform" falls back to the per-layer XLA path
    want = make_analysis_step(tiny_bert, stats_impl="stacked", gate_mode=mode)(step_batch, gate)
    got = make_analysis_step(tiny_bert, stats_impl="fused", gate_mode=mode)(step_batch, gate)
    _check(got, want)
  sb = got["sieve_bias"][:, 1, 2]            # uniform head: bias 1 on every non-block role
  plain = [B.ROLES.index(r) for r in B.ROLES if r != "block"]
  np.testing.assert_allclose(sb[:, plain][~np.isnan(sb[:, plain])], 1.0, rtol=1e-5)


def test_js_and_plain_callables_take_the_stacked_path(tiny_bert):
  assert make_analysis_step(tiny_bert, js=True).stats_impl == "stacked"
  assert make_analysis_step(tiny_bert).stats_impl == "layerwise"  # CPU default
  with pytest.raises(ValueError, match="stats_impl"):
    make_analysis_step(tiny_bert, stats_impl="flash")


def test_bfloat16_compute_is_close_to_float32(tiny_bert, step_batch, stacked):
  got = make_analysis_step(tiny_bert, measures=True, compute_dtype="bfloat16")(step_batch)
  assert tiny_bert.config.dtype == "float32"  # the model itself is unchanged
  finite = ~np.isnan(stacked["sieve_bias"])
  np.testing.assert_array_equal(np.isnan(got["sieve_bias"]), ~finite)
  err = np.abs(got["sieve_bias"][finite] - stacked["sieve_bias"][finite])
  assert 0 < err.max() < 0.1 * np.abs(stacked["sieve_bias"][finite]).max()


# ------------------------------------------------------------------------------------------------
# The role registry: a role added to the registry alone reaches the sieves, the reference
# statistics, the per-layer path and the kernel.

FAKE_ROLES = (
    B.Role("prev3", B.COARSE_LOCAL, B.SIEVE_OFFSETS, "#000000", "prev3", "three previous tokens",
           offsets=(-3, -1)),
    B.Role("subj_obj", B.COARSE_SYNTACTIC, B.SIEVE_RELATION, "#000001", "subj_obj",
           "nsubj or obj", relations=(B.REL_NSUBJ, B.REL_OBJ)),
    B.Role("sep_h", None, B.SIEVE_KEYS, "#000002", "sep_h", "[SEP] x entropy",
           keys=(B.KEY_SEP,), entropy_weighted=True),
)


def _fake_reference(batch, p, direction, roles):
  """Loop reference of the fake roles: S(t) spelled out here, beta(t) by ref.token_biases."""
  attn = np.asarray(p, np.float64)                                     # [b, h, q, k]
  b, h = attn.shape[:2]
  out = np.full((b, h, len(roles)), np.nan)
  for i in range(b):
    row = ref.row_of(batch, i)
    n = int(row["attention_mask"].sum())
    for j, name in enumerate(roles):
      if name == "prev3":
        sets = [{x for x in range(t - 3, t) if x >= 0} for t in range(n)]
      elif name == "subj_obj":
        sets = [a | o for a, o in zip(ref.sieve_sets(row, "nsubj", direction),
                                      ref.sieve_sets(row, "obj", direction))]
      else:
        sets = ref.sieve_sets(row, "sep", direction)
      for hi in range(h):
        vals = [v for v in ref.token_biases(attn[i, hi], sets, name == "sep_h") if v is not None]
        if vals:
          out[i, hi, j] = np.mean(vals)
  return out


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["dep2head", "both"])
def test_a_new_registry_role_reaches_sieves_reference_and_kernel(monkeypatch, direction):
  for role in FAKE_ROLES:
    monkeypatch.setitem(B.ROLE_TABLE, role.name, role)
  roles = ("prev3", "subj_obj", "sep_h", "local")
  batch, q, kk, p = _case(3, b=5, k=10, h=2)
  want = _fake_reference(batch, p, direction, roles[:3])
  # the reference statistics (heads_jax.sieves + heads_jax.stats.sieve_bias)
  from heads_jax import sieves
  from heads_jax.stats import sieve_bias
  sv = sieves.build_sieves(batch, roles, direction)
  got = np.asarray(sieve_bias.sieve_bias(p[:, None].astype(np.float32), sv,
                                         batch["attention_mask"], roles))[:, 0]
  _check({"sieve_bias": got[..., :3]}, {"sieve_bias": want}, rtol=1e-4, atol=1e-5)
  # the kernel, all of them
  tables = fused.fused_tables(batch, roles, direction)
  out = fused.fused_layer_stats(jnp.asarray(q), jnp.asarray(kk), tables, roles, direction,
                                interpret=True)
  _check({"sieve_bias": _finished(out, tables)["sieve_bias"][..., :3]}, {"sieve_bias": want},
         rtol=1e-4, atol=1e-5)
  # the per-layer path, for the roles it supports (entropy weighting only on block sieves)
  sub = roles[:2]
  tables = layerwise.batch_tables(batch, sub, direction)
  out = layerwise.reduce_layer(p.astype(np.float32), tables, sub, batch["attention_mask"])
  _check({"sieve_bias": _finished(out, tables)["sieve_bias"]}, {"sieve_bias": want[..., :2]},
         rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="per-layer path weights only 'block' sieves"):
    t = layerwise.batch_tables(batch, ("sep_h",), direction)
    layerwise.reduce_layer(p.astype(np.float32), t, ("sep_h",), batch["attention_mask"])


def test_kernel_refuses_a_role_it_does_not_implement(monkeypatch):
  class Unknown(B.Role):
    kernel = property(lambda self: 99)

  monkeypatch.setitem(B.ROLE_TABLE, "odd", Unknown("odd", None, B.SIEVE_OFFSETS, "#000000", "odd",
                                                   "odd", offsets=(0, 0)))
  batch, q, kk, _ = _case(4, b=2, k=6)
  with pytest.raises(ValueError, match="role 'odd' has kernel code 99, which the fused Pallas "
                                       "kernel does not implement"):
    fused.fused_tables(batch, ("local", "odd"))
  # a key set without its column of E (as after adding a key kind to the registry only)
  monkeypatch.delitem(fused._KEY_COLUMNS, frozenset({B.KEY_POSITION0, B.KEY_SEP}))
  with pytest.raises(ValueError, match="fused Pallas kernel has no column for the key set"):
    fused.kernel_roles(("delimiter",))
  with pytest.raises(ValueError, match="unknown role"):
    fused.kernel_roles(("nope",))


# -- which path: auto per platform, the run-time fallback, one program per configuration --------

def test_auto_per_platform_and_the_environment_override(tiny_bert, monkeypatch):
  monkeypatch.delenv("HEADS_JAX_STATS_IMPL", raising=False)
  # the fastest path measured per platform; "fused" (slowest on the H200) is no default anywhere
  assert [default_stats_impl(p) for p in ("cuda", "rocm", "gpu", "tpu", "cpu")] == [
      "stacked", "stacked", "stacked", "layerwise", "layerwise"]
  assert "fused" not in AUTO_STATS_IMPL.values()
  monkeypatch.setenv("HEADS_JAX_STATS_IMPL", "stacked")
  assert make_analysis_step(tiny_bert).stats_impl == "stacked"
  assert make_analysis_step(tiny_bert, stats_impl="layerwise").stats_impl == "layerwise"
  monkeypatch.setenv("HEADS_JAX_STATS_IMPL", "flash")
  with pytest.raises((ValueError, UserError), match="HEADS_JAX_STATS_IMPL.*must be one of"):
    make_analysis_step(tiny_bert)   # heads_jax.env refuses it (UserError), or the step does


GIB = 2 ** 30


def test_stack_bytes_are_the_issues_figures():
  """BERT-base's float32 stack: 0.3 GB at 32 x 128, 4.8 GB at 32 x 512 (issue 35)."""
  assert stack_bytes(32, 12, 12, 128) == 4 * 32 * 12 * 12 * 128 * 128
  assert round(stack_bytes(32, 12, 12, 128) / 1e9, 1) == 0.3
  assert round(stack_bytes(32, 12, 12, 512) / 1e9, 1) == 4.8


@pytest.mark.parametrize("platform, batch, length, memory, want", [
    ("cuda", 32, 128, 80 * GIB, "stacked"),       # H100: 0.3 GB stack
    ("cuda", 128, 128, 80 * GIB, "stacked"),      # the issue's benchmark batch: 1.2 GB
    ("cuda", 32, 512, 80 * GIB, "stacked"),       # 4.8 GB, 3 copies within half of 80 GiB
    ("cuda", 256, 512, 80 * GIB, "kernel"),       # 38.7 GB stack, 3.2 GB a layer: map-free
    ("cuda", 32, 512, 16 * GIB, "kernel"),        # a 16 GB card: no stack, 0.4 GB a layer
    ("cuda", 32, 512, None, "stacked"),           # memory unknown: the measured default
    ("tpu", 8, 128, 16 * GIB, "layerwise"),
    ("tpu", 2, 2048, 16 * GIB, "kernel"),         # 0.4 GB a layer
    ("cpu", 32, 128, None, "layerwise"),
    ("cpu", 8, 512, None, "layerwise"),           # 0.1 GB a layer (a 128-budget batch at 512)
    ("cpu", 1, 8192, None, "kernel"),             # one long document: 3.2 GB a layer
])
def test_auto_takes_the_stack_while_it_fits(platform, batch, length, memory, want, monkeypatch):
  monkeypatch.delenv("HEADS_JAX_STATS_IMPL", raising=False)
  got = auto_stats_impl(platform, batch=batch, layers=12, heads=12, length=length,
                        memory_bytes=memory)
  assert got == want
  # a forced path is taken whatever the memory
  monkeypatch.setenv("HEADS_JAX_STATS_IMPL", "stacked")
  assert auto_stats_impl(platform, batch=batch, layers=12, heads=12, length=length,
                         memory_bytes=memory) == "stacked"


@pytest.mark.slow
def test_auto_step_chooses_per_batch_shape(tiny_bert, step_batch, stacked, monkeypatch):
  """A step under ``auto`` on a platform whose default is the stack (the GPU's table, applied
  to this CPU) takes "layerwise" for a batch whose stack exceeds the memory it plans with, with
  the same numbers; an explicit path is never switched."""
  monkeypatch.delenv("HEADS_JAX_STATS_IMPL", raising=False)
  monkeypatch.setitem(AUTO_STATS_IMPL, "cpu", "stacked")
  l, h = tiny_bert.config.num_layers, tiny_bert.config.num_heads
  # 8 devices: 6 rows -> 1 per device; the budget holds a stack of 16 positions, not of 32
  memory = int(STACK_COPIES * stack_bytes(1, l, h, 16) / STACK_MEMORY_SHARE)
  step = make_analysis_step(tiny_bert, measures=True, memory_bytes=memory)
  assert step.stats_impl == "stacked"
  assert step.path_for(8, 16) == "stacked" and step.path_for(8, 32) == "layerwise"
  assert step.path_for(16, 16) == "layerwise"   # 2 rows per device
  _check(step(step_batch), stacked)               # [6, 16]: stacked
  wide = {f: np.concatenate([v, B.empty_batch(6, 16)[f]], 1) for f, v in step_batch.items()}
  got = step(wide)                                # [6, 32]: layerwise, same rows
  _check({k: v for k, v in got.items()}, stacked)
  forced = make_analysis_step(tiny_bert, stats_impl="stacked", memory_bytes=memory)
  assert forced.path_for(8, 32) == "stacked"
  # where one layer's maps would not fit either, the map-free kernel (it packs too), same numbers
  monkeypatch.setattr(step_mod, "LAYER_MAP_BYTES", stack_bytes(1, 1, h, 16))
  assert step.path_for(8, 16) == "stacked" and step.path_for(8, 32) == "kernel"
  assert step.packs and step.packs_for(8, 16) and step.packs_for(8, 32)
  _check(step(wide), stacked)


def test_steps_of_one_configuration_share_one_compiled_program(step_batch):
  cfg = config_for("tiny", vocab_size=2048, max_position_embeddings=32)
  a, b = BertModel(cfg, rngs=nnx.Rngs(2)), BertModel(cfg, rngs=nnx.Rngs(3))
  step_a, step_b = make_analysis_step(a), make_analysis_step(b)
  assert step_a.program("layerwise") is step_b.program("layerwise")
  # [6, 20]: a shape no other test compiles (step_batch padded with 4 positions)
  batch = {f: np.concatenate([v, B.empty_batch(6, 4)[f]], 1) for f, v in step_batch.items()}
  with CompileLog() as log:
    got_a, got_b = step_a(batch), step_b(batch)
    step_a(batch)
  assert log.count("analysis_pass") == 1          # one compilation for both steps
  assert not np.allclose(got_a["distance"], got_b["distance"])   # each with its own weights
  np.testing.assert_allclose(got_a["distance"], make_analysis_step(a, stats_impl="stacked")(
      batch)["distance"], rtol=1e-5, atol=1e-6)
  assert make_analysis_step(a, measures=True).program("layerwise") is not step_a.program(
      "layerwise")  # other options
