"""The run-level files of the pipelines (`heads_jax.pipelines`): the one place that names,
writes and reads them (no jax; the analysis directory's own files are `heads_jax.contract`'s).

Every file here is JSON, written atomically (a temporary file renamed over the target), so a
reader sees the previous version or the new one, never half of one.

Stage engine (`heads_jax.pipelines.engine`), under ``RUN/stages/``:

* ``<stage>/<unit>.started.json``: ``{"key", "started"}``, written before a unit runs;
* ``<stage>/<unit>.json``: the finish marker ``{"key", "outputs", "started", "finished",
  "seconds"}``, written last, after every output of the unit;
* ``<stage>.json``: ``{"stage", "finished", "seconds", "ran", "reused"}`` of the stage.

Reproduce (`heads_jax.pipelines.reproduce`): ``reproduce_config.json``, ``data/splits.json``
(`SPLITS_JSON`), ``pretrained/pretrained.json``, ``finetune/<task>/best.json`` (`BEST_JSON`),
``analysis/analyses.json`` (`ANALYSES_JSON`).

Demo (`heads_jax.pipelines.demo`): ``demo.json`` (what ran, where, how long).

Compare (`heads_jax.pipelines.compare`): ``attention_similarity.csv`` (`write_table`; the
comparison's own tables are `heads_jax.contract.write_comparison`'s).

Ablation (`heads_jax.pipelines.ablate`): ``ablation.json`` (`ABLATION_JSON`), its tables
``<stem>.csv`` (`ABLATION_TABLES`; `write_table`) and ``importance.npy`` (`write_array`).

Every directory a job writes (analysis, comparison, ablation, reproduce, demo, pre-training,
fine-tuning) says what it is: ``heads_jax_job.json`` (`JOB_FILE`; `claim_dir`) ``{"kind",
"model", "data", "task", "settings", "created"}``. A job refuses (`check_dir`, one UserError
line, before any work) a path that is a file, or a directory of another kind or, for kinds with
a task, another task; a directory from before the markers is recognised by its files
(`LEGACY_SIGNS`).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import numpy as np

from heads_jax import contract, storage
from heads_jax.errors import UserError

STAGES_DIR = "stages"
STARTED_SUFFIX = ".started.json"
REPRODUCE_CONFIG_JSON = "reproduce_config.json"
SPLITS_JSON = "splits.json"
PRETRAINED_JSON = "pretrained.json"
BEST_JSON = "best.json"
ANALYSES_JSON = "analyses.json"
DEMO_JSON = "demo.json"
ABLATION_JSON = "ablation.json"
ABLATION_TABLES = ("ablation.csv", "segment_ablation.csv", "importance.csv", "pruning.csv",
                   "pruning_summary.csv")


def write_json(path, data) -> Path:
  """Writes ``data`` as JSON to ``path`` atomically (parents created); returns ``path``."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")   # processes writing at once: their own
  tmp.write_text(json.dumps(data, indent=2, default=str))
  tmp.replace(path)
  return path


def read_json(path, missing_ok: bool = False, damaged_ok: bool = False):
  """The JSON document at ``path``; None when absent and ``missing_ok``. A file that is not JSON
  (empty, cut short by a crash or a full disk) is `contract.read_json`'s ValueError naming it,
  or, with ``damaged_ok`` (markers: the unit then counts as not done and reruns),
  ``{"damaged": path}``."""
  path = Path(path)
  if missing_ok and not path.is_file():
    return None
  try:
    return contract.read_json(path, fix="the file is damaged (a crash or a full disk while it was "
                                        "written): remove it, or rerun with --redo")
  except ValueError:
    if damaged_ok:
      return {"damaged": str(path)}
    raise


def canonical(obj) -> str:
  """A key as a canonical string (sorted keys; non-JSON values as ``str``), for comparison."""
  return json.dumps(obj, sort_keys=True, default=str)


def unit_file_name(unit: str) -> str:
  """A unit name as a file name (``/`` and other odd characters as ``_``)."""
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", unit)


# ------------------------------------------------------------------------------------------------
# locations a run records: relative to the run's own folder, so that it travels


