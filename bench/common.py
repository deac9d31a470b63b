"""Shared helpers of the benchmarks: machine description, timing, memory, tables, JSON.

Every benchmark writes a JSON file whose ``machine`` entry (``machine_info``) says where and
when it ran: date (UTC), host CPU, cores, memory, Python / jax / jaxlib / flax / optax / torch /
transformers versions, the JAX devices, ``XLA_FLAGS`` and the torch thread count. Timings are
wall-clock seconds (``time.perf_counter``); a figure is the median of several repeats, with
the minimum and maximum beside it (the 2-core machine is shared, so single runs are noisy).

This module imports neither jax nor torch at import time (the notebook baseline and the memory
children decide what they load).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent


# ------------------------------------------------------------------------------------------------
# Machine

def available_cores() -> int:
  """Cores this process may run on (the affinity mask; what XLA's CPU client uses)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # macOS
    return os.cpu_count() or 1


def _cpuinfo() -> dict:
  info = {}
  try:
    text = Path("/proc/cpuinfo").read_text()
  except OSError:
    return info
  for line in text.splitlines():
    key, _, value = line.partition(":")
    key, value = key.strip(), value.strip()
    if key and key not in info:
      info[key] = value
  return info


def cpu_description() -> dict:
  """Model name, clock (MHz, as /proc/cpuinfo reports it), vector flags, cores."""
  info = _cpuinfo()
  flags = set(info.get("flags", "").split())
  return {
      "model": info.get("model name", platform.processor() or platform.machine()),
      "family": info.get("cpu family"), "model_id": info.get("model"),
      "mhz": float(info["cpu MHz"]) if "cpu MHz" in info else None,
      "avx2": "avx2" in flags, "fma": "fma" in flags, "avx512f": "avx512f" in flags,
      "cores": available_cores(),
  }


def cpu_peak_flops_estimate(cpu: dict | None = None) -> dict:
  """Estimated peak float32 FLOP/s of this CPU: cores x clock x FLOPs per cycle per core.

  FLOPs per cycle per core: 2 FMA pipes x vector lanes x 2 (multiply + add): 64 with AVX-512,
  32 with AVX2 + FMA (e.g. AMD Zen 2/3/4 with 256-bit data paths, Intel Haswell+), 8 with SSE.
  The clock is the one /proc/cpuinfo reports (the base clock on most VMs; turbo would be
  higher, so this is an estimate, not a measured bound). Returns ``{"flops": None}`` when the
  clock is unknown.
  """
  cpu = cpu or cpu_description()
  if cpu.get("avx512f"):
    per_cycle, isa = 64, "AVX-512 (2 x 16 lanes x FMA)"
  elif cpu.get("avx2") and cpu.get("fma"):
    per_cycle, isa = 32, "AVX2 + FMA (2 x 8 lanes x FMA)"
  else:
    per_cycle, isa = 8, "SSE (assumed)"
  mhz = cpu.get("mhz")
  if not mhz:
    return {"flops": None, "how": "clock unknown"}
  flops = cpu["cores"] * mhz * 1e6 * per_cycle
  return {"flops": flops, "how": f"{cpu['cores']} cores x {mhz:.0f} MHz x {per_cycle} FLOP/cycle "
                                  f"({isa}); an estimate from the reported clock"}


def measured_matmul_flops(n: int = 1024, repeats: int = 5) -> float:
  """Float32 FLOP/s of a jitted ``n x n`` matmul in XLA (median of ``repeats``): the best a
  dense model can hope for on this CPU."""
  import jax
  import jax.numpy as jnp
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a).block_until_ready()
    times.append(time.perf_counter() - t0)
  return 2 * n ** 3 / statistics.median(times)


def _version(name: str) -> str | None:
  try:
    from importlib.metadata import version
    return version(name)
  except Exception:
    return None


COMMIT_ENV = "HEADS_JAX_COMMIT"   # the commit measured, where the tree is no git checkout


def git_commit() -> str:
  """The commit the benchmark runs: ``HEADS_JAX_COMMIT`` when set (the device machine gets a copy
  of the tree without ``.git``: bench/device_run.sh is called with it), else ``git rev-parse
  HEAD`` of the checkout, ``+dirty`` when tracked files differ from it; ``"unknown"`` otherwise."""
  import subprocess
  given = os.environ.get(COMMIT_ENV, "").strip()
  if given:
    return given
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          timeout=20, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True, timeout=20, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown (no git checkout; set HEADS_JAX_COMMIT)"
  return head + ("+dirty" if dirty else "")


