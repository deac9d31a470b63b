"""Job markers (`heads_jax.runfiles.claim_dir` / `check_dir`): every directory a job writes says
what it is, and a job refuses a file, another kind's directory or another task's (issue 28)."""

import json
import re

import pytest

from heads_jax import runfiles
from heads_jax.errors import UserError


@pytest.mark.parametrize("files,kind", [
    (["scores.npz"], "analysis"), (["run.json"], "analysis"), (["compare.json"], "comparison"),
    (["ablation.json"], "ablation"), (["reproduce_config.json"], "reproduce"), (["demo.json"], "demo"),
    (["trajectory.csv", "scores.npz"], "trajectory"),
    (["checkpoints/"], "training"), (["metrics.jsonl", "summary.json"], "training"),
    (["heads_jax.json", "params.safetensors", "config.json"], "model"),
    (["config.json", "model.safetensors"], "model"), (["notes.txt"], None), ([], None),
])
def test_unmarked_directories_are_recognised_by_their_files(tmp_path, files, kind):
  d = tmp_path / "d"
  d.mkdir()
  for f in files:
    (d / f).mkdir() if f.endswith("/") else (d / f).write_text("{}")
  assert runfiles.guess_kind(d) == kind


def test_claim_check_and_refusals(tmp_path):
  d = tmp_path / "a"
  assert runfiles.check_dir(d, "analysis") is None and not d.exists()  # nothing created
  doc = runfiles.claim_dir(d, "analysis", model=tmp_path / "m", data=["ud-ewt"], settings={"k": 1})
  on_disk = json.loads((d / runfiles.JOB_FILE).read_text())
  assert on_disk == doc and doc["kind"] == "analysis" and doc["model"] == str(tmp_path / "m")
  assert doc["data"] == ["ud-ewt"] and doc["settings"] == {"k": 1} and doc["created"]
  again = runfiles.claim_dir(d, "analysis", settings={"k": 2})  # the same kind: accepted
  assert again["created"] == doc["created"] and again["settings"] == {"k": 2}
  for kind in ("comparison", "ablation", "finetuning", "demo"):
    with pytest.raises(UserError, match=f"--out {d} is an analysis directory \\(written by "
                                        "`heads-jax analyze`\\).*choose another --out"):
      runfiles.check_dir(d, kind)
  # tasks
  ft = tmp_path / "ft"
  runfiles.claim_dir(ft, "finetuning", flag="--workdir", task="sst2")
  runfiles.check_dir(ft, "finetuning", flag="--workdir", task="sst2")
  with pytest.raises(UserError, match="holds the finetuning of task sst2, not mrpc.*--workdir"):
    runfiles.check_dir(ft, "finetuning", flag="--workdir", task="mrpc")
  # an unmarked training directory may be either training kind
  old = tmp_path / "old"
  (old / "checkpoints").mkdir(parents=True)
  runfiles.check_dir(old, "pretraining")
  runfiles.check_dir(old, "finetuning", task="sst2")
  with pytest.raises(UserError, match="is a training directory"):
    runfiles.check_dir(old, "analysis")
  # a file; a damaged marker
  (tmp_path / "f").write_text("")
  with pytest.raises(UserError, match="--workdir .*f is a file; give a directory"):
    runfiles.check_dir(tmp_path / "f", "pretraining", flag="--workdir")
  (d / runfiles.JOB_FILE).write_text("{")
  with pytest.raises(UserError, match=f"{d / runfiles.JOB_FILE} is damaged"):
    runfiles.check_dir(d, "analysis")


def swap_bytes_keep_stat(path, line: int | None = None):
  """Rewrites ``path`` with two neighbouring bytes swapped (the last two distinct letters, of
  line ``line`` when given, so a TSV keeps its layout): same size, same mtime (restored)."""
  import os
  st = path.stat()
  b = bytearray(path.read_bytes())
  lo, hi = 0, len(b)
  if line is not None:
    starts = [0] + [i + 1 for i, c in enumerate(b) if c == ord("\n")]
    lo, hi = starts[line], starts[line + 1] - 1
  k = next(k for k in range(hi - 1, lo, -1)
           if chr(b[k]).isalnum() and chr(b[k - 1]).isalnum() and b[k] != b[k - 1])
  b[k - 1], b[k] = b[k], b[k - 1]
  path.write_bytes(bytes(b))
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_fingerprint_is_the_content_not_the_path_or_the_stat(tmp_path):
  """A rewrite of the same size with the mtime set back changes it (the hash cache is keyed on
  ctime and inode too); the same files under another path, or copied with new times, do not."""
  d = tmp_path / "model"
  d.mkdir()
  (d / "w.bin").write_bytes(b"0123456789")
  (d / "sub").mkdir()
  (d / "sub" / "vocab.txt").write_text("a\nb\n")
  f1 = runfiles.fingerprint(d, cache=tmp_path)
  assert [r[:2] for r in f1] == [["sub/vocab.txt", 4], ["w.bin", 10]]
  import hashlib
  assert f1[1][2] == hashlib.sha256(b"0123456789").hexdigest()
  assert (tmp_path / runfiles.HASHES_JSON).is_file()  # the cache between runs
  assert runfiles.fingerprint(d) == f1
  swap_bytes_keep_stat(d / "w.bin")
  f2 = runfiles.fingerprint(d, cache=tmp_path)
  assert f2 != f1 and f2[1][2] == hashlib.sha256(b"0123456798").hexdigest()
  import shutil
  shutil.copytree(d, tmp_path / "elsewhere")  # new path, new times: same content, same identity
  assert runfiles.fingerprint(tmp_path / "elsewhere") == f2
  assert runfiles.fingerprint(d / "w.bin") == [f2[1]]
  assert runfiles.fingerprint(tmp_path / "missing") == [[str(tmp_path / "missing"), None, None]]


