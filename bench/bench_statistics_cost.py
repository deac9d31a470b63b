"""Where the analysis step's CPU overhead over the bare forward goes (issue 35, item 6).

On the same encoded UD EWT batches (all-MiniLM-L6-v2, the analysis's batching: sort window 1024,
batch 32, 16-position buckets), process CPU seconds (all threads) of one pass, interleaved over
``--repeats`` rounds, minimum and median, as a ratio against the bare jitted forward of the same
round: the per-layer analysis step (``layerwise``), the same with the ``block`` role left out (its
score is bias x row entropy: the one entropy-weighted role, which needs each row's entropy and
block mass per query), and ``stacked``.

    python bench/bench_statistics_cost.py --sequences 128 --repeats 7
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--sequences", type=int, default=128)
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--out", default=None, help="JSON path (default: bench/bench_statistics_cost.json)")
  a = p.parse_args(argv)
  print(common.device_header(common.machine_info()), flush=True)
  import jax
  from flax import nnx
  from bench_notebook_baseline import default_hf_dir
  from heads_jax import load_model
  from heads_jax.data.specs import encode_spec
  from heads_jax.data.vocabulary import ROLES
  from heads_jax.parallel import data_mesh, pad_to_multiple, replicate, shard_batch
  from heads_jax.stats.step import make_analysis_step
  import tempfile
  with tempfile.TemporaryDirectory() as tmp:
    model_dir, name = default_hf_dir("mini", Path(tmp))
    model, tok = load_model(model_dir)
  _, batches, n = encode_spec("ud-ewt", tok, max_length=128, batch_size=32,
                              max_examples=a.sequences, sort_window=1024, bucket_step=16,
                              pad_to_batch_size=True)
  batches = list(batches)
  mesh = data_mesh()
  graphdef, state = nnx.split(model)
  state = replicate(state, mesh)

  @jax.jit
  def bare(s, b):
    return nnx.merge(graphdef, s)(b["input_ids"], attention_mask=b["attention_mask"],
                                  token_type_ids=b["token_type_ids"])["pooled"]

  multiple = len(mesh.devices.flat)
  dev = [shard_batch(pad_to_multiple({f: np.asarray(v, np.int32) for f, v in b.items()},
                                     multiple)[0], mesh) for _, b in batches]
  steps = {"layerwise": make_analysis_step(model, stats_impl="layerwise"),
           "layerwise without block": make_analysis_step(
               model, roles=tuple(r for r in ROLES if r != "block"), stats_impl="layerwise"),
           "stacked": make_analysis_step(model, stats_impl="stacked")}

  def run(key):
    if key == "bare forward":
      jax.block_until_ready([bare(state, b) for b in dev])
    else:
      [h.result() for h in [steps[key].submit(b) for _, b in batches]]

  names = ["bare forward"] + list(steps)
  for key in names:   # compile
    run(key)
  cpu = {k: [] for k in names}
  wall = {k: [] for k in names}
  for _ in range(a.repeats):
    for key in names:
      with common.Timer() as t:
        run(key)
      cpu[key].append(t.cpu)
      wall[key].append(t.wall)
  rows = []
  for key in names:
    rows.append({"method": key, "cpu_min_s": min(cpu[key]), "cpu_median_s": float(np.median(cpu[key])),
                 "cpu_min_vs_bare": f"{min(cpu[key]) / min(cpu['bare forward']) - 1:+.1%}",
                 "cpu_median_vs_bare": f"{np.median(cpu[key]) / np.median(cpu['bare forward']) - 1:+.1%}",
                 "wall_median_vs_bare": f"{np.median(wall[key]) / np.median(wall['bare forward']) - 1:+.1%}"})
  print(common.format_table(rows, title=f"\nstatistics' CPU cost, {name}, {n} sequences, "
                                        f"{len(batches)} batches, {a.repeats} interleaved repeats"))
  result = {"machine": common.machine_info(), "command": common.command_line(), "rows": rows,
            "cpu_s": cpu, "wall_s": wall, "model": name, "sequences": n}
  path = common.write_json(common.default_json_path(__file__, a.out), result)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