def machine_info(*, jax_devices: bool = True, torch_threads: bool = True) -> dict:
  """Where and when a benchmark ran (see the module docstring)."""
  import socket
  mem = None
  try:
    for line in Path("/proc/meminfo").read_text().splitlines():
      if line.startswith("MemTotal"):
        mem = round(int(line.split()[1]) / 2**20, 1)
  except OSError:
    pass
  out = {
      "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
      "host": socket.gethostname(), "platform": platform.platform(),
      "cpu": cpu_description(), "memory_gib": mem,
      "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
      "python": platform.python_version(),
      "versions": {p: _version(p) for p in ("jax", "jaxlib", "flax", "optax", "numpy", "torch",
                                            "transformers")},
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "accelerator": "none (CPU only)",
      "git_commit": git_commit(),
  }
  if jax_devices:
    import jax
    devs = jax.devices()
    out["jax_devices"] = f"{len(devs)} x {devs[0].platform}:{devs[0].device_kind}"
    if devs[0].platform != "cpu":
      out["accelerator"] = devs[0].device_kind
      try:
        out["backend_version"] = devs[0].client.platform_version
      except Exception:
        out["backend_version"] = None
      out["gpu"] = nvidia_smi()
  if torch_threads:
    try:
      import torch
      out["torch_threads"] = torch.get_num_threads()
    except ImportError:
      out["torch_threads"] = None
  return out


def nvidia_smi() -> list | None:
  """``[{"name", "driver", "memory_mib", "clock_max_mhz"}]`` per GPU from ``nvidia-smi``, or None."""
  import shutil
  import subprocess
  if not shutil.which("nvidia-smi"):
    return None
  try:
    text = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          timeout=30, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  rows = []
  for line in text.strip().splitlines():
    name, driver, mem, clock = (x.strip() for x in line.split(",")[:4])
    rows.append({"name": name, "driver": driver, "memory_mib": mem, "clock_max_mhz": clock})
  return rows


def device_header(info: dict) -> str:
  """One line naming where a benchmark runs: devices, driver, jax/jaxlib, date, load."""
  v = info.get("versions", {})
  gpu = info.get("gpu") or []
  driver = f", driver {gpu[0]['driver']}" if gpu else ""
  backend = f", {info['backend_version']}" if info.get("backend_version") else ""
  return (f"device: {info.get('jax_devices', '?')} ({info.get('accelerator')}{driver}{backend}); "
          f"jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, flax {v.get('flax')}, torch {v.get('torch')}; "
          f"{info['date_utc']} UTC; commit {info.get('git_commit')}; "
          f"load average {info.get('load_average_1m')}; "
          f"XLA_FLAGS={info.get('xla_flags')!r}")


# Dense peak FLOP/s per device from the vendors' data sheets (no sparsity), by compute dtype.
# "tf32": the tensor-core peak a float32 matmul gets at XLA's default precision on a GPU.
ACCELERATOR_PEAKS = {
    "H100 SXM": {"bfloat16": 989e12, "tf32": 495e12, "float32": 67e12},  # H100 SXM5 data sheet
    "H100 PCIe": {"bfloat16": 756e12, "tf32": 378e12, "float32": 51e12},
    "H100 NVL": {"bfloat16": 835e12, "tf32": 418e12, "float32": 60e12},
    "H200": {"bfloat16": 989e12, "tf32": 495e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "tf32": 156e12, "float32": 19.5e12},
    "TPU v3": {"bfloat16": 123e12, "float32": None},
    "TPU v4": {"bfloat16": 275e12, "float32": None},
    "TPU v5 lite": {"bfloat16": 197e12, "float32": None},
}