def test_a_stale_cache_entry_is_not_trusted(tmp_path):
  """An entry of the cache file for other stat values (another file once at that path) is
  not used: the file is hashed again."""
  f = tmp_path / "data.tsv"
  f.write_text("ab\tcd\n")
  runfiles.fingerprint(f, cache=tmp_path)
  runfiles._HASHES.clear()
  cached = json.loads((tmp_path / runfiles.HASHES_JSON).read_text())
  assert len(cached) == 1 and list(cached.values())[0] == runfiles.fingerprint(f)[0][2]
  swap_bytes_keep_stat(f)
  runfiles._HASHES.clear()
  assert runfiles.fingerprint(f, cache=tmp_path)[0][2] != list(cached.values())[0]
  assert len(json.loads((tmp_path / runfiles.HASHES_JSON).read_text())) == 1  # one per path


def test_data_identity_keys_on_the_files_a_spec_reads(tmp_path):
  glue = tmp_path / "glue" / "MRPC"
  glue.mkdir(parents=True)
  rows = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA cat sat.\tA cat sat down.\n"
  (glue / "dev.tsv").write_text(rows)
  (glue / "train.tsv").write_text(rows)
  spec = f"glue-tsv:{glue}:dev"
  a = runfiles.data_identity(spec)
  assert runfiles.data_files(spec) == [glue / "dev.tsv"]
  assert a["task"] == "mrpc" and a["split"] == "dev" and str(tmp_path) not in json.dumps(a)
  (glue / "train.tsv").write_text(rows + rows)   # a file the spec does not read
  assert runfiles.data_identity(spec) == a
  swap_bytes_keep_stat(glue / "dev.tsv")
  assert runfiles.data_identity(spec) != a
  # TFDS data: its prepared files (test_tfds_data_is_keyed_by_the_content_of_its_prepared_split)


def test_model_identity_of_a_hub_id_is_its_snapshot(tmp_path, monkeypatch):
  """A hub id is the commit its cache's refs/main names: a moved ref is another model."""
  cache = tmp_path / "hub"
  repo = cache / "models--org--tiny"
  for commit in ("a" * 40, "b" * 40):
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_bytes(b"w")
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text("a" * 40)
  monkeypatch.setenv("HF_HUB_CACHE", str(cache))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.chdir(tmp_path)
  assert runfiles.model_identity("org/tiny") == {"hub": "org/tiny", "commit": "a" * 40}
  (repo / "refs" / "main").write_text("b" * 40)
  assert runfiles.model_identity("org/tiny") == {"hub": "org/tiny", "commit": "b" * 40}
  local = tmp_path / "m"
  local.mkdir()
  (local / "config.json").write_text("{}")
  assert runfiles.model_identity(local) == {"files": runfiles.fingerprint(local)}


def test_a_lock_of_a_live_pid_that_is_another_process_is_taken_over(tmp_path):
  """pid reuse (a reboot, a pid wrap): the lock's pid is alive, but its process started at
  another time than the lock's writer: the lock is stale. The same pid with its own start
  time is refused."""
  import os
  import socket
  ppid = os.getppid()
  start = runfiles.process_start(ppid)
  assert start is not None and start == runfiles.process_start(ppid)
  lock = {"pid": ppid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00",
          "what": "an analysis", "command": "heads-jax analyze ..."}
  (tmp_path / runfiles.LOCK_FILE).write_text(json.dumps(dict(lock, pid_start=start)))
  with pytest.raises(UserError, match=rf"in use by an analysis \(pid {ppid} on this host"):
    runfiles.WorkdirLock(tmp_path).acquire()
  (tmp_path / runfiles.LOCK_FILE).write_text(json.dumps(dict(lock, pid_start="other:1")))
  lines = []
  held = runfiles.WorkdirLock(tmp_path, log=lines.append).acquire()
  assert len(lines) == 1 and f"taking over the lock of an analysis (pid {ppid}" in lines[0]
  mine = json.loads((tmp_path / runfiles.LOCK_FILE).read_text())
  assert mine["pid"] == os.getpid() and mine["pid_start"] == runfiles.process_start(os.getpid())
  held.release()
  assert not (tmp_path / runfiles.LOCK_FILE).exists()


