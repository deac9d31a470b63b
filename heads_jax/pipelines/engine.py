"""The stage engine every pipeline runs on: keyed stages made of keyed units.

A pipeline is a sequence of `Stage`s; a stage is made of units (a task, a grid point, an
analysis), each run through `run_unit(ctx, stage, unit, key, fn, clean)`:

* the key holds everything the unit's result depends on: its settings and the identity of its
  inputs (for a file or folder its content fingerprint, `fingerprint`; for another unit's result
  that unit's finish time, read from the typed result of its stage in ``ctx.results``);
* a unit whose finish marker holds the current key, and whose outputs are intact (``intact``),
  is skipped (reused);
* a unit started or finished with another key, never started, or whose outputs are missing or
  damaged, has its outputs (``clean``) removed, then runs (outputs without a marker have unknown
  settings: never reused);
* a unit started with the same key and not finished runs again over what it left (fine-tuning
  resumes from its checkpoints);
* ``RUN/stages/<stage>/<unit>.started.json`` is written before ``fn`` runs and the finish marker
  ``<unit>.json`` last, after every output (atomically; `heads_jax.runfiles.Markers`).

Since a key holds the finish time of the units it reads, a unit that reran makes every unit that
reads it rerun, and a changed setting reruns exactly what depends on it. ``redo=STAGE``
(`run_pipeline`) removes that stage's markers and outputs, so it reruns, and with it every stage
that reads it (`dependents`). Each stage prints one line when it starts and one with its time.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Generic, Sequence, TypeVar

from heads_jax.errors import UserError
from heads_jax import runfiles
from heads_jax.runfiles import Markers, WorkdirLock, canonical, now


@dataclasses.dataclass(frozen=True)
class UnitResult:
  """A unit's finish marker: its key, what it returned, when it ran, and whether this call
  reused it (``reused``) instead of running it."""
  key: Any
  outputs: Any
  started: str
  finished: str
  seconds: float
  reused: bool = False

  def marker(self, workdir, paths=()) -> dict:
    """The finish marker: the locations ``paths`` names in the outputs recorded relative to the
    run folder ``workdir`` (`runfiles.portable_outputs`), with their pointers."""
    outputs, pointers = runfiles.portable_outputs(self.outputs, paths, workdir)
    return {"key": self.key, "outputs": outputs, "paths": pointers, "started": self.started,
            "finished": self.finished, "seconds": self.seconds}

  @classmethod
  def from_marker(cls, m: dict, workdir, reused: bool = False) -> "UnitResult":
    """A finish marker read back, its recorded locations opened from here (under ``workdir`` as
    given: the run may have moved, or be a copy)."""
    return cls(key=m.get("key"), started=m.get("started"), finished=m.get("finished"),
               outputs=runfiles.located_outputs(m.get("outputs"), m.get("paths"), workdir),
               seconds=m.get("seconds"), reused=reused)


# A job's one typed config (a frozen dataclass, or the job's ml_collections config): what
# `run_pipeline` receives and every stage reads as ``ctx.config``.
C = TypeVar("C")


@dataclasses.dataclass
class Context(Generic[C]):
  """What a stage function gets: the job's typed config (``config``: its settings, the only
  place a stage reads them), its run directory, its markers, the log, the counts of units run
  and reused in the current stage, and the earlier stages' typed results (``results``: the only
  place a stage reads what an earlier one made)."""
  config: C
  workdir: Path
  markers: Markers
  log: Callable[[str], None]
  tasks: tuple[str, ...] = ()
  counts: dict = dataclasses.field(default_factory=lambda: {"ran": 0, "reused": 0})
  results: dict = dataclasses.field(default_factory=dict)  # the earlier stages' results, this run
  finished: dict = dataclasses.field(default_factory=dict)  # {stage: its units' latest finish time}
  seconds: dict = dataclasses.field(default_factory=dict)   # {stage: seconds of its last run}

  def sub(self, message: str) -> None:
    """Logs an indented line under the current stage's."""
    self.log("  " + str(message).replace("\n", "\n  "))

  def files(self, path) -> list:
    """`runfiles.fingerprint` of ``path`` (hashes kept in the run directory's stages/)."""
    return runfiles.fingerprint(path, cache=self.markers.root)

  def model(self, model) -> dict:
    """`runfiles.model_identity` of a model argument (path, hub id or URL)."""
    return runfiles.model_identity(model, cache=self.markers.root)

  def data(self, spec) -> dict:
    """`runfiles.data_identity` of a data spec."""
    return runfiles.data_identity(spec, cache=self.markers.root)


def unit_markers(workdir, stage: str, unit: str) -> tuple[dict | None, dict | None]:
  """``(finish marker, start marker)`` of ``unit`` of ``stage`` in ``workdir`` (None: absent),
  for a job that checks, before it takes the lock and writes anything, what a directory holds."""
  markers = Markers(workdir)
  return markers.read_unit(stage, unit), markers.read_unit(stage, unit, started=True)