def to_run_path(path, workdir) -> str:
  """``path`` as a run records it: an existing file or folder relative to the run folder
  ``workdir`` when inside it (`run_relative`), else absolute (an input outside the run: a
  model, a data file); anything else (a hub id, a URL) as given."""
  rel = run_relative(path, workdir)
  if rel is not None:
    return rel
  s = str(path)
  p = os.path.abspath(os.path.expanduser(s))
  return p if not storage.is_url(s) and os.path.exists(p) else s


def run_relative(path, workdir) -> str | None:
  """``path`` relative to the run folder ``workdir`` when it exists inside it (a moved or copied
  run then reads its own files, from any working directory; URLs: under ``workdir``), else
  None."""
  s, root = str(path), str(workdir)
  if storage.is_url(s) or storage.is_url(root):
    base = root.rstrip("/") + "/"
    return s[len(base):] if s.startswith(base) else None
  p = os.path.abspath(os.path.expanduser(s))
  if not os.path.exists(p):
    return None
  rel = os.path.relpath(p, os.path.abspath(os.path.expanduser(root)))
  return None if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def from_run_path(rel, workdir) -> str:
  """A location `to_run_path` recorded, as the user opens it from where they stand: under
  ``workdir`` as given (relative to the working directory, or absolute) when it was relative."""
  s = str(rel)
  if storage.is_url(s) or os.path.isabs(s):
    return s
  root = str(workdir)
  if storage.is_url(root):
    return root.rstrip("/") + "/" + s if s != "." else root
  return os.path.normpath(os.path.join(root, s))


def _walk_paths(obj, pattern: tuple, here: tuple = ()):
  """The pointers (key tuples) of ``obj`` that the dotted ``pattern`` names (``*``: every key of
  a dict, every item of a list); only string or Path values."""
  if not pattern:
    if isinstance(obj, (str, os.PathLike)):
      yield here
    return
  head, rest = pattern[0], pattern[1:]
  if isinstance(obj, dict):
    keys = list(obj) if head == "*" else [head] if head in obj else []
  elif isinstance(obj, list) and head == "*":
    keys = range(len(obj))
  else:
    keys = []
  for k in keys:
    yield from _walk_paths(obj[k], rest, here + (k,))


def _map_pointers(obj, pointers, fn):
  """A deep copy of ``obj`` with ``fn`` applied at each pointer (its other values as they are)."""
  obj = copy.deepcopy(obj)
  for ptr in pointers:
    node = obj
    for k in ptr[:-1]:
      node = node[k]
    node[ptr[-1]] = fn(node[ptr[-1]])
  return obj


def portable_outputs(outputs, paths, workdir) -> tuple:
  """``(outputs with the locations ``paths`` names recorded by `to_run_path`, their
  pointers)``: what a finish marker holds (``paths``: dotted fields, ``*`` for any key)."""
  found = [p for pat in paths for p in _walk_paths(outputs, tuple(pat.split(".")))]
  relative = [list(p) for p in found if run_relative(_at(outputs, p), workdir) is not None]
  return _map_pointers(outputs, found, lambda v: to_run_path(v, workdir)), relative


def _at(obj, pointer):
  for k in pointer:
    obj = obj[k]
  return obj


def located_outputs(outputs, pointers, workdir):
  """A finish marker's outputs with the locations at ``pointers`` opened from here
  (`from_run_path`); a marker without pointers (written before) as it is."""
  if not pointers:
    return outputs
  return _map_pointers(outputs, [tuple(p) for p in pointers],
                       lambda v: from_run_path(v, workdir))


class Markers:
  """The stage and unit markers of one run directory (``RUN/stages``)."""

  def __init__(self, workdir):
    self.root = Path(workdir) / STAGES_DIR

  def unit_path(self, stage: str, unit: str, started: bool = False) -> Path:
    return self.root / stage / (unit_file_name(unit) + (STARTED_SUFFIX if started else ".json"))

  def read_unit(self, stage: str, unit: str, started: bool = False) -> dict | None:
    """The unit's marker; ``{"damaged": path}`` for a damaged one (the unit is not done)."""
    return read_json(self.unit_path(stage, unit, started), missing_ok=True, damaged_ok=True)

  def write_unit(self, stage: str, unit: str, data: dict, started: bool = False) -> None:
    write_json(self.unit_path(stage, unit, started), data)

  def read_stage(self, stage: str) -> dict | None:
    return read_json(self.root / f"{stage}.json", missing_ok=True, damaged_ok=True)

  def write_stage(self, stage: str, data: dict) -> None:
    write_json(self.root / f"{stage}.json", data)

  def clear(self, stage: str) -> None:
    """Removes every marker of ``stage``."""
    shutil.rmtree(self.root / stage, ignore_errors=True)
    (self.root / f"{stage}.json").unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------
