"""Benchmark of the forward pass that returns the attention maps, heads_jax vs PyTorch.

Same weights (a random ``--size`` model, seed 0, exported to a Hugging Face directory that
transformers loads), same batch ``[b, q]`` (random word-piece ids, no padding, two segments),
float32, inference mode on both sides:

* **heads_jax**: the jitted ``BertModel`` with ``return_attentions=True``; the attentions
  ``[b, l, h, q, k]`` float32 are produced on the device (blocked on, not copied to numpy);
* **PyTorch**: ``transformers.BertModel`` with ``attn_implementation="eager"`` and
  ``output_attentions=True`` (the only form that returns maps), under ``torch.inference_mode``,
  with torch threads = the cores XLA uses and with 1 thread (on a machine shared with other
  processes torch's OpenMP threads wait on each other at every operator, and 1 thread can win;
  the better of the two is the comparison figure);
* and, for reference, both without attentions (heads_jax: pooled output only; PyTorch: SDPA).

The attentions of the two sides are compared (largest absolute difference) as a check that the
same computation is timed. Reported: tokens/s (``b x q`` per batch), median of ``--repeats``
timed runs of ``--batches`` batches each after a warm-up (which also compiles), process CPU
seconds, GFLOP/s at ``2 N + 4 l d q`` FLOPs per token (N non-embedding parameters; the
attention scores and the weighted sum), and the share of the device's peak (the CPU's estimate,
or an accelerator's data sheet for the matmuls float32 runs at JAX's default precision: TF32 on a
GPU, ``bench/common.py`` ``ACCELERATOR_PEAKS`` by device kind).

    python bench/bench_forward.py                           # base, batch 8 x 128
    python bench/bench_forward.py --size tiny --batch-size 4 --seq-len 32 --repeats 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="base")
  p.add_argument("--batch-size", type=int, default=8)
  p.add_argument("--seq-len", type=int, default=128)
  p.add_argument("--batches", type=int, default=1, help="batches per timed run")
  p.add_argument("--torch-threads", default="", help="comma-separated torch thread counts "
                 "(default: the cores XLA uses, and 1)")
  p.add_argument("--repeats", type=int, default=3, help="timed runs (median reported)")
  p.add_argument("--no-plain", action="store_true", help="skip the runs without attentions")
  p.add_argument("--out", default=None, help="JSON path (default: bench/bench_forward.json)")
  return p.parse_args(argv)


def make_inputs(b: int, q: int, vocab: int, seed: int = 0) -> dict:
  """Random ids ``[b, q]`` (no padding), token types 0 for the first half and 1 after."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1000, vocab, size=(b, q)).astype(np.int32)
  ids[:, 0] = 101
  types = (np.arange(q)[None] >= q // 2).astype(np.int32).repeat(b, 0)
  return {"input_ids": ids, "attention_mask": np.ones((b, q), np.int32), "token_type_ids": types}


def jax_forward(model, attentions: bool):
  """A jitted ``fn(inputs) -> array`` (attentions or pooled) with the state bound."""
  import jax
  from flax import nnx
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, ids, mask, types):
    out = nnx.merge(graphdef, state)(ids, attention_mask=mask, token_type_ids=types,
                                     return_attentions=attentions, deterministic=True)
    return out["attentions"] if attentions else out["pooled"]

  return lambda x: run(state, x["input_ids"], x["attention_mask"], x["token_type_ids"])


def torch_forward(hf_dir, attentions: bool, threads: int | None = None):
  """transformers' ``BertModel`` on the GPU when torch sees one (else the CPU), float32."""
  import torch
  from transformers import BertModel
  from bench_notebook_baseline import torch_device
  device = torch_device()
  model = BertModel.from_pretrained(str(hf_dir), attn_implementation="eager" if attentions else "sdpa")
  model.eval().to(device)

  def run(x):
    if threads:
      torch.set_num_threads(threads)
    with torch.inference_mode():
      out = model(input_ids=torch.from_numpy(x["input_ids"]).long().to(device),
                  attention_mask=torch.from_numpy(x["attention_mask"]).long().to(device),
                  token_type_ids=torch.from_numpy(x["token_type_ids"]).long().to(device),
                  output_attentions=attentions)
    return torch.stack(out.attentions, dim=1) if attentions else out.pooler_output

  return run


