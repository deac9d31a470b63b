"""The LAMB update compiled on this machine: fusions (kernels) and bytes, the optax chain
(``optimizer.lamb``) against the flat LAMB (``optimizer.flat_lamb``) for one model's parameters.

A fusion is one kernel of the compiled program: XLA's ``fusion`` instructions plus the
unfused instructions of the entry computation that do work (not parameters, tuples, bitcasts or
constants). It says how many passes over memory and launches the update costs; it says nothing
of speed on its own (and XLA's byte count overstates the flat update: see ``measure``) (count here, time on the device: ``bench/pretrain_ab.py``).

    python bench/bench_lamb_fusions.py                   # BERT-base (110M parameters, 206 leaves)
    python bench/bench_lamb_fusions.py --size tiny       # seconds
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

_FREE = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "copy-start",
         "copy-done"}


def count_kernels(hlo_text: str) -> dict:
  """``{"fusions", "other_ops", "kernels"}`` of an optimised HLO module's entry computation."""
  entry = hlo_text[hlo_text.index("\nENTRY"):]
  entry = entry[:entry.index("\n}\n") if "\n}\n" in entry else len(entry)]
  fusions, other = 0, 0
  for line in entry.splitlines()[1:]:
    m = re.match(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][\w\-]*)\(", line)
    if not m:
      continue
    op = m.group(1)
    if op == "fusion":
      fusions += 1
    elif op not in _FREE:
      other += 1
  return {"fusions": fusions, "other_ops": other, "kernels": fusions + other}


def measure(size: str = "base", vocab: int = 30522) -> list[dict]:
  import jax
  import optax
  from flax import nnx
  from heads_jax.model.config import config_for
  from heads_jax.model.heads import BertForPreTraining
  from heads_jax.training import optimizer as opt, steps

  cfg = config_for(size, vocab_size=vocab)
  model = nnx.eval_shape(lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(0)))
  _, params = steps.split_model(model)
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  n = sum(x.size for x in jax.tree.leaves(params))
  rows = []
  for name, flat in (("optax chain (lamb)", False), ("flat LAMB (flat_lamb)", True)):
    tx, _ = opt.make_optimizer(learning_rate=1e-4, warmup_steps=10, total_steps=1000, flat=flat)
    state = jax.eval_shape(tx.init, params)

    def update(g, s, p):
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    compiled = jax.jit(update, donate_argnums=(1, 2)).lower(params, state, params).compile()
    counts = count_kernels(compiled.as_text())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    # XLA's cost analysis counts an operand a fusion slices as read whole: the flat update's
    # per-leaf output fusions each "read" the whole flat vector there, so its figure overstates
    rows.append({"update": name, **counts,
                 "xla_bytes_accessed_GB": cost.get("bytes accessed", 0) / 1e9,
                 "leaves": len(jax.tree.leaves(params)), "parameters": n,
                 "necessary_GB": 40 * n / 1e9})   # read g, w, m, v; write w, m, v (+ 3 passes)
  return rows


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--size", default="base")
  args = ap.parse_args(argv)
  import jax
  sys.path.insert(0, str(Path(__file__).resolve().parent))
  import common
  rows = measure(args.size)
  print(common.format_table(rows, title=f"LAMB update of BERT-{args.size}, compiled for "
                                        f"{jax.devices()[0].platform} (jax {jax.__version__})"))
  return rows


if __name__ == "__main__":
  main()