# reproduce


def splits_path(workdir) -> Path:
  return Path(workdir) / "data" / SPLITS_JSON


def pretrained_path(workdir) -> Path:
  return Path(workdir) / "pretrained" / PRETRAINED_JSON


def best_path(workdir, task: str) -> Path:
  return Path(workdir) / "finetune" / task / BEST_JSON


def analyses_path(workdir) -> Path:
  return Path(workdir) / "analysis" / ANALYSES_JSON


# the locations each reproduce file records (relative to the run folder: `to_run_path`)
_LOCATIONS = {SPLITS_JSON: ("*.dir", "*.roles.*.file"), PRETRAINED_JSON: ("model", "workdir"),
              BEST_JSON: ("model",), ANALYSES_JSON: ("units.*.out", "units.*.model")}


def _write_located(path, doc, workdir) -> Path:
  return write_json(path, portable_outputs(doc, _LOCATIONS[Path(path).name], workdir)[0])


def _read_located(path, workdir):
  """The document `_write_located` wrote, its locations opened from here; a location a file
  written before recorded relative to the working directory is kept when it is not in the run."""
  doc = read_json(path, missing_ok=True)
  if doc is None:
    return None

  def here(v):
    p = from_run_path(v, workdir)
    return v if not os.path.exists(p) and os.path.exists(v) else p
  pointers = [p for pat in _LOCATIONS[Path(path).name] for p in _walk_paths(doc, tuple(pat.split(".")))]
  return _map_pointers(doc, pointers, here)


def write_reproduce_config(workdir, config: dict) -> Path:
  return write_json(Path(workdir) / REPRODUCE_CONFIG_JSON, config)


def read_reproduce_config(workdir) -> dict | None:
  return read_json(Path(workdir) / REPRODUCE_CONFIG_JSON, missing_ok=True)


def write_splits(workdir, splits: dict) -> Path:
  return _write_located(splits_path(workdir), splits, workdir)


def read_splits(workdir) -> dict | None:
  return _read_located(splits_path(workdir), workdir)


def write_pretrained(workdir, info: dict) -> Path:
  return _write_located(pretrained_path(workdir), info, workdir)


def read_pretrained(workdir) -> dict | None:
  return _read_located(pretrained_path(workdir), workdir)


def write_best(workdir, task: str, summary: dict) -> Path:
  return _write_located(best_path(workdir, task), summary, workdir)


def read_best(workdir, task: str) -> dict | None:
  return _read_located(best_path(workdir, task), workdir)


def write_analyses(workdir, analyses: dict) -> Path:
  return _write_located(analyses_path(workdir), analyses, workdir)


def read_analyses(workdir) -> dict | None:
  return _read_located(analyses_path(workdir), workdir)


# ------------------------------------------------------------------------------------------------
# demo


def write_demo(out, parts: dict) -> Path:
  return write_json(Path(out) / DEMO_JSON, parts)


# ------------------------------------------------------------------------------------------------
# ablation


def write_table(out, stem: str, table) -> Path:
  """A pandas table as ``out/<stem>.csv`` (no index), written atomically."""
  path = Path(out) / f"{stem}.csv"
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")   # processes writing at once: their own
  table.to_csv(tmp, index=False)
  tmp.replace(path)
  return path


def write_array(out, stem: str, array) -> Path:
  """A numpy array as ``out/<stem>.npy``."""
  path = Path(out) / f"{stem}.npy"
  path.parent.mkdir(parents=True, exist_ok=True)
  np.save(path, np.asarray(array))
  return path


def write_ablation_json(out, info: dict) -> Path:
  return write_json(Path(out) / ABLATION_JSON, info)


# ------------------------------------------------------------------------------------------------
# job markers: what a directory is

