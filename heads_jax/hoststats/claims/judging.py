"""Judging a claim on a run: the checks' registry, the claim's figure from ``summary.json``, the
number judge (tolerance or Wilson interval) and the comparability gates (`evaluate`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from heads_jax.data import vocabulary as vocab
from heads_jax.hoststats.claims import guan, guan_checks, pande, pande_checks
from heads_jax.hoststats.claims.claim import (
    BLOG, FAILS, GUAN, HOLDS, NOT_COMPARABLE, NOT_COMPARABLE_MODEL, NOT_COMPUTABLE, PANDE,
    PANDE_METHOD_CLAIMS, PAPER_MODELS, PAPER_ROLES, TASK_NAMES, Claim, finite, format_value, pct,
    wilson_interval)
from heads_jax.hoststats.claims.run import (
    Evaluation, NotComputable, RunFigures, low_margin_note, need_types, pande_setting,
    task_analyses)

def _from_summary(c: Claim, run: RunFigures, state: str):
  """(value, detail, n): the claim's figure, what it was computed over, and the number of
  heads / tests it is a share of (None when it is no share)."""
  if c.scope == "pooled":
    pooled = run.pooled.get(state) or {}
    v = pooled.get(c.summary_key)
    if v is None:
      raise NotComputable(f"no pooled {c.summary_key} for the {state} model")
    n = len(task_analyses(run, c, state))
    count = pooled.get("num_p_values") if c.summary_key == "share_p_between" else None
    return v, f"pooled over {n} task(s), roles {', '.join(PAPER_ROLES)}", count
  per = task_analyses(run, c, state)
  # A mean over tasks is a share of the model's heads, each counted once: the Wilson n is the
  # number of distinct heads (the tasks' analyses are of near-identical models, so their heads
  # are not independent trials).
  if c.summary_key.startswith("cluster_share:"):
    name = c.summary_key.split(":", 1)[1]
    per = {t: a for t, a in per.items() if a.clusters is not None}
    if not per:
      raise NotComputable("no clustering in the analyses")
    need_types(per, (name,))
    vals = {t: float((a.clusters == name).mean()) for t, a in per.items()}
    heads = max(per[t].num_heads for t in vals)
    return float(np.mean(list(vals.values()))), "mean over " + ", ".join(
        f"{TASK_NAMES[t]} {pct(v)}" for t, v in vals.items()) + low_margin_note(per), heads
  if c.summary_key == "cluster_stability":
    vals = {t: a.stability for t, a in per.items() if a.stability is not None}
    if not vals:
      raise NotComputable("no clustering stability in the analyses")
    heads = max(per[t].num_heads for t in vals)
    return float(np.mean(list(vals.values()))), "mean over " + ", ".join(
        f"{TASK_NAMES[t]} {pct(v)}" for t, v in vals.items()), heads
  vals = {t: ({**a.summary, **a.shares()}).get(c.summary_key) for t, a in per.items()}
  values = {t: float(v) for t, v in vals.items() if finite(v)}
  if not values:
    why = "needs a parse of the task text" if "syntactic" in c.summary_key else "not computed"
    raise NotComputable(f"{c.summary_key}: {why}")
  if c.summary_key == "share_syntactic_also_local":   # distinct heads syntactic in some task
    heads = int(np.logical_or.reduce([
        per[t].coarse()[0][..., per[t].coarse()[1].index(vocab.COARSE_SYNTACTIC)]
        for t in values]).sum())
  else:
    heads = max(per[t].num_heads for t in values)
  count = heads if c.kind == "share" else None
  fmt = (lambda v: format_value(c.kind, v))
  detail = ", ".join(f"{TASK_NAMES[t]} {fmt(v)}" for t, v in values.items())
  if c.scope == "task":
    return values[c.task], detail, count
  value = float(np.mean(list(values.values())))
  if c.scope == "range_over_tasks":
    detail = f"range {fmt(min(values.values()))} to {fmt(max(values.values()))}; " + detail
  return value, "mean over " + detail, count


Evaluator = Callable[..., tuple]


def _evaluator(c: Claim) -> Evaluator | None:
  """The check ``c.check`` names (None: the claim's figure is its ``summary_key``). A check with
  arguments ("half:cls:first") is called as ``_half(c, run, state, "cls", "first")``. Looked up
  in the checks modules' registries at each call."""
  if not c.check:
    return None
  name, *args = c.check.split(":")
  for checks in (pande_checks, guan_checks):
    if name in checks.WITH_ARGUMENTS:
      evaluate = checks.WITH_ARGUMENTS[name]
      return lambda c, run, state: evaluate(c, run, state, *args)
    if name in checks.EVALUATORS:
      return checks.EVALUATORS[name]
  raise KeyError(f"claim {c.key}: no check {name!r}")


def _measure(c: Claim, run: RunFigures, state: str
             ) -> tuple[object, bool | str | None, str, int | None]:
  """(value, holds: a bool, a verdict (`HOLDS`, `FAILS`, `UNDECIDED` of a statement judged on a
  share, `heads_jax.hoststats.claims.bars`) or None for a number judged by tolerance / interval,
  detail, n: what a share is over, or None)."""
  fn = _evaluator(c)
  if fn is None:
    value, detail, n = _from_summary(c, run, state)
    return value, None, detail, n
  out = fn(c, run, state)
  return tuple(out) + (None,) * (4 - len(out))


# Checks that do not read an analysis of the claim's model state (no pre-trained column).
_STATE_FREE = ("finetune_at_par", "stability_over_95", "stable_3_5")


def _judge_number(c: Claim, value, n) -> tuple[bool, str]:
  """Whether a number holds by the claim's tolerance or interval, and the interval in words."""
  if c.interval == "wilson":
    if not n:
      raise NotComputable("no count to put an interval on")
    scale = 100.0 if c.kind == "score" else 1.0
    lo, hi = wilson_interval(float(value) / scale, int(n))
    fmt = (lambda x: f"{100 * x:.2f}") if c.kind == "score" else pct
    return (lo - 1e-12 <= float(c.value) / scale <= hi + 1e-12,
            f"95% interval over {int(n)}: {fmt(lo)} to {fmt(hi)}")
  return abs(float(value) - float(c.value)) <= float(c.tolerance) + 1e-12, ""


def evaluate(c: Claim, run: RunFigures) -> Evaluation:
  """Judges claim ``c`` on ``run`` (module docstring; the rules in DESIGN.md section 3). Guan et
  al.'s claims are `NOT_COMPARABLE` (value shown) on a GLUE run, and so are their numbers on the
  guan pipeline with another model than theirs."""
  state = "finetuned" if c.model == "change" else c.model
  try:
    value, holds, detail, n = _measure(c, run, state)
    if holds is None:
      if not finite(value) or c.value is None:
        return Evaluation(value, NOT_COMPUTABLE, detail or "no value")
      holds, interval = _judge_number(c, value, n)
      detail = "; ".join(x for x in (detail, interval) if x)
  except NotComputable as e:
    return Evaluation(None, NOT_COMPUTABLE, str(e))
  pretrained = None
  if c.model == "finetuned" and c.check not in _STATE_FREE and not c.check.startswith("squad"):
    try:
      pretrained = _measure(dataclasses.replace(c, model="pretrained"), run, "pretrained")[0]
    except NotComputable:
      pretrained = None
  verdict = holds if isinstance(holds, str) else (HOLDS if holds else FAILS)
  if c.paper == GUAN and (run.setting == "glue" or (run.setting == "guan_other"
                                                      and c.value is not None)):
    verdict = NOT_COMPARABLE
    detail = ("Guan et al. analysed " + PAPER_MODELS[GUAN] + "; this run: "
              + ("GLUE tasks of its own models" if run.setting == "glue" else
                 "another SQuAD model") + "; " + detail)
  elif c.paper in (PANDE, BLOG):
    base, what = pande_setting(run)
    if not base and c.key in PANDE_METHOD_CLAIMS:
      detail = f"a statement about the method, judged on {what}; " + detail
    elif not base:
      verdict = NOT_COMPARABLE_MODEL
      detail = (f"a number or layer placement of Pande et al.'s BERT-base (12 layers x 12 "
                f"heads); this run: {what}; " + detail)
  return Evaluation(value, verdict, detail, pretrained)


def evaluate_all(run: RunFigures, claims_: tuple[Claim, ...] | None = None
                 ) -> list[tuple[Claim, Evaluation]]:
  """Every claim (default: Pande et al.'s, then Guan et al.'s, `heads_jax.hoststats.claims.CLAIMS`)
  judged on ``run``, in order."""
  if claims_ is None:
    claims_ = pande.CLAIMS + guan.CLAIMS
  return [(c, evaluate(c, run)) for c in claims_]
