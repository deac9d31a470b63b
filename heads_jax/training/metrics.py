"""Training metrics: a JSON-lines log, TensorBoard event files, throughput, MFU, progress line.

TensorBoard files are written with ``tensorboardX`` (no TensorFlow needed). Only process 0
writes. Paths: ``heads_jax.training.rundir.RunDir`` (a local folder or a ``gs://`` URL).

FLOPs convention (PaLM, Chowdhery et al. 2022, appendix B): one training step costs
``6 * N + 12 * l * d * q`` FLOPs per token, with ``N`` the number of non-embedding parameters
(word, position and token-type tables excluded; the tied MLM decoder, which only runs at the
few masked positions, is not counted), ``l`` layers, ``d`` the hidden size and ``q`` the
sequence length (the attention scores and the weighted sum, forward and backward, no causal
halving). Tokens are all positions of the padded batch (what the device computes).
MFU = achieved FLOP/s / (devices x peak dense bfloat16 FLOP/s of one device), from the table
``PEAK_BF16_FLOPS`` (vendor data sheets, dense, no sparsity); ``None`` for devices not in it
(e.g. CPUs). Under float32 compute the bfloat16 peak still is the reference.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import time

import jax

from heads_jax.storage import exists, read_text, upload_tree, write_text
from heads_jax.training.rundir import RunDir

def summary_writer():
  """``tensorboardX.SummaryWriter``, imported without torch: ``tensorboardX.writer`` imports
  torch whenever it is installed (only to accept torch tensors; we log floats), 3-5 CPU-seconds
  at every training command's start on a machine with torch (Colab, or this project's tests).
  Where torch is already imported it is used as is."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError: tensorboardX's numpy path
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


# Peak dense bfloat16 FLOP/s of one JAX device (a TPU v2/v3 device is one core; v4 and later
# expose one device per chip).
PEAK_BF16_FLOPS = {
    "tpu v2": 22.5e12,
    "tpu v3": 61.5e12,      # 123 TFLOP/s per chip, 2 cores
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,  # v5e
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v5": 459e12,
    "tpu v6 lite": 918e12,  # v6e (Trillium)
    "tpu v6e": 918e12,
    "a100": 312e12,
    "h100 pcie": 756e12,
    "h100": 989e12,         # SXM
    "h200": 989e12,
    "b200": 2250e12,
}


def peak_flops(device_kind: str) -> float | None:
  """Peak dense bf16 FLOP/s of one device of this kind (``jax.devices()[0].device_kind``)."""
  kind = device_kind.lower()
  for name in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):  # longest match first
    if name in kind:
      return PEAK_BF16_FLOPS[name]
  return None


def non_embedding_params(params) -> int:
  """Parameters outside the embedding tables (leaves whose path holds ``embedding``)."""
  total = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    if any("embed" in str(getattr(k, "key", getattr(k, "name", k))) for k in path):
      continue
    total += int(math.prod(leaf.shape))
  return total


def train_flops_per_token(n_non_embedding: int, num_layers: int, hidden_size: int,
                          seq_len: int) -> float:
  """``6 N + 12 l d q`` (see the module docstring)."""
  return 6.0 * n_non_embedding + 12.0 * num_layers * hidden_size * seq_len