JOB_FILE = "heads_jax_job.json"
# kind -> the command that writes such a directory
JOB_KINDS = {"analysis": "heads-jax analyze", "comparison": "heads-jax compare",
             "ablation": "heads-jax ablate", "reproduce": "heads-jax reproduce",
             "demo": "heads-jax demo", "trajectory": "heads-jax trajectory",
             "pretraining": "heads-jax pretrain",
             "finetuning": "heads-jax finetune", "training": "heads-jax pretrain/finetune",
             "model": "heads-jax convert or a training export"}
# Directories written before the markers, recognised by their files (first match wins).
LEGACY_SIGNS = (("reproduce", (REPRODUCE_CONFIG_JSON,)), ("demo", (DEMO_JSON,)),
                ("ablation", (ABLATION_JSON,)), ("comparison", (contract.COMPARE_JSON,)),
                ("trajectory", (contract.TRAJECTORY_CSV,)),
                ("analysis", (contract.SCORES_FILE, contract.RUN_FILE)),
                ("model", ("heads_jax.json", "params.safetensors", "model.safetensors",
                           "pytorch_model.bin")),
                ("training", ("checkpoints", "metrics.jsonl", "config.json")))
# Kinds that the legacy guess "training" may be.
_TRAINING = ("pretraining", "finetuning")


def _job_path(path):
  return storage.as_path(path) / JOB_FILE


def read_job(path) -> dict | None:
  """The marker of directory ``path`` (local or URL), or None when it has none. A marker that is
  not JSON is a UserError naming it."""
  file = _job_path(path)
  if not storage.exists(file):
    return None
  try:
    doc = json.loads(storage.read_text(file))
  except ValueError as e:
    raise UserError(f"{storage.display(file)} is damaged ({e}); it should say which job wrote "
                    "the directory: remove it only if you know, or choose another directory") from None
  return doc if isinstance(doc, dict) else None


def guess_kind(path) -> str | None:
  """The kind of an unmarked directory from its files (`LEGACY_SIGNS`), or None."""
  p = storage.as_path(path)
  for kind, names in LEGACY_SIGNS:
    if any(storage.exists(p / n) for n in names):
      return kind
  return None


def _a(kind: str) -> str:
  return ("an " if kind[0] in "aeiou" else "a ") + kind


def check_dir(path, kind: str, *, flag: str = "--out", task: str | None = None) -> dict | None:
  """Refuses ``path`` for a ``kind`` job (UserError, one line) when it is a file, or a directory
  of another kind, or of another ``task``; returns its marker (None when new or unmarked).
  Nothing is created or written."""
  shown = storage.display(path)
  p = storage.as_path(path)
  if not storage.exists(p):
    return None
  if not storage.is_url(p) and not Path(str(p)).is_dir():
    raise UserError(f"{flag} {shown} is a file; give a directory (a new or an earlier "
                    f"{JOB_KINDS[kind].split()[-1]} directory)")
  job = read_job(p)
  other = job.get("kind") if job else guess_kind(p)
  if other is not None and other != kind and not (other == "training" and kind in _TRAINING):
    raise UserError(f"{flag} {shown} is {_a(other)} directory (written by `{JOB_KINDS.get(other, other)}`)"
                    f"; {_a(kind)} job would mix its files with it and replace some: choose "
                    f"another {flag}")
  if job and task is not None and job.get("task") not in (None, task):
    raise UserError(f"{flag} {shown} holds the {kind} of task {job['task']}, not {task}: its "
                    f"checkpoints and results are not this task's; choose another {flag}")
  return job


def claim_dir(path, kind: str, *, flag: str = "--out", model=None, data=None,
              task: str | None = None, settings: dict | None = None) -> dict:
  """`check_dir`, then creates the directory and writes its marker (kind, model, data, task,
  settings; the first writer's ``created`` is kept). Returns the marker."""
  job = check_dir(path, kind, flag=flag, task=task)
  doc = {"kind": kind, "model": model if model is None or isinstance(model, list) else str(model),
         "data": data if data is None or isinstance(data, (str, list)) else [str(d) for d in data],
         "task": task, "settings": settings or {},
         "created": (job or {}).get("created") or _dt.datetime.now().isoformat(timespec="seconds")}
  storage.write_text(_job_path(path), json.dumps(doc, indent=2, default=str))
  return doc


# ------------------------------------------------------------------------------------------------
# inputs' identity and the work directory's lock


