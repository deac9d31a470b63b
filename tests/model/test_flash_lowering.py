"""The flash path lowers for CUDA on the CPU (``jax.export``, no GPU): BERT-base's forward and
gradient with attention dropout 0.1 in bfloat16, three Triton kernels per layer (forward, dK/dV,
dQ) and the dropout masks drawn by jax.random outside them. Newer jax (0.11+) lowers a Pallas
Triton call without a GPU only for an abstract GPU device, hence the abstract GPU mesh (as
tests/e2e/test_lowering.py). Whether Triton compiles the kernels on a given GPU is left to the
device (bench/accelerator.py)."""

import jax
import pytest
import jax.numpy as jnp
from flax import nnx
from jax import export
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

from heads_jax.model import flash_attention
from heads_jax.model.bert import BertModel
from heads_jax.model.config import config_for
from heads_jax.training import steps

TRITON = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
GPU_MESH = AbstractMesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,)).update(
    abstract_device=jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3",
                                                num_cores=132, platform="gpu"))


def _concrete(x):
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    return jax.random.key(0)
  return jnp.zeros(x.shape, x.dtype)


@pytest.mark.slow
def test_flash_training_forward_and_gradient_lower_for_cuda():
  cfg = config_for("base", dtype="bfloat16", attention_dropout=0.1)
  # abstract parameters, concrete (tiny) rng state, as tests/e2e/test_lowering.py
  parts, params = steps.split_model(nnx.eval_shape(lambda: BertModel(cfg, rngs=nnx.Rngs(0))))
  parts.rng_state = jax.tree.map(_concrete, parts.rng_state)
  parts.rest = jax.tree.map(_concrete, parts.rest)
  b, q = 8, 128

  def make_grad():  # a new function each time: jit's trace cache does not key on the tuning
    def grad(params, ids, mask, key):
      def loss(params):
        model = steps.merge_model(parts, params, key)
        out = model(ids, mask, deterministic=False, attention="flash")
        return jnp.sum(out["last_hidden_state"] ** 2)
      return jax.grad(loss)(params)
    return grad

  rep = NamedSharding(GPU_MESH, P())
  spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep)  # noqa: E731
  args = (jax.tree.map(spec, params), jax.ShapeDtypeStruct((b, q), jnp.int32, sharding=rep),
          jax.ShapeDtypeStruct((b, q), jnp.int32, sharding=rep),
          jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep))
  with jax.sharding.use_abstract_mesh(GPU_MESH):
    exp = export.export(jax.jit(make_grad()), platforms=["cuda"],
                        disabled_checks=[TRITON])(*args)
    # flash_attention.tuned(fuse_dq=True): dQ written by the dK/dV kernel (128 keys: one block)
    with flash_attention.tuned(fuse_dq=True, inner=64, bwd_warps=8, stages=3):
      fused = export.export(jax.jit(make_grad()), platforms=["cuda"],
                            disabled_checks=[TRITON])(*args)
  text = exp.mlir_module()
  assert exp.platforms == ("cuda",)
  assert text.count("__gpu$xla.gpu.triton") == 3 * cfg.num_layers
  for name in ("flash_attention_forward", "flash_attention_dkdv", "flash_attention_dq"):
    assert text.count(name) >= cfg.num_layers, name
  fused_text = fused.mlir_module()
  assert fused_text.count("__gpu$xla.gpu.triton") == 2 * cfg.num_layers
  assert fused_text.count("flash_attention_dkdv_dq") >= cfg.num_layers