def _time(fn, inputs, batches: int, repeats: int, block) -> dict:
  def run():
    out = None
    for _ in range(batches):
      out = fn(inputs)
    block(out)
  with common.Timer() as t:
    run()                 # warm-up (compiles the jitted function)
  timing = common.time_repeats(run, repeats, warmup=0)
  timing["first_run_s"] = t.wall
  return timing


def main(argv=None):
  args = _parse(argv)
  note = common.warn_if_emulated_devices()
  print(common.device_header(common.machine_info()))
  cores = common.available_cores()
  threads = [int(x) for x in (args.torch_threads or f"{cores},1").split(",") if x.strip()]
  threads = list(dict.fromkeys(threads))
  import jax
  from flax import nnx
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  from heads_jax.model.convert import export_hf
  from heads_jax.training.metrics import non_embedding_params
  tok = load_tokenizer()
  cfg = config_for(args.size, vocab_size=tok.vocab_size, dtype="float32",
                   max_position_embeddings=max(512, args.seq_len))
  model = BertModel(cfg, rngs=nnx.Rngs(0))
  n_params = non_embedding_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  inputs = make_inputs(args.batch_size, args.seq_len, cfg.vocab_size)
  tokens = args.batch_size * args.seq_len * args.batches
  fpt = 2.0 * n_params + 4.0 * cfg.num_layers * cfg.hidden_size * args.seq_len
  peak = common.peak_flops("float32")

  jax_block = lambda out: out.block_until_ready()

  def torch_block(out):
    if out.is_cuda:
      import torch
      torch.cuda.synchronize()
    return out

  entries = {}
  with tempfile.TemporaryDirectory() as tmp:
    export_hf(model, tok, tmp)
    jax_attn, torch_attn = jax_forward(model, True), torch_forward(tmp, True, threads[0])
    diff = float(np.max(np.abs(np.asarray(jax_attn(inputs)) - torch_attn(inputs).cpu().numpy())))
    entries["heads_jax jit, attentions"] = _time(jax_attn, inputs, args.batches, args.repeats, jax_block)
    del jax_attn
    for th in threads:
      entries[f"torch eager, output_attentions, {th} thr"] = _time(
          torch_forward(tmp, True, th), inputs, args.batches, args.repeats, torch_block)
    if not args.no_plain:
      entries["heads_jax jit, no attentions"] = _time(jax_forward(model, False), inputs, args.batches,
                                                      args.repeats, jax_block)
      for th in threads:
        entries[f"torch sdpa, no attentions, {th} thr"] = _time(
            torch_forward(tmp, False, th), inputs, args.batches, args.repeats, torch_block)
  rows = []
  for method, t in entries.items():
    tps = common.rate(tokens, t)
    row = {"method": method, "tokens_per_s": tps, "range": common.spread(tokens, t),
           "cpu_s_per_batch": t["cpu_median_s"] / args.batches, "first_run_s": t["first_run_s"],
           "GFLOP/s": tps * fpt / 1e9}
    if peak["flops"]:
      row["share_of_peak"] = f"{100 * tps * fpt / peak['flops']:.1f}%"
    t["tokens_per_s"] = tps
    rows.append(row)
  best_torch = max(e["tokens_per_s"] for m, e in entries.items() if m.startswith("torch eager"))
  ratio = entries["heads_jax jit, attentions"]["tokens_per_s"] / best_torch
  machine = common.machine_info()
  title = (f"\nforward pass, {args.size} ({cfg.num_layers} layers x {cfg.num_heads} heads, hidden "
           f"{cfg.hidden_size}), batch {args.batch_size} x {args.seq_len}, float32, "
           f"{jax.devices()[0].device_kind} (host: {cores} cores, load average "
           f"{machine['load_average_1m']} at the end); {fpt / 1e6:.3g} MFLOP/token; peak: "
           f"{peak['how']}")
  print(common.format_table(rows, title=title))
  print(f"heads_jax / best torch, with attentions: {ratio:.2f}x tokens/s; attentions agree to "
        f"{diff:.1e} (max abs diff)")
  result = {"machine": machine, "command": common.command_line(), "note": note,
            "size": args.size, "batch_size": args.batch_size, "seq_len": args.seq_len,
            "batches_per_run": args.batches, "flops_per_token": fpt, "non_embedding_params": n_params,
            "peak_flops_estimate": peak, "torch_threads": threads, "methods": entries,
            "rows": rows, "jax_over_torch_with_attentions": ratio, "attention_max_abs_diff": diff,
            "devices": f"{len(jax.devices())} x {jax.devices()[0].device_kind}"}
  path = common.write_json(common.default_json_path(__file__, args.out), result)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
