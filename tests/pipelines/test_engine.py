"""The stage engine: a unit reruns when its key changes and only then, an unfinished unit
continues, ``redo`` cascades to the stages that read the redone one, the finish marker is
written last, and each stage logs a start line and a timed end line."""

import json
from pathlib import Path

import pytest

from heads_jax import runfiles
from heads_jax.errors import UserError
from heads_jax.pipelines import engine
from heads_jax.pipelines.engine import Context, Stage, run_pipeline, run_unit


def _ctx(tmp_path, log=None):
  return Context(None, tmp_path, runfiles.Markers(tmp_path), log or (lambda m: None))


def test_same_key_skips_and_changed_key_reruns_and_cleans(tmp_path):
  ctx = _ctx(tmp_path)
  out = tmp_path / "out"
  calls = []

  def fn(v):
    def run():
      calls.append(v)
      out.mkdir(exist_ok=True)
      (out / f"{v}.txt").write_text(str(v))
      return {"v": v}
    return run
  r1 = run_unit(ctx, "s", "a/b", {"n": 1}, fn(1), clean=[out])
  assert not r1.reused and r1.outputs == {"v": 1} and calls == [1]
  r2 = run_unit(ctx, "s", "a/b", {"n": 1}, fn(1), clean=[out])
  assert r2.reused and r2.finished == r1.finished and calls == [1]
  assert ctx.counts == {"ran": 1, "reused": 1}
  r3 = run_unit(ctx, "s", "a/b", {"n": 2}, fn(2), clean=[out])
  assert not r3.reused and calls == [1, 2] and r3.finished > r1.finished
  # the outputs of the run with the other key were removed before the new run
  assert sorted(p.name for p in out.iterdir()) == ["2.txt"]


def test_started_unfinished_unit_continues_without_cleaning(tmp_path):
  ctx = _ctx(tmp_path)
  out = tmp_path / "out"

  def killed():
    out.mkdir(exist_ok=True)
    (out / "checkpoint").write_text("step 3")
    raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    run_unit(ctx, "train", "u", {"steps": 10}, killed, clean=[out])
  assert ctx.markers.read_unit("train", "u", started=True)["key"] == {"steps": 10}
  assert ctx.markers.read_unit("train", "u") is None  # no finish marker: not done
  seen = []
  r = run_unit(ctx, "train", "u", {"steps": 10},
               lambda: seen.append((out / "checkpoint").read_text()) or "done", clean=[out])
  assert seen == ["step 3"] and r.outputs == "done"  # same key: what it left is kept


def test_started_with_another_key_is_cleaned(tmp_path):
  ctx = _ctx(tmp_path)
  out = tmp_path / "out"

  def killed():
    out.mkdir(exist_ok=True)
    (out / "checkpoint").write_text("old")
    raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    run_unit(ctx, "train", "u", {"steps": 10}, killed, clean=[out])
  run_unit(ctx, "train", "u", {"steps": 20}, lambda: out.exists(), clean=[out])
  assert ctx.markers.read_unit("train", "u")["outputs"] is False


def test_finish_marker_is_written_last(tmp_path):
  """While ``fn`` runs (its outputs being written) there is no finish marker; a failing ``fn``
  leaves none."""
  ctx = _ctx(tmp_path)
  path = ctx.markers.unit_path("s", "u")

  def fn():
    assert not path.exists() and ctx.markers.unit_path("s", "u", started=True).is_file()
    return 1
  run_unit(ctx, "s", "u", {}, fn)
  assert json.loads(path.read_text())["outputs"] == 1
  with pytest.raises(RuntimeError):
    run_unit(ctx, "s", "v", {}, lambda: (_ for _ in ()).throw(RuntimeError("boom")))
  assert not ctx.markers.unit_path("s", "v").exists()
  assert not list(path.parent.glob("*.tmp"))


def _pipeline(calls, settings):
  """a -> b (reads a) -> c (reads b); d independent."""
  def stage(name, reads=()):
    def run(ctx):
      key = {"setting": settings[name], "inputs": [ctx.results[r] for r in reads]}
      return run_unit(ctx, name, name, key, lambda: calls.append(name) or name).finished
    return Stage(name, f"stage {name}", run, reads=reads)
  return (stage("a"), stage("b", ("a",)), stage("c", ("b",)), stage("d"))


def test_pipeline_reruns_exactly_what_a_changed_setting_reaches(tmp_path):
  calls, logs = [], []
  settings = {"a": 1, "b": 1, "c": 1, "d": 1}
  run_pipeline(_pipeline(calls, settings), tmp_path, log=logs.append)
  assert calls == ["a", "b", "c", "d"]
  # each stage: one start line and one line with its time
  assert [m for m in logs if m.startswith("[2/4] b")] == ["[2/4] b: stage b", logs[3]]
  assert logs[3].startswith("[2/4] b: 1 part(s) run; ") and logs[3].endswith(" s")
  calls.clear()
  logs.clear()
  run_pipeline(_pipeline(calls, settings), tmp_path, log=logs.append)
  assert calls == [] and "[4/4] d: all 1 part(s) done earlier, reused" in logs[-1]
  settings["b"] = 2
  run_pipeline(_pipeline(calls, settings), tmp_path, log=logs.append)
  assert calls == ["b", "c"]


