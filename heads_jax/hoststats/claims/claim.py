"""The claim type: what a paper states, how it reads, and the vocabulary of verdicts.

A `Claim` holds the paper's value *as printed* (``printed``, e.g. "73.43%") and as a number
(``value``; None for a statement), the model state it is about (``model``: Pande et al. analyse
each task's *fine-tuned* model: "For each task, we feed all the input sequences to the
fine-tuned BERTBASE model and compute the sieve bias score" (section "Assigning functional roles
to heads"); only Fig. 6 compares with the pre-trained model), the tasks, the section / figure /
table and the quoted sentence, how this run's value is computed (``measure``) and the verdict
rule (``rule``). The papers' claims are in `heads_jax.hoststats.claims.pande` and `.guan`;
`heads_jax.hoststats.claims.judging` applies the rules.

Host-only module (numpy); no jax.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from heads_jax.data import vocabulary as vocab
from heads_jax.hoststats import intervals
from heads_jax.hoststats import roles as roles_lib

PANDE = "Pande et al. 2021 (AAAI; arXiv 2101.09115)"
BLOG = "Pande 2021, blog post on the paper"
GUAN = "Guan et al. 2020 (COLING; arXiv 2011.00943)"
DEVLIN = "Devlin et al. 2019 (NAACL; arXiv 1810.04805)"
PAPERS = (PANDE, BLOG, GUAN)
# The plain-text copy each claim's ``quote`` comes from (shared/papers/).
PAPER_FILES = {PANDE: "pande2021_heads_hypothesis.txt", BLOG: "pande2021_blog.txt",
               GUAN: "guan2020_how_far_does_bert_look_at.txt"}
# What each paper analysed.
PAPER_MODELS = {
    PANDE: "BERT-base (12 layers x 12 heads) pre-trained by the authors, fine-tuned per GLUE task; "
           "1000 test sequences per task",
    BLOG: "as the paper",
    GUAN: "BERT-large, whole-word masking, fine-tuned on SQuAD "
          "(bert-large-uncased-whole-word-masking-finetuned-squad; 24 layers x 16 heads = 384 "
          "heads); 1,000 SQuAD samples",
}

TASKS = ("mrpc", "qqp", "sst2", "qnli")
PAIR_TASKS = ("mrpc", "qqp", "qnli")
TASK_NAMES = {"mrpc": "MRPC", "qqp": "QQP", "sst2": "SST-2", "qnli": "QNLI",
              # more GLUE (reproduce runs them; no claim of the papers is about them)
              "mnli": "MNLI", "rte": "RTE", "cola": "CoLA", "stsb": "STS-B", "wnli": "WNLI",
              "squad": "SQuAD"}
BERT_BASE_LAYERS = 12

# kind: how a value reads.
#   share  a fraction 0..1 (shown as %); difference in percentage points
#   float  a number
#   corr   a correlation coefficient
#   count  a number of heads
#   score  a task score in percent as the paper prints it (EM / F1 of SQuAD: 82.85)
#   text   a statement: no number in the paper; this run's "value" is what the rule measured
KINDS = ("share", "float", "corr", "count", "score", "text")
# model: the model state the paper's statement is about.
#   finetuned  each task's fine-tuned model on its own task's sequences (Pande Figs. 3-5)
#   pretrained the pre-trained model
#   change     fine-tuned minus pre-trained on the same sequences (Pande Fig. 6)
MODELS = ("finetuned", "pretrained", "change")
# scope: how the tasks' values combine ("pooled": all tasks' scores / p-values together,
# "mean_over_tasks", "range_over_tasks", "task": one task, "tasks": the rule reads each task).
SCOPES = ("pooled", "mean_over_tasks", "range_over_tasks", "task", "tasks")

HOLDS = "holds"
FAILS = "does not hold"
NOT_COMPUTABLE = "not computable here"
# A statement judged on a share whose bar (or base rate) lies inside the share's 95% interval:
# the sample cannot tell (`heads_jax.hoststats.claims.bars`).
UNDECIDED = "undecided at this n"
# A Guan et al. claim measured on another model and other data (a GLUE run of a small model, or
# the guan pipeline on a model other than theirs): the value is shown, no verdict is given.
NOT_COMPARABLE = "not comparable (other model and data)"
# A number or a layer placement Pande et al. measured on BERT-base, on a run of another model
# (`RunFigures.pande_model`): the value is shown, no verdict (statements about the method,
# `PANDE_METHOD_CLAIMS`, are still judged and say what they were judged on).
NOT_COMPARABLE_MODEL = "not comparable (other model)"
VERDICTS = (HOLDS, FAILS, UNDECIDED, NOT_COMPUTABLE, NOT_COMPARABLE, NOT_COMPARABLE_MODEL)
# Pande et al.'s statements about the method (overlaps of roles, averages against the test, the
# direction of the changes fine-tuning makes): judged on any model. Every other claim of
# Pande et al. and the blog is a number or a layer placement of BERT-base.
PANDE_METHOD_CLAIMS = ("average_vs_test", "nsubj_next_local", "obj_prev_local",
                       "delimiter_intersect", "multi_functional", "block_marginal_overlap",
                       "finetune_delimiter_final_drop", "finetune_sep_not_cls",
                       "finetune_block_final_rise", "finetune_initial_middle_stable",
                       "finetune_delimiter_heads_drop")
# Guan et al.'s model, the one their numbers are about: 24 layers x 16 heads.
GUAN_SHAPE = (24, 16)
# The bar of both stability statements (Guan et al.: "over 95% attention heads are clustered
# stably"), read on the mean over the clusterings a statement names: their own Table 1 averages
# 95.65% (one model, MNLI, at 94.37%), so their table passes their sentence.
STABLE_BAR = 0.95
# Fig. 2's case needs a gap around tau: a mean at least tau + FIG2_GAP with a median at most
# tau - FIG2_GAP (sieve bias units); a mean or median within the gap is noise at the threshold.
FIG2_GAP = 0.5
# The one-sided level of every significance the rules ask for ("significant", a classifier
# beating its majority class): 5%, the paper's alpha ("the null hypothesis is rejected if the
# p-value is smaller than 0.05").
ALPHA = 0.05
# Settings a run can be in (`RunFigures.setting`): "glue" (reproduce: GLUE tasks, the run's own
# models), "guan" (the guan pipeline on Guan et al.'s model), "guan_other" (the guan pipeline on
# another SQuAD model: Guan's statements are judged, their numbers are not comparable).
SETTINGS = ("glue", "guan", "guan_other")
Z95 = 1.959963984540054   # two-sided 95% normal quantile (the Wilson interval)

# The roles pooled for the paper's Fig. 3 numbers (mean sieve score, tau, p-values in the band):
# the four functional roles the paper tests ("Note that we perform this hypothesis test
# independently for all heads and the four functional roles", section "Assigning functional
# roles to heads"; Fig. 3 caption: "144 x |tasks| x |roles| x |num sents| scores").
PAPER_ROLES = roles_lib.PAPER_ROLES
# The roles of the paper's Fig. 5 ("we have split the delimiter role into [SEP] and [CLS] roles.
# Similarly, we have split the syntactic role into nsubj, dobj, amod and advmod roles").
FIG5_DELIMITER = tuple(r for r in vocab.GRID_ROLES if vocab.role(r).group == vocab.COARSE_DELIMITER)
FIG5_SYNTACTIC = tuple(r for r in vocab.GRID_ROLES if vocab.role(r).group == vocab.COARSE_SYNTACTIC)
FIG5_ROLES = vocab.GRID_ROLES


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim of a paper (see the module docstring).

  key: stable identifier (tables, JSON, tests).
  paper: `PANDE`, `BLOG` or `GUAN`.
  text: the claim in words.
  value: the paper's number (a fraction for shares), None for a statement.
  kind: one of `KINDS`.
  summary_key: the ``summary.json`` key the claim's number is (None when it is not one).
  model: the model state the paper's value is about (`MODELS`).
  scope: how the tasks combine (`SCOPES`).
  source: section / figure / table of the paper.
  task: the one task of a per-task claim.
  value_range: (low, high) where the paper gives a range.
  verified: what was checked against the paper's text.
  note: what a reader must know (a typo, a cross-model comparison, an ambiguity).
  printed: the value exactly as the paper prints it.
  quote: the sentence the claim rests on (from `PAPER_FILES`).
  tasks: the tasks the claim is about (default: all four).
  measure: how this run's value is computed.
  rule: the verdict rule in words.
  tolerance: numbers: holds when ``|this run - value| <= tolerance`` (a fraction for shares).
  interval: "wilson": a share (of heads, tests or questions) holds when the paper's value lies
    in the 95% Wilson interval of this run's share over its n (`wilson_interval`): heads are a
    sample of 144 (or 72, 384, ...), so the interval is the share's sampling uncertainty.
  check: the evaluator (`EVALUATORS`); "" = the ``summary_key`` figure of the claim's model.
  layers: BERT-base layer ranges the rule reads, ``{name: (first, last)}``.
  """
  key: str
  paper: str
  text: str
  value: float | None
  kind: str
  summary_key: str | None
  model: str
  scope: str
  source: str
  task: str | None = None
  value_range: tuple[float, float] | None = None
  verified: str = ""
  note: str = ""
  printed: str = ""
  quote: str = ""
  tasks: tuple[str, ...] = TASKS
  measure: str = ""
  rule: str = ""
  tolerance: float | None = None
  interval: str = ""
  check: str = ""
  layers: tuple[tuple[str, tuple[int, int]], ...] = ()

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"claim {self.key}: kind {self.kind!r} is not one of {KINDS}")
    if self.model not in MODELS:
      raise ValueError(f"claim {self.key}: model must be one of {MODELS}")
    if self.scope not in SCOPES:
      raise ValueError(f"claim {self.key}: scope must be one of {SCOPES}")
    if self.paper not in PAPERS:
      raise ValueError(f"claim {self.key}: paper must be one of {PAPERS}")
    if self.value is not None and self.tolerance is None and not self.interval and not self.check:
      raise ValueError(f"claim {self.key}: a number needs a tolerance, an interval or a check")
    if self.interval not in ("", "wilson"):
      raise ValueError(f"claim {self.key}: interval must be '' or 'wilson'")
    if not self.quote or not self.rule:
      raise ValueError(f"claim {self.key}: every claim quotes its sentence and states its rule")

  @property
  def source_file(self) -> str:
    return PAPER_FILES[self.paper]

  def as_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["value_range"] = list(self.value_range) if self.value_range else None
    d["tasks"] = list(self.tasks)
    d["layers"] = {k: list(v) for k, v in self.layers}
    d["source_file"] = self.source_file
    return d



