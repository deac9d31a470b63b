"""The second pass's memory and operations beside the first pass's (issue 52 item 2).

One process compiles and runs the analysis's passes over synthetic full-length single sentences
(words of 1-3 pieces with dependency arcs, so the parse runs) on a randomly initialised BERT of
the given shape, as ``heads-jax analyze`` does: ``--pass first`` (the analysis step alone),
``--pass both`` (the analysis step, then the second pass in the same process, as ``analyze``
runs them). Measure the process's peak memory from outside:

    /usr/bin/time -v python bench/bench_second_pass.py --pass first --length 8192 --batch 1 \\
        --layers 2 --heads 8 --hidden 32 --stats-impl kernel
    /usr/bin/time -v python bench/bench_second_pass.py --pass both  --length 8192 --batch 1 \\
        --layers 2 --heads 8 --hidden 32 --stats-impl kernel

and read "Maximum resident set size". The script prints one JSON line: each pass's path, its
compiled program's temporary bytes (``memory_analysis().temp_size_in_bytes``), its operation
counts (``op_counts``: matmul FLOPs and other element operations from the program's jaxpr, loop
bodies times their trip counts; no timing), and the process's own peak RSS (``ru_maxrss``).
``--no-run`` compiles and counts only. The second pass's path follows the first's
(``--stats-impl kernel``: map-free; otherwise each layer's map, one layer at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sentences(batch: int, length: int, seed: int = 0) -> dict:
  """``batch`` full-length single sentences ``[b, length]``: [CLS], words of 1-3 pieces (each
  word's head a random other word, relation 1-4), [SEP]; a comma or period now and then."""
  from heads_jax.data import vocabulary as V
  rng = np.random.default_rng(seed)
  out = V.empty_batch(batch, length)
  for i in range(batch):
    out["attention_mask"][i] = 1
    out["input_ids"][i] = rng.integers(5, 100, length)
    tc = np.full(length, V.TOKEN_OTHER)
    tc[0], tc[-1] = V.TOKEN_CLS, V.TOKEN_SEP
    punct = rng.random(length) < 0.05
    tc[1:-1][punct[1:-1]] = V.TOKEN_COMMA
    out["token_class"][i] = tc
    words, w, left = np.full(length, -1), -1, 0
    for t in range(1, length - 1):
      if left == 0:
        w, left = w + 1, int(rng.integers(1, 4))
      words[t], left = w, left - 1
    out["word_ids"][i] = words
    n = w + 1
    heads = rng.integers(0, n, n)
    heads = np.where(heads == np.arange(n), (heads + 1) % max(n, 2), heads)
    out["dep_head"][i] = np.where(words >= 0, heads[np.clip(words, 0, None)], -1)
    out["dep_rel"][i] = np.where(words >= 0, rng.integers(1, 5, length), 0)
  return {k: np.asarray(v, np.int32) for k, v in out.items()}


def op_counts(closed_jaxpr) -> dict:
  """``{"matmul_flops", "element_ops"}`` of a jaxpr: 2 m n k per ``dot_general``, the output size
  of every other equation; a ``scan`` / ``while`` body counted times its trip count (a while
  loop's from its bounds where they are literals), a ``cond`` by its largest branch."""
  from jax.extend import core as jcore
  totals = {"matmul_flops": 0, "element_ops": 0}

  def size(aval):
    return int(np.prod(getattr(aval, "shape", ()), dtype=np.int64))

  def walk(jaxpr, times):
    for eqn in jaxpr.eqns:
      name = eqn.primitive.name
      p = eqn.params
      if name == "dot_general":
        (lc, _), (lb, _) = p["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        contract = int(np.prod([lhs[d] for d in lc], dtype=np.int64))
        totals["matmul_flops"] += times * 2 * size(eqn.outvars[0].aval) * contract
      elif name == "scan":
        walk(p["jaxpr"].jaxpr, times * int(p["length"]))
      elif name == "while":
        trips = 1
        body = p["body_jaxpr"].jaxpr
        bounds = [v for v in eqn.invars[p["cond_nconsts"] + p["body_nconsts"]:][:2]]
        if all(isinstance(v, jcore.Literal) for v in bounds):
          trips = max(1, int(bounds[1].val) - int(bounds[0].val))
        walk(body, times * trips)
      elif name == "cond":
        best = None
        for branch in p["branches"]:
          before = dict(totals)
          walk(branch.jaxpr, times)
          cost = (totals["matmul_flops"] - before["matmul_flops"],
                  totals["element_ops"] - before["element_ops"])
          totals.update(before)
          best = cost if best is None or sum(cost) > sum(best) else best
        totals["matmul_flops"] += best[0]
        totals["element_ops"] += best[1]
      else:
        inner = [v for v in p.values() if isinstance(v, (jcore.ClosedJaxpr, jcore.Jaxpr))]
        if inner:
          for j in inner:
            walk(getattr(j, "jaxpr", j), times)
        else:
          totals["element_ops"] += times * sum(size(v.aval) for v in eqn.outvars)
  walk(closed_jaxpr.jaxpr, 1)
  return totals


def _measure(jitted, *args) -> dict:
  import jax
  lowered = jitted.lower(*args)
  compiled = lowered.compile()
  return {"temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
          **op_counts(jax.make_jaxpr(jitted)(*args))}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--pass", dest="which", choices=("first", "both"), default="both")
  ap.add_argument("--length", type=int, default=128)
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--layers", type=int, default=6)
  ap.add_argument("--heads", type=int, default=12)
  ap.add_argument("--hidden", type=int, default=384)
  ap.add_argument("--stats-impl", default="auto",
                  help="the first pass's path (HEADS_JAX_STATS_IMPL); 'kernel' is map-free")
  ap.add_argument("--no-run", action="store_true", help="compile and count only")
  args = ap.parse_args(argv)
  if args.stats_impl != "auto":
    os.environ["HEADS_JAX_STATS_IMPL"] = args.stats_impl
  import jax
  import jax.numpy as jnp
  from heads_jax.data import vocabulary as V
  from heads_jax.model.checkpoint import build_model
  from heads_jax.model.config import config_for
  from heads_jax.parallel import data_mesh
  from heads_jax.stats.norms import make_norm_step
  from heads_jax.stats.step import make_analysis_step

  cfg = config_for("base", num_layers=args.layers, num_heads=args.heads, hidden_size=args.hidden,
                   intermediate_size=4 * args.hidden, vocab_size=128,
                   max_position_embeddings=max(512, args.length))
  model = build_model("BertModel", cfg, seed=0)
  mesh = data_mesh(jax.devices()[:1])
  batch = sentences(args.batch, args.length)
  spec = jax.ShapeDtypeStruct((args.batch, args.length), jnp.int32)
  specs = {f: spec for f in V.BATCH_FIELDS}
  step = make_analysis_step(model, measures=True, mesh=mesh)
  path = step.path_for(args.batch, args.length)
  report = {"length": args.length, "batch": args.batch, "layers": args.layers,
            "heads": args.heads, "hidden": args.hidden, "first_path": path,
            "first": _measure(step.program(path), step._state,
                              step.input_specs(args.batch, args.length), None)}
  if not args.no_run:
    step(batch)
  if args.which == "both":
    norm = make_norm_step(model, mesh=mesh)
    free = norm.path_for(args.batch, args.length)
    report["second_path"] = "map-free" if free else "per-layer maps"
    report["second"] = _measure(norm.program(free), norm._state, specs)
    if not args.no_run:
      norm(batch)
  report["ru_maxrss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
  print(json.dumps(report))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
