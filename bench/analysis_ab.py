"""``analysis_ab`` (issue 38 item 6), a part of ``bench/accelerator.py``: every path of the
analysis step on one batch **with dependency arcs**, each checked against ``stacked`` on the same
device, and one long-sequence analysis.

    python bench/accelerator.py --parts analysis_ab                 # BERT-base bf16, 128 x 128
    python bench/accelerator.py --tiny --parts analysis_ab          # CPU smoke (tests/e2e)

Paths, on the batch of ``../shared/measurements/gpu-2026-11-26/analysis_t4.py`` (random ids,
pairs, [CLS]/[SEP], every word's head the previous word, random relations, so the syntactic
roles are timed):

* ``bare forward`` (the model's fast attention: cuDNN for bf16 on GPUs) and ``forward returning
  maps`` (the explicit path writing the float32 ``[b, l, h, q, k]`` stack);
* ``stacked v1``: the maps reduced by the stand-alone functions (``sieve_bias``,
  ``distance_features``, ``all_measures``: the definitions, and the reference of every check);
* ``stacked v2``: the same maps through ``layerwise.reduce_stack`` (one weight table, one
  matmul, one entropy pass; ``absent`` where it is not there);
* the step's paths: ``stacked`` (whichever the step runs), ``layerwise``, ``fused`` (the first
  Pallas kernel), ``kernel`` (kernel v2, ``heads_jax.stats.kernel``; ``absent`` where the step
  does not offer it);
* kernel v2's variants (``KERNEL_VARIANTS``): the XLA wrapper, and the kernel on the
  explicit-attention forward of ``stacked v1`` (its check compares like with like);
* a float32 reference (``F32_REFERENCE``: stacked v1 on the float32 forward of the same
  parameters, matmuls at ``highest``) against which every path is checked too, the kernel on that
  forward (``KERNEL_F32``: its own error) and a one-line ``precision verdict``;
* ``profile of ...``: the bare forward, ``stacked`` and kernel steps' device time by category
  (``PROFILE_CATEGORIES``, ``bench/profiling.py``);
* ``statistics ... alone`` (``ALONE``): the kernel (and the XLA wrapper) on the forward's own q
  and k of every layer and the batch's tables, all on the device before the timing;
* ``kernel, 8192 positions``: one BERT-base-shaped sequence of 8,192 positions (random weights)
  through the bare forward and kernel v2 (the Triton key loop on GPUs; ``LONG_VARIANTS``: key
  blocks of 256, key blocks inside the heads' loop, the XLA wrapper; each checked against the
  last), with the compiled program's temporary memory.

* ``data: ...`` (issue 50 item 7, "measured as a user runs it"): ``heads-jax analyze`` on real
  data (``DATA_WORKLOADS``: UD EWT test with its gold arcs, MRPC dev pairs without a parser),
  encoded with the embedded bert-base-uncased vocabulary and packed as the device pass packs
  them (``pipelines.device_pass.pass_packing``: ``data_batches``) at this part's token budget (``--batch-size`` =
  the full-row batch's rows): the bare forward, ``stacked`` and ``kernel`` over every batch of
  the pass, kernel checked against stacked, what ``auto`` takes, and one ``side by side`` row per
  workload (the full-row batch's from the rows above): time per step and the ratio to the bare
  forward of each, the fastest path and whether ``auto`` takes it.

The part starts with a ``measured on`` row (the device, the commit: ``common.git_commit``, the
versions), so its rows say what they measured wherever they are copied. The order is the
priority: the paths on the full-row batch, their checks, the ``data`` rows, then the profiles,
the statistics alone and the long sequence (a part cut by its time limit keeps what it wrote).

Programs are lowered in the main thread and compiled in parallel (``ThreadPoolExecutor``; the
bare forward first and alone, so that the GEMM autotuner's cache fills without contention), then
timed one after another: median over ``repeats`` of ``steps`` device-resident steps. Each check
row gives the largest relative error against ``stacked v1`` (``heads_jax.doctor.relative_error``:
``|a - b| / max(1, |b|)``, inf where the NaN patterns differ).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import time

import numpy as np

FULL = {"long": 8192, "long_size": "base", "data_examples": None}
# the CPU smoke: 6 sequences of each data set fill only the pass's tail batches ([2, 32], packed),
# one shape shared by both workloads, so its three programs compile once
TINY = {"long": 256, "long_size": "tiny", "data_examples": 6}
OUTPUTS = ("sieve_bias", "distance", "entropy", "cls_entropy", "token_attention")
# A regular expression (environment) selecting what runs, for a short device run: the programs
# whose name it finds (the paths and variants by their row names; "statistics ... alone: ...";
# "profile of NAME"; "long: NAME" for the long sequence's); the bare forward always runs.
ONLY = "ANALYSIS_AB_ONLY"


def selected(name: str) -> bool:
  """Whether ``name`` runs under ``ANALYSIS_AB_ONLY`` (everything when it is unset)."""
  pattern = os.environ.get(ONLY, "")
  return name == "bare forward" or not pattern or re.search(pattern, name) is not None


def arcs_batch(b: int, q: int, seed: int = 0) -> dict:
  """A full-length batch ``[b, q]`` with arcs (as ``analysis_t4.py``): random ids, pairs (token
  types 0 then 1), [CLS] first and [SEP] last, one word per piece, each word's head the previous
  word, random relations (``REL_*`` 0..4)."""
  rng = np.random.default_rng(seed)
  batch = {f: np.zeros((b, q), np.int32) for f in
           ("input_ids", "attention_mask", "token_type_ids", "token_class", "word_ids",
            "dep_head", "dep_rel")}
  batch["input_ids"] = rng.integers(1000, 30000, (b, q)).astype(np.int32)
  batch["attention_mask"][:] = 1
  batch["token_type_ids"][:, q // 2:] = 1
  batch["token_class"][:, 0], batch["token_class"][:, -1] = 1, 2
  batch["word_ids"][:] = np.arange(q)[None] - 1
  batch["word_ids"][:, -1] = -1
  heads = np.arange(q)[None].repeat(b, 0) - 2          # piece t is word t-1; its head: word t-2
  heads[:, :2] = -1
  batch["dep_head"][:] = heads
  batch["dep_rel"][:] = rng.integers(0, 5, (b, q))
  return batch


def _median_seconds(fn, steps: int, repeats: int) -> float:
  import jax
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    for _ in range(steps):
      out = fn()
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t) / steps)
  return float(np.median(times))


def _programs(model, batch: dict, mesh):
  """``{name: (jitted, args) or None}`` of every path (None: absent here). A float32 model has
  no separate float32 reference (``F32_REFERENCE``, ``KERNEL_F32``: stacked v1 and kernel are)."""
  import jax
  from flax import nnx
  from heads_jax.data.vocabulary import ROLES
  from heads_jax.parallel import replicate, shard_batch
  from heads_jax.sieves import build_sieves
  from heads_jax.stats import layerwise
  from heads_jax.stats.distance import distance_features
  from heads_jax.stats.measures import all_measures
  from heads_jax.stats.sieve_bias import sieve_bias
  from heads_jax.stats.step import STATS_IMPLS, make_analysis_step

  graphdef, state = nnx.split(model)
  state = replicate(state, mesh)
  device_batch = shard_batch(batch, mesh)
  text = ("input_ids", "attention_mask", "token_type_ids")

  def forward(maps: bool):
    def run(st, bt):
      out = nnx.merge(graphdef, st)(*(bt[f] for f in text), deterministic=True,
                                     return_attentions=maps)
      return out["attentions"] if maps else out["last_hidden_state"]
    return jax.jit(run), (state, device_batch)

  float32 = model.config.dtype == "float32"
  graphdef_f32 = None if float32 else float32_graphdef(model)

  def stacked_v1_of(gd, highest: bool = False):
    def stacked_v1(st, bt):
      with _precision(highest):
        attn = nnx.merge(gd, st)(*(bt[f] for f in text), deterministic=True,
                                 return_attentions=True)["attentions"]
        out = {"sieve_bias": sieve_bias(attn, build_sieves(bt, ROLES), bt["attention_mask"],
                                        ROLES),
               "distance": distance_features(attn, bt["token_class"], bt["attention_mask"])}
        out.update(all_measures(attn, bt["token_class"], bt["attention_mask"]))
        return out
    return stacked_v1

  def stacked_v2(st, bt):
    attn = nnx.merge(graphdef, st)(*(bt[f] for f in text), deterministic=True,
                                   return_attentions=True)["attentions"]
    return layerwise.reduce_stack(attn, bt, ROLES, "dep2head", measures=True)

  progs = {"bare forward": forward(False), "forward returning maps": forward(True),
           "stacked v1 (stand-alone functions)": (jax.jit(stacked_v1_of(graphdef)),
                                                  (state, device_batch)),
           F32_REFERENCE: None if float32 else (jax.jit(stacked_v1_of(graphdef_f32,
                                                                      highest=True)),
                                                 (state, device_batch)),
           "stacked v2 (layerwise.reduce_stack)": ((jax.jit(stacked_v2), (state, device_batch))
                                                   if hasattr(layerwise, "reduce_stack") else None)}
  for impl in ("stacked", "layerwise", "fused", "kernel"):
    name = "stacked (the step's)" if impl == "stacked" else impl
    if impl not in STATS_IMPLS:
      progs[name] = None
      continue
    step = make_analysis_step(model, measures=True, stats_impl=impl, mesh=mesh)
    # the kernel path's program takes its tables with the batch, built on the host
    progs[name] = (step.program(step.path_for(*batch["input_ids"].shape)),
                   (step._state, shard_batch(step.with_tables(batch), mesh), None))
  try:
    from heads_jax.stats import kernel
  except ImportError:
    kernel = None
  from heads_jax.stats.fused import target_platform
  triton = kernel is not None and kernel.default_wrapper(target_platform(None)) == "triton"
  if kernel is not None and getattr(kernel, "TRITON_MEASURED", TRITON_MEASURED) != TRITON_MEASURED:
    raise SystemExit("bench/analysis_ab.py TRITON_MEASURED differs from kernel.TRITON_MEASURED")
  native = None if kernel is None else kernel.default_wrapper(target_platform(None))
  for name, options in KERNEL_VARIANTS:
    # absent: a Triton setting off Triton, or the XLA wrapper where it is the step's own (CPU)
    progs[name] = None if kernel is None or "kernel" not in STATS_IMPLS or (
        TRITON_ONLY & set(options) and not triton) or options.get("wrapper") == native else (
        _kernel_program(graphdef, mesh, **options), (state, device_batch))
  progs[SAME_PROGRAM] = None if kernel is None or "kernel" not in STATS_IMPLS else (
      _kernel_program(graphdef, mesh, beside_stacked=True), (state, device_batch))
  progs[KERNEL_F32] = None if kernel is None or "kernel" not in STATS_IMPLS or float32 else (
      _kernel_program(graphdef_f32, mesh, highest=True), (state, device_batch))
  return {name: prog for name, prog in progs.items() if selected(name)}


def float32_graphdef(model):
  """The graph of ``model`` computing in float32 (its parameters are float32 in either dtype:
  the bf16 model's state runs through it unchanged), for the float32 reference."""
  import dataclasses
  from flax import nnx
  from heads_jax.model.bert import BertModel
  cfg = dataclasses.replace(model.config, dtype="float32")
  return nnx.split(BertModel(cfg, rngs=nnx.Rngs(0)))[0]


def _precision(highest: bool):
  """``jax.default_matmul_precision("highest")`` while tracing a float32 reference (GPUs take
  TF32 for float32 matmuls by default), else nothing."""
  import contextlib
  import jax
  return jax.default_matmul_precision("highest") if highest else contextlib.nullcontext()


# The float32 reference: stacked v1 on the float32 forward of the same parameters and batch, all
# matmuls at "highest" precision; every path is also checked against it, so the bf16 rounding of
# the forward (which both stacked and the kernel inherit) is told apart from the kernel's own.
F32_REFERENCE = "stacked v1 on the float32 forward (float32 reference)"
# Kernel v2 on that float32 forward: its distance from the reference is the kernel's own error.
KERNEL_F32 = "kernel on the float32 forward"


# One program computing both the stand-alone statistics from the maps and kernel v2 from the same
# layer's q and k: its check compares the kernel with stacked on identical inputs (separately
# compiled bf16 programs may round their matmuls differently, which no cross-program check separates).
SAME_PROGRAM = "kernel beside stacked v1 in one program"


# kernel.TRITON_MEASURED, written out here (the module imports jax lazily)
TRITON_MEASURED = {"block_k": 1024, "heads_per_program": "all", "num_warps": 4}

# Kernel v2's settings timed beside the step's choice (each checked like the paths): the XLA
# wrapper (the tile under lax.scan) at this length, and the kernel on the same
# explicit-attention forward as stacked v1 (a like-with-like check: the other rows' forward is
# cuDNN's in bf16, whose hidden states differ from the explicit path's at bf16 rounding).
KERNEL_VARIANTS = (("kernel, XLA wrapper (tile under lax.map, 8 blocks a step)",
                    {"wrapper": "xla", "blocks_per_step": 8}),
                   ("kernel on the explicit forward", {"attention": "explicit"}),
                   # the default is the tile that passes the offline sm_90 gate (heads on the
                   # grid, 32-key tiles, 8 warps: kernel.TRITON_DEFAULTS); beside it the last
                   # device-measured tile (kernel.TRITON_MEASURED: 13.38 ms on the H200)
                   ("kernel, the last measured tile (all keys at once, all heads a program, "
                    "4 warps: TRITON_MEASURED)", dict(TRITON_MEASURED)),
                   ("kernel, key tiles of 64 (block_k=64)", {"block_k": 64}),
                   ("kernel, 4 heads per program (heads_per_program=4)",
                    {"heads_per_program": 4}))


def _kernel_program(graphdef, mesh, attention: str = "auto", wrapper: str | None = None,
                    beside_stacked: bool = False, highest: bool = False, **options):
  """The analysis step's kernel branch with ``options`` for ``kernel.kernel_reducer``."""
  import jax
  from flax import nnx
  from heads_jax.data.vocabulary import ROLES
  from heads_jax.stats import kernel
  from heads_jax.stats.fused import target_platform
  from heads_jax.sieves import build_sieves
  from heads_jax.stats.distance import distance_features
  from heads_jax.stats.layerwise import finish
  from heads_jax.stats.measures import all_measures
  from heads_jax.stats.sieve_bias import sieve_bias
  platform = target_platform(None)

  def run(st, bt):
    with _precision(highest):
      return body(st, bt)

  def body(st, bt):
    chosen = wrapper or kernel.wrapper_for(platform, bt["input_ids"].shape[1])
    tables = kernel.kernel_program_tables(bt, ROLES, "dep2head", True, wrapper=chosen)
    reduce = kernel.kernel_reducer(tables, ROLES, "dep2head", True, wrapper=chosen, mesh=mesh,
                                   platform=platform, **options)
    out = nnx.merge(graphdef, st)(bt["input_ids"], attention_mask=bt["attention_mask"],
                                  token_type_ids=bt["token_type_ids"], deterministic=True,
                                  attention=attention, attention_reduce=reduce,
                                  return_attentions=beside_stacked)
    got = finish(out["attention_reduced"], tables)
    if not beside_stacked:
      return got
    attn, mask, tc = out["attentions"], bt["attention_mask"], bt["token_class"]
    want = {"sieve_bias": sieve_bias(attn, build_sieves(bt, ROLES), mask, ROLES),
            "distance": distance_features(attn, tc, mask)}
    want.update(all_measures(attn, tc, mask))
    return {"kernel": got, "stacked": want}
  return jax.jit(run)


def _compile_all(progs: dict, p, first: str | None = "bare forward") -> dict:
  """Lowers every program here, compiles ``first`` alone, then the rest in parallel."""
  lowered, compiled = {}, {}
  for name, prog in progs.items():
    if prog is None:
      continue
    try:
      lowered[name] = prog[0].lower(*prog[1])
    except Exception as e:  # noqa: BLE001  a path that does not lower here is a finding
      p.row(f"{name}: does not lower", f"{type(e).__name__}: {str(e)[:200]}")
  t0 = time.perf_counter()
  if first is not None:
    compiled[first] = lowered.pop(first).compile()
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    futures = {name: pool.submit(low.compile) for name, low in lowered.items()}
    for name, fut in futures.items():
      try:
        compiled[name] = fut.result()
      except Exception as e:  # noqa: BLE001
        p.row(f"{name}: does not compile", f"{type(e).__name__}: {str(e)[:200]}")
  p.row(f"compiling every program ({first + ' first, ' if first else ''}in parallel)",
        time.perf_counter() - t0, "s")
  return compiled


def _errors(got: dict, want: dict) -> dict:
  from heads_jax.doctor import relative_error
  got = {k: np.asarray(v) for k, v in got.items()}
  rows = int(np.asarray(want["sieve_bias"]).shape[0])
  errs = {k: relative_error(got[k][:rows], want[k]) for k in OUTPUTS}
  nan_same = all(np.array_equal(np.isnan(got[k][:rows]), np.isnan(want[k])) for k in OUTPUTS)
  return {"max_rel_error": max(errs.values()), "per_output": errs, "nan_pattern_equal": nan_same}


def part_analysis_ab(p, s: dict, tiny: bool) -> None:
  """The part (``bench/accelerator.py`` runs it in its own process); ``s`` is that suite's
  settings (model size, dtype, analysis batch, steps, repeats)."""
  import jax
  from flax import nnx
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  from heads_jax.parallel import data_mesh
  from heads_jax.stats.step import make_analysis_step

  extra = TINY if tiny else FULL
  b, q = s["analysis_batch"]
  steps, reps = s["analysis_steps"], s["repeats"]
  measured_on(p)
  mesh = data_mesh()
  model = BertModel(config_for(s["size"], vocab_size=30522, dtype=s["dtype"]), rngs=nnx.Rngs(0))
  batch = arcs_batch(b, q)
  progs = _programs(model, batch, mesh)
  for name, prog in progs.items():
    if prog is None:
      p.row(name, "absent")
  compiled = _compile_all(progs, p)
  outputs, times = {}, {}
  bare = None
  for name, prog in progs.items():
    if name not in compiled:
      continue
    fn, args = compiled[name], prog[1]
    secs = _median_seconds(lambda: fn(*args), steps, reps)
    bare = bare or secs
    times[name] = secs
    outputs[name] = fn(*args)
    p.row(f"{name}, batch {b} x {q} {s['dtype']} with arcs", 1e3 * secs, "ms/step",
          f"{secs / bare:.2f}")
  want = {k: np.asarray(v) for k, v in outputs.get("stacked v1 (stand-alone functions)",
                                                     {}).items()}
  same = s["dtype"] == "float32"       # stacked v1 is the float32 reference, kernel KERNEL_F32
  ref32 = want if same else {k: np.asarray(v) for k, v in outputs.get(F32_REFERENCE, {}).items()}
  for name, out in outputs.items():
    if name == SAME_PROGRAM:
      e = _errors(out["kernel"], {k: np.asarray(v) for k, v in out["stacked"].items()})
      p.row(f"check {name}: kernel against the stand-alone statistics of the same maps",
            e["max_rel_error"], "max rel. error",
            "NaN pattern equal" if e["nan_pattern_equal"] else "NaN PATTERN DIFFERS",
            per_output=e["per_output"])
    elif isinstance(out, dict) and want and name not in ("stacked v1 (stand-alone functions)",
                                                          F32_REFERENCE):
      e = _errors(out, want)
      p.row(f"check {name} against stacked v1", e["max_rel_error"], "max rel. error",
            "NaN pattern equal" if e["nan_pattern_equal"] else "NaN PATTERN DIFFERS",
            per_output=e["per_output"])
  far = _float32_checks(p, outputs, ref32,
                        "stacked v1 (stand-alone functions)" if same else F32_REFERENCE)
  if same and "kernel" in far:
    far[KERNEL_F32] = far["kernel"]
  _precision_verdict(p, far)
  del outputs
  auto = make_analysis_step(model, measures=True, mesh=mesh).path_for(b, q)
  side_by_side(p, f"full rows, batch {b} x {q} with arcs",
               {"bare forward": times.get("bare forward"),
                "stacked": times.get("stacked (the step's)"), "kernel": times.get("kernel")},
               {auto})
  for label, spec, syntax in DATA_WORKLOADS:
    if selected(f"data: {label}"):
      _data_rows(p, model, mesh, label, spec, syntax, q, b, extra["data_examples"], steps, reps)
  # the profiles first: they reuse compiled programs (a new Triton program that fails hard
  # cannot take them along)
  _profile_rows(p, {name: (compiled[name], progs[name][1]) for name in PROFILED[2 if tiny else 0:]
                    if name in compiled and selected(f"profile of {name}")}, steps)
  del compiled, progs
  _alone_rows(p, model, batch, mesh, steps, reps, bare)
  _long_row(p, s, extra, steps, reps, mesh)


def measured_on(p) -> None:
  """The part's first row: the device, the commit (``common.git_commit``: ``HEADS_JAX_COMMIT`` on
  the device, whose tree has no ``.git``) and the versions."""
  import jax
  import common
  info = common.machine_info(torch_threads=False)
  dev = jax.devices()[0]
  p.row("measured on", f"{jax.device_count()} x {dev.device_kind}", "", "",
        commit=info["git_commit"], platform=dev.platform, versions=info["versions"],
        date_utc=info["date_utc"], gpu=info.get("gpu"))


# The analysis as a user runs it (issue 50 item 7): `heads-jax analyze --data SPEC` on real
# sentence lengths, packed as its device pass packs (row label, data spec, arcs). UD EWT test:
# 2,077 single sentences with gold arcs (short rows of half the length); MRPC dev: 408 sentence
# pairs, no parser on the device (`--parser none`: the syntactic roles are NaN, the other roles,
# the distances and the measures are computed), full rows.
DATA_WORKLOADS = (("UD EWT test, packed, gold arcs", "ud-ewt", True),
                  ("MRPC dev pairs, packed, no parser", "mrpc", False))
# The paths timed side by side with the bare forward (the step's, make_analysis_step(stats_impl=))
SIDE_BY_SIDE = ("stacked", "kernel")


# AnalysisConfig.sort_window's default (heads_jax.pipelines imports the host statistics'
# libraries, which the device machine may lack; tests/e2e/test_bench_analysis_ab.py checks both)
SORT_WINDOW = 1024


def data_batches(spec: str, syntax: bool, length: int, batch_size: int,
                 examples: int | None) -> list:
  """``[(indices, packed batch)]``: the batches ``heads-jax analyze --data SPEC --max-length
  LENGTH --batch-size BATCH_SIZE [--parser none]`` runs on the device (the embedded
  bert-base-uncased vocabulary, ``SORT_WINDOW``), the first ``examples`` sequences (None: all):
  ``pipelines.device_pass.pass_packing``'s packing (short rows of ``length // 2``, at most
  ``PACK_SLOTS`` sequences a full row), written with the data module's own functions (equal to
  it: tests/e2e/test_bench_analysis_ab.py)."""
  from heads_jax.data.encoding import DEFAULT_SLOTS, pack_batches
  from heads_jax.data.specs import encode_spec
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.stats.compiling import batch_rows
  rows = batch_rows(batch_size, length)
  _, batches, _ = encode_spec(spec, load_tokenizer(), max_length=length, batch_size=rows,
                              max_examples=examples, syntax=syntax, pad_to_batch_size=True,
                              sort_window=SORT_WINDOW)
  return list(pack_batches(batches, length=length, rows=rows, slots=DEFAULT_SLOTS,
                           window=max(SORT_WINDOW, rows), short_length=length // 2))


def packing_summary(batches: list) -> dict:
  """Sequences, real positions, computed positions, the padding's share and the shapes (with
  their batch counts) of ``batches``."""
  real = sum(int(np.asarray(bt["attention_mask"]).sum()) for _, bt in batches)
  total = sum(int(np.asarray(bt["attention_mask"]).size) for _, bt in batches)
  shapes = {}
  for _, bt in batches:
    shapes[bt["input_ids"].shape] = shapes.get(bt["input_ids"].shape, 0) + 1
  return {"sequences": int(sum(int((np.asarray(i) >= 0).sum()) for i, _ in batches)),
          "real_positions": real, "positions": total,
          "padding_share": round(1 - real / total, 4) if total else None,
          "shapes": {f"{b} x {k}": n for (b, k), n in sorted(shapes.items())}}


def side_by_side(p, label: str, secs: dict, auto: set) -> None:
  """One row: ``secs`` (``{"bare forward", "stacked", "kernel"}``: seconds per step, None where
  absent) as time per step and the ratio to the bare forward, the fastest path and what
  ``auto`` takes (``auto``: its paths for this workload's shapes)."""
  bare = secs.get("bare forward")
  if not bare:
    p.row(f"side by side, {label}", "absent", note="no bare forward time")
    return
  parts = [f"bare forward {1e3 * bare:.3g} ms"]
  ratios = {}
  for path in SIDE_BY_SIDE:
    t = secs.get(path)
    if t:
      ratios[path] = t / bare
      parts.append(f"{path} {1e3 * t:.3g} ms ({t / bare:.2f}x)")
    else:
      parts.append(f"{path} absent")
  fastest = min(ratios, key=ratios.get) if ratios else None
  follows = fastest is not None and auto == {fastest}
  p.row(f"side by side, {label}", "; ".join(parts), "",
        f"fastest {fastest}; auto takes {'/'.join(sorted(auto))}"
        f"{'' if follows else ' (not the fastest)'}",
        ms_per_step={k: (None if v is None else 1e3 * v) for k, v in secs.items()},
        ratio_to_bare_forward=ratios, fastest=fastest, auto=sorted(auto),
        auto_follows_measurement=follows)


def _packed_forward(graphdef):
  """The bare forward (the model's fast attention, hidden states only) of packed rows."""
  import jax
  from flax import nnx
  from heads_jax.sieves import segment_positions

  def run(st, bt):
    seg = bt["segment_ids"]
    return nnx.merge(graphdef, st)(bt["input_ids"], attention_mask=bt["attention_mask"],
                                   token_type_ids=bt["token_type_ids"], deterministic=True,
                                   segment_ids=seg, position_ids=segment_positions(seg)
                                   )["last_hidden_state"]
  return jax.jit(run)


def _data_rows(p, model, mesh, label: str, spec: str, syntax: bool, length: int,
               batch_size: int, examples: int | None, steps: int, reps: int) -> None:
  """The ``data: LABEL`` rows: every batch of the pass (``data_batches``) through the bare
  forward, ``stacked`` and ``kernel`` (time per step: a pass over all of them, divided by their
  number; median of ``reps`` x ``steps`` passes), kernel against stacked on the same batches,
  what ``auto`` takes, and the ``side by side`` row."""
  import jax
  from flax import nnx
  from heads_jax.data.encoding import DEFAULT_SLOTS, row_slots
  from heads_jax.parallel import pad_to_multiple, replicate, shard_batch
  from heads_jax.stats.step import STATS_IMPLS, make_analysis_step
  what = f"data: {label}"
  try:
    batches = data_batches(spec, syntax, length, batch_size, examples)
  except Exception as e:  # noqa: BLE001  data that do not load here are a finding, not a crash
    p.row(f"{what}: batches", "absent", note=f"{type(e).__name__}: {str(e)[:200]}")
    return
  summary = packing_summary(batches)
  p.row(f"{what}: padding of the packed batches", summary["padding_share"], "share",
        f"{summary['sequences']} sequences in {len(batches)} batches", **summary)
  graphdef, state = nnx.split(model)
  state = replicate(state, mesh)
  steps_of = {impl: make_analysis_step(model, measures=True, stats_impl=impl, mesh=mesh)
              for impl in SIDE_BY_SIDE if impl in STATS_IMPLS}
  auto_step = make_analysis_step(model, measures=True, mesh=mesh)
  multiple = auto_step.multiple
  device, shapes = {path: [] for path in ("bare forward",) + tuple(steps_of)}, {}
  for _, bt in batches:
    padded, _ = pad_to_multiple({f: np.asarray(v, np.int32) for f, v in bt.items()}, multiple)
    b, k = padded["input_ids"].shape
    slots = row_slots(k, length, DEFAULT_SLOTS)
    device["bare forward"].append(shard_batch(padded, mesh))
    for impl, step in steps_of.items():   # the kernel's with its tables, built on the host
      device[impl].append(shard_batch(step.with_tables(padded, slots), mesh))
    shapes.setdefault((b, k), (slots, len(device["bare forward"]) - 1))
  auto = {auto_step.path_for(b, k) for b, k in shapes}
  progs = {}
  forward = _packed_forward(graphdef)
  for (b, k), (slots, at) in shapes.items():
    progs[("bare forward", b, k)] = (forward, (state, device["bare forward"][at]))
    for impl, step in steps_of.items():
      if not step.packs_for(b, k):
        p.row(f"{what}: {impl}", "absent", note=f"the {impl} step does not take packed rows here")
        continue
      progs[(impl, b, k)] = (step.program(impl, slots), (step._state, device[impl][at], None))
  named = {f"{path}, {b} x {k}": prog for (path, b, k), prog in progs.items()}
  first = next(iter(named))
  compiled = _compile_all(named, p, first=first)
  secs, outputs = {}, {}
  for path in ("bare forward",) + tuple(steps_of):
    fns = []
    for bt in device[path]:
      b, k = bt["input_ids"].shape
      fn = compiled.get(f"{path}, {b} x {k}")
      if fn is None:
        break
      fns.append((fn, (state, bt) if path == "bare forward" else (steps_of[path]._state, bt, None)))
    else:
      def one_pass(fns=fns):
        return [fn(*args) for fn, args in fns]
      secs[path] = _median_seconds(one_pass, steps, reps) / len(fns)
      if path != "bare forward":
        outputs[path] = one_pass()
      bare = secs.get("bare forward")
      p.row(f"{what}: {path}, per batch ({', '.join(summary['shapes'])})", 1e3 * secs[path],
            "ms/step", f"{secs[path] / bare:.2f}" if bare else "",
            tokens_per_s=summary["real_positions"] / (secs[path] * len(fns)))
  if len(outputs) == 2:
    errs = [_errors(got, {key: np.asarray(v) for key, v in want.items()})
            for got, want in zip(outputs["kernel"], outputs["stacked"])]
    same = all(e["nan_pattern_equal"] for e in errs)
    p.row(f"check {what}: kernel against stacked", max(e["max_rel_error"] for e in errs),
          "max rel. error", "NaN pattern equal" if same else "NaN PATTERN DIFFERS",
          per_output={key: max(e["per_output"][key] for e in errs) for key in OUTPUTS})
  side_by_side(p, label, secs, auto)


def _float32_checks(p, outputs: dict, ref32: dict, reference: str = F32_REFERENCE) -> dict:
  """Every path's distance from the float32 reference (the outputs ``ref32`` of the program
  ``reference``, 0 from itself): ``{name: max rel. error}``; a row each."""
  far = {reference: 0.0}
  if not ref32:
    p.row("checks against the float32 reference", "absent")
    return far
  for name, out in outputs.items():
    if name in (F32_REFERENCE, reference) or not isinstance(out, dict):
      continue
    got = out["kernel"] if name == SAME_PROGRAM else out
    e = _errors(got, ref32)
    far[name] = e["max_rel_error"]
    p.row(f"check {name} against the float32 reference", e["max_rel_error"], "max rel. error",
          "NaN pattern equal" if e["nan_pattern_equal"] else "NaN PATTERN DIFFERS",
          per_output=e["per_output"])
  return far


def precision_verdict(stacked: float, kernel: float, kernel_own: float | None) -> str:
  """Whose rounding the kernel's distance from stacked bf16 is, from the distances to the float32
  reference of ``stacked`` (bf16), ``kernel`` (bf16) and ``kernel_own`` (the kernel on the float32
  forward: its own arithmetic; None where absent). The kernel is "as close" as stacked when its
  distance is at most 1.5 times stacked's (the two bf16 forwards round differently)."""
  own = "" if kernel_own is None else f"; the kernel's own error (float32 forward) {kernel_own:.2g}"
  head = f"from the float32 reference: stacked {stacked:.2g}, kernel {kernel:.2g}{own}: "
  if max(stacked, kernel) <= 1e-4:
    return head + "every path within 1e-4 of float32: no bf16 rounding to tell apart"
  if kernel <= 1.5 * stacked and (kernel_own is None or kernel_own <= 1e-4):
    return head + ("the kernel's distance from stacked is the bf16 forward's rounding "
                   "(the kernel is as close to float32 as stacked)")
  if kernel_own is not None and kernel_own > 1e-4:
    return head + "the kernel's own arithmetic adds error (on the float32 forward too)"
  return head + "the kernel is farther from float32 than stacked: its bf16 inputs' rounding"


def _precision_verdict(p, far: dict) -> None:
  stacked, kernel = far.get("stacked v1 (stand-alone functions)"), far.get("kernel")
  if stacked is None or kernel is None:
    p.row("precision verdict (kernel vs stacked, against float32)", "absent")
    return
  p.row("precision verdict (kernel vs stacked, against float32)",
        precision_verdict(stacked, kernel, far.get(KERNEL_F32)))


def capture_qk(model):
  """A jitted ``fn(state, batch) -> {"q", "k"}``: every layer's queries and keys ``[b, l, k, h,
  e]`` from the model's own forward (its fast attention; the kernel's inputs), for timing the
  statistics alone."""
  import jax
  from flax import nnx
  graphdef, _ = nnx.split(model)

  def keep(layer, probs, query, key, mask):
    del layer, probs, mask
    return {"q": query, "k": key}
  keep.needs_probs = False

  def run(st, bt):
    out = nnx.merge(graphdef, st)(bt["input_ids"], attention_mask=bt["attention_mask"],
                                  token_type_ids=bt["token_type_ids"], deterministic=True,
                                  attention_reduce=keep)
    return out["attention_reduced"]
  return jax.jit(run)


# The statistics alone, on the forward's own queries and keys and the batch's tables already on
# the device (computed once, outside the timed function), every layer in one program: the Pallas
# call by itself (its partial sums), with the parts merged (kernel_layer_stats: what the step
# runs), Triton settings, and the XLA wrapper.
ALONE = (("statistics kernel alone: the Pallas call, every layer", {"rows_only": True}),
         ("statistics kernel alone: Pallas call + the parts merged (kernel_layer_stats), "
          "every layer", {}),
         ("statistics kernel alone: the Pallas call, 4 window corrections shared (static=4)",
          {"rows_only": True, "static": 4}),
         ("statistics kernel alone: the Pallas call, none shared (static=0)",
          {"rows_only": True, "static": 0}),
         ("statistics kernel alone: the Pallas call, num_stages 1",
          {"rows_only": True, "num_stages": 1}),
         ("statistics kernel alone: the Pallas call, the last measured tile (TRITON_MEASURED)",
          {"rows_only": True, **TRITON_MEASURED}),
         ("statistics kernel alone: the Pallas call, 4 heads per program (heads_per_program=4)",
          {"rows_only": True, "heads_per_program": 4}),
         ("statistics kernel alone: the Pallas call, 2 warps", {"rows_only": True,
                                                                "num_warps": 2}),
         ("statistics kernel alone: the Pallas call, key blocks of 64 (the two-pass key loop)",
          {"rows_only": True, "block_k": 64}),
         ("statistics alone: XLA wrapper (lax.scan, 8 blocks a step), every layer",
          {"wrapper": "xla", "blocks_per_step": 8}))


TRITON_ONLY = {"num_warps", "num_stages", "block_k", "static", "heads_per_program"}


def alone_program(layers: int, platform: str, *, rows_only: bool = False,
                  wrapper: str | None = None, **options):
  """``fn(qs, ks, tables)``: the statistics of every layer from ``qs, ks [b, l, k, h, e]``
  (``capture_qk``) with ``tables = kernel.kernel_program_tables(...)``; ``rows_only``: the
  Pallas call alone (``kernel.kernel_layer_partials``: every head's partial sums)."""
  import jax
  import jax.numpy as jnp
  from heads_jax.data.vocabulary import ROLES
  from heads_jax.stats import kernel
  wrapper = wrapper or kernel.default_wrapper(platform)

  def run(qs, ks, tables):
    outs = []
    for layer in range(layers):
      if rows_only:
        outs.append(kernel.kernel_layer_partials(qs[:, layer], ks[:, layer], tables, ROLES,
                                                 "dep2head", True, wrapper=wrapper,
                                                 platform=platform, **options))
      else:
        outs.append(kernel.kernel_layer_stats(qs[:, layer], ks[:, layer], tables, ROLES,
                                              "dep2head", True, wrapper=wrapper,
                                              platform=platform, **options))
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
  return jax.jit(run)


def _alone_rows(p, model, batch: dict, mesh, steps: int, reps: int, bare: float | None) -> None:
  """The ``ALONE`` rows (ratios to the bare forward of this part): kernel time against the rest
  of the kernel step."""
  import jax
  from flax import nnx
  from heads_jax.data.vocabulary import ROLES
  from heads_jax.parallel import replicate, shard_batch
  from heads_jax.stats import kernel
  from heads_jax.stats.fused import target_platform
  platform = target_platform(None)
  native = kernel.default_wrapper(platform)
  try:
    _, state = nnx.split(model)
    device_batch = shard_batch(batch, mesh)
    qk = capture_qk(model)(replicate(state, mesh), device_batch)
    jax.block_until_ready(qk)
  except Exception as e:  # noqa: BLE001
    p.row("statistics alone: capturing the forward's q and k", "absent",
          note=f"{type(e).__name__}: {str(e)[:200]}")
    return
  b, layers, k = qk["q"].shape[:3]
  make_tables = jax.jit(lambda bt, w: kernel.kernel_program_tables(bt, ROLES, "dep2head", True,
                                                                   wrapper=w),
                        static_argnums=1)
  progs = {}
  for name, options in ALONE:
    if not selected(name):
      continue
    wrapper = options.get("wrapper", native)
    opts = {key: v for key, v in options.items() if key != "wrapper"}
    if wrapper == "xla" and "wrapper" not in options:
      p.row(name, "absent", note=f"no Pallas wrapper on {platform}")
      continue
    if TRITON_ONLY & set(opts) and wrapper != "triton":
      p.row(name, "absent", note=f"a Triton setting; the wrapper here is {wrapper}")
      continue
    args = (qk["q"], qk["k"], make_tables(device_batch, wrapper))
    progs[name] = (alone_program(layers, platform, wrapper=wrapper, **opts), args)
  compiled = _compile_all(progs, p, first=None)
  for name, prog in progs.items():
    if name not in compiled:
      continue
    fn, args = compiled[name], prog[1]
    secs = _median_seconds(lambda: fn(*args), steps, reps)
    p.row(f"{name}, batch {b} x {k}", 1e3 * secs, "ms/step",
          f"{secs / bare:.2f}" if bare else "")


# The profile's categories: (category, regex on an event's label, ``bench/profiling.py``:
# ``k:<kernel> op:<hlo op> opc:<opcodes> tgt:<custom-call target> ...``), first match wins.
PROFILE_CATEGORIES = (("statistics kernel", r"heads_jax_statistics"),
                      ("cuDNN attention", r"fmha|sdpa|flash|tgt:\S*fmha"),
                      ("GEMMs", r"gemm|cutlass|cublas|matmul|xmma|nvjet|cudnn"
                                r"|opc:(dot|convolution)\b"),
                      ("other fusions", r"."))
# The programs profiled (tiny: the kernel step only, the CPU is shared)
PROFILED = ("bare forward", "stacked (the step's)", "kernel")


def _profile_rows(p, programs: dict, steps: int) -> None:
  """Per-kernel device time of each of ``programs`` (``{name: (compiled, args)}``) by
  ``PROFILE_CATEGORIES`` (``bench/profiling.py``), or "absent"."""
  try:
    import profiling
    categorize = profiling.profile_categories
  except (ImportError, AttributeError):
    p.row("profiles", "absent", note="bench/profiling.py not there")
    return
  for name, (fn, args) in programs.items():
    what = f"profile of {name}"
    try:
      ms = categorize(fn, args, steps=steps, categories=PROFILE_CATEGORIES)
    except Exception as e:  # noqa: BLE001  a profile that fails is a finding, not a crash
      p.row(what, "absent", note=f"{type(e).__name__}: {str(e)[:200]}")
      continue
    busy = sum(v for k, v in ms.items() if k != "idle")
    for category, value in ms.items():
      p.row(f"{what}: {category}", value, "ms/step",
            f"{value / busy:.1%} of busy" if busy and category != "idle" else "")


def _long_row(p, s: dict, extra: dict, steps: int, reps: int, mesh) -> None:
  """One sequence of ``extra["long"]`` positions: the bare forward and kernel v2."""
  import jax
  from flax import nnx
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  from heads_jax.parallel import data_mesh
  from heads_jax.stats.step import STATS_IMPLS

  length = extra["long"]
  if "kernel" not in STATS_IMPLS:
    p.row(f"kernel, one sequence of {length} positions", "absent")
    return
  one = data_mesh(jax.devices()[:1])
  cfg = config_for(extra["long_size"], vocab_size=30522, dtype=s["dtype"],
                   max_position_embeddings=length)
  model = BertModel(cfg, rngs=nnx.Rngs(0))
  progs = _programs_long(model, arcs_batch(1, length, seed=1), one)
  if len(progs) == 1:       # ANALYSIS_AB_ONLY left no long program but the bare forward
    return
  compiled = _compile_all(progs, p)
  bare = None
  results = {}
  for name, prog in progs.items():
    if name not in compiled:
      continue
    fn = compiled[name]
    secs = _median_seconds(lambda: fn(*prog[1]), max(1, steps // 2), min(reps, 2))
    bare = bare or secs
    mem = fn.memory_analysis()
    temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
    out = fn(*prog[1])
    if isinstance(out, dict):
      results[name] = out
    finite = "" if not isinstance(out, dict) else (
        f"finite distance: {bool(np.isfinite(np.asarray(out['distance'])).all())}")
    p.row(f"{name}, one sequence of {length} positions ({extra['long_size']}, {s['dtype']})",
          1e3 * secs, "ms/step", f"{secs / bare:.2f}", temp_bytes=temp,
          map_bytes=4 * cfg.num_heads * length * length, note=finite)
  reference = LONG_VARIANTS[-1][0]        # the XLA wrapper: the tile under lax.scan
  for name, out in results.items():
    if name != reference and reference in results:
      e = _errors(out, results[reference])
      p.row(f"check {name} against {reference}, {length} positions", e["max_rel_error"],
            "max rel. error", "NaN pattern equal" if e["nan_pattern_equal"] else
            "NaN PATTERN DIFFERS", per_output=e["per_output"])


# Kernel v2's settings on the long sequence beside the step's (the Triton key loop on GPUs):
# larger key blocks, and the XLA wrapper (the path past 1,024 keys before the key loop; last:
# the others' reference).
LONG_VARIANTS = (("kernel, key blocks of 256", {"block_k": 256}),
                 ("kernel, XLA wrapper (32 blocks a step)", {"wrapper": "xla",
                                                            "blocks_per_step": 32}))


def _programs_long(model, batch: dict, mesh) -> dict:
  """The bare forward, the analysis step's kernel path and, on GPUs, ``LONG_VARIANTS``."""
  import jax
  from flax import nnx
  from heads_jax.parallel import replicate, shard_batch
  from heads_jax.stats import kernel
  from heads_jax.stats.fused import target_platform
  from heads_jax.stats.step import make_analysis_step
  graphdef, state = nnx.split(model)
  state = replicate(state, mesh)
  device_batch = shard_batch(batch, mesh)
  text = ("input_ids", "attention_mask", "token_type_ids")
  fwd = jax.jit(lambda st, bt: nnx.merge(graphdef, st)(*(bt[f] for f in text),
                                                        deterministic=True)["last_hidden_state"])
  step = make_analysis_step(model, measures=True, stats_impl="kernel", mesh=mesh)
  progs = {"bare forward": (fwd, (state, device_batch)),
           "kernel": (step.program(step.path_for(*batch["input_ids"].shape)),
                      (step._state, shard_batch(step.with_tables(batch), mesh), None))}
  if kernel.default_wrapper(target_platform(None)) == "triton":
    for name, options in LONG_VARIANTS:
      progs[name] = (_kernel_program(graphdef, mesh, **options), (state, device_batch))
  return {name: prog for name, prog in progs.items() if name == "bare forward"
          or selected(f"long: {name}")}
