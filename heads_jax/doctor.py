"""``heads-jax doctor``: what this machine gives heads_jax, and whether every path computes right.

    report = run_doctor(quick=False)      # prints as it goes; report["ok"] False on a mismatch

0. **Variables**, before JAX starts: every variable of ``heads_jax.env`` that is set to a value of
   the wrong form (``env.check``: ``HEADS_JAX_STORAGE_TIMEOUT=abc``, ``HEADS_JAX_STATS_IMPL=bogus``,
   ...) and every flag of ``XLA_FLAGS`` the installed XLA does not know
   (``heads_jax.xla_flags.unknown``) is one line; then the doctor stops there with ``ok`` False
   (every job would stop on them too). A set path variable that does not exist is a line too, and
   fails the run at the end.
1. **Environment**: platform, device kind and count, process count, the versions of jax,
   jaxlib, flax, optax and heads_jax, the XLA flags in force and the heads_jax environment
   variables that are set (``heads_jax.env``).
2. **Checks**, on a tiny random BERT (2 layers x 4 heads, attention sharpened so that the
   statistics are not those of uniform rows) and 8 UD EWT sentences (embedded; gold arcs):
   every attention path (``explicit``, ``xla``; ``cudnn`` and the Pallas ``flash`` kernel on a
   GPU, in bfloat16) and every
   analysis path (``stats_impl`` ``layerwise``, ``fused``, ``stacked``, ``kernel``: statistics
   kernel v2, whose check on a GPU or TPU is what lets ``auto`` take it there) on the user's devices,
   each against the float32 reference computed on the host CPU at the highest matmul precision
   (explicit attention; the stand-alone statistics). The error of each, ``max |got - ref| /
   max(1, |ref|)`` over every output (hidden states; sieve bias, distance features, entropies,
   token measures, NaN where the reference is NaN), is printed beside its tolerance: 5e-3 in
   float32 (GPUs run float32 matmuls in TF32 by default, about 1e-3 here) and 6e-2 in bfloat16
   (8 mantissa bits through 2 layers; 2e-2 measured on the CPU). A path that fails to compile
   (a cuDNN or Triton missing on this machine) counts as a mismatch, with its error.
3. **Timings** (skipped with ``timing=False``): one BERT-base analysis step (``stats_impl``
   ``auto``, 128 positions) and one BERT-base pre-training step (LAMB, bfloat16 on an
   accelerator; a batch of 256 sequences on accelerators, enough to fill a GPU (halved until it
   fits the device's memory), 2 per device on a CPU; the batch is printed beside the figures), each compiled first, then timed over
   ``steps`` steps: tokens per second (every position of the batch counts) and MFU with the FLOP convention of ``bench/``
   (``heads_jax.training.metrics``: ``6 N + 12 l d q`` per token for training, a third of that
   for the forward-only analysis) against the device's data-sheet peak (none on a CPU).
   ``quick=True`` times the tiny model instead, at 32 positions (the CI smoke test).

The ``heads-jax doctor`` command exits 1 when a check fails. Library code; the entry point is
``analyze/doctor.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import heads_jax
from heads_jax import env, xla_flags
from heads_jax.data.assets import ud_ewt_test_path
from heads_jax.data.specs import encode_spec
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.model.bert import BertModel
from heads_jax.model.config import config_for
from heads_jax.parallel import data_mesh, replicate, shard_batch
from heads_jax.stats.step import make_analysis_step, with_compute_dtype
from heads_jax.training import metrics as metrics_lib
from heads_jax.training import optimizer, steps

TOLERANCE = {"float32": 5e-3, "bfloat16": 6e-2}
ANALYSIS_OUTPUTS = ("sieve_bias", "distance", "entropy", "cls_entropy", "token_attention")
PACKAGES = ("jax", "jaxlib", "flax", "optax")
ACCELERATOR_BATCH = 256  # sequences per timed BERT-base step on accelerators (all devices)


@dataclasses.dataclass
class Check:
  """One path against the reference: ``error`` is ``relative_error`` (None when the
  path did not run: ``note`` says why; ``skipped`` when it does not exist on this platform)."""
  name: str
  dtype: str
  error: float | None
  tolerance: float
  note: str = ""
  skipped: bool = False

  @property
  def ok(self) -> bool:
    return self.skipped or (self.error is not None and self.error <= self.tolerance)

  def line(self) -> str:
    if self.skipped:
      return f"  {self.name:<34} {self.dtype:<9} {'-':>10} {'-':>9}  skipped: {self.note}"
    err = "-" if self.error is None else f"{self.error:.2e}"
    verdict = "ok" if self.ok else "MISMATCH"
    note = f"  ({self.note})" if self.note else ""
    return f"  {self.name:<34} {self.dtype:<9} {err:>10} {self.tolerance:>9.0e}  {verdict}{note}"


def _version(name: str) -> str:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def environment() -> dict:
  """Platform, devices, processes, versions, XLA flags and heads_jax variables in force."""
  devices = jax.devices()
  return {
      "platform": jax.default_backend(),
      "device_kind": devices[0].device_kind,
      "device_count": len(devices),
      "local_device_count": jax.local_device_count(),
      "process_count": jax.process_count(),
      "versions": {**{p: _version(p) for p in PACKAGES}, "heads_jax": heads_jax.__version__},
      "xla_flags": env.get("XLA_FLAGS"),
      "variables": env.in_force(),
  }


# ------------------------------------------------------------------------------------------------
# Checks

def check_model(seed: int = 0) -> BertModel:
  """The tiny float32 BERT of the checks, its query weights scaled by 40 (peaked attention)."""
  tokenizer = load_tokenizer()
  cfg = config_for("tiny", vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
  model = BertModel(cfg, rngs=nnx.Rngs(seed))
  for layer in model.layers:
    layer.attention.query.kernel[...] = layer.attention.query.kernel[...] * 40
  return model


def check_batch(rows: int = 8, max_length: int = 64) -> dict:
  """``rows`` UD EWT test sentences (embedded, gold arcs), encoded: every field ``[rows, k]``."""
  _, batches, _ = encode_spec(f"conllu:{ud_ewt_test_path()}", load_tokenizer(),
                              max_length=max_length, batch_size=rows, max_examples=rows)
  _, batch = next(iter(batches))
  return {name: np.asarray(x) for name, x in batch.items()}


def relative_error(got, want) -> float:
  """``max |got - want| / max(1, |want|)`` over the entries where ``want`` is not NaN; inf when
  the shapes or the NaN positions differ."""
  a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
    return float("inf")
  finite = ~np.isnan(b)
  if not finite.any():
    return 0.0
  return float(np.max(np.abs(a[finite] - b[finite]) / np.maximum(1.0, np.abs(b[finite]))))


def _max_error(got: dict, want: dict, names) -> float:
  return max(relative_error(got[name], want[name]) for name in names)


def _on_cpu(fn, *args):
  """``fn(*args)`` jitted on the host CPU at the highest matmul precision (the reference)."""
  cpu = jax.devices("cpu")[0]
  with jax.default_device(cpu), jax.default_matmul_precision("highest"):
    return jax.tree.map(np.asarray, jax.jit(fn)(*jax.device_put(args, cpu)))


def _short(e: Exception) -> str:
  return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]


def attention_checks(model, batch: dict, platform: str) -> list[Check]:
  """Each attention path's ``last_hidden_state`` on the default device against the explicit
  path in float32 on the host CPU."""
  ids, mask, types = (batch[f] for f in ("input_ids", "attention_mask", "token_type_ids"))
  real = mask[..., None] > 0

  def forward(m, attention):
    graphdef, state = nnx.split(m)
    fn = jax.jit(lambda st, i, a, t: nnx.merge(graphdef, st)(
        i, a, t, attention=attention, deterministic=True)["last_hidden_state"])
    return fn, state

  ref_fn, state = forward(model, "explicit")
  want = _on_cpu(ref_fn, state, ids, mask, types)
  paths = [("explicit", "float32"), ("xla", "float32"), ("explicit", "bfloat16"),
           ("xla", "bfloat16"), ("cudnn", "bfloat16"), ("flash", "bfloat16")]
  gpu_only = {"cudnn": "cuDNN: GPUs only",
              "flash": "Pallas flash kernel (auto's for dropout in bf16 training): GPUs only"}
  out = []
  for attention, dtype in paths:
    name = f"attention {attention}"
    if attention in gpu_only and platform != "gpu":
      out.append(Check(name, dtype, None, TOLERANCE[dtype], gpu_only[attention], skipped=True))
      continue
    try:
      fn, st = forward(with_compute_dtype(model, dtype), attention)
      got = np.asarray(fn(st, ids, mask, types), np.float32)
      err = relative_error(np.where(real, got, 0.0), np.where(real, want, 0.0))
      out.append(Check(name, dtype, err, TOLERANCE[dtype]))
    except Exception as e:  # noqa: BLE001  a path that does not compile here is a finding
      out.append(Check(name, dtype, None, TOLERANCE[dtype], _short(e)))
  return out


def analysis_checks(model, batch: dict, platform: str) -> list[Check]:
  """Each ``stats_impl`` through the analysis step on all devices against the stand-alone
  statistics (``"stacked"``) in float32 on the host CPU."""
  cpu_mesh = data_mesh(jax.devices("cpu")[:1])
  with jax.default_matmul_precision("highest"):
    want = make_analysis_step(model, measures=True, stats_impl="stacked", mesh=cpu_mesh)(batch)
  out = []
  for impl in ("layerwise", "fused", "stacked", "kernel"):
    for dtype in ("float32", "bfloat16"):
      name = f"analysis {impl}"
      note = "Pallas interpret mode: the kernel compiles on GPUs only" if (
          impl == "fused" and platform != "gpu") else ""
      if impl == "kernel":
        note = {"gpu": "kernel v2: Pallas (Triton)", "tpu": "kernel v2: Pallas (Mosaic)"}.get(
            platform, "kernel v2: the tile under lax.map (Pallas on GPUs and TPUs)")
      try:
        step = make_analysis_step(model, measures=True, stats_impl=impl, compute_dtype=dtype)
        err = _max_error(step(batch), want, ANALYSIS_OUTPUTS)
        out.append(Check(name, dtype, err, TOLERANCE[dtype], note))
      except Exception as e:  # noqa: BLE001
        out.append(Check(name, dtype, None, TOLERANCE[dtype], _short(e)))
  return out


# ------------------------------------------------------------------------------------------------
# Timings

def _timed(fn, steps_: int) -> float:
  """Seconds per call of ``fn`` (blocking on its result) after one untimed call (compilation)."""
  jax.block_until_ready(fn())
  start = time.perf_counter()
  for _ in range(steps_):
    out = fn()
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / steps_


def timings(*, quick: bool = False, steps_: int = 3, per_device_batch: int | None = None) -> list[dict]:
  """Tokens/s and MFU of one analysis step and one pre-training step (module docstring). A batch
  that does not fit the device's memory is halved until it does (the rows say which ran)."""
  platform = jax.default_backend()
  n_dev = data_mesh().devices.size
  per = per_device_batch or (2 if quick or platform == "cpu" else
                             max(1, -(-ACCELERATOR_BATCH // n_dev)))
  while True:
    try:
      return _timings(quick=quick, steps_=steps_, per_device_batch=per)
    except Exception as e:  # noqa: BLE001 (XLA's out-of-memory errors have no common type)
      if per <= 1 or not ("RESOURCE_EXHAUSTED" in str(e) or "Out of memory" in str(e)):
        raise
      per //= 2


def _timings(*, quick: bool, steps_: int, per_device_batch: int) -> list[dict]:
  platform = jax.default_backend()
  size, seq = ("tiny", 32) if quick else ("base", 128)
  dtype = "float32" if platform == "cpu" else "bfloat16"
  mesh = data_mesh()
  n_dev = mesh.devices.size
  b = n_dev * per_device_batch
  peak = metrics_lib.peak_flops(jax.devices()[0].device_kind)
  cfg = config_for(size, vocab_size=30522, dtype=dtype)
  rng = np.random.default_rng(0)
  rows = []

  def row(name, seconds, flops_per_token):
    tokens = b * seq / seconds
    mfu = tokens * flops_per_token / (peak * n_dev) if peak else None
    rows.append({"name": name, "batch": b, "seq_len": seq, "dtype": dtype, "step_s": seconds,
                 "tokens_per_s": tokens, "mfu": mfu})

  from heads_jax.model.heads import BertForPreTraining  # the task model (training steps)
  model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
  parts, params = steps.split_model(model)
  n = metrics_lib.non_embedding_params(params)
  train_fpt = metrics_lib.train_flops_per_token(n, cfg.num_layers, cfg.hidden_size, seq)

  # analysis step: the encoder, stats_impl auto, a batch of full-length rows
  batch = {f: np.zeros((b, seq), np.int32) for f in
           ("input_ids", "attention_mask", "token_type_ids", "token_class", "word_ids",
            "dep_head", "dep_rel")}
  batch["input_ids"] = rng.integers(1000, 30000, (b, seq)).astype(np.int32)
  batch["attention_mask"][:] = 1
  batch["token_class"][:, 0], batch["token_class"][:, -1] = 1, 2
  batch["word_ids"][:] = np.arange(seq)[None] - 1
  batch["word_ids"][:, -1] = -1
  batch["dep_head"][:] = -1
  step = make_analysis_step(model.bert, measures=True)
  secs = _timed(lambda: step.submit(batch)._outputs, steps_)
  row(f"analysis step ({step.stats_impl})", secs, train_fpt / 3)

  # pre-training step: LAMB, 20 predictions per 128 positions (configs/pretrain.py)
  tx, schedule = optimizer.make_optimizer(learning_rate=1e-4, warmup_steps=10, total_steps=100)
  state = replicate(steps.init_train_state(params, tx), mesh)
  train = steps.make_train_step(parts, tx, steps.pretraining_loss, mesh=mesh, schedule=schedule)
  p = max(1, seq * 20 // 128)
  pre = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
         "token_type_ids": batch["token_type_ids"],
         "masked_positions": np.tile(np.arange(1, p + 1, dtype=np.int32), (b, 1)),
         "masked_ids": rng.integers(1000, 30000, (b, p)).astype(np.int32),
         "masked_weights": np.ones((b, p), np.float32),
         "next_sentence_label": np.zeros((b,), np.int32)}
  pre = shard_batch(pre, mesh)
  holder = {"state": state}

  def one():
    holder["state"], m = train(holder["state"], pre)
    return m["loss"]

  secs = _timed(one, steps_)
  row("pre-training step (LAMB)", secs, train_fpt)
  return rows


# ------------------------------------------------------------------------------------------------

def variable_problems() -> tuple[list[str], list[str]]:
  """``(stopping, other)``: lines for variables set to a value every job would stop on
  (``env.check``; unknown ``XLA_FLAGS`` entries, which end the process when JAX starts), and for
  set path variables that do not exist. Nothing here starts JAX."""
  stopping = env.check()
  other = [line for line in env.check(paths=True) if line not in stopping]
  flags = env.get("XLA_FLAGS")
  bad = xla_flags.unknown(flags) if flags.strip() else ()
  if bad:
    stopping.append(xla_flags.unknown_line(bad))
  return stopping, other


def run_doctor(*, quick: bool = False, timing: bool = True, steps_: int = 3, out=None) -> dict:
  """Prints the environment, the checks and the timings; returns them with ``ok`` (every
  check within tolerance, every variable fine)."""
  out = out or (lambda line: print(line, flush=True))
  out("heads-jax doctor")
  stopping, other = variable_problems()
  for line in stopping + other:
    out(f"environment: {line}")
  if stopping:
    out(f"environment: {len(stopping)} variable(s) set to values every job would stop on; fix "
        f"them and run heads-jax doctor again")
    return {"environment": {"problems": stopping + other}, "checks": [], "timings": [],
            "ok": False}
  info = environment()
  info["problems"] = other
  platform = info["platform"]
  out(f"platform: {platform}, {info['device_count']} x {info['device_kind']} "
      f"({info['local_device_count']} local), {info['process_count']} process(es)")
  out("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
  out(f"XLA_FLAGS: {info['xla_flags'] or '(none)'}")
  others = {k: v for k, v in info["variables"].items() if k != "XLA_FLAGS"}
  out("environment: " + (", ".join(f"{k}={v}" for k, v in others.items()) or "(no heads_jax "
                                                                               "variable set)"))
  out("checks (tiny BERT, 8 UD EWT sentences; reference: float32 on the host CPU):")
  out(f"  {'path':<34} {'dtype':<9} {'error':>10} {'tolerance':>9}  result")
  model, batch = check_model(), check_batch()
  checks = []
  for group in (attention_checks, analysis_checks):
    for c in group(model, batch, platform):
      out(c.line())
      checks.append(c)
  ok = all(c.ok for c in checks)
  rows = []
  if timing:
    what = "tiny model, 32 positions (--quick)" if quick else "BERT-base, 128 positions"
    out(f"timings ({what}; {steps_} steps after compilation):")
    rows = timings(quick=quick, steps_=steps_)
    for r in rows:
      mfu = f"MFU {100 * r['mfu']:.1f}%" if r["mfu"] is not None else "MFU n/a (no peak for this device)"
      out(f"  {r['name']:<34} batch {r['batch']} x {r['seq_len']} {r['dtype']}: "
          f"{r['step_s'] * 1e3:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s, {mfu}")
  failed = [f"{c.name} ({c.dtype})" for c in checks if not c.ok]
  if not ok:
    out(f"MISMATCH in {len(failed)} check(s): {', '.join(failed)}")
  elif other:
    out(f"all checks passed, but {len(other)} variable(s) name paths that do not exist (above)")
  else:
    out("all checks passed")
  return {"environment": info, "checks": [dataclasses.asdict(c) | {"ok": c.ok} for c in checks],
          "timings": rows, "ok": ok and not other}