def now() -> str:
  return _dt.datetime.now().isoformat(timespec="microseconds")


HASHES_JSON = ".heads_jax_hashes.json"  # a directory's cache of its inputs' content hashes
_HASHES: dict[str, str] = {}  # this process's: "path|size|mtime_ns|ctime_ns|inode" -> sha256
_READ_ONLY = False


@contextlib.contextmanager
def hashes_read_only():
  """Within it, `ContentHashes` reads a directory's saved hashes but writes none: the checks a
  job makes before it claims its directory (a refused command writes nothing there)."""
  global _READ_ONLY
  was, _READ_ONLY = _READ_ONLY, True
  try:
    yield
  finally:
    _READ_ONLY = was


def _stat_key(f: Path, st) -> str:
  # ctime and inode too: a file rewritten to the same size with its mtime set back (os.utime
  # sets ctime to now) or replaced by another file (a new inode) is hashed again
  return f"{f.absolute()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


class ContentHashes:
  """The sha256 of files, cached by their path and stat (size, mtime, ctime, inode) in this
  process and, given ``cache`` (a directory), in ``cache/.heads_jax_hashes.json``, so that a
  model of gigabytes is hashed once, not at every run."""

  def __init__(self, cache=None):
    self.file = None if cache is None else Path(cache) / HASHES_JSON
    self.saved = {}
    if self.file is not None and self.file.is_file():
      try:
        self.saved = json.loads(self.file.read_text())
      except (OSError, ValueError):
        self.saved = {}
    self.dirty = False

  def digest(self, f: Path, st) -> str:
    key = _stat_key(f, st)
    h = _HASHES.get(key) or self.saved.get(key)
    if h is None:
      with open(f, "rb") as fh:
        h = hashlib.file_digest(fh, "sha256").hexdigest()
    _HASHES[key] = h
    if self.file is not None and self.saved.get(key) != h:
      path = key.rsplit("|", 4)[0]
      for old in [k for k in self.saved if k.rsplit("|", 4)[0] == path]:
        del self.saved[old]  # one entry per path: the file as it is now
      self.saved[key], self.dirty = h, True
    return h

  def save(self) -> None:
    if self.dirty and self.file is not None and not _READ_ONLY:
      write_json(self.file, self.saved)
      self.dirty = False


def fingerprint(path, *, cache=None) -> list:
  """The identity of a file or folder's content: ``[[relative path, size, sha256], ...]`` of its
  files (sorted; a file: its name), so that a unit reading ``path`` reruns when what it holds
  changes, and only then (the path string is not part of it). A missing path is
  ``[[path, None, None]]``; a URL ``[[url, None, None]]`` (its copy is fetched anyway).
  ``cache``: a directory keeping the hashes between runs (`ContentHashes`)."""
  if storage.is_url(path):
    return [[str(path), None, None]]
  p = Path(path).expanduser()
  hashes = ContentHashes(cache)
  if p.is_file():
    files = [(p.name, p)]
  elif p.is_dir():
    files = [(f.relative_to(p).as_posix(), f) for f in sorted(p.rglob("*")) if f.is_file()
             and f.name not in (HASHES_JSON, LOCK_FILE)]
  else:
    return [[str(p), None, None]]
  out = []
  for rel, f in files:
    st = f.stat()
    out.append([rel, st.st_size, hashes.digest(f, st)])
  hashes.save()
  return out


def model_identity(model, *, cache=None) -> dict:
  """What a model argument holds: a local directory or file its `fingerprint`; a hub id (not an
  existing path) the snapshot it resolves to in the hub cache (``{"hub": id, "commit": ...}``,
  the commit that the cache's ``refs/`` names: a moved ref is another model); a URL itself."""
  name = str(model)
  if storage.is_url(name):
    return {"url": name}
  p = Path(name).expanduser()
  if not p.exists():
    from heads_jax import hub
    if hub.looks_like_repo_id(name):
      folder = hub.installed(name)   # a model a registry package carries: its files
      if folder is not None:
        return {"files": fingerprint(folder, cache=cache)}
      return {"hub": name, "commit": hub.resolve(name).name}
  return {"files": fingerprint(p, cache=cache)}


