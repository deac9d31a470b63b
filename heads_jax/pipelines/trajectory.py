"""Roles over training: analyse every kept checkpoint of a pre-training or fine-tuning run
(``heads-jax trajectory --run WORKDIR``).

For each Orbax checkpoint in ``WORKDIR/checkpoints`` (``heads_jax.training.rundir``), the encoder's
parameters (the ``bert`` subtree of the saved train state) are restored by training's own
reader (`heads_jax.training.checkpointing.restore_params_from_run`, ``only_saved``: only the
encoder parameters the checkpoint holds, so every run kind works: pre-training, GLUE
classification and regression, SQuAD's span model without a pooler) into the run's exported
model (``WORKDIR/model``, ``best_model`` or ``hf``: it gives the architecture and the tokenizer),
and analysed by the analysis's own two stages, as every job runs them:

* ``scores`` (`heads_jax.pipelines.stages.scores`, device): ``OUT/checkpoints/step_<s>/scores.npz``
  and ``measures.npz``, with **one compiled analysis program** (the checkpoints share the
  encoder's graph; ``heads_jax.stats.step.analysis_program`` caches the jitted program per graph
  and settings, its state an argument), so every checkpoint after the first runs without
  recompiling;
* ``analysis`` (`heads_jax.pipelines.stages.statistics`, host): the hypothesis tests and the
  run's role rule into each checkpoint's ``tests.csv`` (and its summary, one cluster);
* ``table`` (host): a row per checkpoint (`checkpoint_row`): the share of heads with each coarse
  role (from its ``tests.csv``), the mean sieve bias of each role over heads and sequences, and
  the sink rate (the share of heads whose mean attention on the first token exceeds 0.3, from the
  step's token measures: ``[CLS]`` is position 0), into ``trajectory.csv`` and
  ``trajectory.png`` / ``.svg`` (`heads_jax.contract`: `TRAJECTORY_CSV`, `TRAJECTORY_PNG`;
  ``heads_jax.report.figures.robustness.plot_trajectory``).

Keep enough checkpoints for a curve: ``checkpoint.keep = 0`` keeps every checkpoint (the ``tiny``
pre-training preset does; others keep the newest ``checkpoint.keep``).

On the stage engine (`heads_jax.pipelines.engine`), its settings one typed config
(`TrajectoryConfig`, the engine's ``config``): one ``scores`` unit per checkpoint (keyed by the
checkpoint's content, the exported model's, the data's and the device settings), one
``analysis`` unit per checkpoint (keyed by its ``scores`` unit's finish time and the host
settings), then the ``table`` (keyed by the analyses' finish times); a rerun reuses every
checkpoint analysed before and analyses only new ones; ``redo=STAGE`` (``--redo``) reruns one
stage and what reads it. ``--out`` is checked (a file, a directory of another job, not writable)
before the first checkpoint, locked while the job runs and claimed. A checkpoint that cannot be
read (damaged: `checkpointing.DamagedCheckpoint`) is set aside with one line: left out of the
table, the run's files untouched; the other checkpoints go on.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from flax import nnx

from heads_jax import contract, runfiles
from heads_jax.data.specs import parse_spec
from heads_jax.data.vocabulary import ROLES, SYNTACTIC_ROLES
from heads_jax.errors import UserError
from heads_jax.hoststats.calibration import DEFAULT_RULE
from heads_jax.hoststats.roles import assignment_array, coarse_roles
from heads_jax.hoststats.sinks import SINK_THRESHOLD
from heads_jax.model.loading import load_model, model_config
from heads_jax.pipelines import engine, stages
from heads_jax.pipelines.analysis import AnalysisConfig, few_sequences_warning
from heads_jax.pipelines.keys import unit_key
from heads_jax.report.figures.robustness import plot_trajectory
from heads_jax.training.checkpointing import (Checkpoints, DamagedCheckpoint,
                                              restore_params_from_run)
from heads_jax.training.rundir import RunDir

EXPORTS = ("model", "best_model", "hf", "best_hf")


def exported_model_dir(run) -> Path:
  """The run's exported model directory (architecture and tokenizer), the first of ``EXPORTS``."""
  root = Path(str(RunDir(run).root))
  for name in EXPORTS:
    if (root / name).is_dir():
      return root / name
  raise UserError(f"{root} holds no exported model ({', '.join(EXPORTS)}): --run must be the work "
                  "directory of a finished pre-training or fine-tuning run")


