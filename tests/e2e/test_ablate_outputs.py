"""`heads-jax ablate` over a finished run directory (issue 43 item 6).

* A part is reused only over intact outputs: a reused part whose file was deleted, damaged or
  truncated (any file it wrote, not only its first table) runs again and says so in one line
  naming the file; `--redo report` with a part's file missing reruns that part instead of
  dropping its section from the report.
* `--redo report` on a run directory that cannot be written ends in one line (exit 2, no
  traceback) naming the folder, and the directory is as it was: no report, figure, marker or
  table removed.

The tests run as root here, and root writes anywhere, so a read-only folder is only read-only to
a thread without the capabilities that override file permissions (CAP_DAC_OVERRIDE,
CAP_DAC_READ_SEARCH, CAP_FOWNER): the test drops them from the effective set of its thread (kept
in the permitted set, restored after; a non-root user needs nothing dropped). Then ``os.access``
still answers "writable" (the kernel checks access() with the permitted set) while every write is
refused, as on an NFS share with root squashing or a folder under an ACL: a check that trusted
``os.access`` passed and the removal then failed half way (report.html, ablation.json and the
report's markers removed, then "figures could not be removed").
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from heads_jax import cli
from heads_jax.pipelines.ablate import AblationConfig, run_ablation
from heads_jax.pipelines.ablation import _damaged
from tests.pipelines.test_ablate import _save_classifier, _stage_states


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A finished `ablate --by role` (its causal test too; report, figures, markers) and its
  command line; tests that may change it work on a copy (`_copy`)."""
  d = tmp_path_factory.mktemp("ablate")
  model = _save_classifier(d / "model")
  ana = d / "analysis"   # two roles: tests.csv as `heads-jax analyze` writes it
  ana.mkdir()
  pd.DataFrame([(l, h, role, 1.0, 10, 1.0, 0.5, 0.5, (l, h, role) in {(0, 1, "delimiter"),
                                                                      (1, 2, "local")})
                for l in range(2) for h in range(4) for role in ("local", "delimiter")],
               columns=["layer", "head", "role", "mean", "n", "statistic", "p_value",
                        "p_adjusted", "assigned"]).to_csv(ana / "tests.csv", index=False)
  out = d / "out"
  flags = dict(model=str(model), data="mrpc", analysis=str(ana), by="role", random_groups=2,
               random_seeds=1, max_examples=6, batch_size=8, max_length=32)
  lines = []
  run_ablation(AblationConfig(out=str(out), **flags), log=lines.append)
  assert set(_stage_states(lines).values()) == {"run"} and (out / "figures").is_dir()
  argv = ["ablate", *(x for k, v in flags.items() for x in ("--" + k.replace("_", "-"), str(v)))]
  return out, argv, flags


def _copy(finished, to: Path):
  """A copy of the finished run at ``to``: ``(out, argv with --out, flags)``."""
  out, argv, flags = finished
  return Path(shutil.copytree(out, to)), argv + ["--out", str(to)], flags


@pytest.mark.slow
def test_a_missing_or_damaged_output_reruns_its_part_and_says_which(finished, tmp_path):
  out, _, flags = _copy(finished, tmp_path / "out")
  cfg = AblationConfig(out=str(out), **flags)

  def run(**kw):
    lines = []
    run_ablation(cfg, log=lines.append, **kw)
    return _stage_states(lines), lines

  # the report's page and ablation.json: only the report reruns (the model is not loaded)
  (out / "ablation.json").unlink()
  states, lines = run()
  assert states == {"baseline": "reused", "ablation": "reused", "report": "run"}
  assert f"  report: {out / 'ablation.json'} is missing; running it again" in lines
  # the part's second file (the causal test) deleted: before, only a part's first table was
  # checked, so it was reused and the report dropped the causal section without a word
  (out / "causal.csv").unlink()
  states, lines = run(redo="report")
  assert states == {"baseline": "reused", "ablation": "run", "report": "run"}
  assert [x for x in lines if x.endswith("; running it again")] == [
      f"  ablation: {out / 'causal.csv'} is missing; running it again"]
  html = (out / "report.html").read_text()
  assert "Ablation by role" in html and "Causal test of the roles" in html


