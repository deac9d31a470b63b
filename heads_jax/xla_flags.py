"""The XLA flags heads_jax sets, in one place, and how they are applied.

XLA reads ``XLA_FLAGS`` once, when JAX initialises a backend (the first device use), so
``apply()`` must run before that: the ``heads-jax`` command calls it first thing in ``main()``;
scripts that drive the library directly can call ``heads_jax.xla_flags.apply()`` before their
first JAX computation. A flag the user already put in ``XLA_FLAGS`` is never overridden (the
user's entry wins, name by name), and ``HEADS_JAX_XLA_FLAGS=off`` turns the defaults off.

Defaults per platform (the platform is decided without initialising JAX: ``JAX_PLATFORMS`` if
set, else a GPU when ``nvidia-smi`` or a CUDA PJRT plugin is present):

* GPU (data-parallel training and analysis, one or several GPUs):

  - ``--xla_gpu_enable_latency_hiding_scheduler=true``: schedule the gradient all-reduce of one
    layer while the backward pass of the next runs (JAX's GPU performance tips; NVIDIA's JAX
    containers set it by default);
  - ``--xla_gpu_enable_highest_priority_async_stream=true``: run those collectives on a
    high-priority stream so they are not starved by compute kernels (JAX's GPU tips);
  - ``--xla_gpu_all_reduce_combine_threshold_bytes=134217728``: combine the per-parameter
    gradient all-reduces of BERT (about 200 tensors) into a few 128 MiB ones.

  All three only matter with more than one GPU; on one GPU they are no-ops. Matmul code
  generation (cuBLAS vs Triton GEMMs) is left to XLA's autotuner: no flag was measured to help.
* CPU: none. (``--xla_cpu_experimental_ynn_fusion_type=`` changes how XLA:CPU fuses the bare
  forward pass: measured in BENCHMARKS.md, not a consistent gain.)
* TPU: none. TPU compiler flags go through ``LIBTPU_INIT_ARGS``, not ``XLA_FLAGS``; the
  data-parallel BERT step needs none of the latency-hiding options there.

Every flag name here is checked by ``tests/test_xla_flags.py`` against the installed jaxlib
(an unknown name in ``XLA_FLAGS`` aborts the process). ``unknown(flags)`` asks the installed XLA
which names of a flag string it does not know (in a child process, since XLA ends the process
it parses them in); ``heads-jax doctor`` checks the user's ``XLA_FLAGS`` with it before JAX
starts.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import subprocess
import sys

from heads_jax import env

GPU_FLAGS = {
    "xla_gpu_enable_latency_hiding_scheduler": "true",
    "xla_gpu_enable_highest_priority_async_stream": "true",
    "xla_gpu_all_reduce_combine_threshold_bytes": "134217728",
}
CPU_FLAGS: dict = {}
TPU_FLAGS: dict = {}
DEFAULTS = {"gpu": GPU_FLAGS, "cpu": CPU_FLAGS, "tpu": TPU_FLAGS}


def parse(flags: str) -> dict:
  """``"--a=1 --b"`` -> ``{"a": "1", "b": None}`` (order kept)."""
  out = {}
  for item in flags.split():
    name, eq, value = item.lstrip("-").partition("=")
    if name:
      out[name] = value if eq else None
  return out


def merge(existing: str, defaults: dict) -> str:
  """``existing`` with each default flag appended unless a flag of that name is already there."""
  have = parse(existing)
  extra = [f"--{k}={v}" for k, v in defaults.items() if k not in have]
  return " ".join(filter(None, [existing.strip(), *extra]))


def detect_platform(environ=None) -> str:
  """``"gpu"``, ``"tpu"`` or ``"cpu"`` without initialising JAX."""
  first = env.get("JAX_PLATFORMS", environ).split(",")[0].strip().lower()
  if first in ("cuda", "gpu", "rocm"):
    return "gpu"
  if first in ("tpu", "cpu"):
    return first
  if first:
    return "cpu"
  if shutil.which("nvidia-smi") or any(importlib.util.find_spec(m) is not None
                                       for m in ("jax_cuda12_plugin", "jax_cuda13_plugin")):
    return "gpu"
  if importlib.util.find_spec("libtpu") is not None:
    return "tpu"
  return "cpu"


def backend_initialised() -> bool:
  """Whether JAX has already created a backend (then new ``XLA_FLAGS`` have no effect)."""
  if "jax" not in sys.modules:
    return False
  try:
    from jax._src import xla_bridge
    return bool(getattr(xla_bridge, "_backends", {}))
  except Exception:  # private API moved: assume not
    return False


def apply(platform: str | None = None, environ=None) -> str:
  """Adds the platform's default flags to ``XLA_FLAGS`` (user entries win); returns the value.

  A no-op with ``HEADS_JAX_XLA_FLAGS=off``. Warns on stderr (and changes nothing) when a JAX
  backend already exists, since XLA would ignore the new flags.
  """
  current = env.get("XLA_FLAGS", environ)
  if env.is_off("HEADS_JAX_XLA_FLAGS", environ):
    return current
  defaults = DEFAULTS.get(platform or detect_platform(environ), {})
  merged = merge(current, defaults)
  if merged == current:
    return current
  if backend_initialised():
    print("heads_jax: JAX is already initialised; XLA flags not applied: "
          + " ".join(f"--{k}={v}" for k, v in defaults.items()), file=sys.stderr)
    return current
  env.put("XLA_FLAGS", merged, environ)
  return merged


_UNKNOWN = re.compile(r"Unknown flags? in XLA_FLAGS: (.*)")


@functools.lru_cache(maxsize=8)
def unknown(flags: str) -> tuple[str, ...]:
  """The entries of ``flags`` (an ``XLA_FLAGS`` value) that the installed XLA does not know,
  e.g. ``("--xla_bogus=1",)``; empty when it takes them all. XLA parses its flags when a backend
  starts and ends the process on an unknown one, so a child process (the CPU backend, which
  parses every XLA flag, GPU ones included) starts one with ``flags`` and its last words are
  read (about 2 s)."""
  if not flags.strip():
    return ()
  environ = env.for_child(XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], env=environ,
                        capture_output=True, text=True, timeout=300)
  if proc.returncode == 0:
    return ()
  for line in proc.stderr.splitlines():
    m = _UNKNOWN.search(line)
    if m:
      return tuple(m.group(1).split())
  return ()  # another failure (not the flags): the jobs will say what it is


def unknown_line(bad) -> str:
  """The line for the unknown entries ``bad`` of ``XLA_FLAGS`` (`unknown`)."""
  one = len(bad) == 1
  return (f"XLA_FLAGS holds {'a flag' if one else 'flags'} this XLA does not know: {' '.join(bad)} "
          f"(XLA would end every job on {'it' if one else 'them'}); remove "
          f"{'it' if one else 'them'} from XLA_FLAGS")


def require_known(environ=None) -> None:
  """Raises a ``UserError`` (`unknown_line`) when ``XLA_FLAGS`` holds a flag the installed XLA
  does not know, before JAX starts (where XLA would end the process with its own fatal line);
  nothing to check once a backend runs (XLA took the flags). About 2 s, once per process."""
  from heads_jax.errors import UserError
  flags = env.get("XLA_FLAGS", environ)
  if not flags.strip() or backend_initialised():
    return
  bad = unknown(flags)
  if bad:
    raise UserError(f"environment: {unknown_line(bad)}")