def tfds_files(dataset: str, split: str, data_dir=None) -> list[Path]:
  """The prepared files of TFDS ``dataset`` (``glue/mrpc``, ``squad/v2.0``) that its ``split``
  reads, in the newest prepared version under ``data_dir`` (default ``$TFDS_DATA_DIR``):
  ``dataset_info.json``, ``features.json`` and the split's shards (``<name>-<split>.<format>-*``);
  the version folder itself (missing) when none is prepared, so that preparing it is new data."""
  from heads_jax import env
  root = Path(data_dir or env.get("TFDS_DATA_DIR")).expanduser() / dataset

  def version(p: Path):
    return tuple(int(x) if x.isdigit() else -1 for x in p.name.split("."))

  versions = sorted((p for p in root.glob("*") if p.is_dir() and version(p)[0] >= 0), key=version)
  if not versions:
    return [root]
  folder = versions[-1]
  name = dataset.split("/")[0]
  meta = [folder / f for f in ("dataset_info.json", "features.json") if (folder / f).is_file()]
  return meta + sorted(folder.glob(f"{name}-{split}.*"))


def data_files(spec) -> list[Path]:
  """The local files a data spec reads (`heads_jax.data.specs`): a GLUE TSV task's split file,
  a CoNLL-U / TSV / text / SQuAD file, the embedded data's file; TFDS data (``glue:``,
  ``squad-tfds:``) its prepared files (`tfds_files`)."""
  from heads_jax.data import glue
  from heads_jax.data.specs import parse_spec
  s = parse_spec(spec) if isinstance(spec, str) else spec
  if s.kind == "glue":
    return tfds_files(f"glue/{glue.task_info(s.task).name}", glue.tfds_split(s.task, s.split))
  if s.kind == "squad-tfds":
    config = {"v1": "v1.1", "v2": "v2.0"}.get(s.version or "v1", s.version)
    return tfds_files(f"squad/{config}", {"dev": "validation"}.get(s.split, s.split))
  if s.path is None:
    return []
  if s.kind == "glue-tsv":
    return [glue.tsv_path(s.path, s.task, s.split)]
  return [Path(s.path)]


def data_identity(spec, *, cache=None) -> dict:
  """What a data spec reads: its settings (kind, task, split, header, version, sample, seed) and
  the `fingerprint` of each file it reads, not the path strings (a spec naming a replaced file
  is other data; the same file under another path is the same)."""
  from heads_jax.data.specs import parse_spec
  s = parse_spec(spec) if isinstance(spec, str) else spec
  return {"kind": s.kind, "task": s.task, "split": s.split, "header": s.header,
          "version": s.version, "sample": s.sample, "seed": s.seed,
          "files": [fingerprint(f, cache=cache) for f in data_files(s)]}


LOCK_FILE = ".heads_jax.lock"  # in a locked work directory: {"pid", "host", "started", "command"}


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, another user's
    return True
  return True


def process_start(pid: int) -> str | None:
  """When process ``pid`` of this host started, as a string that differs between two processes
  that had the same pid (after a reboot or a pid wrap): the boot id and the start tick from
  ``/proc`` on Linux, else ``ps -o lstart=``; None when neither can say."""
  try:
    stat = Path(f"/proc/{pid}/stat").read_text()
    ticks = stat[stat.rindex(")") + 2:].split()[19]  # field 22, after the command's parentheses
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}:{ticks}"
  except (OSError, IndexError, ValueError):
    pass
  try:
    import subprocess
    got = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True,
                         timeout=5)
    return got.stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    return None


def process_started_at(pid: int) -> _dt.datetime | None:
  """The local wall-clock time process ``pid`` of this host started (Linux ``/proc``: the boot
  time plus the start tick); None where it cannot be read."""
  try:
    stat = Path(f"/proc/{pid}/stat").read_text()
    ticks = int(stat[stat.rindex(")") + 2:].split()[19])
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))
    return _dt.datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"))
  except (OSError, IndexError, ValueError, StopIteration):
    return None


