"""Pre-training A/B (issue 39): each change to the BERT pre-training step measured in one process.

    python bench/pretrain_ab.py                       # on the GPU: BERT-base, seq 128, batch 256
    python bench/pretrain_ab.py --tiny                # CPU smoke (a tiny model, seconds of steps)
    python bench/accelerator.py --parts pretrain_ab   # the same, as a part of the device suite

One real pre-training batch (the embedded Gutenberg books, ``bench_training.pretraining_batch``)
stays on the device. The variants, in this order:

* V0  explicit attention with dropout 0.1 (the step as of 9125a24: float32 LayerNorm outputs,
  threefry dropout bits, the optax LAMB chain, float32 MLM logits);
* V1  fused attention without attention dropout (cuDNN on a GPU): the speed BERT's dropout cost;
* V4  the Pallas flash kernel with exact attention dropout 0.1 (``attention="flash"``), dropout
  bits from an ``rbg`` key (``dropout_rng="rbg"``), LayerNorm outputs and the residual stream in
  bf16 (``layer_norm_dtype="compute"``): run 2 on the H200 (2026-11-27) measured these one at a
  time (V2 flash 28.4% MFU, V3 + rbg 28.7%, V4 + bf16 30.2%), so they are one row now (a switch
  that does not exist is named in the label and left out);
* V5  V20 + the flat LAMB (``optimizer.flat``): a side row, not in the chain (V4 + the flat
  LAMB was 1.61x slower a step in run 2, one scatter, since replaced; its profile says where);
* V6  V4 + the MLM loss on padded bf16 logits with a float32 log-sum-exp
  (``mlm_logits="padded"``): the step ``configs/pretrain.py`` trains;
* V7  V6 at twice the batch (512 at sequence 128; the ``bert_base_b512`` preset);
* V8  V6 at the settings' ``long`` (batch, sequence, predictions), e.g. ``(64, 512, 80)``: the
  same tokens a step at phase 2's sequence length (only when ``long`` is set: ``--tiny``, or
  ``PRETRAIN_AB_LONG=64,512,80`` on the device);
* V9  V6 compiled with ``xla_gpu_enable_cublaslt`` (``Lowered.compile(compiler_options=...)``,
  per program): bias epilogues fused into the GEMMs; V12 with
  ``xla_gpu_enable_cudnn_layer_norm`` (LayerNorm forward and backward as cuDNN kernels);
* V10, V11  V6 with other launch settings of the flash kernels (``flash_attention.tuned``):
  the backward in 64-row steps with 8 warps; every kernel pipelined 4 stages deep;
* V13  V6 with dQ written by the flash dK/dV kernel (``tuned(fuse_dq=True)``: 128 keys are one
  block, so that kernel's program has every key of its rows; the dQ kernel, which recomputes the
  probabilities, is not launched);
* V14  V6 with V9's, V12's and V13's changes together; V15 V14 at twice the batch.
* V16  V6 + issue 49's custom gradients (``heads_jax/model/fused_ops.py``: the exact GELU with one
  residual and its bias gradient from the same pass; the MLM decoder's backward in bf16 instead
  of TF32). Every variant before it is lowered under ``fused_ops.plain()`` (the step as it was)
  and with issue 39's flash launch settings (4 warps), so V6 -> V16 -> V17 is issue 49's A/B in
  one process;
* V17  V16 with the flash kernels at 8 warps (``flash_attention.Tuning``'s defaults now, from
  the offline sm_90 compile: no spills, where 4 warps spilled in the forward and in dK/dV);
* V19  V17 with each block's residual + dropout + LayerNorm as one custom-gradient op
  (``fused_ops.residual_dropout_norm``; V16 and V17 trace ``fused_ops.plain("norm")``);
* V20  V19 with dropout masks from 8 random bits an element (``BertConfig.dropout_bits=8``: a
  quarter of the random words): ``configs/pretrain.py``'s step; V18 V20 at twice the batch;
* V8   V20 at the settings' ``long`` (batch, sequence, predictions): ``(64, 512, 80)`` on the
  device (phase 2's sequence), ``PRETRAIN_AB_LONG`` to change it or ``none``.

Before the variants, transformers' ``BertForPreTraining`` (``bench/torch_peer.py``, under
``torch.compile`` on the device) runs at the base shape and at the long one, each in a child
process (its GPU memory freed before JAX takes the device's); its rows come after the variants,
with the fastest heads_jax variant of the same shape beside it. Every result records the git
commit (``common.git_commit``: ``HEADS_JAX_COMMIT`` on the device, whose tree is no checkout)
and the device.

By default the rows are V0, V6, V16, V17, V19, V20, V18, V5, V8 (V1, V4, V7, V9-V15 were
measured in run 2: no gain, or in V6). ``PRETRAIN_AB_VARIANTS`` (e.g. ``V6,V9,V12,V13,V14,V15,V5``)
runs any subset, in the order V0, V1, V4, V6, V16, V17, V19, V20, V9-V14, V7, V18, V15, V5, V8;
ratios are against the first.

The last rows are the candidates for the default. Each row: tokens/s, MFU (``6N + 12 l d q``
FLOPs per token over the device's data-sheet bf16 peak; ``bench_training.flops_per_token``), step
ms, and the loss after ``loss_steps`` steps from the same initial parameters (finite, and close
across variants: the changes keep the arithmetic). V0, V4-V6, V9-V14, V16, V17, V19, V20 are profiled
(``bench/profiling.py``, ``profile_steps`` steps traced right after the timing): device time per
step by category (GEMM, attention kernel, optimizer, dropout RNG, copies, reductions,
elementwise fusions, other, idle) and by phase (forward, backward, optimizer, from the HLO's
op names; ``training.steps`` scopes the update as ``optimizer``), the table printed in the log.
V0 and the fastest of the default chain (V4, V6, V16, V17, V19, V20) get the breakdown programs (unless the part is already
``breakdown_before_s`` seconds old: its limit would cut them; the profiles' phases stand in):
forward (the loss alone, dropout on), backward (forward+backward minus forward), optimizer (in
the step: step minus forward+backward; alone: ``tx.update`` + ``apply_updates``). A last row
says whether the input pipeline (``data.num_workers=-1``: all but 2 of this host's cores) can
build real batches as fast as the fastest variant of that batch consumes them (one batch built
here, timed; the workers' rate estimated as workers / seconds per batch).

Programs are lowered in the main thread, then compiled in parallel (``ThreadPoolExecutor`` over
``lowered.compile()``; XLA releases the GIL) after the baseline alone (so the GEMM autotuner's
cache fills without contention); they are timed one after another, each alone. Every variant's
step comes first, the breakdown programs after them (a part cut by its time limit keeps every
variant's figure). Timing: after the
``loss_steps`` steps (which also warm up), ``repeats`` runs of ``steps`` steps, median.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import functools
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

FULL = {"size": "base", "dtype": "bfloat16", "seq": 128, "batch": 256, "preds": 20,
        "loss_steps": 10, "steps": 10, "repeats": 3, "profile_steps": 5,
        "breakdown_before_s": 150, "long": (64, 512, 80), "peer_compile": True,
        "peer_limit_s": 110}
TINY = {"size": "tiny", "dtype": "float32", "seq": 32, "batch": 4, "preds": 5,
        "loss_steps": 2, "steps": 2, "repeats": 1, "num_layers": 1, "profile_steps": 1,
        "breakdown_before_s": 1e9, "long": (2, 64, 10), "peer_compile": False,
        "peer_limit_s": 300}
# --tiny only checks that every variant runs: XLA's CPU backend without its LLVM optimisations
# compiles the 12 programs several times faster
TINY_XLA_FLAGS = "--xla_backend_optimization_level=0"


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  label: str
  attention: str = "explicit"
  attention_dropout: float = 0.1
  layer_norm_dtype: str = "float32"
  dropout_rng: str = "threefry2x32"
  flat_lamb: bool = False
  mlm_logits: str = "float32"
  batch_factor: int = 1
  long: bool = False          # at the settings' ``long`` (sequence, batch, predictions)
  xla: tuple = ()             # XLA options of this variant's compilation: ((name, value), ...)
  flash: tuple = (("fwd_warps", 4), ("bwd_warps", 4))  # flash_attention.tuned: issue 39's
  fused_ops: bool = False     # issue 49's GELU and bf16 decoder (model/fused_ops.py); off: plain()
  fused_norm: bool = False    # issue 49's residual + dropout + LayerNorm; off: plain("norm")
  dropout_bits: int = 32      # random bits per dropout-mask element (BertConfig.dropout_bits)

  def shape(self, s: dict) -> tuple[int, int, int]:
    """``(batch, sequence, predictions)`` of this variant under settings ``s``."""
    if self.long:
      return tuple(s["long"])
    return s["batch"] * self.batch_factor, s["seq"], s["preds"]


def _has_flash() -> bool:
  from heads_jax.model import bert
  return "flash" in bert.ATTENTION_PATHS


def _has_config_field(name: str) -> bool:
  from heads_jax.model.config import BertConfig
  return name in {f.name for f in dataclasses.fields(BertConfig)}


def variants(long: bool = False) -> list[tuple[Variant, str | None]]:
  """``[(variant, why absent or None)]`` in the order of the module docstring: V0, V1, V4 (the
  chain's merged step), V5 (a side row on V4), V6 on V4, V7 on V6; with ``long``, V8 (V6 at the
  long sequence)."""
  v0 = Variant("V0", "explicit attention, dropout 0.1 (as of 9125a24)")
  v1 = dataclasses.replace(v0, name="V1", label="fused attention, no attention dropout",
                           attention="auto", attention_dropout=0.0)
  flash, ln = _has_flash(), _has_config_field("layer_norm_dtype")
  missing = [w for w, ok in (("no flash kernel: explicit attention", flash),
                             ("no BertConfig.layer_norm_dtype: float32 LayerNorm", ln)) if not ok]
  v4 = dataclasses.replace(
      v0, name="V4", label="flash kernel with dropout 0.1 + rbg bits + bf16 LayerNorm/residual"
      + (f" ({'; '.join(missing)})" if missing else ""),
      attention="flash" if flash else "explicit", dropout_rng="rbg",
      layer_norm_dtype="compute" if ln else "float32")
  v6 = dataclasses.replace(v4, name="V6", label="V4 + padded bf16 MLM logits "
                           "(configs/pretrain.py's step)", mlm_logits="padded")
  v7 = dataclasses.replace(v6, name="V7", label="V6 at twice the batch (bert_base_b512)",
                           batch_factor=2)
  # after run 1 (2026-11-27 08:14, H200): V6's profile has 31 of 56 ms outside the GEMMs, the
  # flash kernels 6.1 ms (10.8%) for ~0.6 ms of their FLOPs at peak
  v9 = dataclasses.replace(v6, name="V9", label="V6 compiled with cuBLASLt GEMMs (bias "
                           "epilogues fused: xla_gpu_enable_cublaslt)",
                           xla=(("xla_gpu_enable_cublaslt", True),))
  v10 = dataclasses.replace(v6, name="V10", label="V6 + flash backward in 64-row steps, 8 warps",
                            flash=v6.flash + (("inner", 64), ("bwd_warps", 8)))
  v11 = dataclasses.replace(v6, name="V11", label="V6 + flash kernels pipelined 4 stages deep",
                            flash=v6.flash + (("stages", 4),))
  v12 = dataclasses.replace(v6, name="V12", label="V6 compiled with cuDNN LayerNorm "
                            "(xla_gpu_enable_cudnn_layer_norm)",
                            xla=(("xla_gpu_enable_cudnn_layer_norm", True),))
  v13 = dataclasses.replace(v6, name="V13", label="V6 + dQ written by the flash dK/dV kernel "
                            "(128 keys: one block; no dQ kernel)", flash=v6.flash + (("fuse_dq", True),))
  v14 = dataclasses.replace(v6, name="V14", label="V6 + V9's, V12's and V13's changes together",
                            xla=v9.xla + v12.xla, flash=v13.flash)
  v15 = dataclasses.replace(v14, name="V15", label="V14 at twice the batch", batch_factor=2)
  # issue 49: the exact GELU with one residual (its bias gradient from the same pass) and the
  # MLM decoder's backward in bf16 (model/fused_ops.py): configs/pretrain.py's step now
  v16 = dataclasses.replace(v6, name="V16", label="V6 + GELU with one residual + bf16 decoder "
                            "backward", fused_ops=True)
  v17 = dataclasses.replace(v16, name="V17", label="V16 + flash kernels at 8 warps (no spill "
                            "offline for sm_90): configs/pretrain.py's step", flash=())
  # issue 49 item 4: the block ends as one custom-gradient op (the backward keeps the LayerNorm
  # input and the mask: 3 bytes an element, autodiff 15), then dropout masks from 8 bits an
  # element (a quarter of the random words): configs/pretrain.py's step now
  v19 = dataclasses.replace(v17, name="V19", label="V17 + fused residual + dropout + LayerNorm",
                            fused_norm=True)
  v20 = dataclasses.replace(v19, name="V20", label="V19 + 8-bit dropout masks: "
                            "configs/pretrain.py's step", dropout_bits=8)
  v18 = dataclasses.replace(v20, name="V18", label="V20 at twice the batch", batch_factor=2)
  v5 = dataclasses.replace(v20, name="V5", label="V20 + flat LAMB (a side row)", flat_lamb=True)
  v8 = dataclasses.replace(v20, name="V8", label="V20 at the long sequence (phase 2's)", long=True)
  everything = (v0, v1, v4, v6, v16, v17, v19, v20, v9, v10, v11, v12, v13, v14, v7, v18, v15, v5)
  everything += (v8,) if long else ()
  # by default: the baseline, the issue-39 step, issue 49's changes one at a time, twice the
  # batch, the flat LAMB, the long sequence (V1, V4, V7, V9-V15 measured in run 2)
  default = ("V0", "V6", "V16", "V17", "V19", "V20", "V18", "V5", "V8")
  only = [x.strip() for x in os.environ.get(VARIANTS_ENV, "").split(",") if x.strip()]
  names = {v.name for v in everything}
  unknown = [x for x in only if x not in names]
  if unknown:
    raise SystemExit(f"{VARIANTS_ENV}: no variant {', '.join(unknown)}; choose from "
                     f"{', '.join(v.name for v in everything)}")
  chosen = tuple(v for v in everything if v.name in (only or default))
  return [(v, None) for v in chosen]


# variants whose step is profiled (bench/profiling.py) right after it is timed: the baseline, the
# chain's candidates for the default, and the flat LAMB (why it is slower)
PROFILED = ("V0", "V4", "V5", "V6", "V9", "V10", "V11", "V12", "V13", "V14", "V16", "V17", "V19",
            "V20")
# a comma-separated subset of the variants to run (in their order), e.g. "V6,V9,V10,V11,V7"
VARIANTS_ENV = "PRETRAIN_AB_VARIANTS"
# "batch,sequence,predictions" of V8 (the long sequence) on the device, e.g. "64,512,80"
LONG_ENV = "PRETRAIN_AB_LONG"
# the breakdown programs (forward, forward+backward, optimizer alone) are compiled for the
# baseline and for the fastest variant of the default chain at the base batch
BREAKDOWN = ("V0",)
DEFAULT_CHAIN = ("V4", "V6", "V16", "V17", "V19", "V20")


# ------------------------------------------------------------------------------------------------

class _Program:
  """One variant's model, state and jitted step, lowered (``lower``) and compiled later."""

  def __init__(self, v: Variant, s: dict, host_params, rng_state, mesh, batches: dict):
    import jax
    from flax import nnx
    from heads_jax.model.config import config_for
    from heads_jax.model.heads import BertForPreTraining
    from heads_jax.training import optimizer as opt, steps as S
    self.v = v
    extra = {"layer_norm_dtype": v.layer_norm_dtype} if _has_config_field("layer_norm_dtype") else {}
    if v.dropout_bits != 32:
      extra["dropout_bits"] = v.dropout_bits
    if _has_config_field("attention"):
      extra["attention"] = v.attention
    if "num_layers" in s:
      extra["num_layers"] = s["num_layers"]
    self.cfg = config_for(s["size"], vocab_size=30522, dtype=s["dtype"],
                          attention_dropout=v.attention_dropout,
                          max_position_embeddings=max(512, v.shape(s)[1]), **extra)
    # the variant's graph without initialising its parameters (they are the same for every
    # variant: host_params), with the concrete rng state of the base model (reseeded per step)
    abstract = nnx.eval_shape(lambda: BertForPreTraining(self.cfg, rngs=nnx.Rngs(0)))
    graphdef, _, _, rest = nnx.split(abstract, nnx.Param, nnx.RngState, ...)
    self.parts = S.ModelParts(graphdef, rng_state, rest)
    self.tx, schedule = opt.make_optimizer(learning_rate=1e-4, warmup_steps=10, total_steps=10_000,
                                           flat=v.flat_lamb)
    attention = None if _has_config_field("attention") else v.attention

    def loss_fn(model, batch, *, deterministic):
      call = model if attention is None else functools.partial(model, attention=attention)
      return S.pretraining_loss(call, batch, deterministic=deterministic, mlm_logits=v.mlm_logits)

    self.loss_fn = loss_fn
    self.host_params = host_params
    self.mesh = mesh
    self.batch = batches[v.shape(s)]
    self.tokens = v.shape(s)[0] * v.shape(s)[1]
    self.step = S.make_train_step(self.parts, self.tx, loss_fn, mesh=mesh, schedule=schedule,
                                  dropout_rng=v.dropout_rng)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    abstract = jax.eval_shape(lambda p: S.init_train_state(p, self.tx), host_params)
    self.abstract_state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), abstract)
    self.abstract_batch = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self.batch)

  def _tuned(self):
    """The flash kernels' launch settings and, unless the variant has issue 49's custom
    gradients, ``fused_ops.plain()``: read while the program is traced."""
    from heads_jax.model import flash_attention, fused_ops
    stack = contextlib.ExitStack()
    stack.enter_context(flash_attention.tuned(**dict(self.v.flash)))
    if not self.v.fused_ops:
      stack.enter_context(fused_ops.plain())
    elif not self.v.fused_norm:
      stack.enter_context(fused_ops.plain("norm"))
    return stack

  def lower_step(self):
    with self._tuned():
      return self.step.lower(self.abstract_state, self.abstract_batch)

  def lower_breakdown(self) -> dict:
    """The forward, forward+backward and optimizer-alone programs, lowered."""
    import jax
    import optax
    from heads_jax.training import steps as S
    key = S.dropout_base_key(0, self.v.dropout_rng)
    parts, loss_fn = self.parts, self.loss_fn

    def loss(p, b):
      return loss_fn(S.merge_model(parts, p, key), b, deterministic=False)[0]

    def update(g, o, p):
      u, o = self.tx.update(g, o, p)
      return optax.apply_updates(p, u), o

    ps, os_ = self.abstract_state["params"], self.abstract_state["opt_state"]
    with self._tuned():
      return {"forward": jax.jit(loss).lower(ps, self.abstract_batch),
              "fwd_bwd": jax.jit(jax.value_and_grad(loss)).lower(ps, self.abstract_batch),
              "optimizer": jax.jit(update).lower(ps, os_, ps)}

  def fresh_state(self, device_params):
    """A new train state on the device from ``device_params`` (copied: the step donates it)."""
    import jax
    from heads_jax.training import steps as S
    rep = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    init = jax.jit(lambda p: S.init_train_state(jax.tree.map(lambda x: x * 1, p), self.tx),
                   out_shardings=rep)
    return init(device_params)