def test_redo_cascades_to_the_stages_that_read_it(tmp_path):
  calls = []
  settings = {"a": 1, "b": 1, "c": 1, "d": 1}
  stages = _pipeline(calls, settings)
  (tmp_path / "a_out").mkdir()
  stages = (Stage("a", "a", stages[0].run, outputs=("a_out",)),) + stages[1:]
  run_pipeline(stages, tmp_path, log=lambda m: None)
  calls.clear()
  run_pipeline(stages, tmp_path, redo="a", log=lambda m: None)
  assert calls == ["a", "b", "c"] and not (tmp_path / "a_out").exists()
  assert engine.dependents(stages, "a") == ("a", "b", "c")
  assert engine.dependents(stages, "d") == ("d",)
  calls.clear()
  run_pipeline(stages, tmp_path, redo="all", log=lambda m: None)
  assert calls == ["a", "b", "c", "d"]
  with pytest.raises(UserError, match=r"--redo 'x': one of a, b, c, d \(or all\)"):
    run_pipeline(stages, tmp_path, redo="x", log=lambda m: None)


def test_stop_after_and_results(tmp_path):
  calls = []
  stages = _pipeline(calls, {"a": 1, "b": 1, "c": 1, "d": 1})
  logs = []
  results = run_pipeline(stages, tmp_path, stop_after="b", log=logs.append)
  assert list(results) == ["a", "b"] and calls == ["a", "b"]
  assert "stopped after b" in logs[-1]


def test_outputs_without_a_marker_are_not_reused(tmp_path):
  """A folder left by a run that wrote no marker (an older version, another tool) has unknown
  settings: it is removed before the unit runs, never resumed from."""
  ctx = _ctx(tmp_path)
  out = tmp_path / "finetune"
  out.mkdir()
  (out / "checkpoint").write_text("150 steps, other settings")
  r = run_unit(ctx, "train", "u", {"steps": 300}, lambda: sorted(p.name for p in out.iterdir())
               if out.exists() else [], clean=[out])
  assert r.outputs == []


def _held_by_another_process(workdir, what: str) -> int:
  """Writes the lock of a live process of this host (our parent) into ``workdir``; its pid."""
  import os
  import socket
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / runfiles.LOCK_FILE).write_text(json.dumps(
      {"pid": os.getppid(), "pid_start": runfiles.process_start(os.getppid()),
       "host": socket.gethostname(), "started": "2026-01-01T00:00:00",
       "what": what, "command": "heads-jax reproduce ..."}))
  return os.getppid()


def test_a_pipeline_workdir_in_use_is_refused_and_released_after_a_run(tmp_path):
  calls = []
  settings = {"a": 1, "b": 1, "c": 1, "d": 1}
  pid = _held_by_another_process(tmp_path, "a pipeline")
  with pytest.raises(UserError, match=rf"is in use by a pipeline \(pid {pid} on this host"):
    run_pipeline(_pipeline(calls, settings), tmp_path, log=lambda *a: None)
  assert calls == []
  (tmp_path / runfiles.LOCK_FILE).unlink()
  run_pipeline(_pipeline(calls, settings), tmp_path, log=lambda *a: None)
  assert calls == ["a", "b", "c", "d"] and not (tmp_path / runfiles.LOCK_FILE).exists()


def test_the_lock_names_the_job_and_the_directory_is_claimed_under_it(tmp_path):
  """``what`` is what a second process is told; ``claim`` checks the directory before the lock
  and marks it for the job (runfiles.claim_dir) before any stage runs."""
  calls = []
  settings = {"a": 1, "b": 1, "c": 1, "d": 1}
  seen = []

  def first(ctx):
    seen.append(json.loads((ctx.workdir / runfiles.LOCK_FILE).read_text())["what"])
    seen.append(runfiles.read_job(ctx.workdir)["kind"])
    return None
  stages = (Stage("first", "first", first),) + _pipeline(calls, settings)
  run_pipeline(stages, tmp_path / "ab", log=lambda m: None, what="an ablation",
               claim={"kind": "ablation", "model": "m", "settings": {"k": 1}})
  assert seen == ["an ablation", "ablation"]
  assert runfiles.read_job(tmp_path / "ab")["settings"] == {"k": 1}
  with pytest.raises(UserError, match="is an ablation directory"):
    run_pipeline(stages, tmp_path / "ab", log=lambda m: None, claim={"kind": "comparison"})
  (tmp_path / "f").write_text("x")
  with pytest.raises(UserError, match="is a file"):
    run_pipeline(stages, tmp_path / "f", log=lambda m: None, claim={"kind": "ablation"})


