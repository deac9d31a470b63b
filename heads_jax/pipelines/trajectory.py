"""Roles over training: analyse every kept checkpoint of a pre-training or fine-tuning run
(``heads-jax trajectory --run WORKDIR``).

For each Orbax checkpoint in ``WORKDIR/checkpoints`` (``heads_jax.training.rundir``), the encoder's
parameters (the ``bert`` subtree of the saved train state) are restored into the run's exported
model (``WORKDIR/model``, ``best_model`` or ``hf``: it gives the architecture and the tokenizer)
and analysed by the analysis's own device stage (`heads_jax.pipelines.stages.scores`, the same
pass as ``analyze``: ``OUT/checkpoints/step_<s>/scores.npz`` and ``measures.npz``), with **one
compiled analysis program**: the checkpoints share the encoder's graph, and
``heads_jax.stats.step.analysis_program`` caches the jitted program per graph and settings (its
state is an argument), so every checkpoint after the first runs without recompiling.
Per checkpoint, on the host (the ``table`` stage): the hypothesis tests and the run's role rule
(``hoststats.hypothesis`` / ``hoststats.calibration``), the share of heads with each coarse role,
the mean sieve bias of each role over heads and sequences, and the sink rate (the share of heads
whose mean attention on the first token exceeds 0.3, from the step's token measures: ``[CLS]``
is position 0).

Writes ``trajectory.csv`` (one row per checkpoint: step, ``share_<coarse role>``,
``bias_<role>``, ``sink_rate``) and ``trajectory.png`` / ``.svg``
(``heads_jax.report.figures.robustness.plot_trajectory``) into ``--out``.
Keep enough checkpoints for a curve: ``checkpoint.keep = 0`` keeps every checkpoint (the ``tiny``
pre-training preset does; others keep the newest ``checkpoint.keep``).

Every run kind: pre-training, GLUE fine-tuning (classification and regression) and SQuAD (whose
span model has no pooler): only the encoder parameters that the checkpoint holds are restored.

On the stage engine (`heads_jax.pipelines.engine`, one typed config, `TrajectoryConfig`):
``checkpoints``, one device unit per checkpoint (keyed by the checkpoint's content, the exported
model's, the data's and the settings), then the ``table`` (host; keyed by their finish times and
the rule); a rerun reuses every checkpoint analysed before and analyses only new ones;
``redo=STAGE`` (``--redo``) reruns one stage and what reads it. ``--out`` is checked (a file, a
directory of another job, not writable) before the first checkpoint, locked while the job runs
and claimed. A checkpoint that cannot be read (damaged) is set aside with one line: left out of
the table, the run's files untouched; the other checkpoints go on.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pandas as pd
from flax import nnx

from heads_jax import contract, runfiles
from heads_jax.data.specs import parse_spec
from heads_jax.data.vocabulary import ROLES, SYNTACTIC_ROLES
from heads_jax.errors import UserError
from heads_jax.hoststats.calibration import DEFAULT_RULE, apply_rule
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.hoststats.roles import assignment_array, coarse_roles
from heads_jax.hoststats.sinks import SINK_THRESHOLD
from heads_jax.model.loading import layer_windows, load_model, model_config
from heads_jax.pipelines import engine, stages
from heads_jax.pipelines.analysis import AnalysisConfig, few_sequences_warning
from heads_jax.pipelines.keys import unit_key
from heads_jax.report.figures.robustness import plot_trajectory
from heads_jax.training.checkpointing import Checkpoints, check_shapes
from heads_jax.training.rundir import RunDir

EXPORTS = ("model", "best_model", "hf", "best_hf")
TRAJECTORY_CSV = "trajectory.csv"
TRAJECTORY_PNG = "trajectory.png"
STAGES = ("checkpoints", "table")


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


def _common(target, saved):
  """``target`` (a pure dict of arrays) cut to the keys that ``saved`` (a checkpoint's metadata
  tree) also has: a span model's encoder has no pooler, a classifier's has."""
  if not isinstance(target, dict):
    return target
  out = {}
  for k, v in target.items():   # a layer's key is an int here, a str in the checkpoint
    key = k if k in saved else str(k)
    if isinstance(saved, dict) and key in saved:
      out[k] = _common(v, saved[key])
  return out


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


class DamagedCheckpoint(Exception):
  """A checkpoint that cannot be read (its message: the first line of the error)."""


class RunCheckpoints:
  """The checkpoints of a training run, opened once (read-only) for reading the encoder of each
  step; ``close()`` (or ``with``) closes Orbax's manager, also after an error."""

  def __init__(self, run):
    self.directory = RunDir(run).checkpoints
    with quiet_orbax():
      self.manager = ocp.CheckpointManager(
          self.directory, item_handlers={"state": ocp.PyTreeCheckpointHandler()},
          options=ocp.CheckpointManagerOptions(read_only=True, create=False))

  def encoder(self, step: int, encoder_params: dict) -> dict:
    """The ``bert`` parameters of ``step`` (a pure dict: the keys of ``encoder_params`` that the
    checkpoint holds). A checkpoint that cannot be read: `DamagedCheckpoint`; one of another
    shape than the exported model: a UserError."""
    where = f"{self.directory}/{step}"
    try:
      with quiet_orbax():
        saved = self.manager.item_metadata(step)["state"]
      saved = getattr(saved, "tree", saved)
      if saved is None:
        raise ValueError("its state metadata (_METADATA) is missing")
    except Exception as e:  # noqa: BLE001 (any unreadable metadata is damage)
      raise DamagedCheckpoint(_first_line(e)) from None
    bert = ((saved.get("params") or {}) if isinstance(saved, dict) else {}).get("bert")
    if not isinstance(bert, dict):
      raise DamagedCheckpoint("it holds no encoder parameters (params/bert)")
    target = {"bert": _common(encoder_params, bert)}
    check_shapes(saved, {"params": target}, where,
                 "the run's exported model and its checkpoints differ; --run must be one "
                 "training run's work directory")
    try:
      with quiet_orbax(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Orbax's notes on a partial restore
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item={"params": target},
            restore_args=ocp.checkpoint_utils.construct_restore_args({"params": target}),
            partial_restore=True)))
    except Exception as e:  # noqa: BLE001 (a torn step: any read error)
      raise DamagedCheckpoint(_first_line(e)) from None
    return restored.state["params"]["bert"]

  def close(self) -> None:
    with quiet_orbax():
      self.manager.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  for code, what in (("OUT_OF_RANGE", "a data file is shorter than its index says (truncated)"),
                     ("DATA_LOSS", "a data file is corrupt"), ("NOT_FOUND", "a file is missing")):
    if text and code in text[0]:
      return f"{what}: {code}"
  return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def checkpoint_row(sieve_bias, token_attention, lengths, roles, *, entropy=None, tau=3.0,
                   alpha=0.05, rule: str = DEFAULT_RULE, threshold: float = SINK_THRESHOLD,
                   windows=None) -> dict:
  """One checkpoint's row: ``share_<coarse role>`` (the run's rule, default test settings; with
  ``entropy`` ``[N, l, h]`` near-uniform heads get no role under the calibrated rule, as in an
  analysis), ``bias_<role>`` (mean over heads and sequences, NaN-aware) and ``sink_rate``.
  ``windows``: `model.loading.layer_windows` (ModernBERT's local layers; None for BERT).
  ``sieve_bias`` ``[N, l, h, r]``, ``token_attention`` ``[N, l, h, 5]`` (index 0: [CLS])."""
  tests, settings = hypothesis_tests(sieve_bias, roles, tau=tau, alpha=alpha)
  tests, _ = apply_rule(tests, settings, sieve_bias, roles, lengths, rule=rule, entropy=entropy,
                        windows=windows)
  assigned, names = assignment_array(tests, roles)
  coarse, coarse_names = coarse_roles(assigned, names)
  row = {f"share_{c}": float(coarse[..., j].mean()) for j, c in enumerate(coarse_names)}
  with np.errstate(invalid="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)   # a role no head's sieve holds: NaN
    means = np.nanmean(np.asarray(sieve_bias, np.float64), axis=(0, 1, 2))
  row.update({f"bias_{r}": float(m) for r, m in zip(roles, means)})
  first = np.asarray(token_attention, np.float64)[..., 0].mean(0)          # [l, h]
  row["sink_rate"] = float((first > threshold).mean())
  return row


def run_trajectory(run, out, *, data=("ud-ewt", "mrpc"), max_examples: int | None = 100,
                   max_length: int = 128, batch_size: int = 32, roles=ROLES,
                   syntax: bool = True, rule: str = DEFAULT_RULE, log=print,
                   progress: bool = False, redo: str | None = None) -> pd.DataFrame:
  """Analyses every kept checkpoint of ``run`` (module docstring) on ``data`` (gold arcs only:
  text data is analysed without a parser); writes and returns the trajectory table.
  ``redo``: ``checkpoints`` (every checkpoint again), ``table`` or ``"all"``."""
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
  roles = tuple(r for r in roles if syntax or r not in SYNTACTIC_ROLES)
  ckpt_dir = Path(str(RunDir(run).checkpoints))
  length = min(max_length, model_config(model_dir).max_positions)
  job = TrajectoryConfig(run=str(run), out=str(out), model_dir=str(model_dir),
                         checkpoints=str(ckpt_dir), steps=tuple(steps), data=tuple(data),
                         max_examples=max_examples, max_length=length, batch_size=batch_size,
                         roles=roles, syntax=syntax, rule=rule, progress=progress)
  claim = {"kind": "trajectory", "flag": "--out", "model": str(run), "data": list(data),
           "settings": {"max_examples": max_examples, "max_length": max_length,
                        "batch_size": batch_size, "roles": list(roles), "syntax": syntax,
                        "rule": rule}}
  reader = _Reader(job)
  with held_back_loop_errors():
    try:
      engine.run_pipeline(trajectory_stages(job, reader), out, config=job, redo=redo, log=log,
                          what="a trajectory", claim=claim)
    finally:
      reader.close()
  return pd.read_csv(out / TRAJECTORY_CSV)


@dataclasses.dataclass(frozen=True)
class TrajectoryConfig:
  """Everything a trajectory depends on (`run_trajectory`'s arguments, checked): the run, its
  exported model and checkpoints, the data and the analysis settings of every checkpoint."""
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
    """The analysis of checkpoint ``step`` (its device pass, `stages.scores`): the exported
    model's architecture with the checkpoint's encoder, into ``OUT/checkpoints/step_<s>``;
    gold arcs only (text data without a parser)."""
    return AnalysisConfig(model=self.model_dir, data=self.data,
                          out=str(Path(self.out) / "checkpoints" / f"step_{step}"),
                          max_examples=self.max_examples, max_length=self.max_length,
                          batch_size=self.batch_size, roles=self.roles, syntax=self.syntax,
                          parser="none", measures=True, clusters=1, rule=self.rule,
                          report=False, examples=0)


class _Reader:
  """The exported encoder and the run's checkpoints, opened on first use (a rerun that reuses
  every checkpoint loads nothing); ``model(step)`` is the encoder with that step's parameters
  (`RunCheckpoints.encoder`: `DamagedCheckpoint` for one that cannot be read)."""

  def __init__(self, job: TrajectoryConfig):
    self.job, self.state = job, {}

  def model(self, step: int):
    if not self.state:
      model, tokenizer = load_model(self.job.model_dir)
      encoder = getattr(model, "bert", model)
      _, abstract = nnx.split(encoder, nnx.Param, ...)[:2]
      self.state.update(encoder=encoder, tokenizer=tokenizer,
                        params=nnx.to_pure_dict(abstract), reader=RunCheckpoints(self.job.run))
    st = self.state
    # the same graph: the cached analysis program, no recompilation
    return with_params(st["encoder"], st["reader"].encoder(step, st["params"])), st["tokenizer"]

  def close(self) -> None:
    if "reader" in self.state:
      self.state["reader"].close()


def _checkpoints(ctx: engine.Context, reader: _Reader) -> dict:
  """``{step: `stages.Scores`}``: the device pass of every readable checkpoint (keyed by the
  checkpoint's content, the exported model's, the data's and the settings); a damaged one is
  set aside with one line."""
  job: TrajectoryConfig = ctx.config
  export = ctx.model(job.model_dir)
  done = {}
  for s in job.steps:
    identity = {"checkpoint": ctx.files(Path(job.checkpoints) / str(s)), "export": export}
    try:
      done[s] = stages.scores(ctx, "checkpoints", f"step_{s}", job.analysis(s), model=identity,
                              loaded=lambda s=s: reader.model(s), log=lambda m: None,
                              progress=job.progress)
    except DamagedCheckpoint as e:
      ctx.sub(f"step {s}: the checkpoint cannot be read ({e}); set aside (left out of the "
              "trajectory, the run's files untouched), going on with the rest")
  if not done:
    raise UserError(f"no checkpoint in {job.checkpoints} could be read; nothing to draw")
  return done


def _table(ctx: engine.Context):
  """trajectory.csv and its figure: a row per checkpoint from its device pass's files (host
  statistics: `checkpoint_row`); keyed by their finish times and the rule."""
  job: TrajectoryConfig = ctx.config
  done = ctx.results["checkpoints"]   # {step: its device pass}
  out = Path(job.out)
  key = unit_key({"rule": job.rule}, inputs={str(s): r.finished for s, r in done.items()})
  windows = layer_windows(job.model_dir)

  def fn():
    rows = []
    for s, r in done.items():
      scores, m = contract.read_scores(r.out), contract.read_measures(r.out)
      rows.append({"step": int(s), **checkpoint_row(
          scores.sieve_bias, m["token_attention"], scores.lengths, scores.roles,
          entropy=m["entropy"], rule=job.rule, windows=windows)})
    frame = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (TRAJECTORY_CSV + ".tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(out / TRAJECTORY_CSV)
    plot_trajectory(frame, out / TRAJECTORY_PNG, dpi=110)
    return {"csv": str(out / TRAJECTORY_CSV), "figure": str(out / TRAJECTORY_PNG)}

  n = min(contract.read_scores(r.out).num_sequences for r in done.values())
  if n < 2:  # the shares would read as 0% roles, 100% sinks
    ctx.sub(f"warning: {few_sequences_warning(n)}")
  res = engine.run_unit(ctx, "table", "table", key, fn,
                        clean=[out / TRAJECTORY_CSV, out / TRAJECTORY_PNG,
                               (out / TRAJECTORY_PNG).with_suffix(".svg")],
                        intact=lambda: None if (out / TRAJECTORY_CSV).is_file()
                        else f"{out / TRAJECTORY_CSV} is missing")
  for row in pd.read_csv(out / TRAJECTORY_CSV).to_dict("records"):
    ctx.sub(f"step {row['step']}: " + ", ".join(f"{k[6:]} {100 * v:.0f}%" for k, v in row.items()
                                                if k.startswith("share_"))
            + f", sinks {100 * row['sink_rate']:.0f}%")
  ctx.sub(f"wrote {res.outputs['csv']} and {res.outputs['figure']}")
  return res


def trajectory_stages(job: TrajectoryConfig, reader: _Reader) -> list[engine.Stage]:
  """``checkpoints`` (the device pass of each, `stages.scores`) and ``table`` (host)."""
  return [engine.Stage("checkpoints", f"{len(job.steps)} checkpoint(s) of {job.run} analysed "
                       "on " + ", ".join(job.data), functools.partial(_checkpoints, reader=reader),
                       outputs=("checkpoints",)),
          engine.Stage("table", "trajectory.csv and its figure", _table, reads=("checkpoints",),
                       outputs=(TRAJECTORY_CSV, TRAJECTORY_PNG, "trajectory.svg"))]
