"""A run's analyses as the claims read them (`Analysis`, `RunFigures`), what judging one claim
gives (`Evaluation`), and the helpers every check shares: the layer scaling, the model setting,
the tasks' analyses of a claim, the pre-trained / fine-tuned pairs of Fig. 6.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from heads_jax.hoststats.claims.claim import (
    ALPHA, BERT_BASE_LAYERS, GUAN, PAPER_ROLES, SETTINGS, TASK_NAMES, Claim, pct)
from heads_jax.hoststats.claims.guan import CLUSTER_TYPES

@dataclasses.dataclass
class Analysis:
  """One analysis (a model on one task's sequences) as the claims read it.

  roles: the r role names of the run.
  assigned: bool ``[l, h, r]``, the paper's rule (mean sieve bias significantly above tau).
  means: float ``[l, h, r]``, each head's mean sieve bias per role (NaN where undefined).
  tau: the tau of the tests.
  summary: the figures of `heads_jax.hoststats.summary.summary_figures` under the paper's rule
    (``share_delimiter``, ``spearman_local_syntactic``, ...).
  clusters: str ``[l, h]`` cluster type per head, or None.
  stability: the clustering's stability, or None.
  medians: float ``[l, h, r]``, each head's median sieve bias per role (None when not read).
  features: float ``[l, h, 21]``, each head's mean distance features (attention masses; from
    clusters.csv), or None.
  cluster_info: the clustering's info dict (method, seed, n_init, ...), or None.
  entropy: float ``[l, h]``, each head's mean row entropy (natural log; measures.npz, the factor
    that turns block_plain into block), or None.
  """
  roles: tuple[str, ...]
  assigned: np.ndarray
  means: np.ndarray
  tau: float
  summary: dict = dataclasses.field(default_factory=dict)
  clusters: np.ndarray | None = None
  stability: float | None = None
  medians: np.ndarray | None = None
  features: np.ndarray | None = None
  cluster_info: dict | None = None
  entropy: np.ndarray | None = None

  def role(self, name: str) -> np.ndarray | None:
    """bool ``[l, h]`` of one role, None when the run did not test it."""
    return self.assigned[..., self.roles.index(name)] if name in self.roles else None

  def any_of(self, names) -> np.ndarray | None:
    """bool ``[l, h]``: heads with any of ``names`` (those the run tested); None if none was."""
    have = [n for n in names if n in self.roles]
    if not have:
      return None
    return self.assigned[..., [self.roles.index(n) for n in have]].any(-1)

  def count_of(self, names) -> np.ndarray | None:
    """int ``[l, h]``: how many of ``names`` each head has (None when none was tested)."""
    have = [n for n in names if n in self.roles]
    if not have:
      return None
    return self.assigned[..., [self.roles.index(n) for n in have]].sum(-1)

  def coarse(self) -> tuple[np.ndarray, tuple[str, ...]]:
    """bool ``[l, h, c]``: the four coarse tests (`PAPER_ROLES`) the run has, and their names."""
    names = tuple(r for r in PAPER_ROLES if r in self.roles)
    if not names:
      return np.zeros(self.assigned.shape[:2] + (0,), bool), names
    return self.assigned[..., [self.roles.index(r) for r in names]], names

  @property
  def num_layers(self) -> int:
    return self.assigned.shape[0]

  @property
  def num_heads(self) -> int:
    """All heads of the model, l * h."""
    return int(self.assigned.shape[0] * self.assigned.shape[1])

  def shares(self) -> dict:
    """Shares of all heads with each coarse role (the four tests), with none (``unskilled``), and
    of syntactic heads that are also local (None where a role was not tested / no syntactic
    head): the keys of ``summary.json``, recomputed from ``assigned``."""
    coarse, names = self.coarse()
    n = coarse.shape[0] * coarse.shape[1]
    out = {f"share_{c}": (float(coarse[..., names.index(c)].sum() / n) if c in names else None)
           for c in PAPER_ROLES}
    out["share_unskilled"] = float((~coarse.any(-1)).sum() / n)
    out["share_syntactic_also_local"] = None
    if "syntactic" in names and "local" in names:
      syn = coarse[..., names.index("syntactic")]
      if syn.any():
        out["share_syntactic_also_local"] = float(
            (syn & coarse[..., names.index("local")]).sum() / syn.sum())
    return out


@dataclasses.dataclass
class RunFigures:
  """What `evaluate` reads of a run.

  tasks: the tasks run.
  analyses: ``{"pretrained" | "finetuned": {task: Analysis}}``.
  pooled: ``{"pretrained" | "finetuned": {"mean_sieve_score", "auto_tau", "share_p_between"}}``
    over the paper's roles (`heads_jax.hoststats.summary.paper_pool`).
  finetune: ``{task: {metric: best dev score}}``.
  setting: `SETTINGS`: "glue" (reproduce), "guan" (the guan pipeline on Guan et al.'s model),
    "guan_other" (the guan pipeline on another model).
  squad: the guan pipeline's Tables 2-3 on the SQuAD model: ``{"rows": {id: {"exact_match",
    "f1", "missing": the types the row needs that the clustering left unnamed}} (percent), "n":
    evaluated questions}``, or None.
  model: the analysed model in words (the details say what a statement was judged on).
  bert_base: whether the analysed models are BERT-base, Pande et al.'s model, from their config
    (`heads_jax.report.reproduce.is_bert_base`); None: not known, so not (never the shape alone).

  ``finetune[task]`` may hold, beside the dev scores, ``majority`` (the share of the dev
  examples in their most frequent class) and ``n`` (their number): a fine-tuning verdict needs
  the classifier's accuracy to beat the majority class (one-sided binomial test, p < 0.05).
  """
  tasks: tuple[str, ...]
  analyses: Mapping[str, Mapping[str, Analysis]]
  pooled: Mapping[str, Mapping] = dataclasses.field(default_factory=dict)
  finetune: Mapping[str, Mapping] = dataclasses.field(default_factory=dict)
  setting: str = "glue"
  squad: Mapping | None = None
  model: str = ""
  bert_base: bool | None = None

  def __post_init__(self):
    if self.setting not in SETTINGS:
      raise ValueError(f"setting must be one of {SETTINGS}; got {self.setting!r}")


@dataclasses.dataclass
class Evaluation:
  """One claim judged on a run: ``value`` (this run, the claim's model state), ``pretrained``
  (the same measure on the pre-trained analyses, where it applies), ``verdict`` (`VERDICTS`) and
  ``detail`` (what was computed over, or why it could not be)."""
  value: object
  verdict: str
  detail: str
  pretrained: object = None


def bert_base_layers(first: int, last: int, num_layers: int) -> tuple[int, ...]:
  """The layers of an L-layer model that stand for BERT-base layers ``first..last`` (from 0):
  those at least half of whose depth share ``[l / L, (l + 1) / L)`` lies in
  ``[first / 12, (last + 1) / 12)``. Identity for L = 12."""
  lo, hi = first / BERT_BASE_LAYERS, (last + 1) / BERT_BASE_LAYERS
  out = []
  for layer in range(num_layers):
    a, b = layer / num_layers, (layer + 1) / num_layers
    overlap = max(0.0, min(b, hi) - max(a, lo))
    if overlap >= 0.5 * (b - a) - 1e-9:
      out.append(layer)
  return tuple(out)


def claim_layers(c: Claim, name: str, num_layers: int) -> tuple[int, ...]:
  first, last = dict(c.layers)[name]
  return bert_base_layers(first, last, num_layers)


def scaled_note(num_layers: int) -> str:
  return "" if num_layers == BERT_BASE_LAYERS else f" (scaled to {num_layers} layers)"


class NotComputable(Exception):
  """Raised by an evaluator with the reason a claim cannot be judged on this run."""


def _shapes(run: RunFigures) -> list[tuple[int, int]]:
  return sorted({tuple(int(x) for x in a.assigned.shape[:2])
                 for per in run.analyses.values() for a in per.values()})


def pande_setting(run: RunFigures) -> tuple[bool, str]:
  """Whether the run's models are Pande et al.'s BERT-base (``run.bert_base``, decided from the
  model's config: never from the shape alone, any 12 x 12 model is not BERT-base; None is not
  known to be), and the models in words: the name and the shape."""
  shapes = _shapes(run)
  what = (run.model + " " if run.model else "") + ("(" + ", ".join(
      f"{l} layers x {h} heads" for l, h in shapes) + ")" if shapes else "")
  return bool(run.bert_base), what.strip() or "this run's model"


def unnamed_types(a: "Analysis") -> list[str] | None:
  """The Guan types an analysis's clustering leaves unnamed (their definition is not met by any
  cluster: `heads_jax.hoststats.clustering`), all four for a clustering with k != 4; None
  without a clustering."""
  if a.clusters is None:
    return None
  names = {str(n) for n in np.asarray(a.clusters).ravel()}
  if any(n.startswith("cluster ") for n in names):
    return list(CLUSTER_TYPES)
  return [t for t in CLUSTER_TYPES if t not in names]


def _closest(a: "Analysis", t: str) -> str:
  """The unnamed cluster closest to type ``t`` in words (its name carries the margin)."""
  names = {str(n) for n in np.asarray(a.clusters).ravel()}
  hit = [n for n in names if n.startswith(f"unnamed (closest: {t},")]
  return hit[0] if hit else "no cluster"


def low_margin_note(per: Mapping[str, "Analysis"]) -> str:
  """"; low margin: MRPC dense, ..." for the clusterings of ``per`` whose names lie within one
  spread of their runner-up (the clustering's ``low_margin``, `heads_jax.hoststats.clustering`:
  it gates no name, so every verdict that reads the names shows it); "" when none."""
  out = [f"{TASK_NAMES.get(t, t)} {', '.join(map(str, low))}" for t, a in per.items()
         if (low := (a.cluster_info or {}).get("low_margin"))]
  return "; low margin (a name within one spread of the next type): " + "; ".join(out) if out else ""


def need_types(per: Mapping[str, "Analysis"], types) -> None:
  """NotComputable("type X: definition not met ...") when a clustering of ``per`` leaves one of
  ``types`` unnamed."""
  for task, a in per.items():
    missing = unnamed_types(a)
    if missing is None:
      raise NotComputable("no clustering in the analyses")
    bad = [t for t in types if t in missing]
    if bad:
      raise NotComputable(f"type {bad[0]}: definition not met ({TASK_NAMES.get(task, task)} "
                          f"model: {_closest(a, bad[0])})")


def beats_majority(scores: Mapping | None) -> tuple[bool | None, str]:
  """Whether a classifier's dev accuracy beats its majority class (one-sided exact binomial
  test against the majority share, p < `ALPHA`), and the figures in words; None when the
  scores lack the accuracy, the majority share or the number of examples."""
  scores = scores or {}
  acc, majority, n = scores.get("accuracy"), scores.get("majority"), scores.get("n")
  if acc is None or majority is None or not n:
    return None, "no majority-class baseline recorded"
  from scipy import stats as sp_stats
  k = int(round(float(acc) * int(n)))
  p = float(sp_stats.binomtest(k, int(n), float(majority), alternative="greater").pvalue)
  return p < ALPHA, (f"accuracy {pct(float(acc))} vs majority class {pct(float(majority))} "
                     f"of {int(n)}, p = {p:.2g}")


def task_analyses(run: RunFigures, c: Claim, state: str) -> dict[str, Analysis]:
  """The claim's tasks' analyses of one model state; NotComputable when there are none. In the
  guan pipeline, Guan et al.'s claims about "the" model (section 4) read the SQuAD model's
  analysis only (the further models are for Table 1 and Fig. 4)."""
  per = run.analyses.get(state, {})
  out = {t: per[t] for t in c.tasks if t in per and t in run.tasks}
  if (run.setting != "glue" and c.paper == GUAN and "squad" in out and c.scope != "task"
      and c.check not in ("stability_over_95", "cluster_similar", "cluster_kept")):
    out = {"squad": out["squad"]}
  if not out:
    raise NotComputable("the run has no " + ("analysis" if not c.tasks else
                        ", ".join(TASK_NAMES.get(t, t) for t in c.tasks) + " analysis")
                        + f" of the {state} model")
  return out


def need(value, what: str):
  if value is None:
    raise NotComputable(f"{what} not tested in this run")
  return value


def change_pairs(c, run) -> dict[str, tuple[Analysis, Analysis]]:
  """Per task, (pre-trained, fine-tuned) analyses of the same sequences: a fine-tuned model is
  set against the pre-trained model's analysis of its own task's data only (in the guan
  pipeline the pre-trained model was analysed on the SQuAD samples, so the MRPC and MNLI models
  are not set against it). On a GLUE run a task whose classifier does not beat its majority
  class (`beats_majority`) is left out: its "fine-tuned" model is the pre-trained one with a
  constant head, and its changes say nothing about fine-tuning."""
  before = run.analyses.get("pretrained", {})
  after = run.analyses.get("finetuned", {})
  tasks = [t for t in c.tasks if t in after and t in run.tasks]
  out = {t: (before[t], after[t]) for t in tasks if t in before}
  dropped = {}
  if run.setting == "glue":
    for t in list(out):
      ok, why = beats_majority(run.finetune.get(t))
      if not ok:
        dropped[t] = why
        del out[t]
  if not out:
    if dropped:
      raise NotComputable("classifier at the majority-class baseline: " + "; ".join(
          f"{TASK_NAMES.get(t, t)} {why}" for t, why in dropped.items()))
    other = [TASK_NAMES.get(t, t) for t in tasks if t not in before]
    raise NotComputable("needs the pre-trained and the fine-tuned analyses of the same task's "
                        "data" + (f" ({', '.join(other)}: the pre-trained model was not "
                                  "analysed on their data)" if other else ""))
  return out