def accelerator_peak_flops(device_kind: str, dtype: str = "bfloat16") -> dict:
  """``{"flops", "how"}``: the data-sheet peak of a GPU/TPU for ``dtype`` (``flops`` None when the
  device is unknown). H100 names: "NVIDIA H100 80GB HBM3" is the SXM part, "... PCIe" the PCIe."""
  kind = device_kind or ""
  if "H100" in kind:
    key = "H100 PCIe" if "PCIe" in kind else ("H100 NVL" if "NVL" in kind else "H100 SXM")
  elif "H200" in kind:
    key = "H200"
  elif "A100" in kind:
    key = "A100"
  else:
    key = next((k for k in ACCELERATOR_PEAKS if k.lower() in kind.lower()), None)
  if key is None or ACCELERATOR_PEAKS[key].get(dtype) is None:
    return {"flops": None, "how": f"no data-sheet peak for {kind!r} / {dtype}"}
  return {"flops": ACCELERATOR_PEAKS[key][dtype], "how": f"{key} data sheet, dense {dtype}"}


def peak_flops(dtype: str = "float32") -> dict:
  """The peak for MFU on the default JAX device: the data sheet on a GPU/TPU for the matmuls
  ``dtype`` runs at JAX's default precision (float32 runs TF32 on a GPU's tensor cores and
  bfloat16 passes on a TPU: their peaks; dividing by the float32 CUDA-core peak gave 196% on an
  H200), the estimate (``cpu_peak_flops_estimate``) on a CPU."""
  import jax
  dev = jax.devices()[0]
  if dev.platform == "cpu":
    return cpu_peak_flops_estimate()
  if dtype == "float32" and jax.config.jax_default_matmul_precision in (None, "default",
                                                                        "bfloat16", "tensorfloat32"):
    peak = accelerator_peak_flops(dev.device_kind, "tf32" if dev.platform == "gpu" else "bfloat16")
    if peak["flops"]:
      peak["how"] += " (float32 matmuls at JAX's default precision)"
      return peak
  return accelerator_peak_flops(dev.device_kind, dtype)


def warn_if_emulated_devices() -> str | None:
  """A note when ``XLA_FLAGS`` forces several host devices (timings then measure the sharded
  path on emulated devices, which share the same cores)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" in flags:
    note = (f"XLA_FLAGS={flags!r} emulates several CPU devices: timings measure the sharded path "
            "on cores they share; unset XLA_FLAGS for the single-device figures")
    print("note: " + note, file=sys.stderr)
    return note
  return None


def set_torch_threads(threads: int | None = None) -> int:
  """Sets torch's intra-op threads to ``threads`` (default: the cores XLA uses); returns it."""
  import torch
  threads = threads or available_cores()
  torch.set_num_threads(threads)
  return threads


# ------------------------------------------------------------------------------------------------
# Timing

def summarize(seconds: Sequence[float], cpu_seconds: Sequence[float] | None = None) -> dict:
  """``{"median_s", "min_s", "max_s", "repeats", "all_s"}`` of repeated wall-clock timings, plus
  ``"cpu_median_s"`` (process CPU time, all threads) when ``cpu_seconds`` is given."""
  s = list(seconds)
  if not s:
    raise ValueError("no timings to summarize")
  out = {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s), "repeats": len(s),
         "all_s": [round(x, 4) for x in s]}
  if cpu_seconds:
    out["cpu_median_s"] = statistics.median(cpu_seconds)
  return out


class Timer:
  """Context manager measuring wall-clock and process CPU seconds (all threads).

  CPU time is less sensitive than wall time to other processes on a shared machine (it counts
  only this process's work), though thread pools that spin while waiting inflate it."""

  def __enter__(self):
    self._w, self._c = time.perf_counter(), time.process_time()
    return self

  def __exit__(self, *exc):
    self.wall = time.perf_counter() - self._w
    self.cpu = time.process_time() - self._c


def time_repeats(fn: Callable[[], object], repeats: int, warmup: int = 1) -> dict:
  """Runs ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; ``summarize`` of those.
  ``fn`` must block until its work is done (``block_until_ready`` / ``np.asarray``)."""
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  for _ in range(warmup):
    fn()
  times, cpu = [], []
  for _ in range(repeats):
    with Timer() as t:
      fn()
    times.append(t.wall)
    cpu.append(t.cpu)
  return summarize(times, cpu)


def rate(count: float, timing: dict) -> float:
  """Items per second at the median time (``timing`` from ``summarize``)."""
  return count / timing["median_s"]


def spread(count: float, timing: dict) -> str:
  """``"min..max"`` items per second over the repeats (for tables)."""
  return f"{count / timing['max_s']:.4g}..{count / timing['min_s']:.4g}"


# ------------------------------------------------------------------------------------------------
# Memory

