"""A training job with a fake step (no model, no data), run in a subprocess by the tests of
``heads_jax.training.job``: ``python -m tests.training.fake_run MODE WORKDIR`` runs ``TrainingJob.train``
for 8 steps with checkpoints every 2, through ``heads_jax.cli``-like exit handling (UserError ->
one line, exit 2). MODE:

* ``plain``: runs to the end;
* ``sigterm``: the step function sends this process SIGTERM at step 3;
* ``sigint``: the same with SIGINT (Ctrl-C);
* ``interrupt``: Ctrl-C (``KeyboardInterrupt``) arrives inside the save of step 4, after Orbax
  started writing it asynchronously;
* ``nospace``: the save of step 6 fails with ``OSError(ENOSPC)`` after leaving a partial
  (temporary) step folder, as a full disk does;
* ``asyncnospace`` / ``asyncdenied``: the asynchronous write of step 4 fails in Orbax's background
  thread (``OSError(ENOSPC)`` / ``PermissionError``); the step function of step 5 waits until
  that save has ended, so a run that goes on past the failure reaches step 6.

Every step prints ``step K`` on stdout.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(mode, workdir):
  """Runs this module as ``MODE WORKDIR`` in a subprocess (the tests' one way to start it):
  ``(completed process, stderr lines without absl's, checkpoint steps kept, steps run)``."""
  p = subprocess.run([sys.executable, "-m", "tests.training.fake_run", mode, str(workdir)],
                     capture_output=True, text=True, timeout=180, cwd=ROOT,
                     env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  lines = [x for x in p.stderr.splitlines() if x.strip() and not x.startswith("WARNING:absl")]
  steps = sorted(int(x.name) for x in (workdir / "checkpoints").iterdir() if x.name.isdigit())
  ran = [int(x.split()[1]) for x in p.stdout.splitlines() if x.startswith("step ") and
         "/" not in x]
  return p, lines, steps, ran


def main(mode: str, workdir: str) -> int:
  from heads_jax.errors import UserError
  from heads_jax.model.config import config_for
  from heads_jax.training import checkpointing, configlib, job as job_lib

  c = configlib.load_config("configs/pretrain.py:tiny")
  c.batch_size, c.num_train_steps, c.log_every, c.tensorboard = 8, 8, 1, False
  c.checkpoint.every_steps, c.checkpoint.keep = 2, 0
  job = job_lib.TrainingJob(c, workdir)
  job.create_dir()
  job.ckpts = checkpointing.Checkpoints(job.dir.checkpoints, save_interval_steps=2, max_to_keep=None)
  job.model_config = config_for("tiny", vocab_size=64)
  real_save = job.ckpts.manager.save

  def save(step, *args, **kwargs):
    if mode == "nospace" and step == 6:
      (job.dir.checkpoints / "6.orbax-checkpoint-tmp-1").mkdir(parents=True)
      raise OSError(errno.ENOSPC, "No space left on device")
    out = real_save(step, *args, **kwargs)
    if mode == "interrupt" and step == 4:
      raise KeyboardInterrupt
    return out

  job.ckpts.manager.save = save

  if mode.startswith("async"):
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jh
    real_write = jh.JsonCheckpointHandler._save_fn

    async def write(self, x, directory):
      if directory.parent.name.startswith("4."):
        if mode == "asyncnospace":
          raise OSError(errno.ENOSPC, "No space left on device")
        raise PermissionError(errno.EACCES, "Permission denied", str(directory))
      return await real_write(self, x, directory)

    jh.JsonCheckpointHandler._save_fn = write

  def train_step(state, batch):
    k = int(state["step"]) + 1
    print(f"step {k}", flush=True)
    if mode in ("sigterm", "sigint") and k == 3:
      os.kill(os.getpid(), signal.SIGTERM if mode == "sigterm" else signal.SIGINT)
    if mode.startswith("async") and k == 5:
      deadline = time.monotonic() + 60
      while job.ckpts.manager.is_saving_in_progress() and time.monotonic() < deadline:
        time.sleep(0.05)
    return ({"step": np.int32(k), "params": {"w": state["params"]["w"] + 1}},
            {"loss": 1.0 / k, "grad_norm": 1.0})

  state = {"step": np.int32(0), "params": {"w": np.zeros((256, 256), np.float32)}}
  batches = iter(lambda: {"x": np.zeros(8, np.float32)}, None)
  try:
    job.train(state, train_step, batches, seq_len=8, meta={})
  except UserError as e:
    print(f"heads-jax fake: error: {e}", file=sys.stderr)
    return 2
  job.close()
  print("done")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1], sys.argv[2]))
