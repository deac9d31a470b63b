"""heads_jax.storage: nothing waits on remote storage forever.

A localhost server that accepts connections and never answers stands in for a stalled bucket:
heads_jax's own calls (``storage.call``) give up after their share of
``HEADS_JAX_STORAGE_TIMEOUT`` and retry, then fail with one line; the watchdog around Orbax
(``storage.watch``) prints a progress line naming the path, then one line, and ends the process
with exit 2, naming the last complete checkpoint. Limits are set to seconds here."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from heads_jax import storage
from heads_jax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SilentServer:
  """Accepts TCP connections on localhost and never answers (nor closes them)."""

  def __init__(self):
    self.sock = socket.socket()
    self.sock.bind(("127.0.0.1", 0))
    self.sock.listen(64)
    self.port = self.sock.getsockname()[1]
    self.conns = []
    self._stop = False
    threading.Thread(target=self._accept, daemon=True).start()

  def _accept(self):
    while not self._stop:
      try:
        conn, _ = self.sock.accept()
      except OSError:
        return
      self.conns.append(conn)  # read nothing, answer nothing

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"

  def close(self):
    self._stop = True
    for c in self.conns:
      c.close()
    self.sock.close()


@pytest.fixture
def silent():
  server = SilentServer()
  yield server
  server.close()


def _run(code: str, server: SilentServer, timeout_s: str, progress_s: str = "1"):
  env = dict(os.environ, STORAGE_EMULATOR_HOST=server.url, TENSORSTORE_GCS_HTTP_URL=server.url,
             TENSORSTORE_GCS_HTTP_VERSION="1", GOOGLE_AUTH_TOKEN_FOR_TESTING="x",
             HEADS_JAX_STORAGE_TIMEOUT=timeout_s, HEADS_JAX_STORAGE_PROGRESS=progress_s,
             JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  t0 = time.monotonic()
  p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                     timeout=120, cwd=ROOT)
  return p, time.monotonic() - t0


def _lines(text: str) -> list[str]:
  return [x for x in text.splitlines() if x.strip() and not x.startswith(("WARNING:absl", "I0", "W0"))]


def test_watchdog_names_the_path_then_exits_2_with_the_last_checkpoint(silent):
  """Orbax cannot be timed out: opening a checkpoint directory on the silent server waits until
  the watchdog ends the process, after a progress line."""
  code = ("from heads_jax.training.checkpointing import Checkpoints\n"
          "Checkpoints('gs://bkt/run/checkpoints')\nprint('returned')\n")
  p, seconds = _run(code, silent, timeout_s="4")
  lines = _lines(p.stderr)
  assert p.returncode == 2, p.stderr[-2000:]
  assert seconds < 60
  assert "returned" not in p.stdout
  assert any(x.startswith("still waiting for storage: opening the checkpoints "
                          "(gs://bkt/run/checkpoints)") for x in lines), lines
  errors = [x for x in lines if x.startswith("heads-jax: error:")]
  assert len(errors) == 1 and "gs://bkt/run/checkpoints" in errors[0]
  assert "HEADS_JAX_STORAGE_TIMEOUT=4 s" in errors[0]
  assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_own_calls_time_out_and_retry_then_fail_with_one_line(silent):
  """heads_jax's own writes (config.json, metrics) on the silent server: a UserError after the
  retries, well within the limit, no hang."""
  code = ("from heads_jax import storage\nfrom heads_jax.errors import UserError\n"
          "try:\n  storage.write_text('gs://bkt/run/config.json', '{}')\n"
          "except UserError as e:\n  print('USERERROR', e)\n")
  p, seconds = _run(code, silent, timeout_s="4", progress_s="30")
  assert p.returncode == 0, p.stderr[-2000:]
  out = [x for x in p.stdout.splitlines() if x.startswith("USERERROR")]
  assert len(out) == 1
  assert "gs://bkt/run/config.json: storage failed while writing after 4 tries (no answer in 1 s)" \
      in out[0]
  assert seconds < 40


def test_the_watchdog_is_quiet_when_the_call_ends_in_time(capsys):
  with storage.watch("saving", "gs://b/x", limit=5, progress=0.2):
    time.sleep(0.5)
  err = capsys.readouterr().err
  assert err.count("still waiting for storage: saving (gs://b/x)") in (1, 2)
  with storage.watch("saving", "gs://b/x", limit=0.5, progress=0.1):
    pass
  time.sleep(0.7)  # the guard has stopped: no exit
  with storage.watch("saving", "/local/path", limit=0.1, progress=0.05):
    time.sleep(0.3)  # local paths are not watched
  assert capsys.readouterr().err == ""


def test_call_retries_transient_errors_with_backoff_and_not_clear_answers(monkeypatch):
  monkeypatch.setattr(time, "sleep", lambda s: sleeps.append(s))
  sleeps, tries = [], []

  def flaky():
    tries.append(1)
    if len(tries) < 3:
      raise ConnectionResetError("reset by peer")
    return "ok"

  assert storage.call(flaky, what="reading", path="gs://b/f") == "ok"
  assert len(tries) == 3 and sleeps == [0.5, 1.0]

  def missing():
    tries.append(1)
    raise FileNotFoundError("gs://b/nope")

  tries.clear()
  with pytest.raises(FileNotFoundError):
    storage.call(missing, what="reading", path="gs://b/nope")
  assert len(tries) == 1  # a clear answer is not retried

  def always():
    raise OSError("503 Service Unavailable")

  with pytest.raises(UserError, match=r"gs://b/f: storage failed while reading after 4 tries "
                                      r"\(OSError: 503 Service Unavailable\)"):
    storage.call(always, what="reading", path="gs://b/f")
  # a local path is called directly, errors unchanged
  with pytest.raises(OSError, match="503"):
    storage.call(always, what="reading", path="/tmp/x")


def test_limits_must_be_positive(monkeypatch):
  monkeypatch.setenv("HEADS_JAX_STORAGE_TIMEOUT", "0")
  with pytest.raises(UserError, match="HEADS_JAX_STORAGE_TIMEOUT must be a positive number of seconds \\(e.g. 300\\), got '0'"):
    storage.storage_timeout()
  monkeypatch.setenv("HEADS_JAX_STORAGE_TIMEOUT", "2.5")
  assert storage.storage_timeout() == 2.5


def test_the_watchdog_line_names_the_last_complete_checkpoint():
  code = ("import time\nfrom heads_jax import storage\n"
          "with storage.watch('saving the checkpoint of step 40', 'gs://b/run/checkpoints',\n"
          "                   note=lambda: 'the last complete checkpoint is step 20 in '\n"
          "                                'gs://b/run/checkpoints', limit=1.5, progress=0.5):\n"
          "  time.sleep(30)\nprint('returned')\n")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                     cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
  assert p.returncode == 2 and "returned" not in p.stdout
  lines = _lines(p.stderr)
  assert re.match(r"still waiting for storage: saving the checkpoint of step 40 "
                  r"\(gs://b/run/checkpoints\), \d+ s so far; giving up after 1.5 s$", lines[0])
  assert re.match(r"heads-jax: error: storage gave no answer for \d+ s while saving the "
                  r"checkpoint of step 40 \(gs://b/run/checkpoints\); the last complete "
                  r"checkpoint is step 20 in gs://b/run/checkpoints; check the network", lines[-1])
  assert sum(x.startswith("heads-jax: error:") for x in lines) == 1


FULL = "/dev/full"  # every write into it fails with ENOSPC and no file name, as a full disk


@pytest.mark.skipif(not os.path.exists(FULL), reason="needs /dev/full")
def test_a_full_disk_names_the_file_and_what_to_do(tmp_path):
  """A write into a full disk (no file name in the OSError) is one line naming the path:
  storage writes, a job's staged output directory, the contract's files."""
  import numpy as np

  from heads_jax import cli, contract
  from heads_jax.hoststats import hypothesis

  fix = "no space left on the device; free some space or choose another output directory"
  (tmp_path / "full.json").symlink_to(FULL)
  with pytest.raises(OSError) as e:
    storage.write_text(tmp_path / "full.json", "{}")
  assert e.value.filename == str(tmp_path / "full.json")
  assert cli.user_message(e.value).startswith(f"{tmp_path / 'full.json'}: {fix}")

  out = tmp_path / "report"
  with pytest.raises(OSError) as e:
    with storage.staged_output(out) as local:
      (local / "page.html").symlink_to(FULL)
      with open(local / "page.html", "w") as f:  # a writer that names nothing itself
        f.write("<html>")
  assert cli.user_message(e.value).startswith(f"{out}: {fix}")

  x = np.arange(6.0).reshape(3, 1, 1, 2)
  df, settings = hypothesis.hypothesis_tests(x, ("local", "cls"), settings={"model": "m"})
  for name in ("tests.csv", "tests.json"):
    d = tmp_path / name.replace(".", "_")
    d.mkdir()
    (d / name).symlink_to(FULL)
    with pytest.raises(OSError) as e:
      contract.write_tests(df, settings, d)
    assert cli.user_message(e.value).startswith(f"{d / name}: {fix}"), name
  (tmp_path / "run" ).mkdir()
  (tmp_path / "run" / "run.json.tmp").symlink_to(FULL)
  with pytest.raises(OSError) as e:
    contract.write_run(tmp_path / "run", {}, [])
  assert cli.user_message(e.value).startswith(f"{tmp_path / 'run' / 'run.json'}: {fix}")
  assert not (tmp_path / "run" / "run.json").exists()


def test_the_emulators_stderr_is_drained_so_a_chatty_server_never_blocks():
  """A child writing 1 MiB to stderr (16 times what a pipe holds) runs to its end under
  ``tests.gcs_emulator.drained``; its last lines are kept."""
  from tests.gcs_emulator import LOG_LINES, drained
  code = ("import sys\nfor i in range(16384): sys.stderr.write(f'{i:063d}\\n')\n"
          "sys.stderr.flush()\n")
  proc, tail = drained([sys.executable, "-c", code])
  assert proc.wait(timeout=60) == 0
  deadline = time.time() + 10
  while (not tail or tail[-1] != f"{16383:063d}") and time.time() < deadline:
    time.sleep(0.05)
  assert len(tail) == LOG_LINES and tail[-1] == f"{16383:063d}"