def _holder_running(held: dict) -> bool:
  """Whether the process that wrote lock ``held`` (of this host) still runs: its pid is alive
  and started when the lock's writer did (``pid_start``); a lock without ``pid_start`` (written
  by an earlier heads_jax) is held by that pid only if the process started before the lock was
  written (``started``). A live pid that started at another time, or after the lock, is another
  process that reused the pid."""
  pid = held.get("pid")
  if not isinstance(pid, int) or not _pid_alive(pid):
    return False
  recorded = held.get("pid_start")
  if recorded is not None:
    return process_start(pid) in (None, recorded)
  began = process_started_at(pid)
  try:
    written = _dt.datetime.fromisoformat(str(held.get("started")))
  except ValueError:
    return True
  # 2 s of slack: /proc's start tick and the lock's own clock reading are not the same clock
  return began is None or began <= written + _dt.timedelta(seconds=2)


class WorkdirLock:
  """``workdir/.heads_jax.lock`` while held: one process at a time per work directory (a
  training run, a pipeline's run directory, an analysis directory; local or a URL).

  ``acquire()`` (or ``with``): a directory locked by another running process is a ``UserError``
  naming it (pid, host, start time, command). A lock left by a process no longer running on this
  host (killed; or its pid alive but another process's since a reboot or a pid wrap: the lock
  records the process's start, `process_start`), or by this same process, is taken over (the first with one line through
  ``log``); a lock of another host cannot be checked and is refused with the ``rm`` to run when
  that process is known to be gone. ``release()`` removes the lock if it is still this
  process's; it runs at most once."""

  def __init__(self, workdir, what: str = "a job", *, log=print):
    self.path = storage.as_path(workdir) / LOCK_FILE
    self.what, self.log = what, log
    self.held = False

  def acquire(self) -> "WorkdirLock":
    path, host = self.path, socket.gethostname()
    mine = {"pid": os.getpid(), "pid_start": process_start(os.getpid()), "host": host,
            "started": now(), "what": self.what, "command": " ".join(sys.argv)[:300]}
    storage.makedirs(path.parent)
    text = json.dumps(mine)
    if storage.is_url(path):
      if storage.exists(path):
        _refuse_or_take(path, host, self.log)
      storage.write_text(path, text)
    else:
      while True:
        try:
          fd = os.open(os.fspath(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
          _refuse_or_take(path, host, self.log)
          continue
        except PermissionError:  # the directory, not the lock, is what refuses
          raise UserError(f"{storage.display(path.parent)} is not writable (its lock {LOCK_FILE} "
                          "cannot be created); make it writable or choose another output "
                          "directory") from None
        with os.fdopen(fd, "w") as f:
          f.write(text)
        break
    self.held = True
    return self

  def release(self) -> None:
    if not self.held:
      return
    self.held = False
    try:
      if json.loads(storage.read_text(self.path)).get("pid") == os.getpid():
        storage.call(self.path.unlink, what="removing the lock", path=self.path)
    except (OSError, ValueError, UserError):
      pass

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _refuse_or_take(path, host: str, log) -> None:
  """Raises a UserError naming the holder of the lock ``path``, or removes a stale one."""
  held = {}
  for attempt in range(2):  # an empty lock may be one just created and not yet written
    try:
      held = json.loads(storage.read_text(path))
    except FileNotFoundError:
      return  # released meanwhile: try again
    except ValueError:
      held = {}
    if held:
      break
    time.sleep(0.5)
  pid, other = held.get("pid"), held.get("host")
  if other == host and pid == os.getpid():  # this process's own (an earlier job object)
    storage.call(lambda: path.unlink(missing_ok=True), what="removing a stale lock", path=path)
    return
  if isinstance(pid, int) and other == host and not _holder_running(held) or not held:
    log(f"{storage.display(path.parent)}: taking over the lock of {held.get('what', 'a job')} "
        f"(pid {pid}, started {held.get('started')}), which is no longer running")
    storage.call(lambda: path.unlink(missing_ok=True), what="removing a stale lock", path=path)
    return
  where = "this host" if other == host else f"host {other}"
  gone = (f"; if pid {pid} is not that job (it ended and another process took its pid)"
          if other == host else "; if that process has ended")
  gone += f", remove the lock: rm {storage.display(path)}"
  raise UserError(f"{storage.display(path.parent)} is in use by {held.get('what', 'another job')} "
                  f"(pid {pid} on {where}, started {held.get('started')}: "
                  f"{held.get('command', '')}); wait for it to end or choose another directory"
                  f"{gone}")
