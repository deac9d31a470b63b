"""Paths that may be local or in cloud storage (``gs://``, ``s3://``, ...), through ``etils.epath``.

Every path a job reads or writes (a training run's work directory, an init checkpoint, corpus
and GLUE data, exports, metrics, an analysis's output directory) goes through this module, so
that ``--workdir gs://bucket/run`` means the bucket, never a local folder named ``gs:``:

* ``as_path(p)``: an ``epath.Path``; a URL stays a URL, a local path becomes absolute. (A URL
  is never passed through ``pathlib.Path`` or ``os.path``: ``Path("gs://b/x")`` is ``gs:/b/x``.)
* ``local_copy(p)``: a local directory or file with the content of ``p``: ``p`` itself when it
  is local, else a mirror in ``cache_root()`` (files already there with the same size are not
  fetched again, so an interrupted copy resumes). For what a library reads through plain
  ``open`` (a Hugging Face or heads_jax model directory, GLUE TSV folders, corpus shards).
* ``upload_tree(local, url)`` and ``staged_output(p)``: a job that writes many files through
  plain ``open`` (figures, reports) writes into a local directory that is then copied to ``p``.

How a URL is reached: ``etils.epath`` uses ``tf.io.gfile`` when TensorFlow is installed, else
``fsspec`` (``gcsfs`` for ``gs://``, the ``gcs`` extra of setup.cfg). Orbax checkpoints use
``epath`` for their directories and TensorStore's own ``gcs`` driver for the arrays. Both follow
the usual Google credentials (a TPU VM's service account, ``gcloud auth application-default
login``). For an emulator (tests): ``STORAGE_EMULATOR_HOST`` (gcsfs) and
``TENSORSTORE_GCS_HTTP_URL`` + ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` (TensorStore); see
``tests/gcs_emulator.py``.

Nothing waits on remote storage forever:

* ``call(fn, ..., what=, path=)``: every call heads_jax makes itself on a URL (a listing, a
  ``mkdir``, a read, a write, a file copy) runs in a worker thread that is given up after its share
  of ``HEADS_JAX_STORAGE_TIMEOUT`` (``storage_timeout()``) and retried with backoff (a dropped
  connection too); after the last try a ``UserError`` (one line, exit 2) names the path.
* ``watch(what, path)``: around the calls heads_jax cannot time out itself (Orbax's save,
  finalisation and restore, TensorStore's array I/O): after ``HEADS_JAX_STORAGE_PROGRESS`` seconds
  of waiting a progress line names the path and what is waited for; after
  ``HEADS_JAX_STORAGE_TIMEOUT`` one line (with ``note``, e.g. the last complete checkpoint) and the
  process ends with exit 2 (the waiting thread cannot be interrupted, so the process is ended).

Host-only (no jax).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from etils import epath

from heads_jax import env
from heads_jax.errors import UserError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path) -> bool:
  """Whether ``path`` is a URL (``gs://...``, ``s3://...``), as a string or an ``epath.Path``."""
  return bool(_URL.match(os.fspath(path) if not isinstance(path, str) else path))


def as_path(path) -> epath.Path:
  """``path`` as an ``epath.Path``: URLs unchanged, local paths made absolute (``~`` expanded)."""
  if isinstance(path, epath.Path) and is_url(path):
    return path
  text = os.fspath(path)
  if is_url(text):
    _check_backend(text)
    return epath.Path(text)
  return epath.Path(os.path.abspath(os.path.expanduser(text)))


@functools.lru_cache(maxsize=None)
def _check_backend(url: str) -> None:
  scheme = url.split("://", 1)[0].lower()
  needs = {"gs": "gcsfs", "s3": "s3fs"}.get(scheme)
  if needs and not (importlib.util.find_spec(needs) or importlib.util.find_spec("tensorflow")):
    extra = ' (pip install "heads_jax[gcs]")' if scheme == "gs" else ""
    raise UserError(f"{url}: reading and writing {scheme}:// paths needs the {needs} package"
                    f"{extra}")


def display(path) -> str:
  """The string to show a user (and to store in JSON): the URL or the absolute local path."""
  return os.fspath(as_path(path))


def cache_root() -> Path:
  """Where remote inputs are mirrored: ``$HEADS_JAX_REMOTE_CACHE`` (default
  ``~/.cache/heads_jax/remote``)."""
  root = env.get("HEADS_JAX_REMOTE_CACHE") or env.VARIABLES["HEADS_JAX_REMOTE_CACHE"][0]
  return Path(os.path.expanduser(root))


def storage_timeout() -> float:
  """Seconds a storage call may wait (``HEADS_JAX_STORAGE_TIMEOUT``, default 300)."""
  return _seconds("HEADS_JAX_STORAGE_TIMEOUT")


def storage_progress() -> float:
  """Seconds of waiting on storage before a progress line (``HEADS_JAX_STORAGE_PROGRESS``)."""
  return _seconds("HEADS_JAX_STORAGE_PROGRESS")


def _seconds(name: str) -> float:
  text = env.get(name)
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if not value > 0:
    raise UserError(f"{name}={text!r} must be a positive number of seconds")
  return value


def _err(line: str) -> None:
  sys.stdout.flush()
  sys.stderr.write(line + "\n")
  sys.stderr.flush()


@contextlib.contextmanager
def watch(what: str, path, *, note=None, limit: float | None = None,
          progress: float | None = None, local: bool = False):
  """A watchdog around a block that waits on storage at ``path`` and cannot be timed out itself
  (Orbax, TensorStore). ``what``: what is waited for ("saving the checkpoint of step 40").

  After ``progress`` seconds (``storage_progress()``) a line on stderr names the path and
  ``what`` (again every ``progress`` seconds); after ``limit`` (``storage_timeout()``) one line
  ``heads-jax: error: ...`` (with ``note()``, a callable or a string, e.g. the last complete
  checkpoint) and the process exits with 2 (``os._exit``: the blocked thread cannot be
  interrupted). A local ``path`` is not watched unless ``local``."""
  if not (local or is_url(path)):
    yield
    return
  limit = storage_timeout() if limit is None else limit
  progress = storage_progress() if progress is None else progress
  done = threading.Event()
  shown = display(path)

  def guard():
    t0 = time.monotonic()
    next_line = progress
    while True:
      if done.wait(max(0.05, min(next_line, limit) - (time.monotonic() - t0))):
        return
      waited = time.monotonic() - t0
      if waited >= limit:
        extra = note() if callable(note) else note
        _err(f"heads-jax: error: storage gave no answer for {waited:.0f} s while {what} "
             f"({shown}){'; ' + extra if extra else ''}; check the network and the bucket "
             f"(HEADS_JAX_STORAGE_TIMEOUT={limit:g} s), then run the same command again")
        os._exit(2)
      if waited >= next_line:
        _err(f"still waiting for storage: {what} ({shown}), {waited:.0f} s so far; "
             f"giving up after {limit:g} s")
        next_line += progress

  thread = threading.Thread(target=guard, name="heads_jax-storage-watchdog", daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()


# Errors that retrying cannot fix (the answer was clear).
_FINAL = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
          NotADirectoryError, UserError)


def call(fn, *args, what: str, path, attempts: int = 4, timeout: float | None = None, **kwargs):
  """``fn(*args, **kwargs)``, a call on storage at ``path`` (``what`` says what it does, for the
  messages). A local path: called directly. A URL: each try runs in a daemon thread and is given
  up after ``timeout`` seconds (default: ``storage_timeout() / attempts``); a try that times out
  or fails with a transient error (``OSError`` other than a missing file or a refused permission,
  ``TimeoutError``, ``ConnectionError``) is retried after 0.5, 1, 2, ... s. After ``attempts``
  tries a ``UserError`` names the path and the last error."""
  if not is_url(path):
    return fn(*args, **kwargs)
  timeout = storage_timeout() / attempts if timeout is None else timeout
  last = None
  for i in range(attempts):
    if i:
      time.sleep(min(0.5 * 2 ** (i - 1), 8.0))
    box = {}

    def run():
      try:
        box["value"] = fn(*args, **kwargs)
      except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
        box["error"] = e

    t = threading.Thread(target=run, name="heads_jax-storage-call", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
      last = f"no answer in {timeout:.3g} s"
      continue
    if "error" not in box:
      return box["value"]
    e = box["error"]
    if isinstance(e, _FINAL) or not isinstance(e, (OSError, TimeoutError, ConnectionError)):
      raise e
    last = f"{type(e).__name__}: {e}"
  raise UserError(f"{display(path)}: storage failed while {what} after {attempts} tries "
                  f"({last}); check the network and the bucket (HEADS_JAX_STORAGE_TIMEOUT), "
                  f"then run the same command again")


def with_path(error: OSError, path) -> OSError:
  """``error`` naming ``path`` when it names no file (a write into a full disk raises ENOSPC
  without one), so that its one line (``heads_jax.cli.user_message``) says where and what to
  do; ``error`` itself when it names one already."""
  if not isinstance(error, OSError) or error.filename is not None or error.errno is None:
    return error
  named = OSError(error.errno, error.strerror or str(error), display(path))
  named.__cause__ = error.__cause__
  return named


@contextlib.contextmanager
def naming(path):
  """Within the block, an ``OSError`` that names no file is raised again naming ``path`` (see
  `with_path`): around a write whose failure would otherwise be a bare ``[Errno 28]``."""
  try:
    yield
  except OSError as e:
    named = with_path(e, path)
    if named is e:
      raise
    raise named from None


def _cache_dir_for(url: str) -> Path:
  url = url.rstrip("/")
  digest = hashlib.sha1(url.encode()).hexdigest()[:16]
  name = re.sub(r"[^A-Za-z0-9._-]", "_", url.rsplit("/", 1)[-1])[:60] or "root"
  return cache_root() / f"{name}-{digest}"


def _fetch_file(src: epath.Path, dest: Path, size: int | None = None) -> None:
  """Copies ``src`` to ``dest`` unless a file of the same size is there; atomic (temporary name,
  then rename), so concurrent copies (several processes of one host) never see half a file."""
  if size is None:
    size = call(lambda: src.stat().length, what="reading the size", path=src)
  if dest.is_file() and dest.stat().st_size == size:
    return
  dest.parent.mkdir(parents=True, exist_ok=True)

  def fetch():
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
    try:
      with naming(dest), src.open("rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, length=16 << 20)
      os.replace(tmp, dest)
    finally:
      if tmp.exists():
        tmp.unlink()

  call(fetch, what="downloading", path=src, timeout=max(storage_timeout(), 60.0), attempts=3)


def walk_files(root: epath.Path):
  """``(relative posix path, epath.Path)`` of every file under ``root`` (recursively)."""
  stack = [(root, "")]
  while stack:
    d, rel = stack.pop()
    listing = call(lambda: [(c, c.is_dir()) for c in d.iterdir()], what="listing", path=d)
    for child, is_dir in sorted(listing, key=lambda x: x[0].name):
      sub = f"{rel}{child.name}"
      if is_dir:
        stack.append((child, sub + "/"))
      else:
        yield sub, child


def local_copy(path, dest=None, *, progress=None):
  """A local path holding the content of ``path`` (a file or a directory tree).

  A ``path`` that is not a URL is returned unchanged (it may also be a name that the caller
  resolves, e.g. a Hugging Face hub id). A URL is mirrored into ``dest`` (default:
  a folder of ``cache_root()`` named after the URL); files already there with the same size are
  kept, so an interrupted copy resumes and a second call costs one listing. ``progress(name,
  size)`` is called for each file fetched. A missing URL raises FileNotFoundError.
  """
  if not is_url(path):
    return path
  src = as_path(path)
  dest = Path(dest) if dest is not None else _cache_dir_for(os.fspath(src))
  if call(src.is_dir, what="reading", path=src):
    for rel, f in walk_files(src):
      target = dest / rel
      size = call(lambda: f.stat().length, what="reading the size", path=f)
      if progress is not None and not (target.is_file() and target.stat().st_size == size):
        progress(rel, size)
      _fetch_file(f, target, size)
    dest.mkdir(parents=True, exist_ok=True)
    return dest
  if not call(src.exists, what="reading", path=src):
    raise FileNotFoundError(f"{src} does not exist")
  target = dest / src.name
  _fetch_file(src, target)
  return target


def upload_tree(local, url) -> epath.Path:
  """Copies every file under the local directory ``local`` to ``url`` (same relative paths,
  existing files replaced); returns ``as_path(url)``."""
  root = as_path(url)
  local = Path(local)
  for f in sorted(local.rglob("*")):
    if f.is_file():
      target = root / f.relative_to(local).as_posix()

      def put(f=f, target=target):
        target.parent.mkdir(parents=True, exist_ok=True)
        with naming(target), open(f, "rb") as fin, target.open("wb") as fout:
          shutil.copyfileobj(fin, fout, length=16 << 20)

      call(put, what="uploading", path=target, timeout=max(storage_timeout(), 60.0), attempts=3)
  return root


def copy_tree(src, dest) -> epath.Path:
  """Copies a directory tree between any two locations (local or URL)."""
  if not is_url(src) and not is_url(dest):
    shutil.copytree(os.fspath(as_path(src)), os.fspath(as_path(dest)), dirs_exist_ok=True)
    return as_path(dest)
  if not is_url(src):
    return upload_tree(os.fspath(as_path(src)), dest)
  with tempfile.TemporaryDirectory(prefix="heads_jax_copy_") as tmp:
    local_copy(src, tmp)
    return upload_tree(tmp, dest) if is_url(dest) else Path(shutil.copytree(
        tmp, os.fspath(as_path(dest)), dirs_exist_ok=True))


@contextlib.contextmanager
def staged_output(path, *, fetch_existing: bool = True, upload: bool = True):
  """Yields a local directory to write ``path``'s files into.

  A local ``path``: itself (created). A URL: a temporary directory holding a copy of what is
  already at the URL (``fetch_existing``; so a job can find its earlier results there), whose
  files are uploaded to the URL when the block ends without an exception (and ``upload``: the
  other processes of a multi-host job pass False). An ``OSError`` of the block that names no
  file (a full disk) is raised naming ``path`` (`naming`).
  """
  if not is_url(path):
    local = Path(os.fspath(as_path(path)))
    with naming(local):
      local.mkdir(parents=True, exist_ok=True)
      yield local
    return
  with tempfile.TemporaryDirectory(prefix="heads_jax_stage_") as tmp:
    remote = as_path(path)
    if fetch_existing and call(remote.is_dir, what="reading", path=remote):
      local_copy(remote, tmp)
    with naming(f"{tmp} (the local copy of {display(remote)})"):
      yield Path(tmp)
    if upload:
      upload_tree(tmp, remote)


def write_text(path, text: str) -> epath.Path:
  """Writes ``text`` (UTF-8) to a local path or URL, creating the parent directory."""
  p = as_path(path)

  def put():
    with naming(p):
      p.parent.mkdir(parents=True, exist_ok=True)
      p.write_text(text)

  call(put, what="writing", path=p)
  return p


def read_text(path) -> str:
  """The text of a local path or URL (a missing file: FileNotFoundError)."""
  p = as_path(path)
  return call(p.read_text, what="reading", path=p)


def exists(path) -> bool:
  p = as_path(path)
  return call(p.exists, what="reading", path=p)


def makedirs(path) -> epath.Path:
  p = as_path(path)

  def make():
    with naming(p):
      p.mkdir(parents=True, exist_ok=True)

  call(make, what="creating the folder", path=p)
  return p