def _median_s(fn, steps: int, repeats: int) -> float:
  import jax
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    out = None
    for _ in range(steps):
      out = fn()
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t) / steps)
  return float(np.median(times))


def run(s: dict, row, *, threads: int = 8) -> list[dict]:
  """Measures every variant (settings ``s``: FULL or TINY); ``row(what, value, unit, ratio,
  **detail)`` is called as each figure comes (``bench/accelerator.py``'s ``Part.row``)."""
  import jax
  from flax import nnx
  from bench_training import flops_per_token, pretraining_batch
  from heads_jax.model.config import config_for
  from heads_jax.model.heads import BertForPreTraining
  from heads_jax.parallel import data_mesh, shard_batch
  from heads_jax.training import metrics, steps as S

  t_start = time.perf_counter()
  # torch's peer first, in child processes: they exit (their GPU memory with them) before JAX
  # takes the device's memory
  peers = _torch_peers(s, row)
  mesh = data_mesh(jax.devices()[:1])
  # every result names what it measured and where (issue 49 item 6)
  stamp = {"commit": common.git_commit(), "device": jax.devices()[0].device_kind}
  chosen = variants(long=bool(s.get("long")))
  shapes = {v.shape(s) for v, absent in chosen if absent is None}
  sizes = sorted(b for b, q, _ in shapes if q == s["seq"])
  host_batch, _, build = pretraining_batch(max(sizes), s["seq"], s["preds"], host_batches=1)
  batches = {(b, q, m): shard_batch({k: x[:b] for k, x in host_batch.items()}, mesh)
             for b, q, m in shapes if q == s["seq"]}
  for b, q, m in shapes - set(batches):          # the long sequence's batch (not timed)
    long_batch = pretraining_batch(b, q, m, host_batches=1)[0]
    batches[(b, q, m)] = shard_batch(long_batch, mesh)
  model = BertForPreTraining(config_for(s["size"], vocab_size=30522,
                                        **{k: s[k] for k in ("num_layers",) if k in s}),
                             rngs=nnx.Rngs(0))
  base_parts, params = S.split_model(model)
  host_params = S.to_host(params)
  del model, params
  n_params = metrics.non_embedding_params(host_params)
  peak = common.peak_flops(s["dtype"])

  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  device_params = jax.device_put(host_params, rep)
  programs, lowered = [], []
  for v, absent in chosen:
    if absent is not None:
      row(f"{v.name} {v.label}", "absent", "", "", why=absent)
      continue
    try:
      prog = _Program(v, s, host_params, base_parts.rng_state, mesh, batches)
      low = prog.lower_step()
    except Exception as e:  # noqa: BLE001  (a variant that cannot be built is reported, not fatal)
      row(f"{v.name} {v.label}", "failed", "", "", why=f"{type(e).__name__}: {e}"[:500])
      continue
    programs.append(prog)
    lowered.append(_WithOptions(low, dict(v.xla)))
  if not programs:
    return []

  # The steps first (every variant's figure comes before any breakdown, so a part cut by its
  # limit keeps them): the baseline alone (autotuning without contention), then the rest in
  # parallel; timed one after another.
  t0 = time.perf_counter()
  try:
    first = lowered[0].compile()
  except Exception as e:  # noqa: BLE001
    first = e
  compiled = [first] + _compile_all(lowered[1:], threads)
  row("compiling the variants' steps (baseline first, then in parallel)",
      time.perf_counter() - t0, "s", "", programs=len(compiled), threads=threads)

  results, kept = [], {}
  base = None
  for i, (prog, step) in enumerate(zip(programs, compiled)):
    v = prog.v
    if isinstance(step, Exception):
      row(f"{v.name} {v.label}", "failed", "", "", why=f"{step}"[:500])
      continue
    holder = {"state": prog.fresh_state(device_params)}

    def one():
      holder["state"], m = step(holder["state"], prog.batch)
      return m["loss"]

    loss = None
    for _ in range(s["loss_steps"]):
      loss = one()
    loss = float(jax.device_get(loss))
    step_s = _median_s(one, s["steps"], s["repeats"])
    b_, seq_, preds_ = v.shape(s)
    fpt = flops_per_token(prog.cfg, n_params, seq_, preds_)["palm_6N_12ldq"]
    tps = prog.tokens / step_s
    mfu = tps * fpt / peak["flops"] if peak.get("flops") else None
    res = {"variant": v.name, "label": v.label, "tokens_per_s": tps, "step_ms": 1e3 * step_s,
           "mfu": mfu, "loss_after": loss, "loss_steps": s["loss_steps"],
           "batch": b_, "seq": seq_, "settings": dataclasses.asdict(v), **stamp}
    base = base or res
    ratio = f"{tps / base['tokens_per_s']:.2f}x {base['variant']}"
    if mfu is not None:
      ratio = f"MFU {100 * mfu:.1f}%, " + ratio
    row(f"{v.name} {v.label}, seq {seq_} batch {b_}", tps, "tokens/s", ratio,
        step_ms=res["step_ms"], loss_after_steps=loss, loss_steps=s["loss_steps"],
        finite=bool(np.isfinite(loss)))
    results.append(res)
    if v.name in PROFILED:
      res["profile"] = _profile_row(v, one, step, s, row)
    if v.name in BREAKDOWN or (v.name in DEFAULT_CHAIN and v.batch_factor == 1):
      kept[i] = (holder["state"], res)
    del holder, one

  # The breakdown of the baseline and of the fastest of the default chain at the base batch:
  # forward, forward+backward, optimizer alone (the others' states are let go first)
  chain = [i for i in kept if programs[i].v.name in DEFAULT_CHAIN]
  if chain:
    best = max(chain, key=lambda i: kept[i][1]["tokens_per_s"])
    for i in chain:
      if i != best:
        del kept[i]
  t0 = time.perf_counter()
  order = sorted(kept)
  if order and t0 - t_start > s["breakdown_before_s"]:
    # the device run's part limit (230 s) would cut the compilation: the profiles' phases
    # (forward / backward / optimizer in the step) stand in for it
    row("breakdown programs skipped", "absent", "", "", why=f"{t0 - t_start:.0f} s into the "
        f"part (past {s['breakdown_before_s']} s): see the profiles' phases")
    order, kept = [], {}
  lows = [programs[i].lower_breakdown() for i in order]
  flat = [low for lw in lows for low in lw.values()]
  done = iter(_compile_all(flat, threads))
  comps = [{k: next(done) for k in lw} for lw in lows]
  if flat:
    row("compiling the breakdown programs (in parallel)", time.perf_counter() - t0, "s", "",
        programs=len(flat))
  for i, comp in zip(order, comps):
    state, res = kept.pop(i)
    b = _breakdown(programs[i], comp, state, res["step_ms"] / 1e3, s)
    res["breakdown_ms"] = b
    text = (" / ".join(f"{b[k]:.1f}" for k in ("forward", "backward", "optimizer_in_step"))
            + f" ({b['optimizer_alone']:.1f})" if "forward" in b else "failed")
    row(f"{programs[i].v.name} breakdown: forward / backward / optimizer in the step (alone)",
        text, "ms", f"step {res['step_ms']:.1f} ms", breakdown_ms=b)
    del state
  if results:
    _peer_rows(peers, results, peak, row)
  if results:
    # the input pipeline on this host: can data.num_workers=-1 keep up with the fastest step?
    from heads_jax.data.prefetch import auto_workers, available_cores
    workers, cores = auto_workers(), available_cores()
    rows_ = max(sizes)
    capacity = max(1, workers) / build["median_s"]          # batches of `rows_` per second
    fastest = max((r for r in results if r["batch"] == rows_ and r["seq"] == s["seq"]),
                  key=lambda r: r["tokens_per_s"],
                  default=None)
    need = None if fastest is None else 1e3 / fastest["step_ms"]
    verdict = "" if need is None else ("keeps up" if capacity >= need else "STARVES the device")
    row(f"input pipeline: one real batch of {rows_} x {s['seq']} built on the host",
        build["median_s"], "s", f"{workers} workers ({cores} cores): ~{capacity:.1f} batches/s "
        f"vs {need or 0:.1f} steps/s: {verdict}".rstrip(": "), cpu_s=build.get("cpu_median_s"),
        workers=workers, cores=cores, estimate="workers / seconds per batch (linear scaling)")
  row("pretrain_ab wall time", time.perf_counter() - t_start, "s", "", peak=peak.get("how"))
  return results