def test_a_legacy_lock_whose_pid_started_after_it_is_stale(tmp_path):
  """A lock without ``pid_start`` (an earlier heads_jax): its pid alive but started after the
  lock was written is another process; one started before it is refused with the file to remove."""
  import datetime
  import os
  import socket
  ppid = os.getppid()
  began = runfiles.process_started_at(ppid)
  assert began is not None and began <= datetime.datetime.now()
  lock = {"pid": ppid, "host": socket.gethostname(), "what": "an analysis", "command": "x"}
  path = tmp_path / runfiles.LOCK_FILE
  path.write_text(json.dumps(dict(lock, started=(began - datetime.timedelta(hours=1)).isoformat())))
  lines = []
  held = runfiles.WorkdirLock(tmp_path, log=lines.append).acquire()
  assert len(lines) == 1 and "no longer running" in lines[0]
  held.release()
  path.write_text(json.dumps(dict(lock, started=(began + datetime.timedelta(minutes=1)).isoformat())))
  with pytest.raises(UserError, match=rf"in use by an analysis \(pid {ppid} on this host.*"
                                      rf"remove the lock: rm {re.escape(str(path))}$"):
    runfiles.WorkdirLock(tmp_path).acquire()


def test_a_damaged_json_file_is_named_and_a_damaged_marker_means_not_done(tmp_path):
  """An empty or cut-short JSON file: one line naming it (never "Expecting value: line 1 column 1");
  a damaged unit marker reads as a marker with no key, so the engine reruns the unit."""
  empty, cut = tmp_path / "data_identity.json", tmp_path / "cut.json"
  empty.write_text("")
  cut.write_text('{"key": [1, 2')
  for path in (empty, cut):
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} is not valid JSON \(.*\); the "
                                         r"file is damaged .*: remove it, or rerun with --redo$"):
      runfiles.read_json(path)
  markers = runfiles.Markers(tmp_path)
  markers.unit_path("analysis", "u").parent.mkdir(parents=True)
  markers.unit_path("analysis", "u").write_text("")
  assert markers.read_unit("analysis", "u") == {"damaged": str(markers.unit_path("analysis", "u"))}
  assert markers.read_unit("analysis", "other") is None


def test_tfds_data_is_keyed_by_the_content_of_its_prepared_split(tmp_path, monkeypatch):
  """glue: and squad-tfds: data are their prepared files (newest version, the split's shards and
  the dataset info), not a name and a split: a re-prepared split is other data, another split's
  files are not read."""
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
  missing = runfiles.data_identity("glue:mrpc:dev")
  folder = tmp_path / "glue" / "mrpc" / "2.0.0"
  folder.mkdir(parents=True)
  (tmp_path / "glue" / "mrpc" / "1.0.0").mkdir()
  (folder / "dataset_info.json").write_text("{}")
  (folder / "glue-validation.array_record-00000-of-00001").write_bytes(b"dev rows")
  (folder / "glue-train.array_record-00000-of-00001").write_bytes(b"train rows")
  files = runfiles.data_files("glue:mrpc:dev")
  assert [f.name for f in files] == ["dataset_info.json", "glue-validation.array_record-00000-of-00001"]
  first = runfiles.data_identity("glue:mrpc:dev")
  assert first != missing
  (folder / "glue-train.array_record-00000-of-00001").write_bytes(b"other train rows")
  assert runfiles.data_identity("glue:mrpc:dev") == first
  (folder / "glue-validation.array_record-00000-of-00001").write_bytes(b"re-prepared dev rows")
  assert runfiles.data_identity("glue:mrpc:dev") != first
  mnli = tmp_path / "glue" / "mnli" / "2.0.0"
  mnli.mkdir(parents=True)
  (mnli / "glue-validation_matched.array_record-00000-of-00001").write_bytes(b"m")
  assert [f.name for f in runfiles.data_files("glue:mnli:dev")] == [
      "glue-validation_matched.array_record-00000-of-00001"]
  squad = tmp_path / "squad" / "v2.0" / "3.0.0"
  squad.mkdir(parents=True)
  (squad / "squad-validation.array_record-00000-of-00001").write_bytes(b"q")
  assert [f.name for f in runfiles.data_files("squad-tfds:v2.0:dev")] == [
      "squad-validation.array_record-00000-of-00001"]


def test_a_directory_that_refuses_its_lock_is_named(tmp_path, monkeypatch):
  # a read-only run directory: the directory is what refuses, not a lock that does not exist
  def refuse(*a, **k):
    raise PermissionError(13, "Permission denied")
  with monkeypatch.context() as m:
    m.setattr(runfiles.os, "open", refuse)
    with pytest.raises(UserError) as e:
      runfiles.WorkdirLock(tmp_path).acquire()
  assert str(e.value) == (f"{tmp_path} is not writable (its lock {runfiles.LOCK_FILE} cannot be "
                          "created); make it writable or choose another output directory")
