"""Where the analysis step's CPU overhead over the bare forward goes (issue 35, item 6).

On the same encoded UD EWT batches (all-MiniLM-L6-v2, the analysis's batching: sort window 1024,
batch 32, 16-position buckets), process CPU seconds (all threads) of one pass, interleaved over
``--repeats`` rounds, minimum and median, as a ratio against the bare jitted forward of the same
round (the model's default attention, ``jax.nn.dot_product_attention`` on the CPU) and, in
``cpu_median_vs_explicit``, against the same forward on the explicit attention path that the
analysis step takes (so the statistics' own cost), of: the per-layer analysis step
(``layerwise``), the same with the ``block`` role left out (its score is bias x row entropy: the
one entropy-weighted role, which needs each row's entropy and block mass per query), and
``stacked``. Where the model takes packed rows (issue 38) the same sequences also run packed, as
the device pass packs them (``heads_jax.pipelines.device_pass.pass_packing``: short rows of 64
positions where the data allow): the bare forwards and the per-layer step on those rows.

The per-layer step (``heads_jax.stats.layerwise``) costs, per layer, one matmul against a per-pair
table of 32 columns, a few diagonals of the map, and the row entropy only where something reads it
(the measures, or ``block`` in a batch with a pair sequence: UD EWT has none); the target is at
most +5% CPU time over the bare forward (issue 38 item 4). The load average before and after is
printed beside the figures: on a loaded machine the ratios are not worth much. Process CPU time
counts every thread, including XLA's worker threads waiting between small operations.

    python bench/bench_statistics_cost.py --sequences 1024 --repeats 7

1,024 sentences make several full packed batches of each shape (64 short rows of 64 positions,
8 full rows of 128); with a few hundred every packed batch is the end's leftover, packed again at
full length, which is not what a pass of real data runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


EXPLICIT = "bare forward, explicit attention"   # the analysis step's attention, no statistics


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--sequences", type=int, default=1024)
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--data", default="ud-ewt",
                 help="data spec (default ud-ewt; e.g. glue-tsv:../shared/data/glue/MRPC:train "
                      "for sentence pairs, without arcs)")
  p.add_argument("--measures", action="store_true",
                 help="the steps compute the measures too (entropy, token masses: analyze's default)")
  p.add_argument("--full-rows", action="store_true",
                 help="also pack every row at 128 positions (no short rows), for comparison")
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
  from heads_jax.data.specs import parse_spec
  # text specs carry no arcs here (as `--parser none`); CoNLL-U keeps its gold arcs
  _, batches, n = encode_spec(a.data, tok, max_length=128, batch_size=32,
                              syntax=parse_spec(a.data).kind == "conllu",
                              max_examples=a.sequences, sort_window=1024, bucket_step=16,
                              pad_to_batch_size=True)
  batches = list(batches)
  mesh = data_mesh()
  graphdef, state = nnx.split(model)
  state = replicate(state, mesh)

  @functools.partial(jax.jit, static_argnames="attention")
  def bare(s, b, attention=None):
    return nnx.merge(graphdef, s)(b["input_ids"], attention_mask=b["attention_mask"],
                                  token_type_ids=b["token_type_ids"],
                                  attention=attention)["pooled"]

  multiple = len(mesh.devices.flat)
  dev = [shard_batch(pad_to_multiple({f: np.asarray(v, np.int32) for f, v in b.items()},
                                     multiple)[0], mesh) for _, b in batches]
  load_before = os.getloadavg()
  m = a.measures
  steps = {"layerwise": make_analysis_step(model, stats_impl="layerwise", measures=m),
           "layerwise without block": make_analysis_step(
               model, roles=tuple(r for r in ROLES if r != "block"), stats_impl="layerwise",
               measures=m),
           "stacked": make_analysis_step(model, stats_impl="stacked", measures=m)}

  packings = {}   # suffix -> (packed batches, their device copies)
  if steps["layerwise"].packs:
    from heads_jax.data.encoding import pack_batches
    from heads_jax.pipelines.device_pass import PACK_SLOTS, pass_packing
    from heads_jax.sieves import segment_positions
    fields = ("input_ids", "attention_mask", "token_type_ids", "segment_ids")
    ways = {", packed": pass_packing(batches, length=128, rows=32, window=1024)}
    if a.full_rows:   # as the pass packed before short rows: every row 128 positions
      ways[", packed full rows"] = pack_batches(batches, length=128, rows=32, slots=PACK_SLOTS,
                                                window=1024)
    for suffix, packed in ways.items():
      packed = list(packed)
      packings[suffix] = (packed, [shard_batch(pad_to_multiple(
          {f: np.asarray(b[f], np.int32) for f in fields}, multiple)[0], mesh) for _, b in packed])

    @functools.partial(jax.jit, static_argnames="attention")
    def bare_packed(s, b, attention=None):
      return nnx.merge(graphdef, s)(b["input_ids"], attention_mask=b["attention_mask"],
                                    token_type_ids=b["token_type_ids"],
                                    segment_ids=b["segment_ids"],
                                    position_ids=segment_positions(b["segment_ids"]),
                                    attention=attention)["pooled"]

  def run(key):
    suffix = next((x for x in packings if key.endswith(x)), "")
    what = key[:len(key) - len(suffix)]
    if suffix:
      packed, packed_dev = packings[suffix]
      if what == "layerwise":
        [h.result() for h in [steps["layerwise"].submit(b, slots=len(i) // len(b["input_ids"]))
                              for i, b in packed]]
      else:
        attention = "explicit" if what == EXPLICIT else None
        jax.block_until_ready([bare_packed(state, b, attention) for b in packed_dev])
    elif key == "bare forward":
      jax.block_until_ready([bare(state, b) for b in dev])
    elif key == EXPLICIT:
      jax.block_until_ready([bare(state, b, "explicit") for b in dev])
    else:
      [h.result() for h in [steps[key].submit(b) for _, b in batches]]

  names = ["bare forward", EXPLICIT] + list(steps)
  for suffix in packings:
    names += ["bare forward" + suffix, EXPLICIT + suffix, "layerwise" + suffix]
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
  load_after = os.getloadavg()
  rows = []
  for key in names:
    suffix = next((x for x in packings if key.endswith(x)), "")
    base, same = "bare forward" + suffix, EXPLICIT + suffix
    rows.append({"method": key, "against": base, "cpu_min_s": min(cpu[key]),
                 "cpu_median_s": float(np.median(cpu[key])),
                 "cpu_min_vs_bare": f"{min(cpu[key]) / min(cpu[base]) - 1:+.1%}",
                 "cpu_median_vs_bare": f"{np.median(cpu[key]) / np.median(cpu[base]) - 1:+.1%}",
                 "wall_median_vs_bare": f"{np.median(wall[key]) / np.median(wall[base]) - 1:+.1%}",
                 "cpu_median_vs_explicit": f"{np.median(cpu[key]) / np.median(cpu[same]) - 1:+.1%}"})
  load = (f"load average (1, 5, 15 min) before {tuple(round(x, 2) for x in load_before)}, "
          f"after {tuple(round(x, 2) for x in load_after)} on {os.cpu_count()} cores")
  print(common.format_table(rows, title=f"\nstatistics' CPU cost{' with the measures' * m}, "
                                        f"{name}, {n} sequences of {a.data}, "
                                        f"{len(batches)} batches"
                                        + "".join(f" ({len(p)}{x})" for x, (p, _) in packings.items())
                                        + f", {a.repeats} interleaved repeats; {load}"))
  result = {"machine": common.machine_info(), "command": common.command_line(), "rows": rows,
            "cpu_s": cpu, "wall_s": wall, "model": name, "sequences": n, "measures": m, "data": a.data,
            "load_average_before": load_before, "load_average_after": load_after}
  path = common.write_json(common.default_json_path(__file__, a.out), result)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
