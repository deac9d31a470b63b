"""Every GEMM of ``configs/pretrain.py``'s pre-training step as lowered for CUDA, with its operand
types (issue 49 item 2): which products still take a float32 operand (a TF32 or float32 GEMM on
an NVIDIA GPU) and which are bfloat16 x bfloat16. No GPU needed: ``jax.export`` lowers the step
for ``cuda`` on the CPU (abstract GPU mesh, as tests/model/test_flash_lowering.py).

    python bench/step_gemms.py                  # BERT-base width, 1 layer (every layer is alike)
    python bench/step_gemms.py --layers 12 --plain   # the step before issue 49 (fused_ops.plain)

Prints one line per distinct ``(operands -> result)`` signature with its count; ``--json``
writes them. The flash kernels' products are inside Triton calls and are not listed (they are
bf16 x bf16 with float32 accumulation, flash_attention.py).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

_DOT = re.compile(r"stablehlo\.dot_general.*?:\s*\((tensor<[^>]*>),\s*(tensor<[^>]*>)\)\s*->\s*"
                  r"(tensor<[^>]*>)")


def lowered_step_text(*, layers: int = 1, seq: int = 128, batch: int = 8, preds: int = 20,
                      plain: bool = False, preset: str = "bert_base_phase1",
                      attention: str = "flash", size: str | None = None,
                      dropout_bits: int | None = None, flat: bool | None = None) -> str:
  """The StableHLO text of ``preset``'s train step (its model settings, ``layers`` layers, the
  job's loss with its ``mlm_logits``) exported for ``cuda``, on the ``attention`` path (what
  ``"auto"`` takes on a GPU for bf16 with dropout: the flash kernels; this CPU's default
  backend would make ``"auto"`` explicit); ``size`` overrides the preset's model size,
  ``dropout_bits`` its ``model.dropout_bits``, ``flat`` its ``optimizer.flat``."""
  import functools

  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax import export
  from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

  from heads_jax.configs import pretrain as pretrain_configs
  from heads_jax.model import fused_ops
  from heads_jax.model.config import config_for
  from heads_jax.model.heads import BertForPreTraining
  from heads_jax.training import steps
  from heads_jax.training.job import make_tx

  c = pretrain_configs.get_config(preset)
  if dropout_bits is not None:
    c.model.dropout_bits = dropout_bits
  if flat is not None:
    c.optimizer.flat = flat
  extra = {k: c.model[k] for k in ("layer_norm_dtype", "dropout_bits") if k in c.model}
  cfg = config_for(size or c.model.size, vocab_size=30522, dtype=c.model.dtype, num_layers=layers,
                   attention_dropout=c.model.attention_dropout,
                   max_position_embeddings=max(512, seq), attention=attention, **extra)
  mesh = AbstractMesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,)).update(
      abstract_device=jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3",
                                                  num_cores=132, platform="gpu"))
  rep = NamedSharding(mesh, P())

  def concrete(x):
    return jax.random.key(0) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else jnp.zeros(x.shape, x.dtype)

  parts, params = steps.split_model(nnx.eval_shape(lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(0))))
  parts.rng_state = jax.tree.map(concrete, parts.rng_state)
  parts.rest = jax.tree.map(concrete, parts.rest)
  tx, schedule = make_tx(c)
  spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep)  # noqa: E731
  state = jax.tree.map(spec, jax.eval_shape(lambda p: steps.init_train_state(p, tx), params))
  loss_fn = functools.partial(steps.pretraining_loss, mlm_logits=c.get("mlm_logits", "float32"))
  step = steps.make_train_step(parts, tx, loss_fn, mesh=mesh, schedule=schedule,
                               dropout_rng=c.get("dropout_rng", "threefry2x32"), donate=False)
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32, sharding=rep)  # noqa: E731
  batch = {"input_ids": i32(batch, seq), "attention_mask": i32(batch, seq),
           "token_type_ids": i32(batch, seq), "masked_positions": i32(batch, preds),
           "masked_ids": i32(batch, preds), "next_sentence_label": i32(batch),
           "masked_weights": jax.ShapeDtypeStruct((batch, preds), jnp.float32, sharding=rep)}
  triton = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
  with jax.sharding.use_abstract_mesh(mesh), (fused_ops.plain() if plain else contextlib.nullcontext()):
    exp = export.export(step, platforms=["cuda"], disabled_checks=[triton])(state, batch)
  return exp.mlir_module()


def cpu_kernels(*, layers: int = 1, seq: int = 128, batch: int = 8, preds: int = 20,
                size: str | None = None) -> dict:
  """The same step compiled for this CPU (explicit attention: the flash kernels are Triton-only)
  with and without ``fused_ops.plain()``: ``{"plain"|"fused": {"fusions", "other_ops",
  "kernels", "bytes_accessed_GB"}}`` (``bench_lamb_fusions.count_kernels``). XLA:CPU fuses
  differently from XLA:GPU: the counts compare the two forms, they do not predict GPU kernels."""
  import functools

  import jax
  import jax.numpy as jnp
  from flax import nnx

  from bench_lamb_fusions import count_kernels
  from heads_jax.configs import pretrain as pretrain_configs
  from heads_jax.model import fused_ops
  from heads_jax.model.config import config_for
  from heads_jax.model.heads import BertForPreTraining
  from heads_jax.parallel import data_mesh
  from heads_jax.training import steps
  from heads_jax.training.job import make_tx

  c = pretrain_configs.get_config("bert_base_phase1")
  cfg = config_for(size or c.model.size, vocab_size=30522, dtype=c.model.dtype, num_layers=layers,
                   attention_dropout=c.model.attention_dropout, attention="explicit",
                   max_position_embeddings=max(512, seq))
  parts, params = steps.split_model(nnx.eval_shape(lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(0))))
  concrete = lambda x: (jax.random.key(0) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)  # noqa: E731
                        else jnp.zeros(x.shape, x.dtype))
  parts.rng_state = jax.tree.map(concrete, parts.rng_state)
  parts.rest = jax.tree.map(concrete, parts.rest)
  tx, schedule = make_tx(c)
  state = jax.eval_shape(lambda p: steps.init_train_state(p, tx), params)
  loss_fn = functools.partial(steps.pretraining_loss, mlm_logits=c.get("mlm_logits", "float32"))
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
  batch = {"input_ids": i32(batch, seq), "attention_mask": i32(batch, seq),
           "token_type_ids": i32(batch, seq), "masked_positions": i32(batch, preds),
           "masked_ids": i32(batch, preds), "next_sentence_label": i32(batch),
           "masked_weights": jax.ShapeDtypeStruct((batch, preds), jnp.float32)}
  out = {}
  for name, ctx in (("plain", fused_ops.plain), ("fused", contextlib.nullcontext)):
    step = steps.make_train_step(parts, tx, loss_fn, mesh=data_mesh(jax.devices()[:1]),
                                 schedule=schedule, dropout_rng=c.get("dropout_rng", "threefry2x32"),
                                 donate=False)
    with ctx():
      compiled = step.lower(state, batch).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    out[name] = dict(count_kernels(compiled.as_text()),
                     bytes_accessed_GB=round(float(cost.get("bytes accessed", 0)) / 1e9, 3))
  return out


_RNG = re.compile(r"stablehlo\.rng_bit_generator.*?->\s*\(tensor<[^>]*>,\s*tensor<([^>]*)>\)")
_THREEFRY = re.compile(r"call @threefry2x32[_0-9]*\(.*?->\s*\(tensor<([^>]*)>,")
_BYTES = {"ui8": 1, "ui16": 2, "ui32": 4, "ui64": 8}


def _tensor_bytes(spec: str) -> int:
  *dims, dtype = spec.split("x")
  return int(np.prod([int(d) for d in dims], dtype=np.int64)) * _BYTES[dtype]


def _functions(text: str) -> dict:
  """``{name: body}`` of the module's ``func.func`` definitions (``main`` included)."""
  out, name, body = {}, None, []
  for line in text.splitlines():
    m = re.match(r"\s*func\.func (?:public |private )?@([\w.$-]+)\(", line)
    if m:
      if name:
        out[name] = "\n".join(body)
      name, body = m.group(1), []
    body.append(line)
  if name:
    out[name] = "\n".join(body)
  return out


