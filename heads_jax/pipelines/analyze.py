"""The analysis job: one model, one or more data sets -> the files of DESIGN.md section 4.

    data specs -> encoded batches -> jitted step (forward + sieves + statistics, on device)
      -> scores.npz -> hypothesis tests, roles, summary, clusters (host) -> figures + report.html

``run_analysis`` is what ``heads-jax analyze`` and the demo call. Several data specs may be
given (e.g. UD sentences for the syntactic roles and MRPC pairs for ``block``): their sequences
are analysed in turn and stacked along N; a role whose sieve is empty for a sequence (no arcs,
no pair) is NaN there and that sequence does not enter the role's test. ``scores.npz`` then also
holds ``data_index`` int ``[N]`` (which spec each sequence came from) beside the contract keys.

The job runs on the stage engine (`heads_jax.pipelines.engine`, markers in ``OUT/stages/``):
a device stage (``scores.npz``, ``measures.npz``, ``run.json``; one unit keyed on the settings
that determine scores.npz and the content of the model and data, `device_key`) and a host
stage (tests, roles, summary, clusters, report). Re-running into the same directory with the
same model and data reuses ``scores.npz`` and recomputes the host statistics, so changing
``--tau``, ``--alpha``, ``--test`` or ``--correction`` costs seconds. "The same" is the settings
of the pass and the content of the model's and data's files (`runfiles.model_identity`,
`runfiles.data_identity`: a hub id is its snapshot), not the path strings; a readable
``scores.npz`` only. Other settings, other content behind the same paths, files of an unknown
run or a damaged file are refused with one line, or computed again with ``--overwrite``. A directory that holds another run's results, or another job's files
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
import math
import shutil
import time
from pathlib import Path

import jax
import numpy as np

from heads_jax import contract, runfiles
from heads_jax.data.vocabulary import PLAIN_TWINS, ROLES
from heads_jax.data.specs import check_max_examples, parse_spec
from heads_jax.storage import as_path, is_url, local_copy, staged_output
from heads_jax.errors import UserError
from heads_jax.hoststats.calibration import DEFAULT_RULE, NEAR_UNIFORM_NATS, RULES, apply_rule
from heads_jax.hoststats.clustering import cluster_heads
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.hoststats.roles import assignment_array, coarse_roles_by_layer, format_roles_by_layer
from heads_jax.hoststats.summary import summary_figures
from heads_jax.model.loading import load_model
from heads_jax.parallel import initialize_distributed
from heads_jax.pipelines.engine import Stage, run_pipeline, run_unit
from heads_jax.pipelines.keys import unit_key
from heads_jax.pipelines.device_pass import check_vocabulary, compute_scores, write_scores  # noqa: F401
from heads_jax.pipelines.robustness import ensure_robustness_pass, robustness_host
from heads_jax.report.analysis import build_analysis_report
from heads_jax.report.headline import headline_text
from heads_jax.stats.examples import DEFAULT_PER_HEAD, write_head_examples

DEVICE_STAGE, DEVICE_UNIT, HOST_STAGE = "device", "scores", "host"  # the stages in OUT/stages/
# Settings that determine scores.npz (the device pass); the others only affect host statistics.
DEVICE_KEYS = ("model", "data", "max_examples", "max_length", "direction", "syntax", "parser", "roles",
               "measures", "js")


@dataclasses.dataclass
class AnalysisConfig:
  """Everything an analysis run depends on (written to ``run.json`` and ``tests.json``)."""
  model: str
  data: tuple[str, ...]
  out: str
  max_examples: int | None = None
  max_length: int = 128
  batch_size: int = 32
  tau: float | str = 3.0
  alpha: float = 0.05
  test: str = "t"
  correction: str = "none"
  rule: str = DEFAULT_RULE           # "calibrated", "paper" or "average" (hoststats.roles, DESIGN.md 3)
  near_uniform_nats: float = NEAR_UNIFORM_NATS
  direction: str = "dep2head"
  syntax: bool = True
  parser: str | None = None  # spaCy pipeline for text inputs (default en_core_web_sm); "none": no arcs for text
  roles: tuple[str, ...] = ROLES
  measures: bool = True              # Clark/Kovaleva measures -> measures.npz (entropy, attention to tokens)
  js: bool = False                   # Jensen-Shannon distance between every pair of heads (about 2x the time)
  clusters: int = 4
  cluster_method: str = "kmeans"
  seed: int = 0
  sort_window: int | None = 1024     # sort by length within windows of this many examples (less padding)
  bucket_step: int = 16              # padded lengths are multiples of this (smaller: less padding, more shapes)
  report: bool = True
  title: str | None = None
  examples: int = DEFAULT_PER_HEAD   # sequences per head in the report's head view (examples.json); 0: none
  robustness: bool = False           # second pass: norm-weighted roles, sinks, heads as parsers
                                     # (pipelines/robustness.py); `heads-jax analyze` turns it on

  @classmethod
  def from_config(cls, block, **fields) -> "AnalysisConfig":
    """The analysis settings of a pipeline's config ``block`` (a ConfigDict or dict whose keys
    are named as this class's fields; other keys are the pipeline's own), with ``fields``
    (model, data, out, ...) over them."""
    names = {f.name for f in dataclasses.fields(cls)}
    d = {k: v for k, v in dict(block or {}).items() if k in names}
    d.update(fields)
    for k in ("data", "roles"):
      if k in d:
        d[k] = tuple(d[k])
    return cls(**d)

  def device_settings(self) -> dict:
    d = dataclasses.asdict(self)
    d["data"] = list(self.data)
    d["roles"] = list(self.roles)
    return {k: d[k] for k in DEVICE_KEYS}


def check_rule_settings(cfg: AnalysisConfig) -> None:
  """The role rule's settings (UserError): a known rule; the calibrated rule for an
  entropy-weighted role needs its plain twin (`PLAIN_TWINS`: its test C); a threshold >= 0."""
  if cfg.rule not in RULES:
    raise UserError(f"--rule must be one of {', '.join(RULES)}; got {cfg.rule!r}")
  for weighted, plain in PLAIN_TWINS.items():
    if cfg.rule == "calibrated" and weighted in cfg.roles and plain not in cfg.roles:
      raise UserError(f"the calibrated rule for {weighted} needs {plain}: add it to --roles, or "
                      "use --rule paper")
  if not cfg.near_uniform_nats >= 0:
    raise UserError(f"--near-uniform-nats must be >= 0; got {cfg.near_uniform_nats}")


def check_settings(cfg: AnalysisConfig) -> None:
  """Every value of ``cfg`` that can be checked without the model or the data (UserError, one
  line, before any file is written or any device work): the rule, tau, alpha, the counts, and
  the data specs (their forms and files; the same data twice is refused: it would double every
  n and make every p-value too small)."""
  check_rule_settings(cfg)
  tau = cfg.tau
  if not (tau == "auto" or (isinstance(tau, (int, float)) and not isinstance(tau, bool)
                            and math.isfinite(tau) and tau >= 0)):
    raise UserError(f"--tau must be a number >= 0 (the sieve-bias threshold of the tests) or "
                    f"'auto'; got {tau!r}")
  if not (isinstance(cfg.alpha, (int, float)) and 0 < cfg.alpha < 1):
    raise UserError(f"--alpha must be a significance level between 0 and 1 (e.g. 0.05); got "
                    f"{cfg.alpha!r}")
  for flag, value, low in (("--examples", cfg.examples, 0), ("--clusters", cfg.clusters, 1),
                           ("--batch-size", cfg.batch_size, 1),
                           ("--bucket-step", cfg.bucket_step, 1)):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise UserError(f"{flag} must be an integer >= {low}; got {value!r}")
  if not isinstance(cfg.max_length, int) or cfg.max_length < 4:
    raise UserError(f"--max-length must be an integer >= 4 ([CLS] A [SEP] B [SEP] needs room); "
                    f"got {cfg.max_length!r}")
  try:
    check_max_examples(cfg.max_examples)
    specs = [parse_spec(d) for d in cfg.data]
  except ValueError as e:
    raise UserError(str(e)) from None
  seen = {}
  for s in specs:
    key = (s.kind, str(s.path), s.task, s.split, s.header, s.version, s.sample, s.seed)
    if key in seen:
      raise UserError(f"--data {s.spec!r} names the same data as --data {seen[key]!r}: every "
                      "sequence would be counted twice (n doubled, p-values too small); give "
                      "each data set once")
    seen[key] = s.spec


def input_identity(cfg: AnalysisConfig) -> dict:
  """The content of the model and data behind ``cfg``'s paths (`runfiles.model_identity`: a
  directory's files, a hub id's snapshot; `runfiles.data_identity`: each file a spec reads), so
  that a reuse of scores.npz keys on what the paths hold, not on the path strings. The hashes
  are kept in ``out`` when it exists (a model of gigabytes is hashed once)."""
  cache = cfg.out if Path(cfg.out).is_dir() else None
  return {"model": runfiles.model_identity(cfg.model, cache=cache),
          "data": [runfiles.data_identity(d, cache=cache) for d in cfg.data]}


def device_key(cfg: AnalysisConfig, inputs: dict) -> dict:
  """The key of the device pass (`keys.unit_key`): the settings that determine scores.npz
  (`DEVICE_KEYS`, the model and data paths left out) and the content of the model and data
  (`input_identity`)."""
  return unit_key(cfg.device_settings(), paths=("model", "data"), inputs=inputs)


def _device_reusable(out: Path, key: dict, overwrite: bool) -> bool:
  """Whether the device pass of ``out`` (its unit marker, `heads_jax.pipelines.engine`) holds
  ``key`` and readable files, so that only the host statistics run. Without ``overwrite``, a
  directory holding another run's results (other settings, or other model or data behind the
  same paths), analysis files without a marker, or a damaged file is refused (one line naming
  what differs and ``--overwrite``); with it, such a pass runs again."""
  markers = runfiles.Markers(out)
  done = markers.read_unit(DEVICE_STAGE, DEVICE_UNIT)
  last = done or markers.read_unit(DEVICE_STAGE, DEVICE_UNIT, started=True)
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
    markers.clear(DEVICE_STAGE)
    return False
  return True


def host_statistics(cfg: AnalysisConfig, scores, data_info: list) -> dict:
  """Tests, roles, summary and clusters from ``scores`` (host only); writes their files."""
  out = Path(cfg.out)
  passthrough = {"direction": cfg.direction, "model": str(cfg.model),
                 "data": " + ".join(cfg.data), "max_length": cfg.max_length,
                 "max_examples": cfg.max_examples,
                 "arcs": ", ".join(str(d.get("arcs")) for d in data_info),
                 "syntax": cfg.syntax}
  for key, name in (("num_truncated", "sequences_truncated"),
                    ("num_empty_dropped", "sequences_empty_dropped"),
                    ("num_duplicates", "sequences_duplicated")):
    if any(d.get(key) for d in data_info):  # the report's settings say so
      passthrough[name] = sum(int(d.get(key) or 0) for d in data_info)
  warnings = [w for d in data_info for w in d.get("warnings", [])]
  if scores.num_sequences < 2:
    warnings.append(few_sequences_warning(scores.num_sequences))
  if warnings:
    passthrough["warnings"] = " | ".join(warnings)
  tests, settings = hypothesis_tests(scores.sieve_bias, scores.roles, tau=cfg.tau, alpha=cfg.alpha,
                                     test=cfg.test, correction=cfg.correction, settings=passthrough)
  if scores.lengths is None:
    raise UserError(f"{out / contract.SCORES_FILE} holds no lengths (an old file?): re-run the "
                    "analysis with --overwrite")
  entropy = None
  if (out / contract.MEASURES_FILE).is_file():  # the row entropy: near-uniform heads
    m = contract.read_measures(out)
    if np.array_equal(m["lengths"], scores.lengths):  # not a stale file of another run
      entropy = m["entropy"]
  tests, settings = apply_rule(tests, settings, scores.sieve_bias, scores.roles, scores.lengths,
                               rule=cfg.rule, entropy=entropy,
                               near_uniform_nats=cfg.near_uniform_nats)
  contract.write_tests(tests, settings, out)
  summary = summary_figures(scores.sieve_bias, scores.roles, tests, rule=cfg.rule,
                            near_uniform_computed=entropy is not None, tau=settings["tau"])
  contract.write_summary(summary, out)
  clusters, info = cluster_heads(scores.distance, k=cfg.clusters, method=cfg.cluster_method, seed=cfg.seed)
  contract.write_clusters(clusters, info, out)
  return {"tests": tests, "settings": settings, "summary": summary, "clusters": clusters,
          "cluster_info": info}


def few_sequences_warning(n: int) -> str:
  return (f"only {n} sequence(s): no test can run (a test needs n >= 2 sequences), so every "
          "head is reported with no role; analyse more data")


def run_analysis(cfg: AnalysisConfig, *, model=None, tokenizer=None, overwrite: bool = False,
                 progress: bool = True, log=print, distributed: dict | None = None) -> dict:
  """Runs the whole analysis; returns the host results plus ``out`` and ``report`` paths.

  ``cfg.out`` may be a URL (module docstring). ``distributed``: keyword arguments of
  ``heads_jax.parallel.initialize_distributed`` (``coordinator_address``, ``num_processes``,
  ``process_id``, ``enabled``) for a run over several host processes; a process other than 0
  returns ``{"out", "process_index", "num_sequences"}`` after the device pass.
  """
  if distributed:
    initialize_distributed(**distributed)
  check_settings(cfg)
  if not is_url(cfg.out):
    return _run_in(cfg, model=model, tokenizer=tokenizer, overwrite=overwrite, progress=progress,
                   log=log)
  main = jax.process_index() == 0
  with staged_output(cfg.out, upload=main) as local:
    host = _run_in(dataclasses.replace(cfg, out=str(local)), model=model, tokenizer=tokenizer,
                   overwrite=overwrite, progress=progress, log=log, shown_out=cfg.out)
    remote = as_path(cfg.out)
    if host.get("report") is not None:
      host["report"] = remote / Path(host["report"]).relative_to(local).as_posix()
    host["out"] = remote
  if main:
    log(f"copied to {cfg.out}")
  return host


def _run_in(cfg: AnalysisConfig, *, model, tokenizer, overwrite: bool, progress: bool, log,
            shown_out: str | None = None) -> dict:
  """``run_analysis`` into the local directory ``cfg.out``: a device stage (scores.npz, keyed
  on `device_key`) and a host stage (tests, summary, clusters, report) on the stage engine,
  under the directory's lock and claim."""
  out = Path(cfg.out)
  main = jax.process_index() == 0
  if not main:
    log = lambda *a, **k: None  # noqa: E731 (process 0 reports)
  try:
    runfiles.check_dir(out, "analysis", flag="--out")  # before the hashes are kept in it
    inputs = input_identity(cfg)
    key = device_key(cfg, inputs)
    reuse = _device_reusable(out, key, overwrite)
  except (FileExistsError, NotADirectoryError, UserError) as e:
    raise type(e)(str(e).replace(str(out), shown_out)) if shown_out else e
  if not main:  # the other processes of a multi-host run: their rows of the pass, no files
    scores = None if reuse else compute_scores(cfg, model, tokenizer, progress=False)
    return {"out": out, "process_index": jax.process_index(),
            "num_sequences": None if scores is None else int(len(scores["lengths"]))}
  new = not out.exists()
  times = {}

  def device(ctx) -> dict:
    t0 = time.time()

    def fn():
      scores = compute_scores(cfg, model, tokenizer, progress=progress, log=log)
      write_scores(out, scores)
      if "measures" in scores:
        contract.write_measures(out, scores["measures"])
      contract.write_run(out, cfg.device_settings(), scores["data_info"], inputs=inputs)
      return {"data_info": scores["data_info"]}
    r = run_unit(ctx, DEVICE_STAGE, DEVICE_UNIT, key, fn,
                 clean=[out / contract.SCORES_FILE, out / contract.MEASURES_FILE,
                        out / contract.RUN_FILE])
    if r.reused:
      log(f"reusing {out / contract.SCORES_FILE} (same model and data); recomputing the host "
          "statistics")
    if cfg.robustness and jax.process_count() == 1:  # issue 26: a second pass, once per scores.npz
      ensure_robustness_pass(cfg, out, model, tokenizer, log=log,
                             load=lambda: load_model(local_copy(cfg.model)))
    times["device"] = time.time() - t0
    return r.outputs

  def host(ctx) -> dict:
    return _host_stage(cfg, out, ctx.results[DEVICE_STAGE]["data_info"], model=model,
                       tokenizer=tokenizer, log=log, device_s=times.get("device", 0.0))

  stages = (Stage(DEVICE_STAGE, "the device pass (scores.npz)", device),
            Stage(HOST_STAGE, "tests, roles, summary, clusters and report", host,
                  reads=(DEVICE_STAGE,)))
  try:
    return run_pipeline(stages, out, log=log, progress=False, what="an analysis",
                        claim={"kind": "analysis", "model": cfg.model, "data": list(cfg.data),
                               "settings": cfg.device_settings()})[HOST_STAGE]
  except BaseException:
    if new and out.is_dir() and {p.name for p in out.iterdir()} <= {
        runfiles.JOB_FILE, runfiles.HASHES_JSON, runfiles.STAGES_DIR}:
      shutil.rmtree(out, ignore_errors=True)  # an early error leaves no empty --out
    raise


