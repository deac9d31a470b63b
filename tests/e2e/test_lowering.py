"""Every jitted program a user can reach, lowered for TPU and for CUDA GPUs on the CPU.

``jax.export`` lowers a jitted function for another platform without a device of it
(``platforms=["tpu"]`` / ``["cuda"]``); the arguments are ``jax.ShapeDtypeStruct`` only, so
nothing of BERT-base is allocated, and batches are split over an abstract mesh of 8 devices
(``AbstractMesh``: a TPU v3-8, or 8 GPUs) with the state replicated, as the real runs place them.
Lowering is a trace plus StableHLO emission, not an XLA compilation: what it catches is a
primitive or a Pallas kernel that has no lowering for the platform, or a sharding the platform
cannot express (the fused statistics kernel failed exactly this way for ``cuda`` before it got
Triton compiler parameters).

Programs: the pre-training step (BERT-base, phase 1 and phase 2 shapes), the fine-tuning and
evaluation steps (BERT-base classifier), the analysis step with each ``stats_impl`` and with
what ``auto`` picks per platform, the ablation evaluator and the head-example pass.

Left to a real device (named here, not testable on the CPU): cuDNN flash attention
(``attention="cudnn"``, what ``auto`` takes for bfloat16 on a GPU where no probabilities are
needed) asks the CUDA runtime for cuDNN while lowering ("cuDNN is not detected"), so it cannot
be lowered without a GPU (``test_cudnn_attention_needs_a_real_gpu`` checks that this is the only
reason); ``heads-jax doctor`` runs it on the user's GPU. Also left: whether Triton compiles the
kernel's StableHLO on a given GPU (only an explicit ``stats_impl="fused"`` takes the kernel).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import export
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

from heads_jax.configs import finetune as finetune_configs
from heads_jax.configs import pretrain as pretrain_configs
from heads_jax.data.vocabulary import BATCH_FIELDS, ROLES
from heads_jax.model.checkpoint import build_model
from heads_jax.model.config import config_for
from heads_jax.parallel import DATA_AXIS
from heads_jax.stats import step as analysis
from heads_jax.stats.examples import attention_maps_program
from heads_jax.stats.norms import norm_program
from heads_jax.training import steps
from heads_jax.training.job import ARCHITECTURES, make_tx

PLATFORMS = ("tpu", "cuda")
DEVICES = 8
# Auto axes: what parallel.data_mesh's Mesh has (newer jax makes an AbstractMesh's axes Explicit,
# and the embedding gather then asks for an out_sharding).
MESH = AbstractMesh((DEVICES,), (DATA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
REPLICATED = NamedSharding(MESH, P())
SHARDED = NamedSharding(MESH, P(DATA_AXIS))
# The analysis programs for "cuda" are built and exported on an abstract GPU mesh: newer jax
# lowers a Pallas (Triton) call without a GPU only for an abstract GPU device.
GPU_MESH = MESH.update(abstract_device=jax.sharding.AbstractDevice(
    device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu"))
# Mosaic (TPU Pallas) lowers only for a TPU device kind: kernel v2's TPU wrapper is exported on an
# abstract TPU mesh.
TPU_MESH = MESH.update(abstract_device=jax.sharding.AbstractDevice(
    device_kind="TPU v5 lite", num_cores=1, platform="tpu"))
# The kernel's Triton call: a custom call without a compatibility guarantee (allowed here; the
# exported artifact is never stored).
TRITON = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
S = jax.ShapeDtypeStruct


def lower(fn, platform, *args, **kwargs) -> export.Exported:
  """``jax.export`` of the jitted ``fn`` for ``platform`` (the test fails if it does not lower)."""
  return export.export(fn, platforms=[platform], disabled_checks=[TRITON])(*args, **kwargs)


def check_exported(exp: export.Exported, platform: str, devices: int = DEVICES) -> str:
  """The module text, after checking platform, device count and that the batch is sharded."""
  assert exp.platforms == (platform,)
  assert exp.nr_devices == devices
  text = exp.mlir_module()
  if devices > 1:
    assert f'[{{"{DATA_AXIS}"}}' in text  # some argument or result split over the data axis
  return text


def abstract(tree, sharding=REPLICATED):
  return jax.tree.map(lambda x: S(x.shape, x.dtype, sharding=sharding), tree)


def _concrete(x):
  """A small concrete leaf for the non-parameter state a step closes over (rng keys, counts)."""
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    return jax.random.key(0)
  return jnp.zeros(x.shape, x.dtype)


def abstract_parts(architecture: str, cfg, num_labels=None):
  """``(parts, params)`` of a model built with ``nnx.eval_shape``: abstract parameters, concrete
  (tiny) rng state, as ``steps.split_model`` gives the training steps."""
  model = nnx.eval_shape(lambda: build_model(architecture, cfg, num_labels, seed=0))
  parts, params = steps.split_model(model)
  parts.rng_state = jax.tree.map(_concrete, parts.rng_state)
  parts.rest = jax.tree.map(_concrete, parts.rest)
  return parts, params


def text_batch(b, k, labels=False):
  """``input_ids``, ``attention_mask``, ``token_type_ids`` ``[b, k]`` (and ``labels`` ``[b]``)."""
  out = {f: S((b, k), jnp.int32, sharding=SHARDED)
         for f in ("input_ids", "attention_mask", "token_type_ids")}
  if labels:
    out["labels"] = S((b,), jnp.int32, sharding=SHARDED)
  return out


# ------------------------------------------------------------------------------------------------
# Training

@functools.lru_cache(maxsize=None)
def pretraining_program(preset: str):
  c = pretrain_configs.get_config(preset)
  cfg = config_for(c.model.size, vocab_size=30522, dtype=c.model.dtype,
                   attention_dropout=c.model.attention_dropout,
                   max_position_embeddings=c.model.max_position_embeddings,
                   dropout_bits=c.model.get("dropout_bits", 32))
  parts, params = abstract_parts(ARCHITECTURES["pretraining"], cfg)
  tx, schedule = make_tx(c)
  state = abstract(jax.eval_shape(lambda p: steps.init_train_state(p, tx), params))
  step = steps.make_train_step(parts, tx, steps.pretraining_loss, mesh=MESH, schedule=schedule,
                               accumulate_steps=c.optimizer.accumulate_steps)
  b, q, p = c.batch_size, c.data.max_seq_length, c.data.max_predictions
  batch = text_batch(b, q)
  batch.update(masked_positions=S((b, p), jnp.int32, sharding=SHARDED),
               masked_ids=S((b, p), jnp.int32, sharding=SHARDED),
               masked_weights=S((b, p), jnp.float32, sharding=SHARDED),
               next_sentence_label=S((b,), jnp.int32, sharding=SHARDED))
  return step, state, batch, (b, q, p)


@pytest.mark.slow
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("preset,shape", [("bert_base_phase1", (256, 128, 20)),
                                          ("bert_base_phase2", (256, 512, 80))])
def test_pretraining_step_lowers(platform, preset, shape):
  step, state, batch, got_shape = pretraining_program(preset)
  assert got_shape == shape  # the paper's two phases (configs/pretrain.py)
  exp = lower(step, platform, state, batch)
  check_exported(exp, platform)
  out_state, metrics = jax.tree.unflatten(exp.out_tree, exp.out_avals)
  assert jax.tree.structure(out_state) == jax.tree.structure(state)
  assert {"loss", "mlm_loss", "nsp_loss", "grad_norm", "learning_rate"} <= set(metrics)


@functools.lru_cache(maxsize=None)
def finetuning_programs():
  c = finetune_configs.get_config("mrpc")
  cfg = config_for(c.model.size, vocab_size=30522, dtype=c.model.dtype,
                   attention_dropout=c.model.attention_dropout)
  parts, params = abstract_parts(ARCHITECTURES["classification"], cfg, 2)
  tx, schedule = make_tx(c)
  state = abstract(jax.eval_shape(lambda p: steps.init_train_state(p, tx), params))
  train = steps.make_train_step(parts, tx, steps.classification_loss, mesh=MESH,
                                schedule=schedule)
  evaluate = steps.make_eval_step(parts, steps.classification_loss, mesh=MESH,
                                  with_predictions=True)
  train_batch = text_batch(c.batch_size, c.data.max_seq_length, labels=True)
  eval_batch = text_batch(c.eval_batch_size, c.data.max_seq_length, labels=True)
  eval_batch["weights"] = S((c.eval_batch_size,), jnp.float32, sharding=SHARDED)
  return train, evaluate, state, train_batch, eval_batch


@pytest.mark.slow
@pytest.mark.parametrize("platform", PLATFORMS)
def test_finetuning_and_eval_steps_lower(platform):
  train, evaluate, state, train_batch, eval_batch = finetuning_programs()
  check_exported(lower(train, platform, state, train_batch), platform)
  exp = lower(evaluate, platform, state["params"], eval_batch)
  check_exported(exp, platform)
  assert exp.out_avals[-1].shape == (eval_batch["labels"].shape[0],)  # predictions [b]


# ------------------------------------------------------------------------------------------------
# Analysis

ANALYSIS_B, ANALYSIS_K = 64, 128   # 8 sequences per device, the analysis's default max length


@functools.lru_cache(maxsize=None)
def bert_base_encoder(positions: int = 512):
  cfg = config_for("base", vocab_size=30522, dtype="bfloat16", max_position_embeddings=positions)
  model = nnx.eval_shape(lambda: build_model("BertModel", cfg, seed=0))
  graphdef, state = nnx.split(model)
  return graphdef, abstract(state)


def analysis_batch():
  return {f: S((ANALYSIS_B, ANALYSIS_K), jnp.int32, sharding=SHARDED) for f in BATCH_FIELDS}


def analysis_exported(stats_impl, platform, measures=True, length=None, slots=0):
  """The analysis program exported for ``platform``; ``slots``: packed rows (``segment_ids``)."""
  mesh = GPU_MESH if platform == "cuda" else (TPU_MESH if stats_impl == "kernel" else MESH)
  graphdef, state = bert_base_encoder(max(512, length or 0))
  state = abstract(state, NamedSharding(mesh, P()))
  fields = analysis_batch()
  if slots:
    fields["segment_ids"] = fields["input_ids"]
  sharded = NamedSharding(mesh, P(DATA_AXIS))
  batch = {f: S(x.shape[:1] + (length or x.shape[1],), x.dtype, sharding=sharded)
           for f, x in fields.items()}
  if stats_impl == "kernel":   # its tables come with the batch, built on the host
    from heads_jax.stats import kernel
    b, k = batch["input_ids"].shape
    specs = kernel.table_specs(b, k, ROLES, "dep2head", measures, slots=slots,
                               wrapper=kernel.wrapper_for(analysis.target_platform(platform), k))
    batch[kernel.TABLES] = {n: S(x.shape, x.dtype, sharding=sharded) for n, x in specs.items()}
  run = analysis.analysis_program(
      graphdef, roles=ROLES, direction="dep2head", gate_mode="remove", measures=measures,
      js=False, stats_impl=stats_impl, mesh=mesh, platform=analysis.target_platform(platform),
      slots=slots)
  with jax.sharding.use_abstract_mesh(mesh):
    return lower(run, platform, state, batch, None)


@pytest.mark.slow
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("stats_impl", ["layerwise", "stacked"])
def test_analysis_step_lowers(platform, stats_impl):
  exp = analysis_exported(stats_impl, platform)
  check_exported(exp, platform)
  out = jax.tree.unflatten(exp.out_tree, exp.out_avals)
  assert out["sieve_bias"].shape == (ANALYSIS_B, 12, 12, len(ROLES))
  assert out["token_attention"].shape == (ANALYSIS_B, 12, 12, 5)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("row", ["full", "short"])
def test_packed_analysis_lowers(platform, row, monkeypatch):
  """The packed programs the device pass runs by default (``segment_ids``, positions restarting
  per segment; the platform's ``auto`` path) lower, with one output row per slot: full rows of
  ``PACK_SLOTS`` sequences, and short rows of half the length and half the slots
  (``pass_packing``)."""
  from heads_jax.data.encoding import row_slots
  from heads_jax.pipelines.device_pass import PACK_SLOTS
  monkeypatch.delenv("HEADS_JAX_STATS_IMPL", raising=False)
  full = analysis_batch()["input_ids"].shape[1]
  length = full if row == "full" else full // 2
  slots = row_slots(length, full, PACK_SLOTS)
  exp = analysis_exported(analysis.default_stats_impl(platform), platform, length=length,
                          slots=slots)
  check_exported(exp, platform)
  out = jax.tree.unflatten(exp.out_tree, exp.out_avals)
  assert slots == (PACK_SLOTS if row == "full" else PACK_SLOTS // 2)
  assert out["sieve_bias"].shape == (ANALYSIS_B * slots, 12, 12, len(ROLES))
  assert out["distance"].shape == (ANALYSIS_B * slots, 12, 12, 21)


@pytest.mark.slow
def test_fused_analysis_lowers_for_gpu_with_triton():
  exp = analysis_exported("fused", "cuda")
  text = check_exported(exp, "cuda")
  # one Triton kernel per layer, each under shard_map (a Pallas call is not partitioned by XLA)
  assert text.count("__gpu$xla.gpu.triton") == 12
  assert "sdy.manual_computation" in text


@pytest.mark.slow
@pytest.mark.parametrize("platform", PLATFORMS)
def test_kernel_v2_analysis_lowers(platform):
  """Statistics kernel v2 (``stats_impl="kernel"``): one Pallas call for all 12 layers after the
  forward (issue 50 item 3: 12 calls and 12 shard_maps before), Triton for ``cuda``
  (power-of-two loads), Mosaic for ``tpu`` (blocks whole or (8, 128)-aligned), under shard_map
  over the data axis. Its tables come with the batch, built on the host (issue 50 item 3): no
  table construction in the program (the sieve sizes' sorted searches, ``kernel._count_equal``,
  were its only sorts; ``cuda``: 3,454 StableHLO operations -> 2,583)."""
  exp = analysis_exported("kernel", platform)
  text = check_exported(exp, platform)
  call = "__gpu$xla.gpu.triton" if platform == "cuda" else "tpu_custom_call"
  assert text.count(call) == 1
  assert text.count("sdy.manual_computation") == 1
  assert "stablehlo.sort" not in text
  if platform == "cuda":
    assert text.count("stablehlo.") < 3000, text.count("stablehlo.")
  out = jax.tree.unflatten(exp.out_tree, exp.out_avals)
  assert out["sieve_bias"].shape == (ANALYSIS_B, 12, 12, len(ROLES))
  assert out["distance"].shape == (ANALYSIS_B, 12, 12, 21)


@pytest.mark.slow
def test_kernel_v2_past_one_pass_lowers_with_the_triton_key_loop():
  """Past ``kernel.ONE_PASS_KEYS`` the Triton program loops over key blocks
  (``tile.head_rows_blocked``): any length is one Pallas call for all layers (where their queries
  and keys fit ``kernel.STASH_BYTES``), no XLA fallback."""
  from heads_jax.stats import kernel
  assert kernel.wrapper_for("gpu", 8192) == "triton" and kernel.wrapper_for("tpu", 8192) == "xla"
  exp = analysis_exported("kernel", "cuda", length=2 * kernel.ONE_PASS_KEYS)
  text = check_exported(exp, "cuda")
  assert text.count("__gpu$xla.gpu.triton") == 1


def test_fused_kernel_does_not_lower_for_tpu_and_auto_never_picks_it_there():
  """Compiled for a TPU (not interpreted) the kernel breaks Mosaic's block-shape rule; the
  analysis step's ``"fused"`` would run the Pallas interpreter there (it lowers, slowly), so
  ``auto`` takes the per-layer XLA path on TPUs."""
  from heads_jax.stats import fused
  b, k, h, e = 8, 128, 12, 64

  def kernel(q, kk, batch):
    tables = fused.fused_tables(batch, ROLES, platform="tpu")
    return fused.fused_layer_stats(q, kk, tables, ROLES, interpret=False, platform="tpu")

  qk = S((b, k, h, e), jnp.bfloat16)
  batch = {f: S((b, k), jnp.int32) for f in BATCH_FIELDS}
  with pytest.raises(Exception, match="divisible by 8 and 128"):
    lower(jax.jit(kernel), "tpu", qk, qk, batch)
  assert analysis.AUTO_STATS_IMPL["tpu"] == "layerwise"


@pytest.mark.slow
@pytest.mark.parametrize("platform", PLATFORMS)
def test_auto_picks_a_path_that_lowers(platform, monkeypatch):
  monkeypatch.delenv("HEADS_JAX_STATS_IMPL", raising=False)
  impl = analysis.default_stats_impl(platform)
  assert impl == {"tpu": "layerwise", "cuda": "stacked"}[platform]
  exp = analysis_exported(impl, platform, measures=False)
  check_exported(exp, platform)


# ------------------------------------------------------------------------------------------------
# Ablation and head examples

@functools.lru_cache(maxsize=None)
def ablation_evaluator():
  """An ``Evaluator`` of a BERT-base classifier whose state and batches stay abstract: its
  ``replicate``/``shard_batch`` are bypassed, so nothing is allocated."""
  from heads_jax.ablation import evaluate
  from heads_jax.data import glue
  cfg = config_for("base", vocab_size=30522, dtype="bfloat16")
  model = nnx.eval_shape(lambda: build_model("BertForSequenceClassification", cfg, 2, seed=0))
  n, k = 8, 128
  data = evaluate.EvalData(np.ones((n, k), np.int32), np.ones((n, k), np.int32),
                           np.zeros((n, k), np.int32), np.zeros(n, np.int32),
                           glue.TASKS["mrpc"], "abstract")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(evaluate, "replicate", lambda tree, mesh: abstract(tree))
    mp.setattr(evaluate, "shard_batch", lambda batch, mesh: batch)
    ev = evaluate.Evaluator(model, data, batch_size=64, mesh=jax.sharding.Mesh(
        np.asarray(jax.devices()[:1]), (DATA_AXIS,)))
  return ev


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("gate_mode", ["remove", "uniform"])
def test_ablation_step_lowers(platform, gate_mode):
  ev = ablation_evaluator()
  b, k = 64, 128
  batch = text_batch(b, k, labels=True)
  batch["weights"] = S((b,), jnp.float32, sharding=SHARDED)
  gate = S((12, 12), jnp.float32, sharding=REPLICATED)
  removal = S((12, 12, 2), jnp.float32, sharding=REPLICATED)
  exp = lower(ev._run, platform, ev.state, batch, gate, removal, gate_mode=gate_mode,
              renormalise=True)
  check_exported(exp, platform)
  assert exp.out_avals[0].shape == (6,)  # SUM_NAMES


@pytest.mark.parametrize("platform", PLATFORMS)
def test_head_example_pass_lowers(platform):
  graphdef, state = bert_base_encoder()
  state = abstract(state, sharding=None)  # the pass runs on the model as loaded: one device
  forward = attention_maps_program(graphdef)
  ids = S((32, ANALYSIS_K), jnp.int32)  # one host batch (examples.DEFAULT_BATCH rows at most)
  exp = lower(forward, platform, state, ids, ids, ids)
  check_exported(exp, platform, devices=1)
  assert exp.out_avals[0].shape == (32, 12, 12, ANALYSIS_K, ANALYSIS_K)


@pytest.mark.slow
@pytest.mark.parametrize("platform", PLATFORMS)
def test_second_pass_lowers(platform):
  """The second pass of issue 26 (norm-weighted sieve bias, sinks, word-level parsing), on the
  8-device data mesh."""
  graphdef, state = bert_base_encoder()
  run = norm_program(graphdef, ROLES, "dep2head", True, MESH)
  exp = lower(run, platform, state, analysis_batch())
  check_exported(exp, platform)
  out = jax.tree.unflatten(exp.out_tree, exp.out_avals)
  assert out["norm_sieve_bias"].shape == (ANALYSIS_B, 12, 12, len(ROLES))
  assert out["first_attention"].shape == (ANALYSIS_B, 12, 12)


# ------------------------------------------------------------------------------------------------
# The one thing left to a real GPU

def test_cudnn_attention_needs_a_real_gpu():
  """cuDNN attention (what the model's ``auto`` takes on a GPU for bfloat16 without attention
  dropout) cannot be lowered without a GPU: jax asks the CUDA runtime for cuDNN's version.
  Everything else of that program lowers (the ``xla`` implementation above)."""
  graphdef, state = bert_base_encoder()

  def forward(state, ids, mask, types):
    return nnx.merge(graphdef, state)(ids, mask, types, attention="cudnn")["last_hidden_state"]

  state = abstract(state, sharding=None)
  ids = S((8, ANALYSIS_K), jnp.int32)
  with pytest.raises(RuntimeError, match="cuDNN is not detected"):
    lower(jax.jit(forward), "cuda", state, ids, ids, ids)