def random_bits(text: str) -> dict:
  """The random bits a step draws, from its StableHLO ``text``, every call of a private function
  counted (jitted helpers such as ``jax.random.bits`` are functions called from each site):
  ``{"rng_bit_generator_bytes", "rng_bit_generator_calls"}`` (rbg keys' ``RngBitGenerator``
  outputs) and ``{"threefry_bytes", "threefry_calls"}`` (threefry's output pairs: key
  derivations, or every mask's bits with threefry keys)."""
  funcs = _functions(text)
  memo = {}

  def total(name):
    if name not in memo:
      body = funcs.get(name, "")
      rbg = [_tensor_bytes(m) for m in _RNG.findall(body)]
      tf = [2 * _tensor_bytes(m) for m in _THREEFRY.findall(body)]
      acc = [sum(rbg), len(rbg), sum(tf), len(tf)]
      for callee in re.findall(r"call @([\w.$-]+)\(", body):
        if callee != name and not callee.startswith("threefry2x32"):
          acc = [a + b for a, b in zip(acc, total(callee))]
      memo[name] = acc
    return memo[name]

  rb, rc, tb, tc = total("main")
  return {"rng_bit_generator_bytes": rb, "rng_bit_generator_calls": rc,
          "threefry_bytes": tb, "threefry_calls": tc}


