"""The PyTorch peer of heads_jax's BERT pre-training step: what a user would pick instead on a GPU.

Hugging Face transformers' ``BertForPreTraining``, bf16 autocast (on CUDA), SDPA attention, fused
AdamW (on CUDA), MLM logits at the masked positions only plus NSP: the same work as heads_jax's
pre-training step. Eager, or under ``torch.compile``. Tokens/s and MFU with heads_jax's FLOP
convention (6N + 12 l d q, N = non-embedding parameters). From
``../shared/measurements/gpu-2026-11-26/torch_peer.py`` (the issue's figures: 460,334 tokens/s
eager, 612,854 compiled on one H200), as a function for ``bench/accelerator.py``.

    python bench/torch_peer.py --batch 256 --seq 128 --preds 20 [--compile] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time

SIZES = {  # hidden, layers, heads, intermediate
    "base": (768, 12, 12, 3072),
    "tiny": (64, 2, 2, 256),
}


def run_peer(*, size: str = "base", batch: int = 256, seq: int = 128, preds: int = 20,
             steps: int = 10, repeats: int = 3, compile: bool = False, dropout: float = 0.1,
             peak: float | None = None, seed: int = 0) -> dict:
  """One timed setting: median seconds per step over ``repeats`` runs of ``steps`` steps, after a
  warm-up of 3 steps (compilation under ``compile``)."""
  import torch
  from transformers import BertConfig, BertForPreTraining

  dev = "cuda" if torch.cuda.is_available() else "cpu"
  torch.manual_seed(seed)
  hidden, layers, heads, inter = SIZES[size]
  cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                   num_attention_heads=heads, intermediate_size=inter,
                   max_position_embeddings=max(512, seq), hidden_dropout_prob=dropout,
                   attention_probs_dropout_prob=dropout, attn_implementation="sdpa")
  model = BertForPreTraining(cfg).to(dev).train()
  n_params = sum(p.numel() for n, p in model.named_parameters()
                 if "embeddings" not in n and "cls.predictions.decoder" not in n)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
  g = torch.Generator(device="cpu").manual_seed(seed)
  ids = torch.randint(1000, 30000, (batch, seq), generator=g).to(dev)
  types = torch.zeros_like(ids)
  types[:, seq // 2:] = 1
  mask = torch.ones_like(ids)
  positions = torch.stack([torch.randperm(seq - 2, generator=g)[:preds] + 1
                           for _ in range(batch)]).to(dev)
  targets = torch.randint(1000, 30000, (batch, preds), generator=g).to(dev)
  nsp = torch.randint(0, 2, (batch,), generator=g).to(dev)
  bert, head = model.bert, model.cls

  def loss_fn():
    out = bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
    seqout = out.last_hidden_state
    picked = torch.gather(seqout, 1, positions[..., None].expand(-1, -1, seqout.shape[-1]))
    logits, nsp_logits = head(picked, out.pooler_output)
    mlm = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                            targets.reshape(-1))
    return mlm + torch.nn.functional.cross_entropy(nsp_logits.float(), nsp)

  def step():
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
      loss = loss_fn()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss

  if compile:
    step = torch.compile(step)
  sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
  t0 = time.perf_counter()
  for _ in range(3):
    loss = step()
  sync()
  warmup = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    sync()
    t = time.perf_counter()
    for _ in range(steps):
      loss = step()
    sync()
    times.append((time.perf_counter() - t) / steps)
  step_s = sorted(times)[len(times) // 2]
  fpt = 6 * n_params + 12 * layers * hidden * seq
  tokens_per_s = batch * seq / step_s
  out = {"peer": "transformers BertForPreTraining, torch"
                 + (" bf16 autocast" if dev == "cuda" else " float32") + ", sdpa, "
                 + ("fused " if dev == "cuda" else "") + "AdamW",
         "compile": compile, "size": size, "batch": batch, "seq": seq, "preds": preds,
         "dropout": dropout, "non_embedding_params": n_params, "step_s": step_s,
         "steps_s_all": times, "warmup_s": warmup, "tokens_per_s": tokens_per_s,
         "flops_per_token": fpt, "loss": float(loss.detach().float().cpu()),
         "torch": torch.__version__,
         "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}
  if peak:
    out["mfu"] = tokens_per_s * fpt / peak
  if dev == "cuda":
    out["max_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="base", choices=sorted(SIZES))
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--preds", type=int, default=20)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--compile", action="store_true")
  p.add_argument("--dropout", type=float, default=0.1, help="attention and hidden dropout")
  p.add_argument("--peak", type=float, default=None, help="peak FLOP/s for the MFU")
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  res = run_peer(size=a.size, batch=a.batch, seq=a.seq, preds=a.preds, steps=a.steps,
                 repeats=a.repeats, compile=a.compile, dropout=a.dropout, peak=a.peak)
  text = json.dumps(res, indent=1)
  print(text)
  if a.out:
    with open(a.out, "w") as f:
      f.write(text)


if __name__ == "__main__":
  main()