def _profile_row(v: Variant, one, step, s: dict, row) -> dict | None:
  """Profiles ``s["profile_steps"]`` calls of the variant's step (``one``; ``bench/profiling.py``):
  prints its table, records one row (the categories in ms per step, the whole profile in the
  detail); "absent" with the reason when the trace has nothing to sum."""
  import profiling
  try:
    prof = profiling.profile(one, steps=s["profile_steps"], hlo_text=step.as_text())
  except Exception as e:  # noqa: BLE001  (no profiler, no device plane: the part goes on)
    row(f"{v.name} profile", "absent", "", "", why=f"{type(e).__name__}: {e}"[:500])
    return None
  print("\n".join("    " + line for line in prof.table(top=12).splitlines()), flush=True)
  cats = " | ".join(f"{k} {x:.2f}" for k, x in prof.categories.items() if x > 0)
  phases = " / ".join(f"{prof.phases[k]:.1f}" for k in ("forward", "backward", "optimizer",
                                                        "idle"))
  row(f"{v.name} profile, ms per step by category (phases forward / backward / optimizer / "
      f"idle: {phases})", cats, "ms", f"span {prof.span_ms:.1f} ms, busy {prof.busy_ms:.1f} ms",
      profile=prof.as_dict())
  return prof.as_dict()