def test_a_file_that_is_no_table_or_not_as_written_is_damaged(tmp_path):
  # what a part's `intact` reads: bytes that are no CSV, an empty file, bad JSON, a table cut
  # short (its finish marker records the rows and columns written)
  (tmp_path / "t.csv").write_bytes(b"\xff\xfe\x00\x81 not a table")
  (tmp_path / "e.csv").write_text("")
  (tmp_path / "ok.csv").write_text("a,b\n1,2\n")
  (tmp_path / "bad.json").write_text("{")
  assert _damaged(tmp_path, {"t.csv": None}) == f"{tmp_path / 't.csv'} cannot be read (UnicodeDecodeError)"
  assert _damaged(tmp_path, {"e.csv": None}) == f"{tmp_path / 'e.csv'} cannot be read (EmptyDataError)"
  assert _damaged(tmp_path, {"bad.json": None}) == f"{tmp_path / 'bad.json'} cannot be read (JSONDecodeError)"
  assert _damaged(tmp_path, {"ok.csv": [1, ["a", "b"]]}) is None
  assert _damaged(tmp_path, {"ok.csv": [2, ["a", "b"]]}).endswith("does not hold what was written "
                                                                  "(damaged or edited)")


OVERRIDES = (1, 2, 3)   # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
# the folders made read-only, one command each: the run directory, its markers, its figures
FOLDERS = (".", "stages", "figures")


def _contents(folder: Path) -> dict:
  """Every file and folder under ``folder``: ``{relative path: content digest or "dir"}``."""
  return {str(p.relative_to(folder)): ("dir" if p.is_dir() else
                                       hashlib.sha256(p.read_bytes()).hexdigest())
          for p in sorted(folder.rglob("*"))}


class _CapHeader(ctypes.Structure):
  _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
  _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
              ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def _writes_refused_but_access_says_yes():
  """Drops the overriding capabilities from this thread's effective set (kept in the permitted
  set, restored after): as root, writes into a read-only folder fail, ``os.access`` says yes."""
  libc = ctypes.CDLL(None, use_errno=True)
  header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()   # _LINUX_CAPABILITY_VERSION_3
  if libc.capget(ctypes.byref(header), data) != 0:
    raise OSError(ctypes.get_errno(), "capget")
  saved = data[0].effective
  data[0].effective &= ~sum(1 << c for c in OVERRIDES)
  if libc.capset(ctypes.byref(header), data) != 0:
    raise OSError(ctypes.get_errno(), "capset")
  try:
    yield
  finally:
    data[0].effective = saved
    libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data)


@pytest.mark.parametrize("folder", FOLDERS)
def test_redo_report_on_a_read_only_folder_is_one_line_and_changes_nothing(finished, folder,
                                                                           capsys, tmp_path):
  out, argv, _ = _copy(finished, tmp_path / "out")   # a copy: a failing command may damage it
  before = _contents(out)
  target = out / folder if folder != "." else out
  os.chmod(target, 0o555)
  try:
    with (_writes_refused_but_access_says_yes() if os.geteuid() == 0 else contextlib.nullcontext()):
      if os.geteuid() == 0:
        assert os.access(target, os.W_OK)   # what a check by os.access sees
      code = cli.main(argv + ["--redo", "report"])
  finally:
    os.chmod(target, 0o755)
  err = capsys.readouterr().err
  lines = [x for x in err.splitlines() if x.strip()]
  assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
  assert lines[0].startswith("heads-jax ablate: error: ") and str(target) in lines[0], lines[0]
  assert _contents(out) == before   # nothing removed, nothing written
