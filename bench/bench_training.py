"""Benchmark of the pre-training step (MLM + NSP), heads_jax vs PyTorch + transformers.

For each model size (default ``tiny`` and ``base``) and the same batch (built by
``heads_jax.data.pretraining`` from the embedded Gutenberg books: ``[b, q]`` tokens, 20 masked
positions per sequence, NSP labels), float32 on both sides, dropout 0.1 on both sides:

* **heads_jax**: ``heads_jax.training.steps.make_train_step`` with ``pretraining_loss`` (MLM
  logits only at the masked positions), donated state, one jitted step per batch; with the
  project's LAMB (``heads_jax.training.optimizer``) and with AdamW (the same clipping, masks
  and schedule), since PyTorch has no LAMB;
* **PyTorch**: ``transformers.BertForPreTraining`` (eager, SDPA attention) with
  ``torch.optim.AdamW`` (eps 1e-6, weight decay 0.01) and gradient clipping to norm 1, with
  torch threads = the cores XLA uses and with 1 thread (on a machine shared with other
  processes, torch's OpenMP threads wait on each other at every operator and 1 thread can be
  much faster; the better of the two is the comparison figure). Two forms: ``masked-only`` computes the MLM logits at the
  masked positions only (the same computation as heads_jax and as BERT's reference code) and
  ``full`` calls ``BertForPreTraining(..., labels=...)`` as its documentation shows (logits at
  all ``q`` positions, a ``[b, q, vocab]`` array: much more work for small models).

By default ``base`` (and ``large``) time only heads_jax AdamW and PyTorch masked-only (the
like-for-like pair; each heads_jax optimizer costs a ~40 s compilation there); ``--all-methods``
adds the rest.

Reported per method: steps/s and tokens/s (tokens = all ``b x q`` positions of the padded
batch), medians of ``--repeats`` timed runs of ``--steps`` steps each (after a warm-up step
that also compiles), the process CPU seconds beside the wall seconds, and the model FLOPs
utilisation (MFU) under two FLOP counts per token:

* ``6 N + 12 l d q`` (PaLM appendix B; ``heads_jax.training.metrics.train_flops_per_token``,
  the project's convention; N = non-embedding parameters);
* the same plus the tied MLM decoder at the masked positions, ``6 v d p / q`` (v vocabulary,
  p masked slots): it dominates for small models.

The peak is this CPU's estimated float32 peak (``common.cpu_peak_flops_estimate``) and, for
reference, the measured FLOP/s of a large XLA matmul. No GPU/TPU here: all figures are CPU.

    python bench/bench_training.py                            # tiny (batch 32) and base (batch 4), q 128
    python bench/bench_training.py --sizes base --all-methods # base with LAMB and the torch 'full' form too
    python bench/bench_training.py --sizes tiny --batch tiny=64 --steps 10
    python bench/bench_training.py --sizes base --batch base=8 --torch-threads 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DEFAULT_BATCH = {"tiny": 32, "mini": 16, "small": 16, "base": 4, "large": 2}
DEFAULT_STEPS = {"tiny": 5, "mini": 3, "small": 3, "base": 1, "large": 1}
# Sizes for which the default run times only heads_jax AdamW and torch masked-only (each heads_jax
# optimizer costs a compilation of ~40 s for base on this CPU); --all-methods times everything.
LIGHT_SIZES = ("base", "large")


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--sizes", default="tiny,base", help="comma-separated model sizes")
  p.add_argument("--batch", default="", help="per-size batch sizes, e.g. 'tiny=32,base=4' "
                 f"(defaults {DEFAULT_BATCH})")
  p.add_argument("--steps", type=int, default=None, help="steps per timed run (default per size "
                 f"{DEFAULT_STEPS})")
  p.add_argument("--seq-len", type=int, default=128)
  p.add_argument("--max-predictions", type=int, default=20)
  p.add_argument("--repeats", type=int, default=3, help="timed runs (median reported)")
  p.add_argument("--optimizers", default="lamb,adamw", help="heads_jax optimizers to time")
  p.add_argument("--no-torch", action="store_true", help="skip PyTorch")
  p.add_argument("--torch-threads", default="", help="comma-separated torch thread counts "
                 "(default: the cores XLA uses, and 1)")
  p.add_argument("--no-torch-full", action="store_true", help="skip the PyTorch 'full' form")
  p.add_argument("--all-methods", action="store_true", help=f"time every method also for "
                 f"{', '.join(LIGHT_SIZES)} (default there: heads_jax adamw and torch masked-only)")
  p.add_argument("--no-donate", action="store_true", help="also time heads_jax without donation "
                 "(first optimizer only)")
  p.add_argument("--out", default=None, help="JSON path (default: bench/bench_training.json)")
  return p.parse_args(argv)


def _batch_sizes(text: str) -> dict:
  out = dict(DEFAULT_BATCH)
  for part in filter(None, (x.strip() for x in text.split(","))):
    size, _, b = part.partition("=")
    if not b.isdigit():
      raise SystemExit(f"--batch: expected SIZE=INT items, got {part!r}")
    out[size] = int(b)
  return out


def pretraining_batch(batch_size: int, seq_len: int, max_predictions: int,
                      host_batches: int = 3) -> tuple[dict, object, dict]:
  """A real pre-training batch from the embedded Gutenberg books (seed 0), the tokenizer, and
  the timing of building ``host_batches`` more batches on the host (one thread, no prefetch)."""
  from heads_jax.data.assets import gutenberg_paths
  from heads_jax.data.corpora import TextCorpus
  from heads_jax.data.pretraining import PretrainingExamples, PretrainingSpec
  from heads_jax.data.tokenizer import load_tokenizer
  tok = load_tokenizer()
  spec = PretrainingSpec(max_seq_length=seq_len, max_predictions=max_predictions)
  examples = PretrainingExamples(TextCorpus([str(p) for p in gutenberg_paths()]), tok, spec, seed=0)
  batch = examples.batch(0, batch_size)
  walls, cpus = [], []
  for i in range(1, host_batches + 1):
    with common.Timer() as t:
      examples.batch(i, batch_size)
    walls.append(t.wall)
    cpus.append(t.cpu)
  return batch, tok, common.summarize(walls, cpus)


def flops_per_token(cfg, n_non_embedding: int, seq_len: int, max_predictions: int) -> dict:
  from heads_jax.training.metrics import train_flops_per_token
  palm = train_flops_per_token(n_non_embedding, cfg.num_layers, cfg.hidden_size, seq_len)
  decoder = 6.0 * cfg.vocab_size * cfg.hidden_size * max_predictions / seq_len
  return {"palm_6N_12ldq": palm, "with_mlm_decoder": palm + decoder}


# ------------------------------------------------------------------------------------------------
# heads_jax

def time_jax(cfg, batch: dict, optimizer: str, steps_per_run: int, repeats: int,
             donate: bool = True) -> dict:
  import jax
  from flax import nnx
  from heads_jax.model.heads import BertForPreTraining
  from heads_jax.parallel import data_mesh, shard_batch
  from heads_jax.training import metrics, optimizer as opt, steps
  mesh = data_mesh()
  if batch["input_ids"].shape[0] % mesh.devices.size:
    raise SystemExit(f"batch size {batch['input_ids'].shape[0]} is not divisible by the "
                     f"{mesh.devices.size} devices (unset XLA_FLAGS or pick a multiple)")
  model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
  parts, params = steps.split_model(model)
  n_params = metrics.non_embedding_params(params)
  tx, schedule = opt.make_optimizer(learning_rate=1e-4, warmup_steps=10, total_steps=10_000,
                                    name=optimizer)
  state = steps.place_state(steps.init_train_state(params, tx), mesh)
  del model, params
  train_step = steps.make_train_step(parts, tx, steps.pretraining_loss, mesh=mesh,
                                     schedule=schedule, donate=donate)
  device_batch = shard_batch(batch, mesh)
  with common.Timer() as t:
    state, m = train_step(state, device_batch)
    jax.block_until_ready((state, m))
  compile_s = t.wall
  walls, cpus = [], []
  for _ in range(repeats):
    with common.Timer() as t:
      for _ in range(steps_per_run):
        state, m = train_step(state, device_batch)
      jax.block_until_ready((state, m))
    walls.append(t.wall)
    cpus.append(t.cpu)
  loss = float(jax.device_get(m["loss"]))
  if not np.isfinite(loss):
    raise FloatingPointError(f"heads_jax {optimizer} loss is {loss}")
  return {"timing": common.summarize(walls, cpus), "first_step_s": compile_s,
          "non_embedding_params": n_params, "loss": loss}


# ------------------------------------------------------------------------------------------------
# PyTorch

def _torch_model(cfg):
  from transformers import BertConfig, BertForPreTraining
  hf = BertConfig(**{k: v for k, v in cfg.to_hf_dict().items() if k not in ("architectures",)},
                  attn_implementation="sdpa")
  model = BertForPreTraining(hf)
  model.train()
  return model


def time_torch(cfg, batch: dict, form: str, steps_per_run: int, repeats: int, threads: int) -> dict:
  """``form``: ``masked-only`` (MLM logits at the masked positions) or ``full`` (the HF API with
  ``labels``: logits at every position); ``threads``: torch intra-op threads."""
  import torch
  from bench_notebook_baseline import torch_device
  device = torch_device()
  common.set_torch_threads(threads)
  torch.manual_seed(0)
  model = _torch_model(cfg).to(device)
  optim = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                            weight_decay=0.01)
  t = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in batch.items()}
  ids, mask, types = t["input_ids"].long(), t["attention_mask"].long(), t["token_type_ids"].long()
  pos, mids, w = t["masked_positions"].long(), t["masked_ids"].long(), t["masked_weights"].float()
  nsp = t["next_sentence_label"].long()
  labels = torch.full_like(ids, -100)
  for r in range(ids.shape[0]):
    keep = w[r] > 0
    labels[r, pos[r][keep]] = mids[r][keep]
  ce = torch.nn.functional.cross_entropy

  def loss_fn():
    if form == "full":
      return model(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels,
                   next_sentence_label=nsp).loss
    out = model.bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
    seq = out.last_hidden_state
    gathered = torch.gather(seq, 1, pos[..., None].expand(-1, -1, seq.shape[-1]))   # [b, p, d]
    logits = model.cls.predictions(gathered)                                        # [b, p, v]
    nll = ce(logits.reshape(-1, logits.shape[-1]), mids.reshape(-1), reduction="none")
    mlm = (nll * w.reshape(-1)).sum() / (w.sum() + 1e-5)
    return mlm + ce(model.cls.seq_relationship(out.pooler_output), nsp)

  def step():
    optim.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    if device == "cuda":
      torch.cuda.synchronize()
    return loss

  with common.Timer() as tm:
    step()
  first = tm.wall
  walls, cpus = [], []
  for _ in range(repeats):
    with common.Timer() as tm:
      for _ in range(steps_per_run):
        loss = step()
    walls.append(tm.wall)
    cpus.append(tm.cpu)
  return {"timing": common.summarize(walls, cpus), "first_step_s": first, "loss": float(loss.detach())}


# ------------------------------------------------------------------------------------------------

def main(argv=None):
  args = _parse(argv)
  note = common.warn_if_emulated_devices()
  print(common.device_header(common.machine_info(torch_threads=False)))
  batch_sizes = _batch_sizes(args.batch)
  cores = common.available_cores()
  threads = [int(x) for x in (args.torch_threads or f"{cores},1").split(",") if x.strip()]
  threads = list(dict.fromkeys(threads))
  from heads_jax.model.config import config_for
  peak = common.peak_flops("float32")
  matmul = common.measured_matmul_flops()
  result = {"machine": common.machine_info(torch_threads=not args.no_torch),
            "command": common.command_line(), "note": note,
            "peak_flops_estimate": peak, "measured_xla_matmul_flops": matmul,
            "float": "float32 on both sides", "sizes": {}}
  rows = []
  for size in filter(None, (s.strip() for s in args.sizes.split(","))):
    b = batch_sizes.get(size)
    if b is None:
      raise SystemExit(f"no batch size for {size!r}; pass --batch {size}=N")
    steps_per_run = args.steps or DEFAULT_STEPS.get(size, 1)
    batch, tok, host = pretraining_batch(b, args.seq_len, args.max_predictions)
    cfg = config_for(size, vocab_size=tok.vocab_size, dtype="float32",
                     max_position_embeddings=max(512, args.seq_len))
    tokens = b * args.seq_len
    entries = {}
    light = size in LIGHT_SIZES and not args.all_methods
    optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    if light and "adamw" in optimizers:
      optimizers = ["adamw"]
    for name in optimizers:
      entries[f"heads_jax {name}"] = time_jax(cfg, batch, name, steps_per_run, args.repeats)
    if args.no_donate:
      first = optimizers[0]
      entries[f"heads_jax {first} no donation"] = time_jax(cfg, batch, first, steps_per_run,
                                                            args.repeats, donate=False)
    if not args.no_torch:
      for th in threads:
        entries[f"torch AdamW masked-only, {th} thr"] = time_torch(cfg, batch, "masked-only",
                                                                    steps_per_run, args.repeats, th)
        if not args.no_torch_full and not light:
          entries[f"torch AdamW full (HF labels API), {th} thr"] = time_torch(
              cfg, batch, "full", steps_per_run, args.repeats, th)
    n_params = next(e["non_embedding_params"] for e in entries.values() if "non_embedding_params" in e) \
        if any("non_embedding_params" in e for e in entries.values()) else None
    fpt = flops_per_token(cfg, n_params, args.seq_len, args.max_predictions) if n_params else None
    for method, e in entries.items():
      tps = steps_per_run * tokens / e["timing"]["median_s"]
      e.update(tokens_per_s=tps, steps_per_s=steps_per_run / e["timing"]["median_s"])
      row = {"size": size, "batch": f"{b}x{args.seq_len}", "method": method,
             "tokens_per_s": tps, "range": common.spread(steps_per_run * tokens, e["timing"]),
             "cpu_s_per_step": e["timing"]["cpu_median_s"] / steps_per_run,
             "first_step_s": e["first_step_s"]}
      if fpt:
        e["gflops_per_s"] = tps * fpt["palm_6N_12ldq"] / 1e9
        row["GFLOP/s (6N+12ldq)"] = e["gflops_per_s"]
        if peak["flops"]:
          e["mfu"] = tps * fpt["palm_6N_12ldq"] / peak["flops"]
          e["mfu_with_decoder"] = tps * fpt["with_mlm_decoder"] / peak["flops"]
          row["MFU"] = f"{100 * e['mfu']:.1f}%"
          row["MFU +decoder"] = f"{100 * e['mfu_with_decoder']:.1f}%"
      rows.append(row)
    jax_rate = entries.get("heads_jax adamw", {}).get("tokens_per_s")
    torch_rates = [e["tokens_per_s"] for m, e in entries.items() if m.startswith("torch AdamW masked-only")]
    torch_rate = max(torch_rates) if torch_rates else None
    result["sizes"][size] = {"batch_size": b, "seq_len": args.seq_len, "steps_per_run": steps_per_run,
                             "host_batch_build": host,
                             "host_batch_tokens_per_s": tokens / host["median_s"],
                             "flops_per_token": fpt, "non_embedding_params": n_params,
                             "methods": entries,
                             "jax_adamw_over_torch_masked_only": (jax_rate / torch_rate
                                                                  if jax_rate and torch_rate else None)}
  result["torch_threads"] = threads
  title = (f"\npre-training step, float32, CPU ({cores} cores, load average "
           f"{result['machine']['load_average_1m']} at the start); peak estimate {peak['flops'] / 1e9 if peak['flops'] else float('nan'):.0f} "
           f"GFLOP/s ({peak['how']}); measured XLA matmul {matmul / 1e9:.0f} GFLOP/s")
  print(common.format_table(rows, title=title))
  for size, s in result["sizes"].items():
    print(f"{size}: building one batch on the host (one thread, no prefetch): "
          f"{s['host_batch_build']['median_s']:.3f} s = {s['host_batch_tokens_per_s']:,.0f} tokens/s")
    if s["jax_adamw_over_torch_masked_only"]:
      print(f"{size}: heads_jax AdamW / best torch AdamW masked-only = "
            f"{s['jax_adamw_over_torch_masked_only']:.2f}x tokens/s")
  path = common.write_json(common.default_json_path(__file__, args.out), result)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