def _peer_shapes(s: dict) -> list[tuple[int, int, int]]:
  """``(batch, sequence, predictions)`` of the torch peers: the base shape and the long one."""
  return [(s["batch"], s["seq"], s["preds"])] + ([tuple(s["long"])] if s.get("long") else [])


def _torch_peers(s: dict, row) -> list[dict]:
  """``bench/torch_peer.py`` at each of `_peer_shapes` (``torch.compile`` where
  ``s["peer_compile"]``, else eager), each in a child process of at most ``peer_limit_s``
  seconds; a peer that fails or is cut is a row saying so."""
  import json
  import subprocess
  import tempfile
  out = []
  for b, q, p in _peer_shapes(s):
    with tempfile.TemporaryDirectory() as tmp:
      path = Path(tmp) / "peer.json"
      cmd = [sys.executable, str(Path(__file__).resolve().parent / "torch_peer.py"),
             "--size", s["size"], "--batch", str(b), "--seq", str(q), "--preds", str(p),
             "--steps", str(s["steps"]), "--repeats", str(s["repeats"]), "--out", str(path)]
      cmd += ["--compile"] if s.get("peer_compile") else []
      what = f"torch peer ({'torch.compile' if s.get('peer_compile') else 'eager'}), seq {q} batch {b}"
      try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=s["peer_limit_s"])
        if done.returncode != 0 or not path.exists():
          row(what, "failed", "", "", why=(done.stderr.strip().splitlines() or ["?"])[-1][:300])
          continue
        out.append(json.loads(path.read_text()))
      except subprocess.TimeoutExpired:
        row(what, "absent", "", "", why=f"cut at {s['peer_limit_s']} s")
  return out


