"""The offline sm_90 compile (``heads_jax.stats.sm90``): Pallas Triton kernels exported for
``cuda`` on the CPU, compiled by the pip ``triton`` wheel, measured by its ``ptxas -v``; and the
chip gate of issue 50 (at most 128 registers, no spills, an asynchronous load) on small kernels
whose answers are known, then on the statistics kernel."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from heads_jax.stats import kernel, sm90

pytest.importorskip("triton", reason="the test extra's triton wheel (Linux x86-64 only)")

S = jax.ShapeDtypeStruct


def _matmul(x_ref, y_ref, o_ref):
  """A [64, 256] x [256, 64] bf16 product in 8 key steps: the loop the pipeliner prefetches."""
  def step(i, acc):
    ks = pl.ds(pl.multiple_of(i * 32, 32), 32)
    return acc + jnp.dot(x_ref[:, ks], y_ref[ks, :], preferred_element_type=jnp.float32)
  o_ref[...] = jax.lax.fori_loop(0, 8, step, jnp.zeros((64, 64), jnp.float32))


def _double(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2.0


def _rescale(x_ref, o_ref):
  """A [64, 128] float32 tile live across a column sum and a row maximum (64 values a thread at
  4 warps)."""
  x = x_ref[...]
  o_ref[...] = x * jnp.sum(x, axis=0, keepdims=True) + x * jnp.max(x, axis=1, keepdims=True)


def _call(body, out_shape):
  return lambda *a: pl.pallas_call(body, out_shape=S(out_shape, jnp.float32), name="probe",
                                   compiler_params=pl_triton.CompilerParams(num_warps=4))(*a)


MATMUL_ARGS = (S((64, 256), jnp.bfloat16), S((256, 64), jnp.bfloat16))


def test_a_pipelined_product_passes_the_gate():
  """Two calls of one kernel are one report; the loop's loads become cp.async and the 64-row
  bf16 product Hopper's wgmma; few registers, no spills."""
  mm = _call(_matmul, (64, 64))
  [report] = sm90.compile_kernels(lambda x, y: mm(x, y) + mm(x, y), *MATMUL_ARGS)
  assert report.name == "probe" and report.num_warps == 4 and report.grid == (1, 1, 1)
  assert report.cp_async and report.wgmma and not report.mma_sync
  assert 0 < report.registers <= 128 and report.spill_bytes == 0
  assert report.shared_bytes > 0                       # the prefetched tiles' staging buffers
  assert sm90.gate_problems(report) == []


def test_the_gate_fails_a_kernel_that_spills():
  """A tile whose 64 values a thread stay live spills when capped at 32 registers a thread (and
  not uncapped), and the gate says so."""
  [call] = sm90.triton_calls(sm90.export_text(_call(_rescale, (64, 128)), S((64, 128), jnp.float32)))
  free = sm90.compile_call(call)
  assert free.registers > 64 and free.spill_bytes == 0
  capped = sm90.compile_call(call, max_registers=32)
  assert capped.registers <= 32
  assert capped.spill_store_bytes > 0 and capped.spill_load_bytes > 0
  assert f"probe: {capped.spill_bytes} bytes of register spills" in sm90.gate_problems(capped)


def test_the_gate_fails_a_kernel_without_asynchronous_loads():
  [report] = sm90.compile_kernels(_call(_double, (16, 128)), S((16, 128), jnp.float32))
  assert not (report.cp_async or report.tma or report.wgmma or report.mma_sync)
  assert report.spill_bytes == 0
  assert sm90.gate_problems(report) == ["probe: no asynchronous copy (cp.async) or TMA load "
                                        "(cp.async.bulk)"]


def test_a_program_without_triton_calls_is_refused():
  with pytest.raises(ValueError, match="no Pallas Triton call"):
    sm90.compile_kernels(lambda x: x * 2, S((4,), jnp.float32))


def test_statistics_kernel_passes_the_chip_gate():
  """BERT-base's layer (12 heads of 64, 128 positions, bf16) as the analysis step runs it
  (``kernel.TRITON_DEFAULTS``: heads on the grid, the key loop over 32-key tiles, 16 warps, the
  weighting epilogue in the kernel), unpacked, packed and on 32-position rows, and
  the last device-measured tile (``TRITON_MEASURED``) failing it as issue 50's review found."""
  fn, args = kernel.triton_program()
  [report] = sm90.compile_kernels(fn, *args)
  assert sm90.gate_problems(report) == [], report.line()
  assert report.grid == (4, 128 // kernel.BLOCK_Q["triton"], 12)        # heads on the grid
  fn, args = kernel.triton_program(slots=16)                            # packed rows (the pass's)
  [packed] = sm90.compile_kernels(fn, *args)
  assert sm90.gate_problems(packed) == [], packed.line()
  fn, args = kernel.triton_program(k=kernel.SHORT_KEYS)                 # short rows: two key blocks
  [short] = sm90.compile_kernels(fn, *args)
  assert sm90.gate_problems(short) == [], short.line()
  fn, args = kernel.triton_program(**kernel.TRITON_MEASURED)
  [old] = sm90.triton_calls(sm90.export_text(fn, *args))
  old = sm90.compile_call(old)
  assert old.registers == 255 and old.spill_bytes > 0 and not old.async_loads