def update_ops(*, flat: bool, size: str = "base", layers: int = 12) -> dict:
  """The LAMB update alone (``tx.update`` + ``optax.apply_updates`` on BERT-base's pretraining
  parameters, ``configs/pretrain.py``'s optimizer, chain or ``flat``) exported for ``cuda``:
  ``{"ops": StableHLO operations, every private function's counted per call, "by_op": {name:
  count}}``. Without XLA:GPU this is what can be counted of its kernels: every elementwise chain
  fuses into one, each reduction and each slice or concatenation of another shape is at least
  one."""
  import jax
  import optax
  from flax import nnx
  from jax import export

  from heads_jax.configs import pretrain as pretrain_configs
  from heads_jax.model.config import config_for
  from heads_jax.model.heads import BertForPreTraining
  from heads_jax.training import steps
  from heads_jax.training.job import make_tx

  c = pretrain_configs.get_config("bert_base_phase1")
  c.optimizer.flat = flat
  cfg = config_for(size, vocab_size=30522, num_layers=layers)
  _, params = steps.split_model(nnx.eval_shape(lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(0))))
  tx, _ = make_tx(c)
  state = jax.eval_shape(tx.init, params)

  def update(g, o, p):
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o

  text = export.export(jax.jit(update), platforms=["cuda"])(params, state, params).mlir_module()
  funcs = _functions(text)
  memo = {}

  def count(name):
    if name not in memo:
      ops = collections.Counter()
      for line in funcs.get(name, "").splitlines():
        m = re.search(r"(?:stablehlo|chlo)\.(\w+)", line)
        if m and "func.func" not in line:
          ops[m.group(1)] += 1
        for callee in re.findall(r"call @([\w.$-]+)\(", line):
          if callee != name:
            ops.update(count(callee))
      memo[name] = ops
    return memo[name]

  ops = count("main")
  return {"ops": sum(ops.values()), "by_op": dict(ops.most_common(8)),
          "leaves": len(jax.tree.leaves(params))}


def gemms(text: str) -> list[dict]:
  """``[{"lhs", "rhs", "out", "count", "float32_operand"}]`` of every ``dot_general``."""
  counts = collections.Counter(_DOT.findall(text))
  return [{"lhs": a, "rhs": b, "out": o, "count": n,
           "float32_operand": "xf32>" in a or "xf32>" in b}
          for (a, b, o), n in sorted(counts.items())]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--layers", type=int, default=1)
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--plain", action="store_true", help="the plain GELU/decoder (before issue 49)")
  ap.add_argument("--attention", default="flash", help="the attention path (default flash)")
  ap.add_argument("--cpu-kernels", action="store_true",
                  help="compile the step for this CPU with and without fused_ops.plain() and "
                  "count its kernels (explicit attention)")
  ap.add_argument("--json", default=None)
  ap.add_argument("--random-bits", action="store_true",
                  help="the bytes of random bits the step draws, with 32-bit and with the "
                  "preset's (8-bit) dropout masks")
  ap.add_argument("--update-ops", action="store_true",
                  help="the LAMB update alone exported for cuda: its operations, chain and flat")
  a = ap.parse_args(argv)
  if a.update_ops:
    for flat in (False, True):
      print(f"{'flat LAMB' if flat else 'LAMB chain'}: {update_ops(flat=flat)}")
    return
  if a.random_bits:
    for bits in (32, 8):
      r = random_bits(lowered_step_text(layers=a.layers, seq=a.seq, batch=a.batch,
                                        attention=a.attention, dropout_bits=bits))
      print(f"dropout_bits={bits}: {r}")
    return
  if a.cpu_kernels:
    for name, k in cpu_kernels(layers=a.layers, seq=a.seq, batch=a.batch).items():
      print(f"{name}: {k}")
    return
  rows = gemms(lowered_step_text(layers=a.layers, seq=a.seq, batch=a.batch, plain=a.plain,
                                      attention=a.attention))
  for r in rows:
    flag = "FLOAT32" if r["float32_operand"] else "bf16   "
    print(f"{flag} x{r['count']:<3} {r['lhs']} x {r['rhs']} -> {r['out']}")
  print(f"{sum(r['count'] for r in rows)} dot_generals, "
        f"{sum(r['count'] for r in rows if r['float32_operand'])} with a float32 operand")
  if a.json:
    Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
