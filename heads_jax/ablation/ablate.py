"""Ablation tables (Guan et al. 2020, Tables 2 and 3) on an ``Evaluator``.

``ablate_groups``: for each group of heads (a cluster type, a role, a layer, a list), the
classifier's metrics with the group removed (``mode="remove"``: gate 0, the heads' outputs are
dropped), replaced by uniform attention over the real tokens (``mode="uniform"``) or by their
mean output over the data (``mode="mean"``: ``heads_jax.ablation.causal.GroupEvaluator``), the change
against the unablated model, and for fairness the mean change when random groups with the same
number of heads in each of the group's layers are ablated the same way (``random_seeds`` draws of
``heads_jax.ablation.causal.matched_random_groups``, the one random baseline of heads_jax: the
harm of removing a head depends much on its layer, so a group in given layers is compared with
heads of those layers; a group of whole layers has none, its random columns empty).

``ablate_segments``: for each group, the metrics with the group's intra-sentence attention
(query and key in the same segment, by token type) or inter-sentence attention removed (Guan
et al. Table 3). Guan et al. do not say whether the remaining attention of a row is
renormalised; heads_jax does not renormalise it unless ``renormalise=True`` (its choice); the table's ``renormalised`` column says which was used. On single-text
tasks every pair is intra-sentence, so inter removal changes nothing there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from heads_jax.ablation.causal import GroupEvaluator, layer_counts, matched_random_groups
from heads_jax.ablation.groups import (SEGMENT_PARTS, HeadGroup, format_heads, gate_for,
                                       segment_removal_for)
from heads_jax.errors import UserError
from heads_jax.report.ablation import value_text

ABLATION_MODES = ("remove", "uniform", "mean")
METRIC_COLUMNS = ("accuracy", "f1", "loss")


def metric_columns(evaluator) -> tuple[str, ...]:
  """The metrics an evaluator reports: ``METRIC_COLUMNS`` for a GLUE classifier, exact match
  and F1 for SQuAD (``evaluate.SquadEvaluator.metric_columns``)."""
  return tuple(getattr(evaluator, "metric_columns", METRIC_COLUMNS))


def _metrics_row(metrics: dict, base: dict, prefix: str = "", columns=METRIC_COLUMNS) -> dict:
  row = {}
  for m in columns:
    row[f"{prefix}{m}"] = metrics[m]
    row[f"{prefix}{m}_change"] = metrics[m] - base[m]
  return row


def _random_rows(evaluate, heads, L: int, H: int, seeds: int, seed: int,
                 columns=METRIC_COLUMNS) -> dict:
  """Mean and standard deviation of each metric over ``seeds`` random groups of the layers of
  ``heads`` (`causal.matched_random_groups`); {} when there are none (no seeds, no heads, whole
  layers)."""
  drawn = matched_random_groups(heads, L, H, seeds, seed)
  if not drawn:
    return {}
  values = {m: [] for m in columns}
  for group in drawn:
    metrics = evaluate(group.heads)
    for m in columns:
      values[m].append(metrics[m])
  out = {}
  for m in columns:
    out[f"random_{m}"] = float(np.mean(values[m]))
    out[f"random_{m}_std"] = float(np.std(values[m]))
  return out


def _with_random_change(row: dict, base: dict, columns=METRIC_COLUMNS) -> dict:
  for m in columns:
    if f"random_{m}" in row:
      row[f"random_{m}_change"] = row[f"random_{m}"] - base[m]
  return row


def ablate_groups(evaluator, groups: list[HeadGroup], *, mode: str = "remove",
                  random_seeds: int = 3, seed: int = 0, base: dict | None = None,
                  log=None) -> pd.DataFrame:
  """Table of group ablations (see the module docstring).

  Columns: group, kind, num_heads, ablation (the mode), accuracy, accuracy_change, f1,
  f1_change, loss, loss_change, random_accuracy, random_accuracy_std, random_accuracy_change
  (and the same for f1 and loss; empty for a group of whole layers), random_seeds (the random
  groups drawn: 0 where there are none), heads; fractions, as every file. The first row is the
  unablated model.
  """
  if mode not in ABLATION_MODES:
    raise UserError(f"--mode must be one of {ABLATION_MODES}, got {mode!r}")
  L, H = evaluator.num_layers, evaluator.num_heads
  cols = metric_columns(evaluator)
  log = log or (lambda *_: None)
  base = base or evaluator.evaluate()

  if mode == "mean" and cols != METRIC_COLUMNS:
    raise UserError("--mode mean needs a GLUE classifier; a SQuAD model is ablated with "
                    "--mode remove or uniform")
  if mode == "mean":
    evaluate = GroupEvaluator(evaluator, "mean").evaluate
  else:
    def evaluate(heads):
      return evaluator.evaluate(gate_for(heads, L, H), gate_mode=mode)

  rows = [_baseline_row(base, cols)]
  rows += _group_rows(evaluate, groups, base, ablation=mode, cols=cols, shape=(L, H),
                      random_seeds=random_seeds, seed=seed, log=log,
                      say=lambda g: f"{mode} {g.kind} {g.name!r} ({len(g)} heads)")
  return pd.DataFrame(rows)


def _baseline_row(base: dict, cols, **extra) -> dict:
  """The unablated row of a group table (``extra``: columns after ``ablation``)."""
  return dict(group="none (unablated)", kind="baseline", num_heads=0, ablation="none", **extra,
              **_metrics_row(base, base, columns=cols), random_seeds=0, heads="")


def _group_rows(evaluate, groups, base: dict, *, ablation: str, cols, shape, random_seeds: int,
                seed: int, log, say, **extra) -> list[dict]:
  """One row per group: ``evaluate(heads)``'s metrics against ``base``, the mean of random
  groups of the same layers (``random_seeds`` of them, computed once per layer distribution)
  and their change; logs ``say(group)`` with the first metric, in the unit a person reads
  (`report.ablation.value_text`). ``extra``: columns after ``ablation``."""
  (L, H), first = shape, cols[0]
  rows, cache = [], {}
  none = {f"random_{m}{s}": np.nan for m in cols for s in ("", "_std")} if random_seeds else {}
  for g in groups:
    metrics = evaluate(g.heads) if len(g) else base
    row = dict(group=g.name, kind=g.kind, num_heads=len(g), ablation=ablation, **extra,
               **_metrics_row(metrics, base, columns=cols))
    key = tuple(layer_counts(g.heads).items())
    if key not in cache:
      cache[key] = _random_rows(evaluate, g.heads, L, H, random_seeds, seed, cols)
    row.update(cache[key] or none)   # none drawn: empty columns, not absent ones
    row["random_seeds"] = random_seeds if cache[key] else 0
    row["heads"] = format_heads(g.heads)
    rows.append(_with_random_change(row, base, cols))
    random = (f", random {value_text(first, row['random_' + first] - base[first], change=True)}"
              if cache[key] else ", random n/a (whole layers)" if len(g) and random_seeds else "")
    log(f"{say(g)}: {first} {value_text(first, metrics[first])} "
        f"({value_text(first, metrics[first] - base[first], change=True)}{random})")
  return rows


def ablate_segments(evaluator, groups: list[HeadGroup], *, parts=SEGMENT_PARTS,
                    renormalise: bool = False, random_seeds: int = 3, seed: int = 0,
                    base: dict | None = None, log=None) -> pd.DataFrame:
  """Table of intra-/inter-sentence attention removal per group (Guan et al. Table 3).

  Columns as ``ablate_groups`` with ``ablation`` = ``intra`` or ``inter`` and a
  ``renormalised`` column.
  """
  parts = (parts,) if isinstance(parts, str) else tuple(parts)
  bad = [p for p in parts if p not in SEGMENT_PARTS]
  if bad:
    raise UserError(f"--cross must be intra, inter or both; got {bad}")
  L, H = evaluator.num_layers, evaluator.num_heads
  cols = metric_columns(evaluator)
  log = log or (lambda *_: None)
  base = base or evaluator.evaluate()
  rows = [_baseline_row(base, cols, renormalised=bool(renormalise))]
  for part in parts:

    def evaluate(heads, part=part):
      return evaluator.evaluate(segment_removal=segment_removal_for(heads, L, H, part),
                                renormalise=renormalise)
    rows += _group_rows(
        evaluate, groups, base, ablation=part, cols=cols, shape=(L, H),
        random_seeds=random_seeds, seed=seed, log=log, renormalised=bool(renormalise),
        say=lambda g, part=part: f"remove {part}-sentence attention of {g.kind} {g.name!r} "
                                 f"({len(g)} heads)")
  return pd.DataFrame(rows)
