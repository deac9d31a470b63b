"""Offline sm_90 compile of a program's Pallas Triton kernels: registers, spills, asynchronous
copies, without a GPU.

``compile_kernels(fn, *args)`` lowers the jitted ``fn`` with ``jax.export`` for ``cuda``, takes
every Pallas Triton custom call (``__gpu$xla.gpu.triton``) out of the StableHLO, compiles each
kernel's Triton IR with the pip ``triton`` wheel's own pipeline (TTIR -> TTGIR -> LLVM -> PTX ->
cubin) for compute capability 9.0 (Hopper, ``sm_90a``), runs the wheel's ``ptxas -v`` on the PTX
and returns one ``KernelReport`` per distinct kernel: registers a thread, spill bytes, shared
memory, and whether the PTX has ``cp.async`` (Ampere's asynchronous copy, what Triton's
software pipeliner emits for a prefetched load), TMA (``cp.async.bulk``), ``wgmma`` (Hopper's
warp-group MMA) or ``mma.sync``. This is what XLA's Triton compile does on the device, with the
wheel's Triton in place of the one XLA bundles, so the figures are the wheel's, not the device's
to the register, but spills and missing asynchronous copies show the same way (the H200 figures
of issue 50's review were reproduced this way).

The route, and why: jaxlib's Pallas writes the kernel as MLIR *bytecode* of its own bundled
Triton dialect, which the wheel's Triton (another LLVM) cannot read ("expected mlir::BoolAttr").
So the bytecode is parsed in jaxlib's MLIR with jaxlib's Triton dialect registered, printed as
text, and the text is what the wheel parses (its ``.ttir`` input route of ``triton.compile``).

``triton`` is in the ``test`` extra (``pip install -e .[test]``); nothing here needs a GPU or a
CUDA driver. Command line (BERT-base's statistics kernel at one shape; library code takes no
flags, so it lives in bench/)::

  python bench/sm90_kernels.py [--batch 4 --length 128 --num-warps 4 ...]
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
import tempfile
import warnings

TRITON_CALL = "__gpu$xla.gpu.triton"
CAPABILITY = 90


@dataclasses.dataclass(frozen=True)
class TritonCall:
  """One Pallas Triton custom call of an exported program: the kernel's name, its Triton IR as
  text, and the launch settings Pallas wrote beside it."""
  name: str
  ttir: str
  num_warps: int
  num_stages: int
  grid: tuple


@dataclasses.dataclass(frozen=True)
class KernelReport:
  """What ``ptxas -v`` and the PTX say about one kernel compiled for sm_90."""
  name: str
  num_warps: int
  num_stages: int
  grid: tuple
  registers: int
  spill_store_bytes: int
  spill_load_bytes: int
  stack_bytes: int
  shared_bytes: int
  cp_async: bool       # cp.async.{ca,cg} (non-bulk): Ampere-style asynchronous global->shared
  tma: bool            # cp.async.bulk (the Tensor Memory Accelerator)
  wgmma: bool          # wgmma.mma_async
  mma_sync: bool       # mma.sync (the pre-Hopper tensor-core instruction)
  ptx: str = dataclasses.field(repr=False, default="")

  @property
  def spill_bytes(self) -> int:
    return self.spill_store_bytes + self.spill_load_bytes

  @property
  def async_loads(self) -> bool:
    """At least one asynchronous copy or TMA load."""
    return self.cp_async or self.tma

  def line(self) -> str:
    flags = [f for f in ("cp_async", "tma", "wgmma", "mma_sync") if getattr(self, f)]
    return (f"{self.name}: {self.registers} registers, {self.spill_bytes} B spilled "
            f"({self.spill_store_bytes} stores, {self.spill_load_bytes} loads), "
            f"{self.shared_bytes} B shared, warps {self.num_warps}, stages {self.num_stages}, "
            f"grid {self.grid}; {', '.join(flags) or 'no async copy, no tensor-core MMA'}")


def _require_triton():
  try:
    import triton  # noqa: F401
  except ImportError as e:  # pragma: no cover - the test extra installs it
    raise RuntimeError("the offline sm_90 compile needs the pip `triton` wheel: "
                       "pip install -e .[test] (or pip install triton)") from e


def triton_calls(module_text: str) -> list[TritonCall]:
  """Every distinct Pallas Triton call of an exported StableHLO module (``Exported.mlir_module()``
  text), its IR printed as text by jaxlib's own Triton dialect (see the module docstring)."""
  from jax._src.interpreters import mlir as jmlir
  from jax._src.lib.mlir import ir
  from jax._src.lib.triton import dialect as tt_dialect

  ctx = jmlir.make_ir_context()
  tt_dialect.register_dialect(ctx)
  module = ir.Module.parse(module_text, context=ctx)
  found, seen = [], set()

  def visit(op):
    op = op.operation
    if op.name == "stablehlo.custom_call" and \
        ir.StringAttr(op.attributes["call_target_name"]).value == TRITON_CALL:
      cfg = ir.DictAttr(op.attributes["mhlo.backend_config"])
      code = ir.StringAttr(cfg["ir"]).value_bytes
      digest = hashlib.sha256(code).hexdigest()
      if digest not in seen:
        seen.add(digest)
        kernel = ir.Module.parse(code, context=ctx)
        found.append(TritonCall(
            name=ir.StringAttr(cfg["name"]).value,
            ttir=kernel.operation.get_asm(),
            num_warps=ir.IntegerAttr(cfg["num_warps"]).value,
            num_stages=ir.IntegerAttr(cfg["num_stages"]).value,
            grid=tuple(ir.IntegerAttr(cfg[f"grid_{a}"]).value for a in "xyz")))
    return ir.WalkResult.ADVANCE

  module.operation.walk(visit)
  return found


