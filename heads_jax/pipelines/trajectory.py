"""Roles over training: analyse every kept checkpoint of a pre-training or fine-tuning run
(``heads-jax trajectory --run WORKDIR``).

For each Orbax checkpoint in ``WORKDIR/checkpoints`` (``heads_jax.training.rundir``), the encoder's
parameters (the ``bert`` subtree of the saved train state) are restored into the run's exported
model (``WORKDIR/model``, ``best_model`` or ``hf``: it gives the architecture and the tokenizer)
and analysed on the same data with **one compiled analysis program**: the checkpoints share the
encoder's graph, and ``heads_jax.stats.step.analysis_program`` caches the jitted program per graph
and settings (its state is an argument), so every checkpoint after the first runs without
recompiling.
Per checkpoint: the hypothesis tests and the run's role rule (``hoststats.hypothesis`` /
``hoststats.calibration``), the share of heads with each coarse role, the mean sieve bias of each
role over heads and sequences, and the sink rate (the share of heads whose mean attention on the
first token exceeds 0.3, from the step's token measures: ``[CLS]`` is position 0).

Writes ``trajectory.csv`` (one row per checkpoint: step, ``share_<coarse role>``,
``bias_<role>``, ``sink_rate``) and ``trajectory.png`` / ``.svg``
(``heads_jax.report.figures.robustness.plot_trajectory``) into ``--out``.
Keep enough checkpoints for a curve: ``checkpoint.keep = 0`` keeps every checkpoint (the ``tiny``
pre-training preset does; others keep the newest ``checkpoint.keep``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from flax import nnx

from heads_jax.data.specs import encode_spec, parse_spec
from heads_jax.data.vocabulary import ROLES, SYNTACTIC_ROLES
from heads_jax.errors import UserError
from heads_jax.hoststats.calibration import DEFAULT_RULE, apply_rule
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.hoststats.roles import assignment_array, coarse_roles
from heads_jax.hoststats.sinks import SINK_THRESHOLD
from heads_jax.model.loading import load_model
from heads_jax.report.figures.robustness import plot_trajectory
from heads_jax.stats.collector import collect
from heads_jax.stats.step import make_analysis_step
from heads_jax.training.checkpointing import Checkpoints, restore_params_from_run
from heads_jax.training.rundir import RunDir

EXPORTS = ("model", "best_model", "hf", "best_hf")
TRAJECTORY_CSV = "trajectory.csv"
TRAJECTORY_PNG = "trajectory.png"


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
  ck = Checkpoints(ckpt_dir, async_save=False)
  try:
    steps = sorted(ck.all_steps())
  finally:
    ck.close()
  if not steps:
    raise UserError(f"{ckpt_dir} holds no checkpoint")
  return steps


def with_params(template, restored: dict):
  """A copy of the template encoder with the restored parameters (a pure dict) in place."""
  model = nnx.merge(*nnx.split(template), copy=True)          # the template stays untouched
  params = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(params, restored)
  nnx.update(model, params)
  return model


def checkpoint_row(sieve_bias, token_attention, lengths, roles, *, entropy=None, tau=3.0,
                   alpha=0.05, rule: str = DEFAULT_RULE, threshold: float = SINK_THRESHOLD) -> dict:
  """One checkpoint's row: ``share_<coarse role>`` (the run's rule, default test settings; with
  ``entropy`` ``[N, l, h]`` near-uniform heads get no role under the calibrated rule, as in an
  analysis), ``bias_<role>`` (mean over heads and sequences, NaN-aware) and ``sink_rate``.
  ``sieve_bias`` ``[N, l, h, r]``, ``token_attention`` ``[N, l, h, 5]`` (index 0: [CLS])."""
  tests, settings = hypothesis_tests(sieve_bias, roles, tau=tau, alpha=alpha)
  tests, _ = apply_rule(tests, settings, sieve_bias, roles, lengths, rule=rule, entropy=entropy)
  assigned, names = assignment_array(tests, roles)
  coarse, coarse_names = coarse_roles(assigned, names)
  row = {f"share_{c}": float(coarse[..., j].mean()) for j, c in enumerate(coarse_names)}
  with np.errstate(invalid="ignore"):
    import warnings
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)
      means = np.nanmean(np.asarray(sieve_bias, np.float64), axis=(0, 1, 2))
  row.update({f"bias_{r}": float(m) for r, m in zip(roles, means)})
  first = np.asarray(token_attention, np.float64)[..., 0].mean(0)          # [l, h]
  row["sink_rate"] = float((first > threshold).mean())
  return row


def run_trajectory(run, out, *, data=("ud-ewt", "mrpc"), max_examples: int | None = 100,
                   max_length: int = 128, batch_size: int = 32, roles=ROLES,
                   syntax: bool = True, rule: str = DEFAULT_RULE, log=print,
                   progress: bool = False) -> pd.DataFrame:
  """Analyses every kept checkpoint of ``run`` (module docstring) on ``data`` (gold arcs only:
  text data is analysed without a parser); writes and returns the trajectory table."""
  steps = checkpoint_steps(run)
  model, tokenizer = load_model(exported_model_dir(run))
  encoder = getattr(model, "bert", model)
  max_length = min(max_length, encoder.config.max_positions)
  roles = tuple(r for r in roles if syntax or r not in SYNTACTIC_ROLES)
  # the data is encoded once; every checkpoint sees the same batches
  encoded = []
  for spec in data:
    gold = syntax and parse_spec(spec).kind == "conllu"   # text data: no parser, no arcs
    info, batches, n = encode_spec(spec, tokenizer, max_length=max_length, batch_size=batch_size,
                                   max_examples=max_examples, syntax=gold, pad_to_batch_size=True)
    encoded.append((list(batches), n))
  _, abstract = nnx.split(encoder, nnx.Param, ...)[:2]
  target = {"bert": nnx.to_pure_dict(abstract)}
  ckpt_dir = RunDir(run).checkpoints
  rows = []
  for s in steps:
    restored, _ = restore_params_from_run(ckpt_dir, target, step=s)
    # the same graph: the cached analysis program, no recompilation
    step = make_analysis_step(with_params(encoder, restored["bert"]), roles=roles, measures=True)
    parts = [collect(step, iter(b), n, roles=roles, progress=progress, desc=f"step {s}")
             for b, n in encoded]
    sb = np.concatenate([p["sieve_bias"] for p in parts])
    ta = np.concatenate([p["token_attention"] for p in parts])
    lengths = np.concatenate([p["lengths"] for p in parts])
    entropy = np.concatenate([p["entropy"] for p in parts])
    row = {"step": int(s), **checkpoint_row(sb, ta, lengths, roles, entropy=entropy, rule=rule)}
    rows.append(row)
    log(f"step {s}: " + ", ".join(f"{k[6:]} {100 * v:.0f}%" for k, v in row.items()
                                  if k.startswith("share_")) + f", sinks {100 * row['sink_rate']:.0f}%")
  table = pd.DataFrame(rows)
  out = Path(out)
  out.mkdir(parents=True, exist_ok=True)
  table.to_csv(out / TRAJECTORY_CSV, index=False)
  plot_trajectory(table, out / TRAJECTORY_PNG, dpi=110)
  log(f"wrote {out / TRAJECTORY_CSV} and {out / TRAJECTORY_PNG}")
  return table
