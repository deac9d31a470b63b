"""Benchmark of the analysis step (not a test).

Measures, on the same encoded batches of UD English EWT test sentences (gold arcs):

* throughput (sequences/s) of the full analysis step (forward with attentions + sieves +
  sieve bias + distance features, streamed by ``collect``) and of the bare jitted forward pass
  (no attentions returned), and their ratio;
* peak host memory (``ru_maxrss``, and the ``tracemalloc`` peak of the collection loop) when
  collecting N and 4N sequences, each in a fresh process: memory must not grow with N beyond
  the result arrays (``[N, l, h, r]`` + ``[N, l, h, 21]``), since attention maps stay on the
  device.

Prints a table and writes JSON.

    python bench/bench_analysis.py                        # mini config, random weights
    python bench/bench_analysis.py --size base --sequences 512 --batch-size 64
    python bench/bench_analysis.py --hf-dir /path/to/bert-base-uncased
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="mini", help="model size variant (tiny, mini, small, base, large)")
  p.add_argument("--hf-dir", default=None, help="Hugging Face BERT directory or heads_jax model dir "
                 "(overrides --size)")
  p.add_argument("--sequences", type=int, default=256, help="N: sequences per throughput run")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--max-length", type=int, default=128)
  p.add_argument("--conllu", default=None, help="CoNLL-U file (default: embedded UD EWT test)")
  p.add_argument("--repeats", type=int, default=2, help="timed passes (best is reported)")
  p.add_argument("--no-memory", action="store_true", help="skip the 1x / 4x memory runs")
  p.add_argument("--json", default="bench/bench_analysis.json", help="where to write the results")
  p.add_argument("--_memory-child", type=int, default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def _model_and_tokenizer(args):
  from flax import nnx
  from heads_jax.data.tokenizer import load_tokenizer
  if args.hf_dir:
    from heads_jax import load_model
    model, tokenizer = load_model(args.hf_dir)
    return model, tokenizer, str(args.hf_dir)
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  tokenizer = load_tokenizer()
  cfg = config_for(args.size, vocab_size=tokenizer.vocab_size,
                   max_position_embeddings=max(512, args.max_length))
  return BertModel(cfg, rngs=nnx.Rngs(0)), tokenizer, f"{args.size} (random init)"


def _encoded_batches(args, tokenizer, n: int) -> list:
  """``n`` sequences (cycling through the file if it is shorter) as a list of
  ``(indices, batch)``, every batch ``batch_size`` rows (filler rows have index -1)."""
  from heads_jax.data.assets import ud_ewt_test_path
  from heads_jax.data.conllu import read_conllu
  from heads_jax.data.encoding import AnalysisExample, Segment, iter_batches
  path = args.conllu or ud_ewt_test_path()
  sentences = list(read_conllu(path))
  if not sentences:
    raise SystemExit(f"{path} holds no sentences")
  examples = [AnalysisExample(Segment.from_sentence(s))
              for s in itertools.islice(itertools.cycle(sentences), n)]
  return list(iter_batches(examples, tokenizer, max_length=args.max_length,
                           batch_size=args.batch_size, pad_to_batch_size=True))


def _forward_fn(model, mesh):
  """The bare jitted forward pass (no attentions), sharded like the analysis step."""
  import jax
  from flax import nnx
  from heads_jax.parallel import replicate
  encoder = getattr(model, "bert", model)
  graphdef, state = nnx.split(encoder)
  state = replicate(state, mesh)

  @jax.jit
  def forward(state, batch):
    out = nnx.merge(graphdef, state)(batch["input_ids"], attention_mask=batch["attention_mask"],
                                     token_type_ids=batch["token_type_ids"], deterministic=True)
    return out["pooled"]

  return lambda batch: forward(state, batch)


def _time_forward(forward, batches, mesh, multiple) -> float:
  """Seconds for one pass, one batch in flight (as ``collect`` runs the analysis)."""
  import numpy as np
  from heads_jax.parallel import pad_to_multiple, shard_batch
  fields = ("input_ids", "attention_mask", "token_type_ids")
  start = time.perf_counter()
  pending = None
  for _, batch in batches:
    padded, _ = pad_to_multiple({f: batch[f] for f in fields}, multiple)
    out = forward(shard_batch(padded, mesh))
    if pending is not None:
      np.asarray(pending)
    pending = out
  np.asarray(pending)
  return time.perf_counter() - start


def _throughput(args) -> dict:
  import jax
  from heads_jax.parallel import data_mesh
  from heads_jax.stats.collector import collect
  from heads_jax.stats.step import make_analysis_step
  model, tokenizer, name = _model_and_tokenizer(args)
  batches = _encoded_batches(args, tokenizer, args.sequences)
  mesh = data_mesh()
  step = make_analysis_step(model)
  forward = _forward_fn(model, mesh)
  # compile every (b, k) shape once before timing
  shapes = {}
  for idx, batch in batches:
    shapes.setdefault(batch["input_ids"].shape, (idx, batch))
  t0 = time.perf_counter()
  collect(step, list(shapes.values()), args.sequences, progress=False, allow_missing=True)
  compile_s = time.perf_counter() - t0
  _time_forward(forward, list(shapes.values()), mesh, step.multiple)
  analysis_s, forward_s = [], []
  for _ in range(args.repeats):
    t0 = time.perf_counter()
    collect(step, batches, args.sequences, progress=False)
    analysis_s.append(time.perf_counter() - t0)
    forward_s.append(_time_forward(forward, batches, mesh, step.multiple))
  cfg = getattr(getattr(model, "bert", model), "config", None)
  n = args.sequences
  return {
      "model": name, "layers": getattr(cfg, "num_layers", None), "heads": getattr(cfg, "num_heads", None),
      "devices": f"{len(jax.devices())} x {jax.devices()[0].device_kind}",
      "sequences": n, "batch_size": args.batch_size, "max_length": args.max_length,
      "padded_lengths": sorted({k for _, k in shapes}),
      "analysis_compile_s": round(compile_s, 2),
      "analysis_seq_per_s": round(n / min(analysis_s), 2),
      "forward_seq_per_s": round(n / min(forward_s), 2),
      "analysis_over_forward_time": round(min(analysis_s) / min(forward_s), 3),
  }


def _memory_child(args, n: int) -> dict:
  """Runs in a fresh process: peak memory of collecting ``n`` sequences."""
  from heads_jax.stats.collector import collect
  from heads_jax.stats.step import make_analysis_step
  model, tokenizer, _ = _model_and_tokenizer(args)
  batches = _encoded_batches(args, tokenizer, n)
  step = make_analysis_step(model)
  shapes = {}
  for idx, batch in batches:
    shapes.setdefault(batch["input_ids"].shape, (idx, batch))
  collect(step, list(shapes.values()), n, progress=False, allow_missing=True)  # compile
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  tracemalloc.start()
  result = collect(step, iter(batches), n, progress=False)
  _, traced_peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  kib = 1 if platform.system() == "Linux" else 1 / 1024  # ru_maxrss: KiB on Linux, bytes on macOS
  result_bytes = result["sieve_bias"].nbytes + result["distance"].nbytes + result["lengths"].nbytes
  return {"sequences": n, "peak_rss_mib": round(after * kib / 1024, 1),
          "rss_growth_during_collect_mib": round((after - before) * kib / 1024, 1),
          "tracemalloc_peak_mib": round(traced_peak / 2**20, 2),
          "result_arrays_mib": round(result_bytes / 2**20, 2)}


def _memory(args) -> list:
  rows = []
  for n in (args.sequences, 4 * args.sequences):
    cmd = [sys.executable, __file__, "--_memory-child", str(n), "--size", args.size,
           "--batch-size", str(args.batch_size), "--max-length", str(args.max_length)]
    if args.hf_dir:
      cmd += ["--hf-dir", str(args.hf_dir)]
    if args.conllu:
      cmd += ["--conllu", str(args.conllu)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
  return rows


def _table(result: dict) -> str:
  lines = [f"{k:>28}: {v}" for k, v in result["throughput"].items()]
  if result.get("memory"):
    cols = list(result["memory"][0])
    lines.append("")
    lines.append(" | ".join(f"{c:>28}" for c in cols))
    for row in result["memory"]:
      lines.append(" | ".join(f"{row[c]:>28}" for c in cols))
  return "\n".join(lines)


def main(argv=None):
  args = _parse(argv)
  if args._memory_child is not None:
    print(json.dumps(_memory_child(args, args._memory_child)))
    return
  result = {"throughput": _throughput(args)}
  if not args.no_memory:
    result["memory"] = _memory(args)
  print(_table(result))
  Path(args.json).parent.mkdir(parents=True, exist_ok=True)
  Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
