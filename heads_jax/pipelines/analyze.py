"""The analysis job: one model, one or more data sets -> the files of DESIGN.md section 4.

    data specs -> encoded batches -> jitted step (forward + sieves + statistics, on device)
      -> scores.npz -> hypothesis tests, roles, summary, clusters (host) -> figures + report.html

``run_analysis`` is what ``heads-jax analyze`` and the demo call. Several data specs may be
given (e.g. UD sentences for the syntactic roles and MRPC pairs for ``block``): their sequences
are analysed in turn and stacked along N; a role whose sieve is empty for a sequence (no arcs,
no pair) is NaN there and that sequence does not enter the role's test. ``scores.npz`` then also
holds ``data_index`` int ``[N]`` (which spec each sequence came from) beside the contract keys.

The job is the analysis's two stages (`heads_jax.pipelines.analysis`, composed by
`heads_jax.pipelines.stages`) on the stage engine (markers in ``OUT/stages/``): ``scores``,
the device pass (``scores.npz``, ``measures.npz``, ``run.json``; one unit keyed on the settings
that determine scores.npz and the content of the model and data, `device_key`), and
``analysis``, the host statistics (tests, roles, summary, clusters, report; keyed on the device
pass's result and the other settings). Re-running into the same directory with the same model
and data reuses ``scores.npz`` and recomputes the host statistics only when one of their
settings changed, so changing ``--tau``, ``--alpha``, ``--test`` or ``--correction`` costs
seconds; ``--redo scores|analysis|all`` runs a stage (and what reads it) again. "The same" is the settings
of the pass and the content of the model's and data's files (`runfiles.model_identity`,
`runfiles.data_identity`: a hub id is its snapshot), not the path strings; a readable
``scores.npz`` only. Other settings, other content behind the same paths, files of an unknown
run or a damaged file are refused with one line, or computed again with ``--overwrite`` (the
same as ``--redo scores``). A directory that holds another run's results, or another job's files
(`heads_jax.runfiles.check_dir`), is refused; ``--no-report`` removes a report.html of earlier
tests. Every value is checked before any file is written (`check_settings`); each data set's
counts (read, empty dropped, truncated, duplicated) are logged and recorded (``run.json``
data_info, the report's settings), and fewer than 2 sequences is warned about.

``--out`` and ``--model`` may be cloud URLs (``gs://bucket/...``): the model directory is
mirrored into the local cache, and the files are written into a local staging folder (holding
a copy of what the URL already has, so the reuse above works there too) that is copied to the
URL at the end (``heads_jax.storage``). With several host processes
(``run_analysis(..., distributed=...)``, ``heads-jax analyze --num-processes``) every process
reads the same data, each runs its devices' rows of every batch, all get every row back, and
process 0 alone writes the files.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import jax

from heads_jax import contract, runfiles
from heads_jax.storage import as_path, is_url, staged_output
from heads_jax.errors import UserError
from heads_jax.parallel import initialize_distributed
from heads_jax.pipelines import engine, names, stages
from heads_jax.pipelines.analysis import (  # noqa: F401 (the analysis's names, as before)
    DEVICE_KEYS, AnalysisConfig, check_rule_settings, check_settings, content_identity,
    few_sequences_warning, headline, host_statistics)
from heads_jax.pipelines.keys import unit_key
from heads_jax.pipelines.device_pass import check_vocabulary, compute_scores, write_scores  # noqa: F401

DEVICE_STAGE, HOST_STAGE = REDO_STAGES = names.ANALYZE   # the stages in OUT/stages/ (--redo)
DEVICE_UNIT, HOST_UNIT = names.ANALYZE


def device_key(cfg: AnalysisConfig, inputs: dict) -> dict:
  """The key of the device pass (`keys.unit_key`, as `stages.scores` makes it): the settings
  that determine scores.npz (`DEVICE_KEYS`, the model and data paths left out) and the content
  of the model and data (`analysis.content_identity`)."""
  return unit_key(cfg.device_settings(), paths=("model", "data"), inputs=inputs)


def _device_reusable(out: Path, key: dict, overwrite: bool, cfg: AnalysisConfig) -> bool:
  """Whether the device pass of ``out`` (its unit markers, `engine.unit_markers`) holds ``key``
  and readable files, so that only the host statistics run. Without ``overwrite``, a
  directory holding another run's results (other settings, or other model or data behind the
  same paths), analysis files without a marker, or a damaged file is refused (one line naming
  what differs and ``--overwrite``); with it, such a pass runs again. Nothing is written."""
  done, started = engine.unit_markers(out, DEVICE_STAGE, DEVICE_UNIT)
  last = done or started
  if last is None:
    try:
      contract.read_run(out)
    except ValueError as e:
      if not overwrite:
        raise UserError(str(e)) from None  # names the file and the --overwrite to pass
    files = [n for n in (contract.SCORES_FILE, contract.RUN_FILE, contract.TESTS_CSV,
                         contract.REPORT_HTML) if (out / n).is_file()]
    if files and not overwrite:
      raise FileExistsError(f"{out} holds analysis files of an unknown run ({', '.join(files)}; "
                            "no record of their settings and inputs): choose another --out or "
                            "pass --overwrite")
    return False
  was = last.get("key") or {}
  if runfiles.canonical(was) != runfiles.canonical(key):
    if overwrite:
      return False
    before, now_ = was.get("settings") or {}, key["settings"]
    diff = [k for k in DEVICE_KEYS if k in now_ and before.get(k) != now_[k]]
    if diff:
      raise FileExistsError(f"{out} holds another run's results (different {', '.join(diff)}); "
                            f"choose another --out or pass --overwrite")
    what = [w for w in ("model", "data")
            if (was.get("inputs") or {}).get(w) != key["inputs"][w]] or ["model and data"]
    recorded = (runfiles.read_job(out) or {}).get("model")
    if "model" in what and recorded not in (None, str(cfg.model),
                                            runfiles.to_run_path(cfg.model, out)):
      raise FileExistsError(f"{out} holds another run's results (the analysis of {recorded}, "
                            f"not {cfg.model}): choose another --out or pass --overwrite")
    raise FileExistsError(
        f"the {' and the '.join(what)} behind the same path(s) changed since the analysis in "
        f"{out}: pass --overwrite to analyse again, or choose another --out")
  if done is None:
    return False  # started with this key and not finished: it runs again
  try:
    contract.read_run(out)
    contract.read_scores(out)
  except (UserError, ValueError, OSError) as e:
    if not overwrite:
      raise UserError(str(e)) from None  # names the file and the --overwrite to pass
    return False  # the device stage finds it damaged (`analysis.scores_intact`) and reruns
  return True


def run_analysis(cfg: AnalysisConfig, *, model=None, tokenizer=None, overwrite: bool = False,
                 redo: str | None = None, progress: bool = True, log=print,
                 distributed: dict | None = None) -> dict:
  """Runs the whole analysis; returns the host results (``tests``, ``settings``, ``summary``,
  ``clusters``, ``cluster_info``, ``robustness``) plus ``out`` and ``report`` paths.

  ``cfg.out`` may be a URL (module docstring). ``overwrite``: replace another run's results
  (or a damaged file) in ``cfg.out`` instead of refusing (``redo="scores"``). ``redo``: ``scores`` (the device pass
  and what reads it), ``analysis`` (the host statistics) or ``all``. ``distributed``: keyword
  arguments of ``heads_jax.parallel.initialize_distributed`` (``coordinator_address``,
  ``num_processes``, ``process_id``, ``enabled``) for a run over several host processes; a
  process other than 0 returns ``{"out", "process_index", "num_sequences"}`` after the device
  pass.
  """
  if redo is not None and redo not in REDO_STAGES + ("all",):
    raise UserError(f"--redo {redo!r}: one of {', '.join(REDO_STAGES)} (or all)")
  if overwrite and redo is None:
    redo = DEVICE_STAGE  # --overwrite: the device pass (and what reads it) again
  if distributed:
    initialize_distributed(**distributed)
  check_settings(cfg)
  if not is_url(cfg.out):
    return _run_in(cfg, model=model, tokenizer=tokenizer, overwrite=overwrite, redo=redo,
                   progress=progress, log=log)
  main = jax.process_index() == 0
  with staged_output(cfg.out, upload=main) as local:
    host = _run_in(dataclasses.replace(cfg, out=str(local)), model=model, tokenizer=tokenizer,
                   overwrite=overwrite, redo=redo, progress=progress, log=log,
                   shown_out=cfg.out)
    remote = as_path(cfg.out)
    if host.get("report") is not None:
      # a reused stage's result names the folder of the run that wrote it (an earlier staging
      # folder): the report's place inside the run folder is what carries over
      report = Path(host["report"])
      inside = (report.relative_to(local) if report.is_relative_to(local)
                else Path(contract.REPORT_HTML))
      host["report"] = remote / inside.as_posix()
    host["out"] = remote
  if main:
    log(f"copied to {cfg.out}")
  return host


def _run_in(cfg: AnalysisConfig, *, model, tokenizer, overwrite: bool, redo, progress: bool,
            log, shown_out: str | None = None) -> dict:
  """``run_analysis`` into the local directory ``cfg.out``: the device stage (`stages.scores`,
  keyed on `device_key`) and the host stage (`stages.statistics`) on the stage engine, under
  the directory's lock and claim."""
  out = Path(cfg.out)
  main = jax.process_index() == 0
  if not main:
    log = lambda *a, **k: None  # noqa: E731 (process 0 reports)
  try:
    runfiles.check_dir(out, "analysis", flag="--out")
    with runfiles.hashes_read_only():  # a refusal writes nothing into --out
      identity = content_identity(cfg, cache=out / runfiles.STAGES_DIR)
      key = device_key(cfg, identity)
      reuse = redo not in (DEVICE_STAGE, "all") and _device_reusable(out, key, overwrite, cfg)
  except (FileExistsError, NotADirectoryError, UserError) as e:
    raise type(e)(str(e).replace(str(out), shown_out)) if shown_out else e
  if not main:  # the other processes of a multi-host run: their rows of the pass, no files
    scores = None if reuse else compute_scores(cfg, model, tokenizer, progress=False)
    return {"out": out, "process_index": jax.process_index(),
            "num_sequences": None if scores is None else int(len(scores["lengths"]))}
  new = not out.exists()
  run = AnalyzeRun(settings=cfg, model=identity["model"], progress=progress,
                   loaded=(lambda: (model, tokenizer)) if model is not None else None)
  try:
    done = engine.run_pipeline(PLAN, out, config=run, redo=redo, log=log, progress=False,
                               what="an analysis",
                               claim={"kind": "analysis",
                                      "model": runfiles.to_run_path(cfg.model, out),
                                      "data": list(cfg.data),
                                      "settings": cfg.device_settings()})[HOST_STAGE]
  except BaseException:
    if new and out.is_dir() and {p.name for p in out.iterdir()} <= {
        runfiles.JOB_FILE, runfiles.HASHES_JSON, runfiles.STAGES_DIR}:
      shutil.rmtree(out, ignore_errors=True)  # an early error leaves no empty --out
    raise
  return analysis_result(out, done)