def _host_stage(cfg: AnalysisConfig, out: Path, data_info: list, *, model, tokenizer, log,
                device_s: float) -> dict:
  """The host stage of `_run_in`: tests, roles, summary and clusters from scores.npz, the head
  view's examples and the report; logs the headline."""
  robust = cfg.robustness and jax.process_count() == 1
  scores = contract.read_scores(out)
  if scores.num_sequences < 2:
    log(f"warning: {few_sequences_warning(scores.num_sequences)}")
  host = host_statistics(cfg, scores, data_info)
  if robust:
    host["robustness"] = robustness_host(out, host, log=log)
  assigned, roles = assignment_array(host["tests"], scores.roles, scores.num_layers, scores.num_heads)
  table = coarse_roles_by_layer(assigned, roles)
  log(f"\n{scores.num_sequences} sequences, {scores.num_layers} layers x {scores.num_heads} heads, "
      f"tau = {host['settings']['tau']:g}, alpha = {cfg.alpha:g}, test = {cfg.test}, "
      f"correction = {cfg.correction}, rule = {cfg.rule}")
  if host["settings"].get("num_near_uniform_heads"):
    log(f"near-uniform heads (no role under the calibrated rule): "
        f"{', '.join(host['settings']['near_uniform_heads'])}")
  log(f"heads per role and layer ({cfg.rule} rule):\n" + format_roles_by_layer(table))
  log(headline(host["summary"]))
  if cfg.examples > 0:  # the head view: a second, small forward pass (stats/examples.py)
    load = ((lambda: (model, tokenizer)) if model is not None
            else (lambda: load_model(local_copy(cfg.model))))
    path, computed = write_head_examples(out, load, None, cfg.data, max_length=cfg.max_length,
                                         max_examples=cfg.max_examples, per_head=cfg.examples,
                                         bucket_step=cfg.bucket_step)
    log(f"head view examples: {path}" + ("" if computed else " (unchanged)"))
  report = None
  if cfg.report:
    report = build_analysis_report(out, title=cfg.title)
    log(f"report: {report}")
  elif (out / contract.REPORT_HTML).is_file():  # it shows the earlier tests: stale
    (out / contract.REPORT_HTML).unlink()
    log(f"removed the earlier {contract.REPORT_HTML} (it showed other tests); run without "
        "--no-report for a new one")
  host.update(out=out, report=report, device_seconds=device_s)
  return host


def headline(summary: dict) -> str:
  """The paper's summary figures in one console line (the one headline table,
  `heads_jax.report.headline`)."""
  return headline_text(summary)