def _remove(path) -> None:
  p = Path(path)
  shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def run_unit(ctx: Context, stage: str, unit: str, key, fn: Callable[[], Any],
             clean=(), *, intact: Callable[[Any], str | None] | None = None,
             paths=()) -> UnitResult:
  """Runs ``fn() -> outputs`` (JSON-able) unless ``unit`` of ``stage`` finished with ``key``
  and its outputs are intact; returns its `UnitResult`.

  ``clean``: paths removed before a run when the unit was last started or finished with another
  key, has no marker at all, or its outputs are not intact. ``intact(outputs) -> None | why``:
  whether a finished unit's files are there and readable, given what its ``fn`` returned (a
  missing or damaged one: it runs again, and says why). ``paths``: the fields of the outputs
  that are locations (dotted, ``*`` for any key): the marker records them relative to the run
  folder, and the result (run or reused) holds them as opened from here, so a moved or copied
  run reads its own files from any working directory."""
  done = ctx.markers.read_unit(stage, unit)
  damaged = None
  if done is not None and canonical(done.get("key")) == canonical(key):
    done_result = UnitResult.from_marker(done, ctx.workdir, reused=True)
    damaged = intact(done_result.outputs) if intact is not None else None
    if damaged is None:
      ctx.counts["reused"] += 1
      _stamp(ctx, stage, done.get("finished"))
      return done_result
  started = ctx.markers.read_unit(stage, unit, started=True)
  last = started or done
  if damaged is not None or last is None or canonical(last.get("key")) != canonical(key):
    if damaged is not None:
      ctx.sub(f"{unit}: {damaged}; running it again")
    for p in clean:  # left by a run with other settings, by one that wrote no marker, or damaged
      _remove(p)
  t0 = time.time()
  t_start = now()
  ctx.markers.write_unit(stage, unit, {"key": key, "started": t_start}, started=True)
  outputs = fn()
  marker = UnitResult(key=key, outputs=outputs, started=t_start, finished=now(),
                      seconds=round(time.time() - t0, 3)).marker(ctx.workdir, paths)
  ctx.markers.write_unit(stage, unit, marker)  # last: the unit is done
  ctx.counts["ran"] += 1
  _stamp(ctx, stage, marker["finished"])
  if not marker["paths"]:
    return UnitResult(key=key, outputs=outputs, started=t_start, finished=marker["finished"],
                      seconds=marker["seconds"])
  return UnitResult.from_marker(marker, ctx.workdir)  # its locations as a reuse reads them


def _stamp(ctx: Context, stage: str, finished) -> None:
  """Keeps the latest finish time of ``stage``'s units (``ctx.finished``: a later stage's key
  holds it)."""
  if finished and str(finished) > str(ctx.finished.get(stage) or ""):
    ctx.finished[stage] = finished


@dataclasses.dataclass(frozen=True)
class Stage(Generic[C]):
  """One stage of a pipeline (a module-level function of the job's typed config, read from
  ``ctx.config``, and of the earlier stages' results, read from ``ctx.results``).

  Attributes:
    name: its name (``--redo`` takes it).
    text: what it does, for the progress line.
    run: ``run(ctx) -> result`` (a typed result of the stage).
    reads: the earlier stages whose results it reads (the ``redo`` cascade).
    outputs: paths under the run directory that ``redo`` removes.
    part: the field of the job's config that is this stage's ``ctx.config`` ("": the whole
      config); a job that composes another's stages beside its own (guan: the ablation's)
      holds both configs as fields of its own.
  """
  name: str
  text: str
  run: Callable[[Context[C]], Any]
  reads: tuple[str, ...] = ()
  outputs: tuple[str, ...] = ()
  part: str = ""


def dependents(stages, name: str) -> tuple[str, ...]:
  """``name`` and every stage that reads it, directly or through another, in pipeline order."""
  out = {name}
  for s in stages:
    if set(s.reads) & out:
      out.add(s.name)
  return tuple(s.name for s in stages if s.name in out)


def _refuses_writes(folder: Path) -> bool:
  """Whether a file cannot be created and removed in ``folder`` (a probe, not ``os.access``:
  root is told "writable" where every write fails, on NFS with root squash or under ACLs)."""
  try:
    fd, name = tempfile.mkstemp(dir=folder, prefix=".heads_jax_probe_")
    os.close(fd)
    os.unlink(name)
  except OSError:
    return True
  return False


def _folders_written(present) -> list[Path]:
  """The folders a removal of ``present`` writes to: the parent of each path, each directory
  and every folder below it (in that order, each once)."""
  out = []
  for p in present:
    out.append(p.parent)
    if p.is_dir() and not p.is_symlink():
      out += [p, *(Path(root) / d for root, dirs, _ in os.walk(p) for d in dirs)]
  return list(dict.fromkeys(out))