@dataclasses.dataclass(frozen=True)
class AnalyzeRun:
  """What the analyze job's stages read (``ctx.config``): the analysis settings, the model's
  identity (its content), whether to show progress, and a model already in memory
  (``loaded() -> (model, tokenizer)``; None: load ``settings.model``)."""
  settings: AnalysisConfig
  model: dict
  progress: bool = True
  loaded: object = None


def _device(ctx: engine.Context[AnalyzeRun]) -> stages.Scores:
  run: AnalyzeRun = ctx.config
  ctx.model(run.settings.model)  # its hashes kept in the claimed directory (checked before)
  return stages.scores(ctx, DEVICE_STAGE, DEVICE_UNIT, run.settings, model=run.model,
                       loaded=run.loaded, log=ctx.log, progress=run.progress)


def _host(ctx: engine.Context[AnalyzeRun]) -> stages.Analysis:
  run: AnalyzeRun = ctx.config
  result = stages.statistics(ctx, HOST_STAGE, HOST_UNIT, run.settings,
                             ctx.results[DEVICE_STAGE], loaded=run.loaded, log=ctx.log)
  if ctx.counts["reused"] and result.summary is not None:
    ctx.log(headline(result.summary))  # what a run prints, for the same settings
    if result.report:
      ctx.log(f"report: {result.report}")
  return result


PLAN = (engine.Stage(DEVICE_STAGE, "the device pass (scores.npz)", _device),
        engine.Stage(HOST_STAGE, "tests, roles, summary, clusters and report", _host,
                     reads=(DEVICE_STAGE,)))


def analysis_result(out: Path, done: stages.Analysis) -> dict:
  """The host results of the analysis in ``out`` as the job returns them, read from its files
  (the same whether the host stage ran or was reused)."""
  tests, settings = contract.read_tests(out)
  clusters, info = contract.read_clusters(out)
  summary = contract.read_summary(out)
  return {"tests": tests, "settings": settings, "summary": summary, "clusters": clusters,
          "cluster_info": info, "robustness": contract.read_robustness(out), "out": out,
          "report": Path(done.report) if done.report else None}