def peak_rss_mib() -> float:
  """Peak resident set size of this process so far, MiB (``ru_maxrss``)."""
  r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return r / 1024 if platform.system() == "Linux" else r / 2**20  # KiB on Linux, bytes on macOS


def _proc_status_kib(key: str) -> int | None:
  try:
    for line in Path("/proc/self/status").read_text().splitlines():
      if line.startswith(key + ":"):
        return int(line.split()[1])
  except OSError:
    pass
  return None


def reset_peak_rss() -> bool:
  """Resets this process's peak RSS (``VmHWM``; Linux >= 4.0, ``/proc/self/clear_refs``), so
  that ``peak_rss_since_reset_mib`` measures one phase; False where that is not possible."""
  try:
    Path("/proc/self/clear_refs").write_text("5")
    return True
  except OSError:
    return False


def peak_rss_since_reset_mib() -> float | None:
  """``VmHWM`` in MiB (the peak since ``reset_peak_rss``, or since the start), None off Linux."""
  kib = _proc_status_kib("VmHWM")
  return None if kib is None else kib / 1024


def current_rss_mib() -> float | None:
  kib = _proc_status_kib("VmRSS")
  return None if kib is None else kib / 1024


def enable_jax_compilation_cache(directory) -> None:
  """Turns on JAX's persistent compilation cache in ``directory`` (every compilation cached)."""
  import jax
  jax.config.update("jax_compilation_cache_dir", str(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def run_json_child(cmd: Sequence[str], env: dict | None = None, timeout: float | None = None) -> dict:
  """Runs ``cmd`` in a fresh process and parses the JSON object on its last stdout line."""
  proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, timeout=timeout)
  if proc.returncode != 0:
    raise RuntimeError(f"benchmark child {' '.join(cmd)} failed ({proc.returncode}):\n"
                       f"{proc.stderr[-3000:]}")
  lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
  if not lines:
    raise RuntimeError(f"benchmark child {' '.join(cmd)} printed nothing; stderr:\n{proc.stderr[-3000:]}")
  return json.loads(lines[-1])


# ------------------------------------------------------------------------------------------------
# Output

def _cell(v) -> str:
  if isinstance(v, float):
    if v != v:
      return "nan"
    return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
  return "" if v is None else str(v)


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None,
                 title: str | None = None) -> str:
  """A plain-text table (Markdown pipe syntax, so it can be pasted into BENCHMARKS.md)."""
  if not rows:
    return title or ""
  columns = list(columns or rows[0].keys())
  cells = [[_cell(r.get(c)) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"
  out = [title] if title else []
  out += [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
  out += [line(row) for row in cells]
  return "\n".join(out)


def command_line() -> str:
  """The command that ran this benchmark (for BENCHMARKS.md)."""
  args = " ".join(sys.argv[1:])
  script = os.path.relpath(sys.argv[0], REPO) if sys.argv and sys.argv[0] else "?"
  return f"python {script} {args}".strip()


def write_json(path, result: dict) -> Path:
  """Writes ``result`` (indent 2) to ``path``, creating parent folders; returns the path."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
  return path


def _json_default(x):
  try:
    import numpy as np
    if isinstance(x, np.generic):
      return x.item()
    if isinstance(x, np.ndarray):
      return x.tolist()
  except ImportError:
    pass
  if isinstance(x, Path):
    return str(x)
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def add_model_args(parser, sequences: int) -> None:
  """The model and batch flags shared by the analysis benchmarks: ``--hf-dir``, ``--size``,
  ``--random``, ``--sequences``, ``--batch-size``, ``--max-length``."""
  parser.add_argument("--hf-dir", default=None, help="Hugging Face BERT directory (default: "
                      "all-MiniLM-L6-v2 if installed, else a random --size model)")
  parser.add_argument("--size", default="mini", help="random model size when there is no "
                      "--hf-dir and MiniLM is not installed, or with --random")
  parser.add_argument("--random", action="store_true", help="use a random --size model even if "
                      "MiniLM is installed")
  parser.add_argument("--sequences", type=int, default=sequences, help="N: sequences per run")
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--max-length", type=int, default=128)


def default_json_path(script: str, out: str | None) -> Path:
  """``out`` if given, else ``<script>.json`` next to the script."""
  return Path(out) if out else Path(script).with_suffix(".json")