def _peer_rows(peers: list[dict], results: list[dict], peak: dict, row) -> None:
  """One row per torch peer: its tokens/s and MFU (its own non-embedding count, the same
  ``6N + 12 l d q`` convention) against the fastest heads_jax variant of the same shape."""
  for r in peers:
    same = [x for x in results if (x["batch"], x["seq"]) == (r["batch"], r["seq"])]
    best = max(same, key=lambda x: x["tokens_per_s"], default=None)
    mfu = r["tokens_per_s"] * r["flops_per_token"] / peak["flops"] if peak.get("flops") else None
    ratio = "" if mfu is None else f"MFU {100 * mfu:.1f}%"
    if best is not None:
      ratio += (", " if ratio else "") + (f"heads_jax {best['variant']} is "
                                          f"{best['tokens_per_s'] / r['tokens_per_s']:.2f}x")
    row(f"torch peer ({'torch.compile' if r['compile'] else 'eager'}), seq {r['seq']} batch "
        f"{r['batch']}", r["tokens_per_s"], "tokens/s", ratio, step_ms=1e3 * r["step_s"],
        warmup_s=r["warmup_s"], device=r["device"], torch=r["torch"], mfu=mfu,
        peer=r["peer"])
    results.append({"variant": "torch_peer" + ("_compile" if r["compile"] else "_eager"),
                    "label": r["peer"], "tokens_per_s": r["tokens_per_s"],
                    "step_ms": 1e3 * r["step_s"], "mfu": mfu, "loss_after": r["loss"],
                    "batch": r["batch"], "seq": r["seq"], "settings": {"compile": r["compile"]},
                    "commit": results[0].get("commit"), "device": r["device"]})