class MetricsWriter:
  """Writes scalars to the run's ``metrics.jsonl`` and TensorBoard events to its ``tb/``.

  A local work directory gets one appended line per record. In cloud storage (a URL), where an
  object cannot be appended to, the file is rewritten whole (the earlier records read back when
  the run resumes) at most every ``sync_seconds`` and when the writer closes; TensorBoard events
  are written to a local folder whose files are copied to ``tb/`` as often (each run segment
  adds its own events file, as locally). ``before_upload()`` is called before each of those
  uploads (a training job passes its checkpoints' ``wait``: no upload runs while Orbax
  finalises a checkpoint on the same filesystem object). Every remote call is timed out and
  retried (``heads_jax.storage.call``).
  """

  def __init__(self, workdir, *, enabled: bool = True, tensorboard: bool = True,
               sync_seconds: float = 30.0, before_upload=None):
    self.enabled = enabled
    self.before_upload = before_upload
    run = RunDir(workdir)
    self.path = run.metrics_file
    self.remote = run.is_remote
    self.sync_seconds = sync_seconds
    self._tb = None
    if not enabled:
      return
    if self.remote:
      self._lines = (read_text(self.path).splitlines(keepends=True) if exists(self.path)
                     else [])
      self._synced = time.monotonic()
      self._dirty = False
    else:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._file = open(self.path, "a")
    self._tb_local = None
    if tensorboard:
      if self.remote:
        self._tb_local = tempfile.mkdtemp(prefix="heads_jax_tb_")
        self._tb_remote = run.tensorboard_dir
      self._tb = summary_writer()(self._tb_local or str(run.tensorboard_dir))

  def write(self, step: int, scalars: dict, prefix: str = "train"):
    if not self.enabled:
      return
    clean = {k: _float(v) for k, v in scalars.items()}
    record = {"step": int(step), "split": prefix, "time": time.time(), **clean}
    line = json.dumps(record) + "\n"
    if self.remote:
      self._lines.append(line)
      self._dirty = True
    else:
      self._file.write(line)
      self._file.flush()
    if self._tb is not None:
      for k, v in clean.items():
        if v is not None and math.isfinite(v):
          self._tb.add_scalar(f"{prefix}/{k}", v, int(step))
      if not self.remote:
        self._tb.flush()
    if self.remote and time.monotonic() - self._synced >= self.sync_seconds:
      self.sync()

  def sync(self):
    """Writes what is buffered (a remote run; a local one writes every record at once)."""
    if not self.enabled or not self.remote:
      return
    if self.before_upload is not None:
      self.before_upload()
    if self._dirty:
      write_text(self.path, "".join(self._lines))
      self._dirty = False
    if self._tb is not None:
      self._tb.flush()
      upload_tree(self._tb_local, self._tb_remote)
    self._synced = time.monotonic()

  def close(self):
    if not self.enabled:
      return
    if self.remote:
      self.sync()
    else:
      self._file.close()
    if self._tb is not None:
      self._tb.close()
      if self._tb_local:
        if self.before_upload is not None:
          self.before_upload()
        upload_tree(self._tb_local, self._tb_remote)
        shutil.rmtree(self._tb_local, ignore_errors=True)


def _float(v):
  try:
    return float(v)
  except (TypeError, ValueError):
    return None


def read_metrics(workdir, split: str | None = None) -> list[dict]:
  """The records of ``workdir/metrics.jsonl`` (optionally of one split); a URL works too."""
  path = RunDir(workdir).metrics_file
  if not exists(path):
    return []
  rows = [json.loads(line) for line in read_text(path).splitlines() if line.strip()]
  return [r for r in rows if split is None or r.get("split") == split]


class Throughput:
  """Steps/s, tokens/s and MFU between two calls of ``update``."""

  def __init__(self, tokens_per_step: int, flops_per_token: float | None, num_devices: int,
               device_kind: str, total_steps: int, start_step: int = 0):
    self.tokens_per_step = tokens_per_step
    self.flops_per_token = flops_per_token
    self.peak = peak_flops(device_kind)
    self.num_devices = num_devices
    self.total_steps = total_steps
    self._t, self._step = time.perf_counter(), start_step

  def reset(self, step: int):
    self._t, self._step = time.perf_counter(), step

  def update(self, step: int) -> dict:
    now = time.perf_counter()
    dt, ds = now - self._t, step - self._step
    self._t, self._step = now, step
    if dt <= 0 or ds <= 0:
      return {}
    steps_per_s = ds / dt
    tokens_per_s = steps_per_s * self.tokens_per_step
    out = {"steps_per_s": steps_per_s, "tokens_per_s": tokens_per_s,
           "eta_s": max(0, self.total_steps - step) / steps_per_s}
    if self.flops_per_token:
      out["tflops_per_s"] = tokens_per_s * self.flops_per_token / 1e12
      if self.peak:
        out["mfu"] = tokens_per_s * self.flops_per_token / (self.peak * self.num_devices)
    return out


def format_duration(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def progress_line(step: int, total: int, scalars: dict) -> str:
  """One line: step, loss and friends, steps/s, tokens/s, MFU, time left."""
  parts = [f"step {step}/{total}"]
  for k in ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "accuracy", "learning_rate"):
    if k in scalars and scalars[k] is not None:
      v = float(scalars[k])
      parts.append(f"{k} {v:.3g}" if k == "learning_rate" else f"{k} {v:.4f}")
  if "steps_per_s" in scalars:
    parts.append(f"{scalars['steps_per_s']:.2f} steps/s")
  if "tokens_per_s" in scalars:
    parts.append(f"{scalars['tokens_per_s']:,.0f} tok/s")
  if scalars.get("mfu") is not None:
    parts.append(f"MFU {100 * scalars['mfu']:.1f}%")
  if "eta_s" in scalars:
    parts.append(f"left {format_duration(scalars['eta_s'])}")
  return " | ".join(parts)
