"""A failed asynchronous checkpoint save on ``gs://`` (issue 43 item 6; the local-disk case is
tests/training/test_signals.py): the GCS emulator on localhost (tests/gcs_emulator.py) refuses
every upload of step 4's checkpoint with 403 Forbidden, as the real service does for a bucket the
account may not write (or under a retention policy); the training job (the fake run of
tests/training/fake_run.py, in its own process: 8 steps, a checkpoint every 2, saved
asynchronously) stops at the first step boundary after the failure with exit 2 and the line
naming the checkpoint, and step 2 stays complete and restorable from the bucket, and that line is
all it prints (the unraisable "Event loop is closed" of gcsfs/aiohttp objects is dropped while
the checkpoints are open: training.checkpointing).

Run as a script, this file is the emulator with that refusal (``--deny REGEX``: 403 for every
upload whose object name matches).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.parse

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUCKET = "heads-jax-denied"
RUN = f"gs://{BUCKET}/run"
DENIED = r"^run/checkpoints/4[/.]"   # step 4's folder (and Orbax's temporary one)
# TensorStore's log line when it takes the emulator's token (glog format, not an error)
_TENSORSTORE_INFO = re.compile(r"^I\d{4} [\d:.]+ +\d+ google_auth_provider\.cc:\d+\] ")


def _deny_uploads(pattern: str) -> None:
  """403 for every upload (POST to /upload/..., a resumable PUT's first POST included) whose
  object name matches ``pattern``; other requests as the emulator answers them."""
  from gcp_storage_emulator import server
  deny = re.compile(pattern)
  handle = server.Router.handle

  def refusing(self, method):
    h = self._request_handler
    url = urllib.parse.urlsplit(h.path)
    name = urllib.parse.parse_qs(url.query).get("name", [""])[0]
    if method in ("POST", "PUT") and url.path.startswith("/upload/") and deny.search(name):
      length = int(h.headers.get("Content-Length") or 0)
      if length:
        h.rfile.read(length)
      body = (b'{"error": {"code": 403, "message": "the emulator refuses uploads of %s"}}'
              % name.encode())
      h.send_response(403)
      h.send_header("Content-Type", "application/json")
      h.send_header("Content-Length", str(len(body)))
      h.end_headers()
      h.wfile.write(body)
      return None
    return handle(self, method)

  server.Router.handle = refusing


# The fake run in its own process, as a user runs a job: its stderr is all that process prints,
# at exit included. The training loop's check after each step does not wait for a save in
# flight; here it does (as the local test's step 5 waits), so that the failure is known at the
# first step boundary after it, whatever the speed of the machine.
CHILD = """
import sys, time
from heads_jax.training import checkpointing
from tests.training import fake_run
check = checkpointing.Checkpoints.check

def check_after_the_save(self):
  while self.pending is not None and self.manager.is_saving_in_progress():
    time.sleep(0.02)
  return check(self)

checkpointing.Checkpoints.check = check_after_the_save
sys.exit(fake_run.main("plain", sys.argv[1]))
"""


@pytest.fixture(scope="module")
def refused():
  """The fake run into ``gs://BUCKET/run`` against the emulator that refuses step 4:
  ``(completed process, its stderr lines but TensorStore's token line and absl warnings, the
  steps it ran)``."""
  from tests import gcs_emulator
  drained = gcs_emulator.drained
  gcs_emulator.drained = lambda cmd: drained([sys.executable, os.path.abspath(__file__),
                                              *cmd[2:], "--deny", DENIED])
  try:
    server = gcs_emulator.GcsEmulator(BUCKET).start()
  except RuntimeError as e:
    from tests.helpers import skip_unless_ci
    skip_unless_ci(str(e))
  finally:
    gcs_emulator.drained = drained
  try:
    p = subprocess.run([sys.executable, "-c", CHILD, RUN], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT,
                                                       JAX_PLATFORMS="cpu"))
    lines = [x for x in p.stderr.splitlines() if x.strip() and not x.startswith("WARNING:absl")
             and not _TENSORSTORE_INFO.match(x)]
    ran = [int(x.split()[1]) for x in p.stdout.splitlines()
           if x.startswith("step ") and "/" not in x]
    yield p, lines, ran
  finally:
    server.stop()


@pytest.mark.slow
def test_a_refused_async_save_to_a_bucket_stops_and_keeps_the_last_checkpoint(refused):
  from heads_jax import storage
  from heads_jax.training import checkpointing
  p, lines, ran = refused
  assert p.returncode == 2, p.stderr[-3000:]
  assert ran == [1, 2, 3, 4], f"training went on past the failed save: {ran}"
  ck = f"{RUN}/checkpoints"
  assert lines and lines[-1].startswith(f"heads-jax fake: error: the checkpoint of step 4 could "
                                        f"not be written to {ck}/4 (OSError: Forbidden: "), lines
  assert f"the last complete checkpoint is step 2 in {ck} (intact" in lines[-1], lines[-1]
  # step 2 is complete and reads back: the state after 2 steps (w = 2 everywhere); step 4 left
  # nothing a resumed run would take for a checkpoint
  ckpts = checkpointing.Checkpoints(ck, save_interval_steps=2, max_to_keep=None)
  try:
    assert ckpts.all_steps() == [2]
    abstract = {"step": np.zeros((), np.int32), "params": {"w": np.zeros((256, 256), np.float32)}}
    state, _ = ckpts.restore(checkpointing.abstract_like(abstract))
    assert int(state["step"]) == 2 and np.all(np.asarray(state["params"]["w"]) == 2)
  finally:
    ckpts.close()
  assert not any(x.name.startswith("4") for x in storage.as_path(ck).iterdir())


def test_a_refused_async_save_to_a_bucket_prints_one_line_only(refused):
  p, lines, _ = refused
  assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]


def main(argv=None):
  import argparse
  sys.path.insert(0, ROOT)
  from tests import gcs_emulator
  parser = argparse.ArgumentParser(description="the GCS emulator, refusing some uploads")
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--bucket", required=True)
  parser.add_argument("--deny", required=True)
  args = parser.parse_args(argv)
  gcs_emulator._patch_emulator()
  _deny_uploads(args.deny)
  from gcp_storage_emulator.server import create_server
  create_server("127.0.0.1", args.port, in_memory=True, default_bucket=args.bucket).run()


if __name__ == "__main__":
  main()