class _WithOptions:
  """A lowered program whose ``compile()`` passes the variant's XLA options
  (``Lowered.compile(compiler_options=...)``: per program, in one process)."""

  def __init__(self, lowered, options: dict):
    self.lowered, self.options = lowered, options

  def compile(self):
    return self.lowered.compile(compiler_options=self.options or None)


def _compile_all(lowered: list, threads: int) -> list:
  """``lowered[i].compile()`` for every i, in a thread pool (XLA releases the GIL); an exception
  in place of a program that failed."""
  out = [None] * len(lowered)
  if not lowered:
    return out
  with cf.ThreadPoolExecutor(threads) as pool:
    futures = {pool.submit(low.compile): i for i, low in enumerate(lowered)}
    for f in cf.as_completed(futures):
      try:
        out[futures[f]] = f.result()
      except Exception as e:  # noqa: BLE001
        out[futures[f]] = e
  return out


def _breakdown(prog: _Program, comp: dict, state, step_s: float, s: dict) -> dict:
  import jax
  if any(isinstance(comp[k], Exception) for k in ("forward", "fwd_bwd", "optimizer")):
    return {k: str(comp[k])[:200] for k in ("forward", "fwd_bwd", "optimizer")
            if isinstance(comp[k], Exception)}
  params, opt_state = state["params"], state["opt_state"]
  grads = jax.tree.map(lambda x: x * 1e-3, params)
  fw = _median_s(lambda: comp["forward"](params, prog.batch), s["steps"], s["repeats"])
  fb = _median_s(lambda: comp["fwd_bwd"](params, prog.batch)[0], s["steps"], s["repeats"])
  op = _median_s(lambda: comp["optimizer"](grads, opt_state, params)[0], s["steps"], s["repeats"])
  return {"forward": 1e3 * fw, "backward": 1e3 * (fb - fw), "optimizer_in_step": 1e3 * (step_s - fb),
          "optimizer_alone": 1e3 * op}