def checkpoint_steps(run) -> list[int]:
  """The steps of the run's kept Orbax checkpoints, in order."""
  ckpt_dir = RunDir(run).checkpoints
  if not Path(str(ckpt_dir)).is_dir():
    raise UserError(f"{ckpt_dir} does not exist: --run must be a training run's work directory")
  with quiet_orbax():
    ck = Checkpoints(ckpt_dir, async_save=False)
    try:
      steps = sorted(ck.all_steps())
    finally:
      ck.close()
  if not steps:
    raise UserError(f"{ckpt_dir} holds no checkpoint")
  return steps


class quiet_orbax:
  """Orbax's absl warnings (several per checkpoint opened) held back while reading another
  run's checkpoints: what matters is said in one plain line by the caller."""

  def __enter__(self):
    self.logger = logging.getLogger("absl")
    self.level = self.logger.level
    self.logger.setLevel(logging.ERROR)
    return self

  def __exit__(self, *exc):
    self.logger.setLevel(self.level)


class held_back_loop_errors:
  """While reading checkpoints: the ``RuntimeError: Event loop is closed`` that Orbax's pending
  reads raise, after a damaged checkpoint's restore failed, in threads whose event loop is gone
  (printed by Python as "Exception ignored" tracebacks) are held back; the damage itself is
  said in one line."""

  def __enter__(self):
    self.previous = sys.unraisablehook

    def hook(info):
      if isinstance(info.exc_value, RuntimeError) and "Event loop is closed" in str(info.exc_value):
        return
      self.previous(info)
    sys.unraisablehook = hook
    return self

  def __exit__(self, *exc):
    gc.collect()   # what a failed restore left is collected while the hook holds its errors
    sys.unraisablehook = self.previous


def check_out(out) -> None:
  """Refuses (UserError, one line) an ``--out`` that is a file, another job's directory, or not
  writable, before any checkpoint is analysed."""
  out = Path(out)
  runfiles.check_dir(out, "trajectory", flag="--out")
  existing = out
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
    raise UserError(f"--out {out}: {existing} is not a writable directory; choose another --out "
                    "(or make it writable)")


def with_params(template, restored: dict):
  """A copy of the template encoder with the restored parameters (a pure dict, possibly a part of
  the encoder's: the rest keeps the template's values) in place."""
  model = nnx.merge(*nnx.split(template), copy=True)          # the template stays untouched
  params = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(params, restored)
  nnx.update(model, params)
  return model