def wilson_rule(of: str = "heads") -> str:
  return (f"holds when the paper's value lies in the 95% Wilson interval of this run's share over "
          f"its number of {of} (the share's sampling uncertainty; no fixed tolerance)")


def wilson_interval(share: float, n: int, z: float = Z95) -> tuple[float, float]:
  """The Wilson score interval of a binomial share observed over ``n`` trials (two-sided, 95%
  by default; `heads_jax.hoststats.intervals.wilson_interval` of ``share * n`` successes, the
  share clipped to [0, 1]). ``n`` = 0 gives (0, 1)."""
  if n <= 0:
    return 0.0, 1.0
  p = min(max(float(share), 0.0), 1.0)
  lo, hi = intervals.wilson_interval(p * n, n, z)
  return max(0.0, lo), min(1.0, hi)


# ------------------------------------------------------------------------------------------------
# formatting


def finite(x) -> bool:
  return (isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
          and math.isfinite(float(x)))


def difference(c: Claim, this_run) -> float | None:
  """This run's value minus the paper's (shares in percentage points); None for statements or
  when either side is missing."""
  if c.kind == "text" or not finite(this_run) or c.value is None:
    return None
  d = float(this_run) - float(c.value)
  return 100.0 * d if c.kind == "share" else d


def format_value(kind: str, value) -> str:
  """A value as the report prints it."""
  if value is None or (isinstance(value, float) and not math.isfinite(value)):
    return "n/a"
  if isinstance(value, str):
    return value
  if kind == "share":
    return f"{100 * value:.1f}%"
  if kind == "score":
    return f"{value:.2f}"
  if kind == "corr":
    return f"{value:.2f}"
  if kind == "count":
    return f"{int(value)}"
  return f"{value:.2f}"


def format_paper_value(c: Claim) -> str:
  """The paper's value as printed (a statement: "(statement)")."""
  if c.printed:
    return c.printed
  if c.value is None:
    return "(statement)"
  text = format_value(c.kind, c.value)
  if c.value_range:
    lo, hi = c.value_range
    text += f" ({format_value(c.kind, lo)} to {format_value(c.kind, hi)})"
  return text


def format_difference(c: Claim, diff) -> str:
  if diff is None:
    return ""
  if c.kind in ("share", "score"):
    return f"{diff:+.1f} pp"
  return f"{diff:+.2f}"


def pct(x) -> str:
  return format_value("share", x)
