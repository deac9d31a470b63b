"""BERT pre-training throughput and MFU on an accelerator, with a breakdown of where a step's
time goes. Device-agnostic: the same command runs on a GPU, a TPU or (with small settings) a CPU.

For each sequence length (default 128 and 512; 20 and 80 masked positions, BERT's two phases)
and each attention-dropout setting (default 0.1, BERT's, and 0.0; the path the model takes is
in each row: explicit, or fused (cuDNN without dropout, the Pallas flash kernel with it on a
GPU in bf16; see ``heads_jax/model/bert.py``)), on one real pre-training batch from the
embedded Gutenberg books (kept on the device), it times:

* **step**: ``heads_jax.training.steps.make_train_step`` (MLM logits at the masked positions
  only, NSP, LAMB or AdamW, gradient clipping, donated state): tokens/s and MFU;
* **fwd+bwd**: the loss and its gradient alone (no optimizer): the optimizer's share of the step
  is ``step - fwd+bwd``;
* **forward**: the loss alone (dropout on, as in training);
* **optimizer**: ``tx.update`` + ``apply_updates`` alone on gradients of the parameters' shape.

FLOPs per token (the project's convention, ``heads_jax.training.metrics.train_flops_per_token``,
PaLM appendix B): ``6 N + 12 l d q`` with N the non-embedding parameters (the MLM head runs on the
masked positions only, so it is not in 6N); a second column adds the tied MLM decoder at the
masked positions, ``6 v d p / q``. Peak: the data-sheet dense peak of the device for the compute
dtype (``common.peak_flops``; H100 SXM bf16 989 TFLOP/s), the CPU estimate on a CPU.

    python bench/bench_pretrain_mfu.py --out bench/results/pretrain_mfu_h100.json   # on the H100
    python bench/bench_pretrain_mfu.py --size tiny --seq-lens 64 --batch 64=8 --dtype float32 \
        --steps 1 --repeats 1 --attention-dropout 0.0                              # CPU smoke
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from bench_training import flops_per_token, pretraining_batch  # noqa: E402

DEFAULT_BATCH = {128: 256, 512: 64}
DEFAULT_PREDICTIONS = {128: 20, 512: 80}


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="base", help="model size (heads_jax.model.config.SIZES)")
  p.add_argument("--seq-lens", default="128,512", help="comma-separated sequence lengths")
  p.add_argument("--batch", default="", help=f"per-length global batch, e.g. '128=256,512=64' "
                 f"(defaults {DEFAULT_BATCH}; others 8)")
  p.add_argument("--predictions", default="", help=f"per-length masked positions (defaults "
                 f"{DEFAULT_PREDICTIONS}; others 15%% of the length)")
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                 help="compute dtype (float32 master weights either way)")
  p.add_argument("--attention-dropout", default="0.1,0.0", help="comma-separated attention "
                 "dropout rates to time (0.1: explicit attention path; 0.0: fused path)")
  p.add_argument("--optimizer", default="lamb", choices=("lamb", "adamw"))
  p.add_argument("--steps", type=int, default=10, help="steps per timed run")
  p.add_argument("--repeats", type=int, default=3, help="timed runs (median reported)")
  p.add_argument("--no-breakdown", action="store_true", help="time the full step only")
  p.add_argument("--profile-dir", default=None, help="also write a jax.profiler trace of 3 steps "
                 "per setting here (TensorBoard / Perfetto)")
  p.add_argument("--out", default=None, help="JSON path (default: bench/bench_pretrain_mfu.json)")
  return p.parse_args(argv)


def _per_length(text: str, defaults: dict, fallback) -> dict:
  out = dict(defaults)
  for part in filter(None, (x.strip() for x in text.split(","))):
    q, _, v = part.partition("=")
    if not (q.isdigit() and v.isdigit()):
      raise SystemExit(f"expected LENGTH=INT items, got {part!r}")
    out[int(q)] = int(v)
  return lambda q: out.get(q, fallback(q))


def _time(fn, steps: int, repeats: int) -> dict:
  """Median wall seconds of ``steps`` calls of ``fn`` (after one warm-up call that compiles);
  ``fn`` returns something to block on."""
  import jax
  with common.Timer() as first:
    jax.block_until_ready(fn())
  walls, cpus = [], []
  for _ in range(repeats):
    with common.Timer() as t:
      out = None
      for _ in range(steps):
        out = fn()
      jax.block_until_ready(out)
    walls.append(t.wall / steps)
    cpus.append(t.cpu / steps)
  res = common.summarize(walls, cpus)
  res["first_call_s"] = first.wall
  return res


def run_setting(size: str, seq_len: int, batch_size: int, predictions: int, dtype: str,
                attention_dropout: float, optimizer: str, steps: int, repeats: int,
                breakdown: bool = True, profile_dir: str | None = None) -> dict:
  import jax
  import optax
  from flax import nnx
  from heads_jax.model.config import config_for
  from heads_jax.model.heads import BertForPreTraining
  from heads_jax.parallel import data_mesh, shard_batch
  from heads_jax.training import metrics, optimizer as opt, steps as S

  mesh = data_mesh()
  if batch_size % mesh.devices.size:
    raise SystemExit(f"batch {batch_size} is not divisible by the {mesh.devices.size} devices")
  batch, tok, _ = pretraining_batch(batch_size, seq_len, predictions, host_batches=1)
  cfg = config_for(size, vocab_size=tok.vocab_size, dtype=dtype,
                   attention_dropout=attention_dropout, max_position_embeddings=max(512, seq_len))
  model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
  parts, params = S.split_model(model)
  n_params = metrics.non_embedding_params(params)
  tx, schedule = opt.make_optimizer(learning_rate=1e-4, warmup_steps=10, total_steps=10_000,
                                    name=optimizer)
  state = S.place_state(S.init_train_state(params, tx), mesh)
  del model
  train_step = S.make_train_step(parts, tx, S.pretraining_loss, mesh=mesh, schedule=schedule)
  device_batch = shard_batch(batch, mesh)
  holder = {"state": state}

  def one_step():
    holder["state"], m = train_step(holder["state"], device_batch)
    return m["loss"]

  timing = {"step": _time(one_step, steps, repeats)}
  loss = float(jax.device_get(one_step()))
  if not np.isfinite(loss):
    raise FloatingPointError(f"loss is {loss}")

  if breakdown:
    key = jax.random.key(0)
    params_now = holder["state"]["params"]

    def loss_fn(p, b):
      return S.pretraining_loss(S.merge_model(parts, p, key), b, deterministic=False)[0]

    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    fwd_fn = jax.jit(loss_fn)
    grads = jax.tree.map(lambda x: x * 1e-3, params_now)
    opt_state = holder["state"]["opt_state"]

    @jax.jit
    def update(g, o, p):
      u, o = tx.update(g, o, p)
      return optax.apply_updates(p, u), o

    timing["fwd_bwd"] = _time(lambda: grad_fn(params_now, device_batch)[0], steps, repeats)
    timing["forward"] = _time(lambda: fwd_fn(params_now, device_batch), steps, repeats)
    timing["optimizer"] = _time(lambda: update(grads, opt_state, params_now)[0], steps, repeats)

  if profile_dir:
    trace = Path(profile_dir) / f"{size}_q{seq_len}_b{batch_size}_adrop{attention_dropout}"
    with jax.profiler.trace(str(trace)):
      for _ in range(3):
        out = one_step()
      jax.block_until_ready(out)

  fpt = flops_per_token(cfg, n_params, seq_len, predictions)
  peak = common.peak_flops(dtype)
  tokens = batch_size * seq_len
  step_s = timing["step"]["median_s"]
  res = {"size": size, "seq_len": seq_len, "batch_size": batch_size, "predictions": predictions,
         "dtype": dtype, "attention_dropout": attention_dropout,
         "attention_path": _path_label(cfg, attention_dropout),
         "optimizer": optimizer, "non_embedding_params": n_params, "flops_per_token": fpt,
         "peak": peak, "timing": timing, "loss": loss,
         "tokens_per_s": tokens / step_s, "step_s": step_s}
  if peak["flops"]:
    res["mfu"] = tokens / step_s * fpt["palm_6N_12ldq"] / peak["flops"]
    res["mfu_with_decoder"] = tokens / step_s * fpt["with_mlm_decoder"] / peak["flops"]
  if breakdown:
    fb, fw, op = (timing[k]["median_s"] for k in ("fwd_bwd", "forward", "optimizer"))
    res["breakdown_s"] = {"forward": fw, "backward": fb - fw, "optimizer_in_step": step_s - fb,
                          "optimizer_alone": op}
  return res


def _path_label(cfg, attention_dropout: float) -> str:
  """The attention path the training step takes (``heads_jax.model.bert.attention_path``):
  ``"explicit"``, or ``"fused: <implementation>"`` (``xla``, ``cudnn`` or the ``flash`` kernel,
  which ``auto`` takes on a GPU for bf16 with attention dropout)."""
  import jax.numpy as jnp
  from heads_jax.model import bert
  kw = dict(needs_probs=False, dropout_active=attention_dropout > 0,
            dtype=jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32, head_dim=cfg.head_dim)
  try:
    path = bert.attention_path(getattr(cfg, "attention", "auto"), supports_flash=True, **kw)
  except TypeError:  # a bert.py without the flash kernel
    path = bert.attention_path("auto", **kw)
  return "explicit" if path == "explicit" else f"fused: {path}"


def main(argv=None):
  args = _parse(argv)
  note = common.warn_if_emulated_devices()
  info = common.machine_info(torch_threads=False)
  print(common.device_header(info))
  batch_of = _per_length(args.batch, DEFAULT_BATCH, lambda q: 8)
  preds_of = _per_length(args.predictions, DEFAULT_PREDICTIONS, lambda q: max(1, round(0.15 * q)))
  rates = [float(x) for x in args.attention_dropout.split(",") if x.strip()]
  results, rows = [], []
  for q in [int(x) for x in args.seq_lens.split(",") if x.strip()]:
    for rate in rates:
      r = run_setting(args.size, q, batch_of(q), preds_of(q), args.dtype, rate, args.optimizer,
                      args.steps, args.repeats, not args.no_breakdown, args.profile_dir)
      results.append(r)
      row = {"seq": q, "batch": r["batch_size"], "attn dropout": rate, "path": r["attention_path"],
             "tokens/s": r["tokens_per_s"], "step ms": 1e3 * r["step_s"],
             "MFU (6N+12ldq)": f"{100 * r['mfu']:.1f}%" if "mfu" in r else "",
             "MFU +decoder": f"{100 * r['mfu_with_decoder']:.1f}%" if "mfu" in r else ""}
      if "breakdown_s" in r:
        b = r["breakdown_s"]
        row.update({"fwd ms": 1e3 * b["forward"], "bwd ms": 1e3 * b["backward"],
                    "opt in step ms": 1e3 * b["optimizer_in_step"],
                    "opt alone ms": 1e3 * b["optimizer_alone"]})
      rows.append(row)
  peak = results[0]["peak"] if results else {}
  print(common.format_table(rows, title=f"\nBERT-{args.size} pre-training step, {args.dtype}, "
                                        f"{args.optimizer}; FLOPs/token 6N + 12ldq (MLM head on "
                                        f"masked positions only); peak {peak.get('how')}"))
  result = {"machine": info, "command": common.command_line(), "note": note, "results": results}
  path = common.write_json(common.default_json_path(__file__, args.out), result)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