def _tiny_flags() -> None:
  import os
  if "jax" not in sys.modules:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + TINY_XLA_FLAGS).strip()


def settings(tiny: bool) -> dict:
  """TINY or FULL, with ``PRETRAIN_AB_LONG`` ("batch,sequence,predictions", e.g. "64,512,80";
  "none": no long sequence) as the long sequence of V8 and of the torch peer when set."""
  s = dict(TINY if tiny else FULL)
  text = os.environ.get(LONG_ENV, "").strip()
  if text.lower() == "none":
    s["long"] = None
  elif text:
    parts = [x.strip() for x in text.split(",")]
    if len(parts) != 3 or not all(x.isdigit() and int(x) > 0 for x in parts):
      raise SystemExit(f"{LONG_ENV} takes batch,sequence,predictions (e.g. 64,512,80); got "
                       f"{text!r}")
    s["long"] = tuple(int(x) for x in parts)
  return s


def part_pretrain_ab(p, s: dict, tiny: bool) -> None:
  """``bench/accelerator.py``'s part (its settings ``s`` are not used: this part has its own)."""
  if tiny:
    _tiny_flags()
  run(settings(tiny), p.row)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--tiny", action="store_true", help="tiny settings (CPU smoke test)")
  ap.add_argument("--out", default=None, help="JSON path (default: bench/pretrain_ab.json)")
  args = ap.parse_args(argv)
  if args.tiny:
    _tiny_flags()
  info = common.machine_info(torch_threads=False)
  print(common.device_header(info), flush=True)
  rows = []

  def row(what, value, unit="", ratio="", **detail):
    rows.append({"what": what, "value": value, "unit": unit, "ratio": ratio, "detail": detail})
    v = f"{value:,.4g}" if isinstance(value, float) else str(value)
    print(f"  {what}: {v} {unit} {ratio}".rstrip(), flush=True)

  results = run(settings(args.tiny), row)
  path = common.write_json(common.default_json_path(__file__, args.out),
                           {"machine": info, "command": common.command_line(), "rows": rows,
                            "results": results})
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