def reset_stage(workdir, stage: Stage) -> None:
  """Removes ``stage``'s markers and outputs, so that it runs again from nothing. A folder the
  removal writes to that refuses a write (`_refuses_writes`: a probe file) stops with one line
  naming it before anything is removed, and a path left behind after the removal stops too: the
  stage is never "reused" over a half removal."""
  markers = Markers(workdir)
  paths = [markers.root / stage.name, markers.root / f"{stage.name}.json",
           *(Path(workdir) / rel for rel in stage.outputs)]
  present = [p for p in paths if p.exists() or p.is_symlink()]
  blocked = next((f for f in _folders_written(present) if _refuses_writes(f)), None)
  if blocked is not None:
    raise UserError(f"--redo {stage.name}: {blocked} is not writable, so {stage.name}'s outputs "
                    "cannot be removed; make it writable and run the command again (nothing "
                    "was removed)")
  markers.clear(stage.name)
  for rel in stage.outputs:
    _remove(Path(workdir) / rel)
  left = [p for p in present if p.exists()]
  if left:
    raise UserError(f"--redo {stage.name}: {left[0]} could not be removed; remove it by hand "
                    "(or make it writable) and run the command again")


def minutes(seconds: float) -> str:
  return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def run_pipeline(stages: Sequence[Stage[C]], workdir, *, config: C = None, tasks=(),
                 redo: str | None = None, stop_after: str | None = None, log=print,
                 what: str = "a pipeline", claim: dict | None = None,
                 progress: bool = True) -> dict:
  """Runs ``stages`` in order in ``workdir`` under its lock, each with ``config`` (the job's one
  typed config, ``ctx.config``); returns ``{stage name: its result}``.

  ``what``: the job, as the lock names it to a second process ("an ablation").
  ``claim``: keyword arguments of `runfiles.claim_dir` (``kind``, ``flag``, ``model``, ``data``,
  ``task``, ``settings``): the directory is checked and claimed for that job under the lock,
  before any stage.
  ``redo``: that stage's markers and outputs are removed first, so it reruns, and every stage
  reading it reruns with it (their keys hold its units' finish times; `dependents` lists them);
  ``"all"``: every stage.
  ``stop_after``: stop after that stage. ``progress=False``: no line per stage (a job that
  prints its own, such as ``analyze``).
  """
  names = [s.name for s in stages]
  if redo is not None and redo != "all" and redo not in names:
    raise UserError(f"--redo {redo!r}: one of {', '.join(names)} (or all)")
  if stop_after and stop_after not in names:
    raise UserError(f"stop_after={stop_after!r}: one of {', '.join(names)} (or empty)")
  workdir = Path(workdir)
  if claim is not None:
    runfiles.check_dir(workdir, claim["kind"], flag=claim.get("flag", "--out"),
                       task=claim.get("task"))  # before the lock creates the directory
  with WorkdirLock(workdir, what, log=log):  # a second process on workdir: one line
    if claim is not None:
      runfiles.claim_dir(workdir, **claim)
    return _run_stages(stages, names, workdir, config=config, tasks=tasks, redo=redo,
                       stop_after=stop_after, log=log, progress=progress)


def _run_stages(stages, names, workdir: Path, *, config, tasks, redo, stop_after, log,
                progress) -> dict:
  """`run_pipeline` under its work directory's lock."""
  say = log if progress else (lambda m: None)
  markers = Markers(workdir)
  # each stage to redo is reset just before it runs: a stage that fails on its inputs (a model
  # path that does not exist) leaves the later stages' results as they were
  again = set(names) if redo == "all" else {redo} if redo else set()
  results, finished = {}, {}
  took = {s.name: float((markers.read_stage(s.name) or {}).get("seconds") or 0.0)
          for s in stages}
  n = len(stages)
  for i, stage in enumerate(stages, 1):
    ctx = Context(getattr(config, stage.part) if stage.part else config, workdir, markers, log,
                  tuple(tasks), results=results, finished=finished, seconds=took)
    say(f"[{i}/{n}] {stage.name}: {stage.text}")
    if stage.name in again:
      reset_stage(workdir, stage)
    t0 = time.time()
    results[stage.name] = stage.run(ctx)
    seconds = time.time() - t0
    ran, reused = ctx.counts["ran"], ctx.counts["reused"]
    if ran == 0 and reused:
      state = f"all {reused} part(s) done earlier, reused"
    elif ran == 0:
      state = "done"
    else:
      state = f"{ran} part(s) run" + (f", {reused} reused" if reused else "")
    say(f"[{i}/{n}] {stage.name}: {state}; {minutes(seconds)}")
    if ran or markers.read_stage(stage.name) is None:
      took[stage.name] = round(seconds, 3)
      markers.write_stage(stage.name, {"stage": stage.name, "finished": now(),
                                       "seconds": round(seconds, 3), "ran": ran, "reused": reused})
    if stop_after == stage.name:
      log(f"stopped after {stage.name} (stop_after); run the same command again to continue")
      break
  return results