def test_a_unit_whose_outputs_are_missing_runs_again(tmp_path):
  """Reused only while its outputs are there (``intact``): a deleted output reruns the unit
  and says which file, instead of "done earlier, reused" over nothing (issue 43 item 6)."""
  ctx, lines = _ctx(tmp_path), []
  ctx.log = lines.append
  out = tmp_path / "o.txt"

  def fn():
    out.write_text("x")
    return "made"
  seen = []

  def intact(outputs):   # given what fn returned (the finish marker's outputs)
    seen.append(outputs)
    return None if out.is_file() else f"{out} is missing"
  assert not run_unit(ctx, "s", "u", {"k": 1}, fn, clean=[out], intact=intact).reused
  assert run_unit(ctx, "s", "u", {"k": 1}, fn, clean=[out], intact=intact).reused
  assert seen == ["made"]
  out.unlink()
  again = run_unit(ctx, "s", "u", {"k": 1}, fn, clean=[out], intact=intact)
  assert not again.reused and out.read_text() == "x"
  assert any(f"{out} is missing; running it again" in line for line in lines)


def test_redo_removes_a_stage_only_when_it_runs(tmp_path):
  """``--redo all`` whose first stage fails on its input (a model path that does not exist)
  leaves every later stage's results as they were (issue 43 item 6: before, everything was
  removed first, then the error came)."""
  out = tmp_path / "later.txt"

  def first(ctx):
    if ctx.config == "typo":
      raise UserError("--model typo does not exist")
    return run_unit(ctx, "first", "u", {}, lambda: 1)

  def later(ctx):
    return run_unit(ctx, "later", "u", {}, lambda: out.write_text("result") and 2, clean=[out])
  plan = (Stage("first", "", first), Stage("later", "", later, reads=("first",),
                                           outputs=("later.txt",)))
  run_pipeline(plan, tmp_path, config="ok", log=lambda m: None)
  with pytest.raises(UserError, match="typo"):
    run_pipeline(plan, tmp_path, config="typo", redo="all", log=lambda m: None)
  assert out.read_text() == "result"


def test_every_stage_reads_the_typed_config_or_its_part(tmp_path):
  # issue 42 item 2: a stage reads its settings from ctx.config (the job's one config, or the
  # field `part` names when a job composes another's stages) and earlier results from ctx.results
  import dataclasses

  @dataclasses.dataclass(frozen=True)
  class Inner:
    n: int

  @dataclasses.dataclass(frozen=True)
  class Outer:
    name: str
    inner: Inner

  seen = []

  def outer(ctx):
    seen.append(("outer", ctx.config.name))
    return 1

  def inner(ctx):
    seen.append(("inner", ctx.config.n, ctx.results["a"]))
    return 2
  done = run_pipeline([Stage("a", "outer", outer), Stage("b", "inner", inner, reads=("a",),
                                                         part="inner")],
                      tmp_path, config=Outer("x", Inner(3)), log=lambda m: None)
  assert seen == [("outer", "x"), ("inner", 3, 1)] and done == {"a": 1, "b": 2}


@pytest.mark.parametrize("refusing", ["figures", "stages"])
def test_redo_probes_every_folder_it_writes_before_removing_anything(tmp_path, monkeypatch,
                                                                    refusing):
  # os.access says "writable" to root where writes fail (NFS root squash, ACLs): reset_stage
  # creates a probe file in every folder a removal writes to, and names the first that refuses
  def report(ctx):
    def fn():
      (tmp_path / "figures").mkdir(exist_ok=True)
      (tmp_path / "figures" / "a.png").write_text("png")
      (tmp_path / "report.html").write_text("html")
      return 1
    return run_unit(ctx, "report", "u", {}, fn)
  plan = (Stage("report", "", report, outputs=("report.html", "figures")),)
  run_pipeline(plan, tmp_path, log=lambda m: None)
  before = sorted(str(p) for p in tmp_path.rglob("*") if ".heads_jax" not in p.name)
  real = engine.tempfile.mkstemp

  def mkstemp(dir=None, **kw):
    if Path(dir) == tmp_path / refusing:
      raise PermissionError(13, "Permission denied")
    return real(dir=dir, **kw)
  monkeypatch.setattr(engine.tempfile, "mkstemp", mkstemp)
  with pytest.raises(UserError, match=f"--redo report: {tmp_path / refusing} is not writable.*"
                                      r"\(nothing was removed\)"):
    run_pipeline(plan, tmp_path, redo="report", log=lambda m: None)
  assert sorted(str(p) for p in tmp_path.rglob("*") if ".heads_jax" not in p.name) == before