def checkpoint_row(tests: pd.DataFrame, sieve_bias, token_attention, roles, *,
                   threshold: float = SINK_THRESHOLD) -> dict:
  """One checkpoint's row from its analysis: ``share_<coarse role>`` (the share of heads with
  each coarse role, from ``tests``: its ``tests.csv``, ``assigned`` by the run's rule),
  ``bias_<role>`` (mean sieve bias over heads and sequences, NaN-aware) and ``sink_rate`` (the
  share of heads whose mean attention on position 0, [CLS], exceeds ``threshold``).
  ``sieve_bias`` ``[N, l, h, r]`` (r: ``roles``), ``token_attention`` ``[N, l, h, 5]``
  (column 0: [CLS])."""
  sieve_bias = np.asarray(sieve_bias, np.float64)
  l, h = sieve_bias.shape[1:3]
  assigned, role_names = assignment_array(tests, roles, l, h)
  coarse, coarse_names = coarse_roles(assigned, role_names)
  row = {f"share_{c}": float(coarse[..., j].mean()) for j, c in enumerate(coarse_names)}
  with np.errstate(invalid="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)   # a role no head's sieve holds: NaN
    means = np.nanmean(sieve_bias, axis=(0, 1, 2))
  row.update({f"bias_{r}": float(m) for r, m in zip(roles, means)})
  first = np.asarray(token_attention, np.float64)[..., 0].mean(0)          # [l, h]
  row["sink_rate"] = float((first > threshold).mean())
  return row


@dataclasses.dataclass(frozen=True)
class TrajectoryConfig:
  """Everything a trajectory depends on (`run_trajectory`'s arguments, checked; the engine's
  ``config``): the run, its exported model and checkpoints, the data and the analysis settings
  of every checkpoint."""
  run: str
  out: str
  model_dir: str
  checkpoints: str
  steps: tuple
  data: tuple
  max_examples: int | None
  max_length: int
  batch_size: int
  roles: tuple
  syntax: bool
  rule: str
  progress: bool = False

  def analysis(self, step: int) -> AnalysisConfig:
    """The analysis of checkpoint ``step`` (`stages.scores` and `stages.statistics`): the
    exported model's architecture with the checkpoint's encoder, into
    ``OUT/checkpoints/step_<s>``; gold arcs only (text data without a parser), one cluster,
    no report nor head view."""
    return AnalysisConfig(model=self.model_dir, data=self.data,
                          out=str(Path(self.out) / "checkpoints" / f"step_{step}"),
                          max_examples=self.max_examples, max_length=self.max_length,
                          batch_size=self.batch_size, roles=self.roles, syntax=self.syntax,
                          parser="none", measures=True, clusters=1, rule=self.rule,
                          report=False, examples=0)

  def claim(self) -> dict:
    """`runfiles.claim_dir`'s arguments for ``out``."""
    return {"kind": "trajectory", "flag": "--out", "model": self.run, "data": list(self.data),
            "settings": {"max_examples": self.max_examples, "max_length": self.max_length,
                         "batch_size": self.batch_size, "roles": list(self.roles),
                         "syntax": self.syntax, "rule": self.rule}}


def trajectory_config(run, out, *, data=("ud-ewt", "mrpc"), max_examples: int | None = 100,
                      max_length: int = 128, batch_size: int = 32, roles=ROLES,
                      syntax: bool = True, rule: str = DEFAULT_RULE,
                      progress: bool = False) -> TrajectoryConfig:
  """The checked `TrajectoryConfig` of a trajectory of ``run`` into ``out`` (module docstring):
  ``out`` checked first (`check_out`), then the counts, roles and data specs, then the run's
  checkpoints and exported model (UserError, one line, before anything is written)."""
  out = Path(out)
  check_out(out)
  for flag, value, least in (("--max-examples", max_examples, 1), ("--max-length", max_length, 8),
                             ("--batch-size", batch_size, 1)):
    if value is not None and (not isinstance(value, int) or value < least):
      raise UserError(f"{flag} {value}: give a whole number of at least {least}")
  unknown = [r for r in roles if r not in ROLES]
  if unknown or not roles:
    raise UserError(f"--roles {','.join(roles)}: " + (f"{', '.join(unknown)} is not a role"
                    if unknown else "no role given") + f"; the roles: {', '.join(ROLES)}")
  for spec in data:
    try:
      parse_spec(spec)
    except ValueError as e:
      raise UserError(str(e)) from None
  steps = checkpoint_steps(run)
  model_dir = exported_model_dir(run)
  return TrajectoryConfig(
      run=str(run), out=str(out), model_dir=str(model_dir),
      checkpoints=str(RunDir(run).checkpoints), steps=tuple(steps), data=tuple(data),
      max_examples=max_examples, max_length=min(max_length, model_config(model_dir).max_positions),
      batch_size=batch_size, roles=tuple(r for r in roles if syntax or r not in SYNTACTIC_ROLES),
      syntax=syntax, rule=rule, progress=progress)


def run_trajectory(run, out, *, log=print, redo: str | None = None,
                   **settings) -> pd.DataFrame:
  """Analyses every kept checkpoint of ``run`` (module docstring) with ``settings``
  (`trajectory_config`'s: data, max_examples, max_length, batch_size, roles, syntax, rule,
  progress); writes and returns the trajectory table. ``redo``: a stage of
  `names.TRAJECTORY` or ``"all"``."""
  job = trajectory_config(run, out, **settings)
  engine.run_pipeline(trajectory_stages(job), job.out, config=job, redo=redo, log=log,
                      what="a trajectory", claim=job.claim())
  return contract.read_trajectory(job.out)


class _Encoders:
  """The exported encoder, opened on first use (a rerun that reuses every checkpoint loads
  nothing); ``model(step)`` is a copy of it with that step's encoder parameters
  (`restore_params_from_run`: `DamagedCheckpoint` for one that cannot be read)."""

  def __init__(self, job: TrajectoryConfig):
    self.job, self.state = job, {}

  def model(self, step: int):
    if not self.state:
      model, tokenizer = load_model(self.job.model_dir)
      encoder = getattr(model, "bert", model)
      _, params = nnx.split(encoder, nnx.Param, ...)[:2]
      self.state.update(encoder=encoder, tokenizer=tokenizer, params=nnx.to_pure_dict(params))
    st = self.state
    with quiet_orbax(), warnings.catch_warnings():
      warnings.simplefilter("ignore")  # Orbax's notes on a partial restore
      restored, _ = restore_params_from_run(
          self.job.checkpoints, {"bert": st["params"]}, step, what=f"checkpoint of step {step}",
          only_saved=True, advice="--run must be one training run's work directory")
    if not restored.get("bert"):
      why = "it holds no encoder parameters (params/bert)"
      raise DamagedCheckpoint(f"the checkpoint of step {step}: {why}", why)
    # the same graph: the cached analysis program, no recompilation
    return with_params(st["encoder"], restored["bert"]), st["tokenizer"]


def _scores(ctx: engine.Context[TrajectoryConfig]) -> dict:
  """``{step: `stages.Scores`}``: the device pass of every readable checkpoint (keyed by the
  checkpoint's content, the exported model's, the data's and the settings); a damaged one is
  set aside with one line."""
  job = ctx.config
  export = ctx.model(job.model_dir)
  encoders = _Encoders(job)
  done = {}
  with held_back_loop_errors():
    for s in job.steps:
      identity = {"checkpoint": ctx.files(Path(job.checkpoints) / str(s)), "export": export}
      try:
        done[s] = stages.scores(ctx, "scores", f"step_{s}", job.analysis(s), model=identity,
                                loaded=lambda s=s: encoders.model(s), log=lambda m: None,
                                progress=job.progress)
      except DamagedCheckpoint as e:
        ctx.sub(f"step {s}: the checkpoint cannot be read ({e.reason}); set aside (left out "
                "of the trajectory, the run's files untouched), going on with the rest")
  if not done:
    raise UserError(f"no checkpoint in {job.checkpoints} could be read; nothing to draw")
  return done


def _analysis(ctx: engine.Context[TrajectoryConfig]) -> dict:
  """``{step: `stages.Analysis`}``: the host statistics (tests and the run's rule) of every
  checkpoint the ``scores`` stage analysed."""
  job = ctx.config
  return {s: stages.statistics(ctx, "analysis", f"step_{s}", job.analysis(s), device,
                               log=lambda m: None)
          for s, device in ctx.results["scores"].items()}


def _table(ctx: engine.Context[TrajectoryConfig]) -> engine.UnitResult:
  """trajectory.csv and its figure: a row per checkpoint from its analysis's files
  (`checkpoint_row`); keyed by the analyses' finish times."""
  job = ctx.config
  done = ctx.results["analysis"]   # {step: its analysis}
  out = Path(job.out)
  csv, png = out / contract.TRAJECTORY_CSV, out / contract.TRAJECTORY_PNG
  key = unit_key({}, inputs={str(s): r.finished for s, r in done.items()})

  def fn():
    rows = []
    for s, r in done.items():
      scores, m = contract.read_scores(r.out), contract.read_measures(r.out)
      tests, _ = contract.read_tests(r.out)
      rows.append({"step": int(s), **checkpoint_row(tests, scores.sieve_bias,
                                                    m["token_attention"], scores.roles)})
    frame = pd.DataFrame(rows)
    contract.write_trajectory(frame, out)
    plot_trajectory(frame, png, dpi=110)
    return {"csv": str(csv), "figure": str(png)}

  n = min(contract.read_scores(r.out).num_sequences for r in done.values())
  if n < 2:  # the shares would read as 0% roles, 100% sinks
    ctx.sub(f"warning: {few_sequences_warning(n)}")
  res = engine.run_unit(ctx, "table", "table", key, fn, clean=[csv, png, png.with_suffix(".svg")],
                        intact=lambda _: None if csv.is_file() else f"{csv} is missing",
                        paths=("csv", "figure"))
  for row in contract.read_trajectory(out).to_dict("records"):
    ctx.sub(f"step {row['step']}: " + ", ".join(f"{k[6:]} {100 * v:.0f}%" for k, v in row.items()
                                                if k.startswith("share_"))
            + f", sinks {100 * row['sink_rate']:.0f}%")
  ctx.sub(f"wrote {res.outputs['csv']} and {res.outputs['figure']}")
  return res


def trajectory_stages(job: TrajectoryConfig) -> list[engine.Stage[TrajectoryConfig]]:
  """``scores`` (the device pass of each checkpoint, `stages.scores`), ``analysis`` (its host
  statistics, `stages.statistics`) and ``table`` (host), as `names.TRAJECTORY` names them."""
  png = contract.TRAJECTORY_PNG
  return [engine.Stage("scores", f"{len(job.steps)} checkpoint(s) of {job.run}: the device pass "
                       "on " + ", ".join(job.data), _scores, outputs=("checkpoints",)),
          engine.Stage("analysis", "each checkpoint's tests and roles", _analysis,
                       reads=("scores",)),
          engine.Stage("table", f"{contract.TRAJECTORY_CSV} and its figure", _table,
                       reads=("analysis",),
                       outputs=(contract.TRAJECTORY_CSV, png, str(Path(png).with_suffix(".svg"))))]
