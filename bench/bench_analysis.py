"""Benchmark of the analysis (sieve bias for all roles + distance features), side by side.

On the same encoded batches of UD English EWT sentences (gold arcs, ``heads_jax.data.specs.
encode_spec``, sorted by length within windows as ``heads-jax analyze`` does), it measures:

* **analysis**: the jitted analysis step (``heads_jax.stats.step.make_analysis_step``: forward
  with attentions + sieves + sieve bias + distance features, reduced on the device), driven by
  ``heads_jax.stats.collector.collect`` over pre-encoded batches (compiled before timing);
* **forward**: the bare jitted forward pass on the same batches, attentions not returned (only
  the pooled output comes back); the statistics' cost is ``analysis / forward - 1`` (target
  under 10 %); **forward+attn** returns the attentions ``[b, l, h, q, k]`` (not fetched), to
  show what materialising the maps costs by itself;
* **packing** (issue 38): the analysis and the bare forward run on packed rows, several
  sequences per row as the device pass packs them (``heads_jax.data.encoding.pack_batches``),
  and once more on the unpacked batches (one sequence per row, padded to 32/64/128): it prints
  the padding share and the compiled shapes of both, and the largest difference between the
  packed and the unpacked scores (``--no-pack``: unpacked only);
* **end-to-end**: ``heads_jax.pipelines.analyze.compute_scores`` (tokenisation + encoding + step
  compilation + device pass + collection: what ``heads-jax analyze`` spends before its host
  statistics), once cold (first thing in the process) and once more at the end with JAX's
  persistent compilation cache warm (turned on in a temporary folder; ``--no-jax-cache`` off);
* **notebook baseline** (``bench_notebook_baseline.py``) on the first ``--baseline-sequences``
  of the same batches: transformers' PyTorch ``BertModel`` with ``output_attentions`` on the
  same weights, maps stored per sequence as numpy and pickled (``--no-baseline-pickle``: kept in
  memory), then Python/numpy loops per sequence, role, layer, head and token, as the authors'
  notebooks; torch threads: the faster of (cores, 1) on the first batch. Its scores are compared
  with heads_jax's (they must agree to float rounding). Target: heads_jax at least 20x faster,
  the baseline's map production included;
* **memory**: peak RSS during ``compute_scores`` (``VmHWM`` reset just before it) on 1x, 4x and
  16x ``--memory-sequences``, each in a fresh process: it must stay flat beyond the result
  arrays ``[N, l, h, r]`` + ``[N, l, h, 21]`` (maps never leave the device); beside it, what the
  notebooks' stored maps (``[l, h, 128, 128]`` float32 per sequence) would hold;
* ``--sweep``: the effect of the existing batching options (sort window, batch size, bucket
  step) on the steady-state analysis throughput, on padding and on compilation time.

Timings are medians of ``--repeats`` passes (methods interleaved, so load from other processes
hits them alike). Prints tables and writes JSON (``--out``, default ``bench/bench_analysis.json``).

    python bench/bench_analysis.py                       # all-MiniLM-L6-v2 if installed, 128 sequences
    python bench/bench_analysis.py --random --size base --sequences 64 --no-memory
    python bench/bench_analysis.py --hf-dir /path/to/bert-base-uncased --sweep
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  common.add_model_args(p, sequences=128)
  p.add_argument("--data", default="ud-ewt", help="data spec with gold arcs (default: embedded "
                 "UD EWT test, 2077 sentences; conllu:FILE for another)")
  p.add_argument("--parser", default=None, help="spaCy pipeline for text data (default "
                 "en_core_web_sm); 'none': no arcs for text inputs (GLUE without spaCy; the "
                 "syntactic roles are then NaN on both sides)")
  p.add_argument("--sort-window", type=int, default=1024, help="length-sorting window "
                 "(AnalysisConfig default 1024; 0 = off)")
  p.add_argument("--bucket-step", type=int, default=16)
  p.add_argument("--repeats", type=int, default=3, help="timed passes (median reported)")
  p.add_argument("--baseline-sequences", type=int, default=64,
                 help="sequences for the notebook baseline: the first ones of the N (0 = skip)")
  p.add_argument("--baseline-threads", default="auto", help="torch threads for the baseline's "
                 "maps: a number, or 'auto' = the faster of (cores, 1) on the first batch")
  p.add_argument("--no-baseline-pickle", action="store_true", help="keep the baseline's maps in "
                 "memory only (default: pickle them to disk and load them back, as the notebooks)")
  p.add_argument("--memory-sequences", type=int, default=64, help="M: sequences of the 1x memory run")
  p.add_argument("--memory-multiples", default="1,4,16",
                 help="comma-separated multiples of M for the memory runs ('' = skip)")
  p.add_argument("--no-memory", action="store_true", help="skip the memory runs")
  p.add_argument("--no-jax-cache", action="store_true", help="do not turn on JAX's persistent "
                 "compilation cache (default: on, in a temporary folder, to measure its effect)")
  p.add_argument("--sweep", action="store_true", help="also sweep sort window, batch size, bucket step")
  p.add_argument("--stats-impl", default="auto", choices=("auto", "layerwise", "fused", "stacked"),
                 help="the analysis step's statistics path (heads_jax.stats.step; auto: the "
                      "stack on a GPU where it fits, per-layer XLA elsewhere)")
  p.add_argument("--compare-impls", default=None, help="comma-separated other stats_impl "
                 "values timed in the same run (default: the other of layerwise and stacked; "
                 "'' = none; 'fused' off a GPU runs the Pallas interpreter: slow)")
  p.add_argument("--no-pack", action="store_true", help="time the unpacked batches only (default: "
                 "the analysis runs on packed rows, several sequences per row, as the device pass "
                 "does wherever the step packs, and the unpacked run is timed beside it)")
  p.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"),
                 help="the encoder's matmul dtype for the step and the forward passes")
  p.add_argument("--dtype-error", action="store_true", help="also measure the sieve-bias / "
                 "distance error of a bfloat16 forward against float32 on the same batches")
  p.add_argument("--out", default=None, help="JSON path (default: bench/bench_analysis.json)")
  p.add_argument("--_memory-child", type=int, default=None, help=argparse.SUPPRESS)
  p.add_argument("--_hf-dir-resolved", default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------
# Model and data

def _resolve_model_dir(args, tmp: Path) -> tuple[Path, str]:
  """The HF directory both sides load (JAX: heads_jax.load_model, PyTorch: transformers)."""
  if args._hf_dir_resolved:
    return Path(args._hf_dir_resolved), args._hf_dir_resolved
  if args.hf_dir:
    return Path(args.hf_dir), str(args.hf_dir)
  from bench_notebook_baseline import default_hf_dir
  return default_hf_dir(args.size, tmp, prefer_minilm=not args.random)


def _encode(args, tokenizer, n: int, sort_window=None, batch_size=None, bucket_step=None) -> list:
  """``n`` sequences of ``args.data`` as a list of ``(indices, batch)`` (batches padded to the
  batch size with filler rows and to the pass's lengths, as ``compute_scores`` does)."""
  from heads_jax.data.specs import encode_spec, parse_spec
  sw = args.sort_window if sort_window is None else sort_window
  syntax = args.parser != "none" or parse_spec(args.data).kind == "conllu"
  parser = None if args.parser == "none" else args.parser
  info, batches, total = encode_spec(args.data, tokenizer, max_length=args.max_length,
                                     parser=parser, syntax=syntax,
                                     batch_size=batch_size or args.batch_size, max_examples=n,
                                     sort_window=sw or None,
                                     bucket_step=bucket_step or args.bucket_step,
                                     pad_to_batch_size=True)
  if total < n:
    from heads_jax import env
    raise SystemExit(f"{args.data} holds only {total} sequences but {n} were asked for; use fewer "
                     f"--sequences / --memory-multiples or a larger file, e.g. "
                     f"--data conllu:{env.shared_default('data/ud_ewt/en_ewt-ud-train.conllu')}")
  from heads_jax.stats.compiling import fit_length, pass_lengths
  lengths = pass_lengths(args.max_length, bucket_step or args.bucket_step)
  return [(i, fit_length(b, lengths)) for i, b in batches]   # the shapes compute_scores runs


def _pack(args, batches) -> list:
  """The same sequences packed as the device pass packs them (``pipelines.device_pass``)."""
  from heads_jax.pipelines.device_pass import pass_packing
  return list(pass_packing(batches, length=args.max_length, rows=args.batch_size,
                           window=args.sort_window))


def _max_diff(a: dict, b: dict) -> dict:
  """Largest absolute difference of each per-sequence result of two collections (NaN patterns
  must be equal)."""
  out = {}
  for key in ("sieve_bias", "distance"):
    x, y = np.asarray(a[key], np.float64), np.asarray(b[key], np.float64)
    both = ~np.isnan(x) & ~np.isnan(y)
    diff = np.abs(x - y)[both]
    out[key] = {"max_abs_diff": float(diff.max()) if both.any() else 0.0,
                # relative to the value (sieve biases reach tens): |x - y| / max(|y|, 1)
                "max_rel_diff": float((diff / np.maximum(np.abs(y[both]), 1.0)).max())
                if both.any() else 0.0,
                "nan_pattern_equal": bool(np.array_equal(np.isnan(x), np.isnan(y)))}
  return out


def _padding(batches) -> dict:
  real = sum(int(np.asarray(b["attention_mask"]).sum()) for _, b in batches)
  computed = sum(int(np.asarray(b["attention_mask"]).size) for _, b in batches)
  return {"real_tokens": real, "computed_tokens": computed,
          "padding_share": round(1 - real / computed, 3),
          "shapes": sorted({tuple(b["input_ids"].shape) for _, b in batches})}


def _forward_fns(model, mesh, compute_dtype: str = "float32"):
  """Jitted bare forward (pooled output only; the model's fused attention path) and forward
  returning the attentions, both with the model state replicated on ``mesh`` like the analysis
  step's, in ``compute_dtype``."""
  import jax
  from flax import nnx
  from heads_jax.parallel import replicate
  from heads_jax.stats.step import with_compute_dtype
  encoder = with_compute_dtype(getattr(model, "bert", model), compute_dtype)
  graphdef, state = nnx.split(encoder)
  state = replicate(state, mesh)

  def run(state, batch, attentions):
    packed = {}
    if "segment_ids" in batch:
      from heads_jax.sieves import segment_positions
      packed = {"segment_ids": batch["segment_ids"],
                "position_ids": segment_positions(batch["segment_ids"])}
    out = nnx.merge(graphdef, state)(batch["input_ids"], attention_mask=batch["attention_mask"],
                                     token_type_ids=batch["token_type_ids"],
                                     return_attentions=attentions, deterministic=True, **packed)
    return out["attentions"] if attentions else out["pooled"]

  bare = jax.jit(lambda s, b: run(s, b, False))
  attn = jax.jit(lambda s, b: run(s, b, True))
  return (lambda b: bare(state, b)), (lambda b: attn(state, b))


def _time_forward(forward, batches, mesh, multiple) -> float:
  """Seconds for one pass over ``batches``, one batch in flight (as ``collect`` runs)."""
  from heads_jax.parallel import pad_to_multiple, shard_batch
  start = time.perf_counter()
  pending = None
  for _, batch in batches:
    fields = ("input_ids", "attention_mask", "token_type_ids") + (
        ("segment_ids",) if "segment_ids" in batch else ())
    padded, _ = pad_to_multiple({f: np.asarray(batch[f], np.int32) for f in fields}, multiple)
    out = forward(shard_batch(padded, mesh))
    if pending is not None:
      pending.block_until_ready()
    pending = out
  pending.block_until_ready()
  return time.perf_counter() - start


def _one_per_shape(batches) -> list:
  shapes = {}
  for idx, batch in batches:
    shapes.setdefault(batch["input_ids"].shape, (idx, batch))
  return list(shapes.values())


# ------------------------------------------------------------------------------------------------
# Throughput

def _say(line: str) -> None:
  """A progress line (a long run on an accelerator shows where it is)."""
  print(line, flush=True)


def _analysis_config(args, name: str, n: int):
  from heads_jax.pipelines.analyze import AnalysisConfig
  return AnalysisConfig(model=name, data=(args.data,), out="unused", max_examples=n,
                        max_length=args.max_length, batch_size=args.batch_size, parser=args.parser,
                        sort_window=args.sort_window or None)


def _throughput(args, hf_dir: Path, name: str) -> tuple[dict, dict, list]:
  import jax
  from heads_jax import load_model
  from heads_jax.pipelines.analyze import compute_scores
  from heads_jax.parallel import data_mesh
  from heads_jax.stats.collector import collect
  from heads_jax.stats.step import make_analysis_step
  model, tokenizer = load_model(hf_dir)
  n = args.sequences
  cfg = _analysis_config(args, name, n)
  # end-to-end first, before anything is compiled (with the persistent cache on, this run fills it)
  _say(f"end to end (compute_scores), cold: {n} sequences ...")
  with common.Timer() as cold:
    compute_scores(cfg, model=model, tokenizer=tokenizer, progress=False)
  _say(f"  {cold.wall:.1f} s ({n / cold.wall:.1f} sequences/s)")

  unpacked = _encode(args, tokenizer, n)
  mesh = data_mesh()
  step = make_analysis_step(model, stats_impl=args.stats_impl, compute_dtype=args.compute_dtype)
  packing = step.packs and not args.no_pack
  batches = _pack(args, unpacked) if packing else unpacked
  compare = args.compare_impls
  if compare is None:  # the other of the two XLA paths than the one auto took
    compare = "stacked" if step.stats_impl == "layerwise" else "layerwise"
  others = {impl: make_analysis_step(model, stats_impl=impl, compute_dtype=args.compute_dtype)
            for impl in filter(None, (x.strip() for x in compare.split(",")))
            if impl != step.stats_impl}
  forward, forward_attn = _forward_fns(model, mesh, args.compute_dtype)
  shapes = _one_per_shape(batches)
  shapes_unpacked = _one_per_shape(unpacked) if packing else []
  _say(f"compiling the step ({step.stats_impl}; {len(shapes)} shapes"
       f"{', packed' if packing else ''}), "
       f"{', '.join(others) or 'no other path'} and the forwards ...")
  with common.Timer() as t:
    collect(step, shapes, n, progress=False, allow_missing=True)
  compile_s = t.wall
  for other in others.values():
    collect(other, shapes, n, progress=False, allow_missing=True)
  _time_forward(forward, shapes, mesh, step.multiple)
  _time_forward(forward_attn, shapes, mesh, step.multiple)
  if packing:
    collect(step, shapes_unpacked, n, progress=False, allow_missing=True)
    _time_forward(forward, shapes_unpacked, mesh, step.multiple)
  _say(f"  compiled in {time.perf_counter() - t._w:.1f} s (the step: {compile_s:.1f} s); "
       f"timing {args.repeats} interleaved repeats ...")

  walls = {"analysis": [], "forward": [], "forward_attn": []}
  walls.update({f"analysis_{impl}": [] for impl in others})
  if packing:
    walls.update({"analysis_unpacked": [], "forward_unpacked": []})
  cpus = {k: [] for k in walls}
  ours = ours_unpacked = None
  for _ in range(args.repeats):       # interleaved, so load from other processes hits all alike
    for key in walls:
      with common.Timer() as t:
        if key == "analysis":
          ours = collect(step, batches, n, progress=False)
        elif key == "analysis_unpacked":
          ours_unpacked = collect(step, unpacked, n, progress=False)
        elif key == "forward_unpacked":
          _time_forward(forward, unpacked, mesh, step.multiple)
        elif key.startswith("analysis_"):
          collect(others[key[len("analysis_"):]], batches, n, progress=False)
        else:
          _time_forward(forward if key == "forward" else forward_attn, batches, mesh, step.multiple)
      walls[key].append(t.wall)
      cpus[key].append(t.cpu)
    _say("  " + ", ".join(f"{k} {walls[k][-1]:.2f} s" for k in walls))
  timing = {k: common.summarize(walls[k], cpus[k]) for k in walls}

  warm = None
  if args.jax_cache:
    with common.Timer() as warm:      # a new step: compiles again, now from the persistent cache
      compute_scores(cfg, model=model, tokenizer=tokenizer, progress=False)

  enc = model.config
  row = lambda method, key: {"method": method, "seq_per_s": common.rate(n, timing[key]),
                             "range": common.spread(n, timing[key]), "median_s": timing[key]["median_s"],
                             "cpu_s": timing[key]["cpu_median_s"]}
  rows = [
      row(f"heads_jax analysis step (sieve bias 13 roles + distance; stats_impl="
          f"{step.stats_impl})", "analysis"),
      *[row(f"heads_jax analysis step, stats_impl={impl}", f"analysis_{impl}") for impl in others],
      *([row("heads_jax analysis step on unpacked batches (one sequence per row)",
             "analysis_unpacked")] if packing else []),
      row("bare jitted forward (fused attention, no attentions returned)", "forward"),
      *([row("bare jitted forward on unpacked batches", "forward_unpacked")] if packing else []),
      row("jitted forward returning attentions", "forward_attn"),
      {"method": "compute_scores end-to-end, cold (encode + compile + pass)",
       "seq_per_s": n / cold.wall, "range": "", "median_s": cold.wall, "cpu_s": cold.cpu},
  ]
  if warm is not None:
    rows.append({"method": "compute_scores end-to-end, warm persistent compilation cache",
                 "seq_per_s": n / warm.wall, "range": "", "median_s": warm.wall, "cpu_s": warm.cpu})
  result = {
      "model": name, "layers": enc.num_layers, "heads": enc.num_heads, "hidden": enc.hidden_size,
      "devices": f"{len(jax.devices())} x {jax.devices()[0].device_kind}",
      "data": args.data, "sequences": n, "batch_size": args.batch_size,
      "stats_impl": step.stats_impl, "compute_dtype": args.compute_dtype,
      "max_length": args.max_length, "sort_window": args.sort_window, "bucket_step": args.bucket_step,
      "packed": packing, "padding": _padding(batches), "padding_unpacked": _padding(unpacked),
      "packed_vs_unpacked": _max_diff(ours, ours_unpacked) if packing else None,
      "analysis_compile_s": round(compile_s, 2),
      "timing": timing, "end_to_end_cold_s": cold.wall,
      "end_to_end_warm_cache_s": warm.wall if warm is not None else None, "rows": rows,
      "statistics_overhead_vs_forward": timing["analysis"]["median_s"] / timing["forward"]["median_s"] - 1,
      "statistics_overhead_vs_forward_attn":
          timing["analysis"]["median_s"] / timing["forward_attn"]["median_s"] - 1,
      "statistics_overhead_vs_forward_cpu":
          timing["analysis"]["cpu_median_s"] / timing["forward"]["cpu_median_s"] - 1,
  }
  if args.dtype_error:
    result["bfloat16_error"] = _dtype_error(model, batches, n)
  return result, ours, unpacked


def _dtype_error(model, batches, n: int) -> dict:
  """Sieve-bias and distance error of a bfloat16 forward against float32 on the same batches
  (same statistics path), over the (sequence, layer, head, role) values defined in both."""
  from heads_jax.stats.collector import collect
  from heads_jax.stats.step import make_analysis_step
  ref = collect(make_analysis_step(model, compute_dtype="float32"), batches, n, progress=False)
  low = collect(make_analysis_step(model, compute_dtype="bfloat16"), batches, n, progress=False)
  out = {}
  for key in ("sieve_bias", "distance"):
    a, b = np.asarray(ref[key], np.float64), np.asarray(low[key], np.float64)
    both = ~np.isnan(a) & ~np.isnan(b)
    err = np.abs(a - b)[both]
    out[key] = {"max_abs": float(err.max()), "mean_abs": float(err.mean()),
                "max_rel": float((err / np.maximum(np.abs(a[both]), 1e-12)).max()),
                "values": int(both.sum()), "nan_pattern_equal": bool(np.array_equal(
                    np.isnan(a), np.isnan(b))), "reference_mean_abs": float(np.abs(a[both]).mean())}
  # the per-head means over the sequences (what the hypothesis tests and the report use)
  a, b = np.asarray(ref["sieve_bias"], np.float64), np.asarray(low["sieve_bias"], np.float64)
  with warnings.catch_warnings():   # roles never defined here (block on single sentences): NaN
    warnings.simplefilter("ignore", RuntimeWarning)
    ma, mb = np.nanmean(a, axis=0), np.nanmean(b, axis=0)               # [l, h, r]
  ok = ~np.isnan(ma) & ~np.isnan(mb)
  err = np.abs(ma - mb)[ok]
  out["sieve_bias_head_means"] = {"max_abs": float(err.max()), "mean_abs": float(err.mean()),
                                  "max_rel": float((err / np.maximum(np.abs(ma[ok]), 1e-12)).max())}
  return out


# ------------------------------------------------------------------------------------------------
# Notebook baseline

def _baseline(args, hf_dir: Path, batches: list, ours: dict, ours_rate: dict) -> dict:
  import bench_notebook_baseline as nb
  m = min(args.sequences, args.baseline_sequences)
  torch_model = nb.load_torch_model(hf_dir)
  device = str(next(torch_model.parameters()).device)
  threads, trial = nb.choose_torch_threads(args.baseline_threads, torch_model, batches[:1])
  picked, count = [], 0
  for idx, batch in batches:       # the first m sequences of the same batches
    keep = (np.asarray(idx) >= 0) & (np.asarray(idx) < m)
    if keep.any():
      picked.append((np.where(keep, idx, -1), batch))
      count += int(keep.sum())
  pickle_dir = None if args.no_baseline_pickle else args.tmp
  res = nb.run_baseline(torch_model, picked, pickle_dir=pickle_dir)
  agreement = nb.compare(res, ours)
  total = res["maps_s"] + res["pickle_s"] + res["loops_s"]
  total_cpu = res["maps_cpu_s"] + res["pickle_cpu_s"] + res["loops_cpu_s"]
  rate = count / total
  return {
      "sequences": count, "torch_device": device, "torch_threads": threads, "thread_trial_s": trial,
      "total_cpu_s": total_cpu, "cpu_s_per_sequence": total_cpu / count,
      "maps_cpu_s": res["maps_cpu_s"], "pickle_cpu_s": res["pickle_cpu_s"],
      "loops_cpu_s": res["loops_cpu_s"],
      "maps_s": res["maps_s"], "pickle_s": res["pickle_s"], "loops_s": res["loops_s"],
      "total_s": total, "seq_per_s": rate, "maps_seq_per_s": count / res["maps_s"],
      "stored_maps_mib": res["maps_mib"], "agreement_with_heads_jax": agreement,
      "speedups": {k: v / rate for k, v in ours_rate.items()},
  }


def _cpu_ratio(tp: dict, bl: dict, key: str = "analysis") -> float:
  """Notebook CPU seconds per sequence / heads_jax CPU seconds per sequence of ``key`` (all
  threads of each process): the work ratio, steadier than wall time on a shared machine. With
  ``key="forward"`` it is the ceiling: the ratio if the statistics cost nothing."""
  ours = tp["timing"][key]["cpu_median_s"] / tp["sequences"]
  return bl["cpu_s_per_sequence"] / ours


# ------------------------------------------------------------------------------------------------
# Memory

def _memory_child(args) -> dict:
  """Fresh process: peak RSS of ``compute_scores`` on ``args._memory_child`` sequences."""
  import tracemalloc
  from heads_jax import load_model
  from heads_jax.pipelines.analyze import compute_scores
  hf_dir = Path(args._hf_dir_resolved)
  model, tokenizer = load_model(hf_dir)
  n = args._memory_child
  cfg = _analysis_config(args, str(hf_dir), n)
  before = common.current_rss_mib()
  reset = common.reset_peak_rss()
  tracemalloc.start()
  scores = compute_scores(cfg, model=model, tokenizer=tokenizer, progress=False)
  _, traced = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  peak = common.peak_rss_since_reset_mib() if reset else None
  if len(scores["lengths"]) != n:
    raise SystemExit(f"{args.data} gave {len(scores['lengths'])} sequences, not {n}")
  result_bytes = sum(scores[k].nbytes for k in ("sieve_bias", "distance", "lengths", "data_index"))
  l, h = model.config.num_layers, model.config.num_heads
  # what the notebooks would hold: one [l, h, 128, 128] float32 array per sequence
  maps_bytes_128 = n * l * h * args.max_length ** 2 * 4
  return {"sequences": n, "process_peak_rss_mib": round(common.peak_rss_mib(), 1),
          "rss_before_analysis_mib": round(before, 1) if before else None,
          "analysis_peak_rss_mib": round(peak, 1) if peak else None,
          "analysis_rss_growth_mib": round(peak - before, 1) if peak and before else None,
          "python_heap_peak_mib": round(traced / 2**20, 2),
          "result_arrays_mib": round(result_bytes / 2**20, 2), "result_arrays_bytes": int(result_bytes),
          "notebook_stored_maps_mib": round(maps_bytes_128 / 2**20, 1)}


def _memory(args, hf_dir: Path) -> list:
  multiples = [int(x) for x in args.memory_multiples.split(",") if x.strip()]
  rows = []
  for mult in multiples:
    cmd = [sys.executable, __file__, "--_memory-child", str(mult * args.memory_sequences),
           "--_hf-dir-resolved", str(hf_dir), "--data", args.data,
           "--batch-size", str(args.batch_size), "--max-length", str(args.max_length),
           "--sort-window", str(args.sort_window)] + (["--parser", args.parser] if args.parser else [])
    env = dict(os.environ)
    if args.jax_cache:
      env["JAX_COMPILATION_CACHE_DIR"] = args.jax_cache
      env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
      env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    row = common.run_json_child(cmd, env=env)
    row["multiple"] = f"{mult}x"
    rows.append(row)
  base = rows[0] if rows else None
  for row in rows:
    key = "analysis_peak_rss_mib" if row.get("analysis_peak_rss_mib") else "process_peak_rss_mib"
    row["peak_growth_vs_first_mib"] = round(row[key] - base[key], 1)
    row["result_growth_vs_first_mib"] = round(row["result_arrays_mib"] - base["result_arrays_mib"], 2)
  return rows


# ------------------------------------------------------------------------------------------------
# Sweep of batching options

SWEEP = [  # (label, sort_window, batch_size, bucket_step); the first is the default setting
    ("default: sort 1024, batch 32, bucket 16", 1024, 32, 16),
    ("no sorting", 0, 32, 16),
    ("sort window 256", 256, 32, 16),
    ("batch 16", 1024, 16, 16),
    ("batch 64", 1024, 64, 16),
    ("bucket step 8", 1024, 32, 8),
    ("bucket step 32", 1024, 32, 32),
    ("batch 16, bucket step 8", 1024, 16, 8),
    ("one shape (bucket = max length)", 1024, 32, 128),
]


def _sweep(args, hf_dir: Path) -> list:
  from heads_jax import load_model
  from heads_jax.stats.collector import collect
  from heads_jax.stats.step import make_analysis_step
  model, tokenizer = load_model(hf_dir)
  step = make_analysis_step(model)
  n = args.sequences
  rows = []
  for label, sw, bs, bucket in SWEEP:
    batches = _encode(args, tokenizer, n, sort_window=sw, batch_size=bs, bucket_step=bucket)
    t0 = time.perf_counter()
    collect(step, _one_per_shape(batches), n, progress=False, allow_missing=True)
    compile_s = time.perf_counter() - t0
    walls, cpus = [], []
    for _ in range(args.repeats):
      with common.Timer() as t:
        collect(step, batches, n, progress=False)
      walls.append(t.wall)
      cpus.append(t.cpu)
    timing = common.summarize(walls, cpus)
    pad = _padding(batches)
    rows.append({"setting": label, "seq_per_s": common.rate(n, timing), "range": common.spread(n, timing),
                 "cpu_s": timing["cpu_median_s"],
                 "padding_share": pad["padding_share"], "shapes": len(pad["shapes"]),
                 "compile_s": round(compile_s, 1)})
  first = rows[0]["seq_per_s"]
  for r in rows:
    r["vs_default"] = f"{r['seq_per_s'] / first:.2f}x"
  return rows


# ------------------------------------------------------------------------------------------------

def main(argv=None):
  args = _parse(argv)
  if args._memory_child is not None:
    import json
    print(json.dumps(_memory_child(args)))
    return
  note = common.warn_if_emulated_devices()
  print(common.device_header(common.machine_info()))
  with tempfile.TemporaryDirectory() as tmp:
    hf_dir, name = _resolve_model_dir(args, Path(tmp) / "model")
    args.tmp, args.jax_cache = tmp, None
    if not args.no_jax_cache:
      args.jax_cache = str(Path(tmp) / "jax_cache")
      common.enable_jax_compilation_cache(args.jax_cache)
    result = {"machine": common.machine_info(), "command": common.command_line(), "note": note}
    tp, ours, batches = _throughput(args, hf_dir, name)
    result["throughput"] = tp
    print(common.format_table(tp["rows"], ["method", "seq_per_s", "range", "median_s", "cpu_s"],
                              title=f"\nanalysis throughput: {name}, {tp['sequences']} sequences, "
                                    f"batch {tp['batch_size']}, padding {tp['padding']['padding_share']:.0%}, "
                                    f"{tp['devices']}"))
    pad, unpad = tp["padding"], tp["padding_unpacked"]
    print(f"padding: {pad['padding_share']:.1%} of {pad['computed_tokens']} positions on "
          f"{len(pad['shapes'])} compiled shape(s) {pad['shapes']}"
          + (f" (packed); unpacked {unpad['padding_share']:.1%} of {unpad['computed_tokens']} on "
             f"{len(unpad['shapes'])} shape(s) {unpad['shapes']}" if tp["packed"] else " (unpacked)"))
    if tp["packed_vs_unpacked"]:
      print("packed vs unpacked scores: " + "; ".join(
          f"{k}: max abs diff {v['max_abs_diff']:.1e} (relative to max(|value|, 1): "
          f"{v['max_rel_diff']:.1e}), NaN pattern equal {v['nan_pattern_equal']}"
          for k, v in tp["packed_vs_unpacked"].items()))
    if "bfloat16_error" in tp:
      print("bfloat16 forward vs float32: " + "; ".join(
          f"{k}: max abs {v['max_abs']:.2e}, mean abs {v['mean_abs']:.2e}, max rel {v['max_rel']:.2e}"
          for k, v in tp["bfloat16_error"].items()))
    print(f"statistics on top of the bare forward: {tp['statistics_overhead_vs_forward']:+.1%} wall, "
          f"{tp['statistics_overhead_vs_forward_cpu']:+.1%} CPU time (target < +10%); on top of the "
          f"forward returning attentions: {tp['statistics_overhead_vs_forward_attn']:+.1%} wall")
    if args.baseline_sequences != 0:
      rates = {"steady state": common.rate(tp["sequences"], tp["timing"]["analysis"]),
               "end-to-end, cold": tp["sequences"] / tp["end_to_end_cold_s"]}
      if tp["end_to_end_warm_cache_s"]:
        rates["end-to-end, warm compilation cache"] = tp["sequences"] / tp["end_to_end_warm_cache_s"]
      bl = _baseline(args, hf_dir, batches, ours, rates)
      bl["speedup_cpu_time_steady_state"] = _cpu_ratio(tp, bl)
      bl["speedup_cpu_time_ceiling_bare_forward"] = _cpu_ratio(tp, bl, "forward")
      result["notebook_baseline"] = bl
      rows = [{"method": "notebook approach: torch maps, pickle, numpy loops", "sequences": bl["sequences"],
               "seq_per_s": bl["seq_per_s"], "maps_s": bl["maps_s"], "pickle_s": bl["pickle_s"],
               "loops_s": bl["loops_s"], "heads_jax_speedup": ""}]
      rows += [{"method": f"heads_jax, {k}", "sequences": tp["sequences"], "seq_per_s": v,
                "heads_jax_speedup": f"{bl['speedups'][k]:.1f}x"} for k, v in rates.items()]
      print(common.format_table(rows, title=f"\nvs the authors' notebook approach (target >= 20x; "
                                            f"torch on {bl['torch_device']}, threads "
                                            f"{bl['torch_threads']})"))
      print(f"in CPU time (all threads of each process): notebook {bl['cpu_s_per_sequence']:.4f} s "
            f"per sequence, heads_jax steady state "
            f"{tp['timing']['analysis']['cpu_median_s'] / tp['sequences']:.4f}: "
            f"{bl['speedup_cpu_time_steady_state']:.1f}x (ceiling with free statistics, notebook / "
            f"bare forward: {bl['speedup_cpu_time_ceiling_bare_forward']:.1f}x; notebook CPU s: maps "
            f"{bl['maps_cpu_s']:.2f}, pickle {bl['pickle_cpu_s']:.2f}, loops {bl['loops_cpu_s']:.2f})")
      agree = bl["agreement_with_heads_jax"]
      print("agreement with heads_jax on the same sequences: "
            + "; ".join(f"{k}: max abs diff {v['max_abs_diff']:.2e}, NaN pattern equal "
                        f"{v['nan_pattern_equal']}" for k, v in agree.items()))
    if not args.no_memory and args.memory_multiples.strip():
      mem = _memory(args, hf_dir)
      result["memory"] = mem
      print(common.format_table(mem, ["multiple", "sequences", "rss_before_analysis_mib",
                                      "analysis_peak_rss_mib", "peak_growth_vs_first_mib",
                                      "result_arrays_mib", "result_growth_vs_first_mib",
                                      "python_heap_peak_mib", "notebook_stored_maps_mib"],
                                title="\npeak memory of compute_scores, one fresh process per size"))
    if args.sweep:
      sweep = _sweep(args, hf_dir)
      result["sweep"] = sweep
      print(common.format_table(sweep, title="\nbatching options (analysis step, steady state)"))
  path = common.write_json(common.default_json_path(__file__, args.out), result)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