_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SHARED = re.compile(r"(\d+) bytes smem")


def ptxas_info(ptx: str, capability: int = CAPABILITY) -> dict:
  """``ptxas -v``'s figures for a PTX text (the wheel's ptxas)."""
  from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
  ptxas = get_ptxas(capability).path
  with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "kernel.ptx")
    with open(src, "w") as f:
      f.write(ptx)
    out = subprocess.run([ptxas, "-v", f"--gpu-name={sm_arch_from_capability(capability)}", src,
                          "-o", os.path.join(tmp, "kernel.cubin")],
                         capture_output=True, text=True, check=True)
  log = out.stderr + out.stdout
  spills = _SPILLS.search(log)
  shared = _SHARED.search(log)
  return dict(registers=int(_REGISTERS.search(log).group(1)),
              stack_bytes=int(spills.group(1)), spill_store_bytes=int(spills.group(2)),
              spill_load_bytes=int(spills.group(3)),
              shared_bytes=int(shared.group(1)) if shared else 0)


def ptx_features(ptx: str) -> dict:
  """Which copy and MMA instructions a PTX text uses."""
  return dict(cp_async=re.search(r"\bcp\.async\.(ca|cg)\b", ptx) is not None,
              tma=re.search(r"\bcp\.async\.bulk\b", ptx) is not None,
              wgmma=re.search(r"\bwgmma\.mma_async\b", ptx) is not None,
              mma_sync=re.search(r"\bmma\.sync\b", ptx) is not None)


def compile_call(call: TritonCall, capability: int = CAPABILITY, *, num_warps: int | None = None,
                 num_stages: int | None = None, max_registers: int | None = None) -> KernelReport:
  """One kernel through the wheel's Triton pipeline for ``capability``, then ``ptxas -v``.
  ``num_warps``/``num_stages`` override what Pallas wrote (to try settings); ``max_registers``
  caps the registers a thread (Triton's ``maxnreg``: ``.maxnreg`` in the PTX)."""
  _require_triton()
  import triton
  from triton.backends.compiler import GPUTarget
  warps = call.num_warps if num_warps is None else num_warps
  stages = call.num_stages if num_stages is None else num_stages
  with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, f"{call.name}.ttir")
    with open(src, "w") as f:
      f.write(call.ttir)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", UserWarning)  # the wheel's fp-fusion default notice
      compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                                options=dict(num_warps=warps, num_stages=stages,
                                             enable_fp_fusion=True, maxnreg=max_registers))
  ptx = compiled.asm["ptx"]
  info = ptxas_info(ptx, capability)
  # Triton's shared memory is dynamic (ptxas counts only the static part)
  info["shared_bytes"] = max(info["shared_bytes"], int(compiled.metadata.shared))
  return KernelReport(name=call.name, num_warps=warps, num_stages=stages, grid=call.grid,
                      ptx=ptx, **info, **ptx_features(ptx))


def gate_problems(report: KernelReport, max_registers: int = 128) -> list[str]:
  """Why ``report`` fails the chip gate (issue 50 item 6), empty when it passes: at most
  ``max_registers`` a thread (128: four 4-warp programs share an SM's 64 K registers), no
  spills, at least one asynchronous copy or TMA load (a load the pipeliner prefetches)."""
  out = []
  if report.registers > max_registers:
    out.append(f"{report.registers} registers a thread (at most {max_registers})")
  if report.spill_bytes:
    out.append(f"{report.spill_bytes} bytes of register spills")
  if not report.async_loads:
    out.append("no asynchronous copy (cp.async) or TMA load (cp.async.bulk)")
  return [f"{report.name}: {p}" for p in out]


def export_text(fn, *args, **kwargs) -> str:
  """The StableHLO text of the jitted ``fn`` exported for ``cuda`` (Triton calls allowed)."""
  import jax
  from jax import export
  jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
  exp = export.export(jitted, platforms=["cuda"],
                      disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON_CALL)])
  return exp(*args, **kwargs).mlir_module()


def compile_kernels(fn, *args, capability: int = CAPABILITY, **kwargs) -> list[KernelReport]:
  """Every distinct Pallas Triton kernel of the jitted ``fn`` at ``args`` (arrays or
  ``jax.ShapeDtypeStruct``), compiled offline for ``capability`` (see the module docstring)."""
  calls = triton_calls(export_text(fn, *args, **kwargs))
  if not calls:
    raise ValueError("the program has no Pallas Triton call (was it lowered with Triton "
                     "compiler parameters?)")
  return [compile_call(c, capability) for c in calls]
