"""What one BERT-base layer keeps for the backward pass, by attention path and LayerNorm dtype
(issue 39): jax's saved residuals of the training forward (dropout on), traced abstractly on
the CPU (nothing allocated, nothing timed). Figures are per layer at ``--batch`` x ``--length``.

  python bench/bench_attention_residuals.py [--batch 256] [--length 128]

Measured on the CPU (2026-11-27, jax 0.10.2, b=256, q=128, bf16, attention dropout 0.1):
explicit path 1008 MiB of [b, h, q, k] residuals a layer, the flash path 48 MiB (the int8
dropout mask); bf16 LayerNorm outputs save a further 144 MiB a layer.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals  # private: the list print_saved_residuals prints

from heads_jax.model.bert import BertModel
from heads_jax.model.config import config_for
from heads_jax.training import steps


def _concrete(x):
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    return jax.random.key(0)
  return jnp.zeros(x.shape, x.dtype)


def residual_bytes(path: str, layer_norm_dtype: str, b: int, q: int) -> tuple[int, int]:
  """(all residuals, those of shape [..., q, k]) in bytes, for one layer."""
  cfg = config_for("base", num_layers=1, dtype="bfloat16", attention_dropout=0.1,
                   layer_norm_dtype=layer_norm_dtype)
  parts, params = steps.split_model(nnx.eval_shape(lambda: BertModel(cfg, rngs=nnx.Rngs(0))))
  parts.rng_state = jax.tree.map(_concrete, parts.rng_state)
  parts.rest = jax.tree.map(_concrete, parts.rest)

  def loss(params, ids, mask):
    model = steps.merge_model(parts, params, jax.random.key(1))
    return model(ids, mask, deterministic=False, attention=path)["last_hidden_state"].sum()

  ids = jax.ShapeDtypeStruct((b, q), jnp.int32)
  total = square = 0
  for aval, why in saved_residuals(loss, params, ids, ids):
    if "from the argument" in why:
      continue
    n = int(np.prod(aval.shape)) * aval.dtype.itemsize
    total += n
    square += n if aval.shape[-2:] == (q, q) else 0
  return total, square


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--length", type=int, default=128)
  a = p.parse_args(argv)
  print(f"residuals of one BERT-base layer, b={a.batch}, q={a.length}, bf16, dropout 0.1")
  for ln in ("float32", "compute"):
    for path in ("explicit", "flash"):
      total, square = residual_bytes(path, ln, a.batch, a.length)
      print(f"  layer_norm_dtype={ln:<8} {path:<8} all {total / 2**20:8.1f} MiB   "
            f"[b, h, q, k] {square / 2**20:7.1f} MiB")


if __name__ == "__main__":
  main()
