"""Every claim of the two papers heads_jax reproduces, and how a run is judged against each.

Sources (full text in ``shared/papers/``, see its README; each claim quotes its sentence):

* `PANDE`: Pande et al., "The heads hypothesis", AAAI 2021 (``pande2021_heads_hypothesis.txt``)
  and the first author's blog post (`BLOG`, ``pande2021_blog.txt``);
* `GUAN`: Guan et al., "How far does BERT look at", COLING 2020
  (``guan2020_how_far_does_bert_look_at.txt``);
* `DEVLIN`: Devlin et al. 2019 (BERT-base GLUE scores the fine-tuned models are set beside).

A `Claim` holds the paper's value *as printed* (``printed``, e.g. "73.43%") and as a number
(``value``; None for a statement), the model state it is about (``model``: Pande et al. analyse
each task's *fine-tuned* model: "For each task, we feed all the input sequences to the
fine-tuned BERTBASE model and compute the sieve bias score" (section "Assigning functional roles
to heads"); only Fig. 6 compares with the pre-trained model), the tasks, the section / figure /
table and the quoted sentence, how this run's value is computed (``measure``) and the verdict
rule (``rule``). DESIGN.md section 3 ("Verdicts") lists the rules; `evaluate` applies them to a
run's analyses (`RunFigures`, built by `heads_jax.report.reproduce`).

Verdicts: `HOLDS`, `FAILS` ("does not hold"), `NOT_COMPUTABLE` ("not computable here", with
the reason) or `NOT_COMPARABLE` (Guan et al.'s claims outside their setting: a GLUE run of other
models, or their numbers on another SQuAD model; the value is shown). Shares hold when the
paper's value lies in the 95% Wilson interval of this run's share over its heads / tests /
questions (``interval="wilson"``, `wilson_interval`); other numbers when within the claim's
``tolerance``; statements by their written rule, each of which a constructed run can fail
(tests/hoststats/test_paper_rules.py). EM and F1 are in percent, as the papers print them.

Layers. The papers number layers from 0 (Pande et al.: "block heads are prevalent in the zeroth
layer"); their layer ranges are BERT-base's 12 layers. For a model with L layers a layer range
a..b of BERT-base becomes the model layers at least half of whose depth share lies inside
[a/12, (b+1)/12) (`bert_base_layers`; identity for L = 12; for L = 6, "layers 6 to 8" are layers
3 and 4); such a verdict says "scaled".

Host-only module (numpy); no jax.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

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
# A Guan et al. claim measured on another model and other data (a GLUE run of a small model, or
# the guan pipeline on a model other than theirs): the value is shown, no verdict is given.
NOT_COMPARABLE = "not comparable (other model and data)"
# A number or a layer placement Pande et al. measured on BERT-base, on a run of another model
# (`RunFigures.pande_model`): the value is shown, no verdict (statements about the method,
# `PANDE_METHOD_CLAIMS`, are still judged and say what they were judged on).
NOT_COMPARABLE_MODEL = "not comparable (other model)"
VERDICTS = (HOLDS, FAILS, NOT_COMPUTABLE, NOT_COMPARABLE, NOT_COMPARABLE_MODEL)
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

_CROSS_MODEL = ("Guan et al. analysed " + PAPER_MODELS[GUAN] + "; judged only on the guan "
                "pipeline with their model (elsewhere: not comparable, the value shown)")
# Guan et al.'s claims read the SQuAD model's analysis where the run has one (the guan
# pipeline), else each GLUE task's (reproduce; then not comparable).
GUAN_TASKS = ("squad",) + TASKS + ("mnli",)
_SCALED = "layer ranges are BERT-base's (12 layers, from 0), scaled to the run's depth"


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


def _share_rule(tol_pp: float) -> str:
  return f"holds when this run's value is within {tol_pp:g} percentage points of the paper's"


def _wilson_rule(of: str = "heads") -> str:
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


_FT = "each task's fine-tuned model on its own task's analysed sequences"

# ------------------------------------------------------------------------------------------------
# Pande et al.: Fig. 3 (scores and p-values pooled), Fig. 4 (co-location), Fig. 5 (layers),
# Fig. 6 (fine-tuning), setup.

_PANDE_FIG3 = (
    Claim("mean_sieve_score", PANDE, "mean of all sieve bias scores (pooled)", 2.8, "float",
          "mean_sieve_score", "finetuned", "pooled",
          "section \"Assigning functional roles to heads\" (choice of tau; Fig. 3a)",
          printed="around 2.8",
          quote="we plot the cumulative frequency distribution (see Figure 3(a)) of the sieve bias "
                "score across all functional roles for 1,000 input sequences, and identify that "
                "the mean sieve bias score is around 2.8",
          measure="mean of every sieve bias score of the four functional roles (local, syntactic, "
                  "block, delimiter; `PAPER_ROLES`) over all analysed sequences and heads of " + _FT
                  + ", the tasks pooled",
          rule="holds when this run's mean is within 0.3 of 2.8 (\"around 2.8\")", tolerance=0.3),
    Claim("tau", PANDE, "tau: the smallest integer larger than the mean sieve score", 3.0, "float",
          "auto_tau", "finetuned", "pooled", "section \"Assigning functional roles to heads\"",
          printed="3",
          quote="We then set τ to be the smallest integer larger than this mean, i.e., 3.",
          measure="floor(pooled mean sieve score) + 1 (the paper's rule on this run's pool); the "
                  "run's tests use the configured tau (3, as the paper)",
          rule="holds when the rule gives 3", tolerance=0.0),
    Claim("share_p_between", PANDE, "share of p-values in (0.05, 0.95)", 0.018, "share",
          "share_p_between", "finetuned", "pooled",
          "section \"Assigning functional roles to heads\" (Fig. 3b)", printed="1.8%",
          quote="Indeed, there are only 1.8% of points in the range (0.05, 0.95).",
          measure="share of the unadjusted p-values of the four functional roles' tests (every "
                  "head, every task) inside (0.05, 0.95), " + _FT,
          rule=_wilson_rule("tests (p-values)"), interval="wilson",
          note="fewer analysed sequences than the paper's 1,000 widen each test and move p-values "
               "into the band: a run with fewer sequences reads high"),
    Claim("average_vs_test", PANDE, "averages assign roles that the test does not (Fig. 2)",
          None, "text", None, "finetuned", "tasks",
          "section \"Hypothesis testing\" (Fig. 2); section \"Related work\"",
          quote="For instance, an assertion based on the average being ≥ 3 would assign the "
                "functional role to the head in Figure 2 . However, hypothesis testing to assert "
                "that population mean is more than 3 would fail.",
          measure="(head, role) pairs of the four functional roles whose scores are skewed as "
                  "in Fig. 2: mean sieve bias at least tau + 0.5, median at most tau - 0.5 "
                  "(`FIG2_GAP`: a mean or median within 0.5 of tau is noise at the threshold, "
                  "not Fig. 2's case), and the test does not reject (the average rule assigns, "
                  "the paper's rule does not), summed over the tasks",
          rule="holds when there is at least one such skewed pair", check="average_vs_test",
          note="\"in our experiments we find that averages are inflated by outliers sufficiently "
               "to incorrectly infer functional roles that are not statistically significant\" "
               "(section \"Related work\")"),
)

_PANDE_FIG4 = (
    Claim("share_delimiter", PANDE, "share of delimiter heads, mean over the four tasks", 0.7343,
          "share", "share_delimiter", "finetuned", "mean_over_tasks",
          "section \"Are functional roles mutually exclusive?\" (Fig. 4)", printed="73.43%",
          quote="Across tasks, there are significant number of delimiter heads (on average "
                "73.43% across the 4 tasks).",
          measure="heads whose delimiter test rejects (the coarse test, not the union of [CLS] "
                  "and [SEP]), share of all heads, mean over " + _FT,
          rule=_wilson_rule(), interval="wilson",
          note="the blog rounds it: \"There are a significant number of Delimiter Heads (73% "
               "across 4 GLUE tasks)\""),
    Claim("share_unskilled", PANDE, "share of heads with no functional role, mean over the tasks",
          0.0937, "share", "share_unskilled", "finetuned", "mean_over_tasks",
          "section \"Are functional roles mutually exclusive?\" (Fig. 4)", printed="9.37%",
          quote="There are very few heads which do not perform any functional role (avg. 9.37% "
                "across the 4 tasks).",
          measure="heads none of whose four coarse tests rejects, share of all heads, mean over "
                  + _FT, rule=_wilson_rule(), interval="wilson"),
    Claim("share_syntactic_also_local", PANDE, "share of syntactic heads that are also local "
          "(per task 42.1% to 88.8%, mean 70.9%)", 0.709, "share", "share_syntactic_also_local",
          "finetuned", "range_over_tasks",
          "section \"Are functional roles mutually exclusive?\" (Fig. 4)",
          value_range=(0.421, 0.888), printed="42.1% to 88.8% (mean 70.9%)",
          quote="More specifically, across the four tasks, 42.1% to 88.8% (with a mean of 70.9%) "
                "of syntactic heads overlap with local heads.",
          measure="per task, heads whose syntactic and local tests both reject over heads whose "
                  "syntactic test rejects; mean over " + _FT,
          rule=_wilson_rule("syntactic heads") + " (the mean over the tasks)", interval="wilson",
          note="needs a parse of the task text (syntactic sieve)"),
    *(Claim(f"spearman_{t}", PANDE, f"Spearman correlation of the local and syntactic sieve "
            f"bias, {TASK_NAMES[t]}", v, "corr", "spearman_local_syntactic", "finetuned", "task",
            "section \"Are functional roles mutually exclusive?\" (overlap of local and syntactic)",
            task=t, tasks=(t,), printed=f"{v:.2f}",
            quote="We observe a very high correlation score of 0.78, 0.81, 0.85, 0.73 scores for "
                  "QNLI, QQP, MRPC, SST-2 tasks respectively, with a p-value of 0.",
            measure="Spearman's rho of the local and syntactic sieve bias over every (sequence, "
                    "head) pair where both are defined, the task's fine-tuned model on its own "
                    "analysed sequences, the syntactic sieve from the task text's parse",
            rule="holds when this run's rho is within 0.10 of the paper's", tolerance=0.10)
      for t, v in (("qnli", 0.78), ("qqp", 0.81), ("mrpc", 0.85), ("sst2", 0.73))),
    Claim("nsubj_next_local", PANDE, "nsubj heads overlap highly with next-local heads", None,
          "text", None, "finetuned", "pooled",
          "section \"Are functional roles mutually exclusive?\"",
          quote="We observe that nsubj heads have a high overlap with next-loc heads and "
                "dobj-heads have a high overlap with the prev-loc heads.",
          measure="heads with both nsubj and next_local over heads with nsubj, the tasks pooled",
          rule="holds when more than half of the nsubj heads are next_local heads",
          check="fine_overlap:nsubj:next_local"),
    Claim("obj_prev_local", PANDE, "dobj heads overlap highly with previous-local heads", None,
          "text", None, "finetuned", "pooled",
          "section \"Are functional roles mutually exclusive?\"",
          quote="We observe that nsubj heads have a high overlap with next-loc heads and "
                "dobj-heads have a high overlap with the prev-loc heads.",
          measure="heads with both obj (dobj) and prev_local over heads with obj, the tasks pooled",
          rule="holds when more than half of the obj heads are prev_local heads",
          check="fine_overlap:obj:prev_local"),
    Claim("delimiter_intersect", PANDE, "delimiter heads intersect with the other functional heads",
          None, "text", None, "finetuned", "pooled",
          "section \"Are functional roles mutually exclusive?\" (Fig. 4)",
          quote="Also given their high prevalence, they naturally intersect with other "
                "functional heads.",
          measure="heads with the delimiter role among the heads with any of local, syntactic, "
                  "block, the tasks pooled",
          rule="holds when more than half of the heads with another coarse role are also "
               "delimiter heads", check="delimiter_intersect"),
    Claim("multi_functional", PANDE, "many heads are multi-functional (Fig. 4)", None, "text",
          None, "finetuned", "mean_over_tasks", "Fig. 4 caption",
          quote="The intersection between various sets indicate that many heads are "
                "multi-functional.",
          measure="heads with two or more of the four coarse roles, share of all heads, mean over "
                  "the tasks",
          rule="holds when at least a quarter of the heads have two or more coarse roles",
          check="multi_functional"),
    Claim("block_marginal_overlap", PANDE, "block heads overlap only marginally with syntactic / "
          "local heads", None, "text", None, "finetuned", "pooled",
          "section \"Are functional roles mutually exclusive?\" (role of block heads)",
          tasks=PAIR_TASKS,
          quote="There is only a marginal overlap between block heads and syntactic/local heads "
                "indicating that these specialisations are unique.",
          measure="block heads that also have the coarse role local or syntactic, over block "
                  "heads, the pair tasks (MRPC, QQP, QNLI) pooled",
          rule="holds when at most a quarter of the block heads are also local or syntactic",
          check="block_marginal_overlap"),
    Claim("block_heads_sst2", PANDE, "no block heads on SST-2", 0.0, "count", "block_heads",
          "finetuned", "task", "section \"Are functional roles mutually exclusive?\"",
          task="sst2", tasks=("sst2",), printed="none",
          quote="Note that there are no block heads in the SST-2 task as it is a single sequence "
                "task.",
          measure="heads with the block role on SST-2",
          rule="not computable: the block sieve is not defined for single sentences, so no SST-2 "
               "head can be a block head and the statement holds by construction, whatever the "
               "run", tolerance=0.0, check="block_heads_sst2"),
)

_PANDE_FIG5 = (
    Claim("multi_skilled_middle", PANDE, "more multi-skilled heads in the middle layers (5 to 9) "
          "for MRPC, QNLI and SST-2", None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          tasks=("mrpc", "qnli", "sst2"), layers=(("middle", (5, 9)),),
          quote="The number of multi-skilled heads is higher in the middle layers (layers 5 to 9) "
                "for MRPC, QNLI and SST-2 tasks.",
          measure="per task, heads with two or more of the Fig. 5 roles (`FIG5_ROLES`) per layer: "
                  "mean over layers 5-9 against the mean over the other layers",
          rule="holds when the middle layers' mean is higher for every one of these tasks run",
          check="multi_skilled_middle", note=_SCALED),
    Claim("multi_skilled_qqp_early", PANDE, "for QQP, more multi-skilled heads in the initial layers",
          None, "text", None, "finetuned", "task",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          task="qqp", tasks=("qqp",), layers=(("initial", (0, 3)),),
          quote="However, for QQP the number of multi-skilled heads is relatively higher in the "
                "initial layers.",
          measure="QQP: heads with two or more Fig. 5 roles per layer, mean over the initial "
                  "layers (0-3, the paper's \"initial ... sets of 4 layers\") against the mean "
                  "over the other layers",
          rule="holds when the initial layers' mean is higher", check="multi_skilled_qqp_early",
          note=_SCALED),
    Claim("delimiter_all_layers", PANDE, "many delimiter ([SEP] and/or [CLS]) heads in all layers",
          None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          quote="Across tasks we find a large number of delimiter heads ([SEP] and/or [CLS]) "
                "across all layers.",
          measure="per task and layer, heads with cls or sep (the Fig. 5 delimiter roles)",
          rule="holds when in every task every layer but layer 0 (the paper's own exception: "
               "\"the first layer contains very few (if any) delimiter heads\") has at least a "
               "quarter of its heads with cls or sep", check="delimiter_all_layers"),
    Claim("delimiter_only_last_three", PANDE, "delimiter heads are often the only functional heads "
          "in the last three layers", None, "text", None, "finetuned", "pooled",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          layers=(("last three", (9, 11)),),
          quote="In fact, such delimiter heads are often the only functional heads in the last "
                "three layers across different tasks.",
          measure="in layers 9-11, heads whose Fig. 5 roles are only cls and/or sep, over heads "
                  "with any Fig. 5 role, the tasks pooled",
          rule="holds when more than half of the skilled heads there have delimiter roles only",
          check="delimiter_only_last_three", note=_SCALED),
    Claim("delimiter_layer0_few", PANDE, "very few (if any) delimiter heads in the first layer",
          None, "text", None, "finetuned", "mean_over_tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          layers=(("first", (0, 0)),),
          quote="Interestingly, the first layer contains very few (if any) delimiter heads.",
          measure="layer 0: heads with cls or sep, share of the layer's heads, mean over the tasks",
          rule="holds when the share is at most 1/6 (2 of BERT-base's 12 heads)",
          check="delimiter_layer0_few", note=_SCALED),
    Claim("block_layer0", PANDE, "block heads are prevalent in layer 0 for MRPC, QQP and QNLI",
          None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          tasks=PAIR_TASKS, layers=(("zeroth", (0, 0)),),
          quote="For all the tasks which take two sentences as inputs (MRPC, QNLI and QQP) block "
                "heads are prevalent in the zeroth layer.",
          measure="per pair task, block heads per layer",
          rule="holds when, in every pair task run, layer 0 has block heads and no layer has more",
          check="block_layer0", note=_SCALED + "; the blog: \"Block heads are mostly present in "
                                               "the zero-th layer\""),
    Claim("block_layers_1_4", PANDE, "in QNLI and MRPC block heads show up in layers 1 to 4",
          None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          tasks=("qnli", "mrpc"), layers=(("1 to 4", (1, 4)),),
          quote="For example, in both QNLI and MRPC, block heads consistently show up in layers 1 "
                "to 4, in addition to layer 0.",
          measure="per task, block heads in each of layers 1-4, scaled, leaving out the layers "
                  "that stand for BERT-base layer 0 (\"in addition to layer 0\")",
          rule="holds when each of those layers has a block head, in QNLI and in MRPC",
          check="block_layers_1_4", note=_SCALED),
    Claim("block_qqp_first_last", PANDE, "in QQP block heads are in the first and last layer, not "
          "the middle ones", None, "text", None, "finetuned", "task",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          task="qqp", tasks=("qqp",), layers=(("middle", (4, 7)),),
          quote="However, in QQP block heads do not show up in the middle layers but are "
                "prevalent in the first and last layer.",
          measure="QQP: block heads in layer 0, in the last layer and in the middle layers (4-7, "
                  "the paper's middle set of 4 layers)",
          rule="holds when layer 0 and the last layer have block heads and the middle layers none",
          check="block_qqp_first_last", note=_SCALED),
    Claim("block_mrpc_all_layers", PANDE, "in MRPC block heads show up in all layers", None,
          "text", None, "finetuned", "task",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          task="mrpc", tasks=("mrpc",),
          quote="Lastly, for MRPC block heads consistently show up across all layers.",
          measure="MRPC: block heads per layer", rule="holds when every layer has a block head",
          check="block_mrpc_all_layers"),
    Claim("syntactic_every_layer", PANDE, "at least 3 syntactic heads in every layer (very few "
          "exceptions)", None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          quote="Across all tasks there are at least 3 syntactic heads (nsubj, dobj, amod and "
                "advmod) for all layers (with very few exceptions).",
          measure="per task and layer, heads with any of nsubj, obj, amod, advmod (the Fig. 5 "
                  "syntactic roles)",
          rule="holds when at most 10% of the (task, layer) pairs have fewer than 3 such heads",
          check="syntactic_every_layer",
          note="the blog: \"There are at least 3 syntactic heads in each layer (except a very few "
               "exceptions)\"; needs a parse of the task text"),
    Claim("syntactic_layers_6_8", PANDE, "syntactic heads are most prevalent in layers 6 to 8",
          None, "text", None, "finetuned", "pooled",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          layers=(("6 to 8", (6, 8)),),
          quote="Across tasks, the prevalence of syntactic heads is higher in layers 6 to 8",
          measure="heads with any Fig. 5 syntactic role per layer, summed over the tasks",
          rule="holds when the layer with the most such heads is one of layers 6-8 (scaled)",
          check="syntactic_layers_6_8", note=_SCALED),
    Claim("last_two_few_syntactic", PANDE, "the last two layers have very few syntactic or "
          "multi-functional heads", None, "text", None, "finetuned", "pooled",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          layers=(("last two", (10, 11)),),
          quote="Lastly, across tasks the last two layers have very few syntactic or "
                "multi-functional heads.",
          measure="per layer, heads with a Fig. 5 syntactic role and heads with two or more Fig. 5 "
                  "roles, summed over the tasks: mean per layer in layers 10-11 against the other "
                  "layers",
          rule="holds when, for both counts, the last two layers' mean is at most half the other "
               "layers' mean", check="last_two_few_syntactic", note=_SCALED),
    Claim("qnli_layer7_eight_roles", PANDE, "QNLI: a head in layer 7 performs eight functional "
          "roles", None, "text", None, "finetuned", "task",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          task="qnli", tasks=("qnli",), layers=(("layer 7", (7, 7)),),
          quote="For example, in the first plot in Figure 5 (QNLI), the first head in Layer7 "
                "performs eight different functional roles, whereas the last head in the same "
                "layer performs only one functional role [SEP].",
          measure="QNLI: the largest number of Fig. 5 roles of a head in layer 7 (scaled)",
          rule="holds when a head there has at least eight of the Fig. 5 roles",
          check="qnli_layer7", note=_SCALED),
)

_PANDE_FIG6 = (
    Claim("finetune_delimiter_final_drop", PANDE, "fine-tuning lowers the delimiter bias in the "
          "final layers", None, "text", None, "change", "tasks",
          "section \"What is the effect of fine-tuning on functional roles\" (Fig. 6)",
          quote="We observe that in the final layers, there is a decrease in the average "
                "delimiter bias score (i.e., avg. βdelimiter h across all heads in these layers).",
          measure="per task, mean over the heads of the final third of the layers of the "
                  "delimiter sieve bias, fine-tuned minus pre-trained (same sequences), and a "
                  "one-sided t-test of the heads' changes",
          rule="holds when, in more than half of the tasks run, the change is negative and "
               "significant (one-sided t-test over the final-third heads, p < 0.05)",
          check="finetune_final:delimiter:-"),
    Claim("finetune_sep_not_cls", PANDE, "the delimiter drop comes from [SEP]; [CLS] changes little",
          None, "text", None, "change", "tasks",
          "section \"What is the effect of fine-tuning on functional roles\" (Fig. 6)",
          quote="On further investigation, we find that this decrease is mainly due to a lower "
                "attention on the [SEP] but the attention on the [CLS] token does not change much.",
          measure="per task, final third of the layers: the change after fine-tuning of the mean "
                  "attention mass on [SEP] and on [CLS] (the distance features' sep and cls; "
                  "attention, as the sentence says, not sieve biases, whose [SEP] one is divided "
                  "by |SEP| = 2 on pairs)",
          rule="holds when, in more than half of the tasks, the [SEP] mass falls and the [CLS] "
               "mass changes at most half as much (\"does not change much\")",
          check="finetune_sep_not_cls",
          note="the blog: \"As part of fine-tuning, there is a decrease in the attention on SEP "
               "token\""),
    Claim("finetune_block_final_rise", PANDE, "fine-tuning raises the block bias in the final "
          "layers", None, "text", None, "change", "tasks",
          "section \"What is the effect of fine-tuning on functional roles\" (Fig. 6)",
          tasks=PAIR_TASKS,
          quote="We also find that there is an increase in the average block bias score (i.e., "
                "avg. βblock h across all heads in these layers).",
          measure="per pair task, mean block sieve bias over the heads of the final third of the "
                  "layers, fine-tuned minus pre-trained, and a one-sided t-test of the heads' "
                  "changes",
          rule="holds when, in more than half of the pair tasks run, the change is positive and "
               "significant (one-sided t-test over the final-third heads, p < 0.05)",
          check="finetune_final:block:+"),
    Claim("finetune_initial_middle_stable", PANDE, "bias scores of the initial and middle layers "
          "change little after fine-tuning", None, "text", None, "change", "tasks",
          "section \"What is the effect of fine-tuning on functional roles\" (Fig. 6)",
          quote="However, we offer a different perspective that bias scores in initial and "
                "middle layers do not change much.",
          measure="mean over the tasks and the four functional roles of |change of the mean sieve "
                  "bias| per layer third (initial, middle, final)",
          rule="holds when the initial and the middle thirds each change at most half as much "
               "as the final third (\"do not change much\")", check="finetune_initial_middle_stable",
          note="conclusion: \"We find that later layers have the largest change in their roles\""),
    Claim("finetune_delimiter_heads_drop", PANDE, "the number of delimiter heads drops after "
          "fine-tuning (later layers)", None, "text", None, "change", "tasks", "Conclusion",
          quote="We find that later layers have the largest change in their roles and "
                "specifically the number of delimiter heads drops sharply indicating "
                "specialization for task-specific roles.",
          measure="per task, heads of the final third of the layers whose delimiter test "
                  "rejects, fine-tuned against pre-trained",
          rule="holds when, in more than half of the tasks run, the fine-tuned model has at least "
               "a third fewer (\"drops sharply\")",
          check="finetune_delimiter_heads_drop"),
)

_PANDE_SETUP = (
    Claim("finetune_at_par", PANDE, "the fine-tuned models score at par with Devlin et al.'s "
          "BERT-base", None, "text", None, "finetuned", "tasks", "section \"Experimental Setup\"",
          quote="The performance of the fine-tuned model on these four GLUE tasks is at par with "
                "the one reported in Devlin et al. (BERTBASE) and suitable for further analysis.",
          measure="per task, the best dev score of the fine-tuning grid against Devlin et al.'s "
                  "BERT-base dev score (`DEVLIN_DEV`; none for QQP)",
          rule="holds when every task with a published dev score is within 5 percentage points "
               "of it", check="finetune_at_par"),
)

_BLOG = (
    Claim("blog_cls_initial", BLOG, "[CLS] heads are in the initial layers", None, "text", None,
          "finetuned", "pooled", "section \"2. How are functional roles distributed across layers?\"",
          quote="Heads attending to the CLS token are in the initial layers.",
          measure="heads with the cls role in the first and in the second half of the layers, "
                  "summed over the tasks",
          rule="holds when the first half has more", check="half:cls:first"),
    Claim("blog_sep_later", BLOG, "[SEP] heads are in the later layers", None, "text", None,
          "finetuned", "pooled", "section \"2. How are functional roles distributed across layers?\"",
          quote="Delimiter heads (attending to SEP) are in the later layers.",
          measure="heads with the sep role in the first and in the second half of the layers, "
                  "summed over the tasks",
          rule="holds when the second half has more", check="half:sep:second"),
)

# ------------------------------------------------------------------------------------------------
# Guan et al.: section 4 (cluster shares and layers), Table 1 (stability), Fig. 4, Tables 2-3.

CLUSTER_TYPES = ("dense", "diagonal", "dense+vertical", "vertical")
_GUAN_SHARES = {
    "dense": (0.2604, "26.04%", "They account for 26.04% of total heads and mainly appear at the "
                                "beginning layers.", ""),
    "diagonal": (0.2556, "25.56%", "They account for 25.56% of total heads and appear at almost all "
                                   "layers.",
                 "most likely a typo for 26.56% (= 102 of 384 heads): the four printed shares sum "
                 "to 98.99%, and 26.04, 34.11 and 13.28% are exactly 100, 131 and 51 of 384; the "
                 "printed value is compared"),
    "dense+vertical": (0.3411, "34.11%", "They account for 34.11% of total heads and mainly "
                                         "appear at middle layers.", ""),
    "vertical": (0.1328, "13.28%", "They account for 13.28% of total heads and mainly appear at "
                                   "higher layers.", ""),
}
_GUAN_PLACEMENT = {
    "dense": ("mainly at the beginning layers", "first"),
    "diagonal": ("at almost all layers", "all"),
    "dense+vertical": ("mainly at the middle layers", "middle"),
    "vertical": ("mainly at the higher layers", "last"),
}

_GUAN_CLUSTERS = (
    *(Claim(f"guan_share_{name.replace('+', '_')}", GUAN, f"share of heads of the {name} type",
            v, "share", f"cluster_share:{name}", "finetuned", "mean_over_tasks",
            "section 4 \"Clustering\"", printed=printed, quote=quote, tasks=GUAN_TASKS,
            measure="share of heads the clustering (K-means, k = 4, types named by Guan et al.'s "
                    "definitions, `heads_jax.hoststats.clustering`) gives the type " + name
                    + "; the SQuAD model's (mean over the tasks' fine-tuned models elsewhere)",
            rule=_wilson_rule(), interval="wilson",
            note="; ".join(x for x in (typo, _CROSS_MODEL) if x))
      for name, (v, printed, quote, typo) in _GUAN_SHARES.items()),
    *(Claim(f"guan_layers_{name.replace('+', '_')}", GUAN, f"{name} heads appear {where}", None,
            "text", None, "finetuned", "tasks", "section 4 \"Clustering\" (Fig. 3)",
            quote=_GUAN_SHARES[name][2], tasks=GUAN_TASKS,
            measure=("per clustering (each model separately), layers with at least one " + name
                     + " head" if rule == "all" else "per clustering (each model separately), the "
                     "median layer of the " + name + " heads"),
            rule=("holds when in every clustering at least 80% of the layers have one"
                  if rule == "all" else
                  f"holds when in every clustering the median layer lies in the {rule} third of "
                  "the layers"),
            check=f"cluster_layers:{name}:{rule}", note=_CROSS_MODEL)
      for name, (where, rule) in _GUAN_PLACEMENT.items()),
)

# Table 1: stability of the clustering per model.
_GUAN_STABILITY = (("pretrained", None, 0.9598, "95.98%", "Pre-train"),
                   ("finetuned", "squad", 0.9626, "96.26%", "SQuAD"),
                   ("finetuned", "mrpc", 0.9598, "95.98%", "MRPC"),
                   ("finetuned", "mnli", 0.9437, "94.37%", "MNLI"))
_STABILITY_MEASURE = ("fraction of heads whose (Hungarian-aligned) cluster is the same in all 10 "
                      "K-means fits on random halves of the heads (DESIGN.md section 3); Guan et "
                      "al.: \"the proportion of input samples that is consistent on all models "
                      "fitted with the random partial training set split\"")
_GUAN_TABLE1 = (
    *(Claim(f"guan_stability_{label.lower().replace('-', '')}", GUAN,
            f"stability of the clustering, {label} model", v, "share", "cluster_stability", model,
            "task" if task else "mean_over_tasks", "Table 1", task=task,
            tasks=(task,) if task else GUAN_TASKS, printed=printed,
            quote="Pre-train SQuAD MRPC MNLI Stability 95.98% 96.26% 95.98% 94.37% Table 1: "
                  "Stability of clustering measured following Von Luxburg (2010) on downstream "
                  "tasks.",
            measure=_STABILITY_MEASURE + ("; mean over the pre-trained model's analyses of the "
                                          "tasks" if model == "pretrained" else
                                          f"; the {label}-fine-tuned model"),
            rule=_wilson_rule(), interval="wilson", note=_CROSS_MODEL)
      for model, task, v, printed, label in _GUAN_STABILITY),
    Claim("guan_stability_over_95", GUAN, "over 95% of the heads are clustered stably", None,
          "text", None, "finetuned", "tasks", "section 4 \"Clustering\" (Table 1)",
          quote="Our result demonstrates that over 95% attention heads are clustered stably with "
                "a limited amount of data.",
          measure="the stability of every analysed model (pre-trained and fine-tuned, each task), "
                  "their mean",
          rule="holds when the mean over the analysed models is at least 95% (`STABLE_BAR`; "
               "Guan et al.'s own Table 1 averages 95.65% with MNLI at 94.37%: the sentence "
               "summarises the table)", check="stability_over_95", note=_CROSS_MODEL),
    Claim("guan_stable_3_5", GUAN, "the clustering is also stable with 3 or 5 clusters", None,
          "text", None, "finetuned", "task", "section 4 \"Clustering\"", task="squad",
          tasks=("squad",),
          quote="We still get stable clustering results with 3 or 5 clusters, but the patterns "
                "can not be distinguished by human-being.",
          measure="the SQuAD model's heads clustered with k = 3 and k = 5 (same method, seed and "
                  "10 half-sample fits as Table 1)",
          rule="holds when each is at least 95% (`STABLE_BAR`, the bar of \"over 95% attention "
               "heads are clustered stably\")", check="stable_3_5", note=_CROSS_MODEL),
    Claim("guan_similar_after_finetuning", GUAN, "fine-tuned models share the pre-trained type "
          "distribution", None, "text", None, "change", "tasks", "section 4 (Fig. 4)",
          quote="In specific, all the four models share similar head type distribution "
                "described in Fig. 3.",
          tasks=GUAN_TASKS,
          measure="per task, the share of each cluster type in the fine-tuned and the pre-trained "
                  "analysis of the same sequences",
          rule="holds when, in every task, each type's fine-tuned share lies in the 95% Wilson "
               "interval of its pre-trained share over the heads (\"similar\": within the "
               "share's sampling uncertainty)",
          check="cluster_similar", note=_CROSS_MODEL),
    Claim("guan_same_cluster_after_finetuning", GUAN, "most heads keep their type after "
          "fine-tuning; changes are in the highest layers", None, "text", None, "change", "tasks",
          "section 4 (Fig. 4)", tasks=GUAN_TASKS,
          quote="Empirically, we find many heads have the same cluster after fine-tuning process. "
                "However, some heads in the highest layers also change.",
          measure="per task, heads with the same cluster type before and after fine-tuning; the "
                  "share of changed heads per layer third, the tasks pooled",
          rule="holds when more than half of the heads keep their type in every task and the "
               "final third of the layers has the highest share of changed heads",
          check="cluster_kept", note=_CROSS_MODEL),
)

# Tables 2 and 3 (SQuAD v1.1 dev, BERT-large fine-tuned on SQuAD, no re-training after the
# ablation). In the extracted text the check marks print as "3" (kept) and "7" (removed).
# Table 2: per type (dense, diagonal, dense+vertical, vertical) kept / "pruned" / "1/L"
# (substituted by uniform attention); EM ("Acc.") and F1.
GUAN_TABLE2 = (
    (1, ("kept", "kept", "kept", "kept"), 82.85, 89.68),
    (2, ("pruned", "kept", "kept", "kept"), 79.92, 87.62),
    (3, ("kept", "pruned", "kept", "kept"), 4.59, 7.55),
    (4, ("kept", "kept", "pruned", "kept"), 73.33, 81.92),
    (5, ("kept", "kept", "kept", "pruned"), 81.42, 88.57),
    (6, ("pruned", "kept", "kept", "pruned"), 75.31, 84.05),
    (7, ("kept", "kept", "pruned", "pruned"), 56.87, 67.62),
    (8, ("1/L", "kept", "kept", "kept"), 74.68, 84.17),
    (9, ("kept", "1/L", "kept", "kept"), 1.27, 6.07),
    (10, ("kept", "kept", "1/L", "kept"), 9.13, 11.15),
    (11, ("kept", "kept", "kept", "1/L"), 53.17, 59.09),
)
# Table 3: per type, (intra, inter) sentence attention kept (True) or removed (False).
GUAN_TABLE3 = (
    (12, ((True, True), (False, True), (True, True), (True, True)), 16.96, 25.29),
    (13, ((True, True), (True, False), (True, True), (True, True)), 82.29, 89.91),
    (14, ((True, True), (True, True), (False, True), (True, True)), 80.28, 87.76),
    (15, ((True, True), (True, True), (True, False), (True, True)), 77.95, 85.86),
    (16, ((False, True), (True, True), (False, True), (False, True)), 71.80, 80.22),
    (17, ((True, False), (True, True), (True, False), (True, False)), 10.11, 15.57),
    (18, ((False, True), (False, True), (True, True), (False, True)), 14.83, 23.55),
    (19, ((True, False), (True, False), (True, True), (True, False)), 75.54, 84.10),
)
_SQUAD_REASON = ("a SQuAD ablation (EM/F1 of BERT-large fine-tuned on SQuAD); the reproduce run "
                 "fine-tunes GLUE classifiers (the guan pipeline, `configs/reproduce.py:guan`, "
                 "computes it)")


def _table2_setting(types) -> str:
  parts = [f"{n} {s}" for n, s in zip(CLUSTER_TYPES, types) if s != "kept"]
  return "; ".join(parts) or "baseline (nothing removed)"


def _table3_setting(types) -> str:
  parts = []
  for n, (intra, inter) in zip(CLUSTER_TYPES, types):
    gone = [p for p, kept in (("intra", intra), ("inter", inter)) if not kept]
    if gone:
      parts.append(f"{n} {'+'.join(gone)}-sentence removed")
  return "; ".join(parts)


_GUAN_ABLATION_NOTE = ("EM and F1 on SQuAD v1.1 dev (\"Acc.\" is EM; percent, as the paper), "
                       "BERT-large fine-tuned on SQuAD, no re-training")
_GUAN_TABLES = (
    *(Claim(f"guan_table2_row{i}", GUAN, f"Table 2 row {i}: {_table2_setting(t)}", em,
            "score", None, "finetuned", "task", "section 5.1, Table 2", task="squad",
            tasks=("squad",), printed=f"{em:.2f} / {f1:.2f}",
            quote="Tbl. 2 reports the experimental results with different settings.",
            measure="EM (percent) of the ablated model on the evaluated questions (F1 in the "
                    "detail)", rule=_wilson_rule("evaluated questions") + " (EM)",
            interval="wilson", check=f"squad_row:{i}", note=_GUAN_ABLATION_NOTE)
      for i, t, em, f1 in GUAN_TABLE2),
    *(Claim(f"guan_table3_row{i}", GUAN, f"Table 3 row {i}: {_table3_setting(t)}", em,
            "score", None, "finetuned", "task", "section 5.2, Table 3", task="squad",
            tasks=("squad",), printed=f"{em:.2f} / {f1:.2f}",
            quote="Tbl. 3 demonstrates the experimental results.",
            measure="EM (percent) of the model with that attention removed (F1 in the detail)",
            rule=_wilson_rule("evaluated questions") + " (EM)", interval="wilson",
            check=f"squad_row:{i}",
            note=_GUAN_ABLATION_NOTE + ("; the text says \"Removing intra-sentence attention "
                                        "from diagonal type ( 12 ) leads to a poor accuracy of "
                                        "19.96%\": the table prints 16.96" if i == 12 else ""))
      for i, t, em, f1 in GUAN_TABLE3),
    *(Claim(key, GUAN, text, None, "text", None, "finetuned", "task", source, task="squad",
            tasks=("squad",), quote=quote, measure="SQuAD EM (percent) of the ablated models",
            rule=rule, check=f"squad_statement:{key}", note=_GUAN_ABLATION_NOTE)
      for key, text, source, quote, rule in (
          ("guan_prune_diagonal", "pruning the diagonal heads makes the model inoperative",
           "section 5.1", "Firstly, we find that pruning all diagonal heads ( 3 ) makes the model "
           "totally inoperative, compared with ( 2 , 4 , 5 ).",
           "holds when row 3's EM is at most a tenth of row 1's (\"totally inoperative\"; "
           "Guan: 4.59 of 82.85) and its loss is larger than rows 2, 4 and 5's (\"compared "
           "with\")"),
          ("guan_prune_vertical", "pruning the vertical heads costs less than 1.5% accuracy",
           "section 5.1", "Pruning all vertical heads directly ( 5 ) has less than 1.5% accuracy "
           "loss.", "holds when the EM loss is below 1.5 points"),
          ("guan_keep_dense_vertical", "keeping dense&vertical beside diagonal is better than "
           "keeping dense", "section 5.1", "Keeping dense&vertical type ( 6 ) together results "
           "in a better accuracy.", "holds when row 6's EM exceeds row 7's"),
          ("guan_uniform_dense", "dense heads replaced by uniform attention lose less than 10%",
           "section 5.1", "Nextly, we find that substituting the dense type with uniformed "
           "attention ( 8 ) results in accuracy loss of less than 10%.",
           "holds when the EM loss is below 10 points"),
          ("guan_uniform_dense_vertical", "dense&vertical heads replaced by uniform attention "
           "lose much", "section 5.1", "However, substituting the mixed type dense&vertical ( 10 "
           ") has a significant accuracy loss, which indicates its crucial role.",
           "holds when the EM loss is significant (one-sided two-proportion z-test over the "
           "evaluated questions, p < 0.05) and larger than that of substituting dense (row 8, "
           "the \"However\" it is set against)"),
          ("guan_uniform_vertical", "vertical heads replaced by uniform attention keep over 50% "
           "accuracy", "section 5.1", "Substituting Vertical type ( 11 ) also has an accuracy of "
           "over 50%.", "holds when row 11's EM is above 50"),
          ("guan_diagonal_intra", "without the diagonal heads' intra-sentence attention accuracy "
           "is poor", "section 5.2", "Removing intra-sentence attention from diagonal type ( 12 ) "
           "leads to a poor accuracy of 19.96%, while removing inter-sentence part ( 13 ) has "
           "little interference.", "holds when row 12's EM is at most half of row 1's (\"poor\") and row "
           "13 loses less than 1.5 points (\"little interference\": the paper's own bar for a "
           "small loss, row 5)"),
          ("guan_dense_vertical_inter", "dense&vertical heads carry the inter-sentence "
           "information", "section 5.2", "On the contrast, with dense&vertical attending other "
           "sentences solely ( 19 ), the model reaches an accuracy of 75.54%.",
           "holds when row 19's EM exceeds row 17's"),
      )),
)

CLAIMS: tuple[Claim, ...] = (_PANDE_FIG3 + _PANDE_FIG4 + _PANDE_FIG5 + _PANDE_FIG6 + _PANDE_SETUP
                             + _BLOG + _GUAN_CLUSTERS + _GUAN_TABLE1 + _GUAN_TABLES)


# ------------------------------------------------------------------------------------------------
# Devlin et al.: the BERT-base GLUE scores the fine-tuned models are set beside.


@dataclasses.dataclass(frozen=True)
class DevScore:
  """A published BERT-base GLUE score of one task."""
  task: str
  metric: str          # "accuracy" or "f1"
  value: float | None  # a fraction 0..1; None when the paper does not give it
  split: str           # "dev" or "test"
  source: str
  note: str = ""


# Devlin et al. report BERT-base dev scores only in their ablations (Table 5: MNLI-m, QNLI,
# MRPC, SST-2 accuracy on dev); QQP dev is not given. Table 1 gives GLUE test scores (F1 for QQP
# and MRPC, accuracy otherwise).
DEVLIN_DEV: dict[str, tuple[DevScore, ...]] = {
    "mrpc": (DevScore("mrpc", "accuracy", 0.867, "dev", f"{DEVLIN}, Table 5 (and Table 6, 12/768/12)"),
             DevScore("mrpc", "f1", 0.889, "test", f"{DEVLIN}, Table 1 (GLUE test server)")),
    "qqp": (DevScore("qqp", "f1", None, "dev", DEVLIN,
                     note="Devlin et al. give no QQP dev score for BERT-base"),
            DevScore("qqp", "f1", 0.712, "test", f"{DEVLIN}, Table 1 (GLUE test server)")),
    "sst2": (DevScore("sst2", "accuracy", 0.927, "dev", f"{DEVLIN}, Table 5"),
             DevScore("sst2", "accuracy", 0.935, "test", f"{DEVLIN}, Table 1 (GLUE test server)")),
    "qnli": (DevScore("qnli", "accuracy", 0.884, "dev", f"{DEVLIN}, Table 5"),
             DevScore("qnli", "accuracy", 0.905, "test", f"{DEVLIN}, Table 1 (GLUE test server)")),
}

# The paper's settings the reproduction follows (the report's "setup" table), each from
# pande2021_heads_hypothesis.txt, section "Experimental Setup".
PANDE_SETUP = {
    "model": "BERT-base (12 layers x 12 heads), pre-trained on English Wikipedia + Project "
             "Gutenberg (\"We pre-train the BERTBASE model using the English Wikipedia corpus "
             "and a subset of of the Project Gutenberg corpus\")",
    "pre-training": "about 300K steps at sequence length 128 and 1K steps at 512, \"a batch size "
                    "of 2K tokens\" (said of pre-training), one Cloud TPU v3-8",
    "fine-tuning grid": "\"batch sizes chosen among {32, 128} and learning rates among {1e-4, "
                        "2e-4}. Warm-up was set to 10K steps and LAMB optimizer was used\"",
    "analysed model": "each task's fine-tuned model (\"For each task, we feed all the input "
                      "sequences to the fine-tuned BERTBASE model\")",
    "analysed sequences": "\"We use 1000 input sequences (num sents) from the standard test sets "
                          "of the 4 GLUE tasks\"",
    "parser": "\"We use open-source library spaCy for dependency parsing.\"",
    "test": "one-sided test of the mean sieve bias > tau, tau = 3, \"the null hypothesis is "
            "rejected if the p-value is smaller than 0.05\"; the four functional roles tested "
            "independently",
}


def claims(paper: str | None = None) -> tuple[Claim, ...]:
  """All claims, or those of one paper (`PANDE`, `BLOG`, `GUAN`)."""
  return tuple(c for c in CLAIMS if paper is None or c.paper == paper)


def claim(key: str) -> Claim:
  for c in CLAIMS:
    if c.key == key:
      return c
  raise KeyError(f"no claim {key!r}; claims: {', '.join(c.key for c in CLAIMS)}")


def devlin_dev(task: str, metric: str | None = None) -> DevScore | None:
  """Devlin et al.'s BERT-base dev score of ``task`` (the first with ``metric`` if given)."""
  for s in DEVLIN_DEV.get(task, ()):
    if s.split == "dev" and (metric is None or s.metric == metric):
      return s
  return None


# ------------------------------------------------------------------------------------------------
# formatting


def _finite(x) -> bool:
  return (isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
          and math.isfinite(float(x)))


def difference(c: Claim, this_run) -> float | None:
  """This run's value minus the paper's (shares in percentage points); None for statements or
  when either side is missing."""
  if c.kind == "text" or not _finite(this_run) or c.value is None:
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


# ------------------------------------------------------------------------------------------------
# a run's analyses as the claims read them


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
  bert_base: whether the analysed models are BERT-base, Pande et al.'s model; None: judged by
    their shape (12 layers x 12 heads).

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


def _layers(c: Claim, name: str, num_layers: int) -> tuple[int, ...]:
  first, last = dict(c.layers)[name]
  return bert_base_layers(first, last, num_layers)


def _scaled(num_layers: int) -> str:
  return "" if num_layers == BERT_BASE_LAYERS else f" (scaled to {num_layers} layers)"


class NotComputable(Exception):
  """Raised by an evaluator with the reason a claim cannot be judged on this run."""


def _shapes(run: RunFigures) -> list[tuple[int, int]]:
  return sorted({tuple(int(x) for x in a.assigned.shape[:2])
                 for per in run.analyses.values() for a in per.values()})


def pande_setting(run: RunFigures) -> tuple[bool, str]:
  """Whether the run's models are Pande et al.'s BERT-base (``run.bert_base``, else by the
  shape: 12 layers x 12 heads), and the models in words."""
  shapes = _shapes(run)
  what = (run.model + " " if run.model else "") + ("(" + ", ".join(
      f"{l} layers x {h} heads" for l, h in shapes) + ")" if shapes else "")
  ok = run.bert_base if run.bert_base is not None else (
      not shapes or shapes == [(BERT_BASE_LAYERS, 12)])
  return bool(ok), what.strip() or "this run's model"


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


def _need_types(per: Mapping[str, "Analysis"], types) -> None:
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
  return p < ALPHA, (f"accuracy {_pct(float(acc))} vs majority class {_pct(float(majority))} "
                     f"of {int(n)}, p = {p:.2g}")


def _runs(run: RunFigures, c: Claim, state: str) -> dict[str, Analysis]:
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


def _need(value, what: str):
  if value is None:
    raise NotComputable(f"{what} not tested in this run")
  return value


def _fig5_syntactic(a: Analysis) -> np.ndarray:
  return _need(a.any_of(FIG5_SYNTACTIC), "the syntactic relations (no parse of the task text)")


def _multi_skilled(a: Analysis) -> np.ndarray:
  return _need(a.count_of(FIG5_ROLES), "the Fig. 5 roles") >= 2


def _pct(x) -> str:
  return format_value("share", x)


def _from_summary(c: Claim, run: RunFigures, state: str):
  """(value, detail, n): the claim's figure, what it was computed over, and the number of
  heads / tests it is a share of (None when it is no share)."""
  if c.scope == "pooled":
    pooled = run.pooled.get(state) or {}
    v = pooled.get(c.summary_key)
    if v is None:
      raise NotComputable(f"no pooled {c.summary_key} for the {state} model")
    n = len(_runs(run, c, state))
    count = pooled.get("num_p_values") if c.summary_key == "share_p_between" else None
    return v, f"pooled over {n} task(s), roles {', '.join(PAPER_ROLES)}", count
  per = _runs(run, c, state)
  # A mean over tasks is a share of the model's heads, each counted once: the Wilson n is the
  # number of distinct heads (the tasks' analyses are of near-identical models, so their heads
  # are not independent trials).
  if c.summary_key.startswith("cluster_share:"):
    name = c.summary_key.split(":", 1)[1]
    per = {t: a for t, a in per.items() if a.clusters is not None}
    if not per:
      raise NotComputable("no clustering in the analyses")
    _need_types(per, (name,))
    vals = {t: float((a.clusters == name).mean()) for t, a in per.items()}
    heads = max(per[t].num_heads for t in vals)
    return float(np.mean(list(vals.values()))), "mean over " + ", ".join(
        f"{TASK_NAMES[t]} {_pct(v)}" for t, v in vals.items()), heads
  if c.summary_key == "cluster_stability":
    vals = {t: a.stability for t, a in per.items() if a.stability is not None}
    if not vals:
      raise NotComputable("no clustering stability in the analyses")
    heads = max(per[t].num_heads for t in vals)
    return float(np.mean(list(vals.values()))), "mean over " + ", ".join(
        f"{TASK_NAMES[t]} {_pct(v)}" for t, v in vals.items()), heads
  vals = {t: ({**a.summary, **a.shares()}).get(c.summary_key) for t, a in per.items()}
  finite = {t: float(v) for t, v in vals.items() if _finite(v)}
  if not finite:
    why = "needs a parse of the task text" if "syntactic" in c.summary_key else "not computed"
    raise NotComputable(f"{c.summary_key}: {why}")
  if c.summary_key == "share_syntactic_also_local":   # distinct heads syntactic in some task
    heads = int(np.logical_or.reduce([
        per[t].coarse()[0][..., per[t].coarse()[1].index(vocab.COARSE_SYNTACTIC)]
        for t in finite]).sum())
  else:
    heads = max(per[t].num_heads for t in finite)
  count = heads if c.kind == "share" else None
  fmt = (lambda v: format_value(c.kind, v))
  detail = ", ".join(f"{TASK_NAMES[t]} {fmt(v)}" for t, v in finite.items())
  if c.scope == "task":
    return finite[c.task], detail, count
  value = float(np.mean(list(finite.values())))
  if c.scope == "range_over_tasks":
    detail = f"range {fmt(min(finite.values()))} to {fmt(max(finite.values()))}; " + detail
  return value, "mean over " + detail, count


def _average_vs_test(c, run, state):
  skewed = flat = m = 0
  for a in _runs(run, c, state).values():
    if a.medians is None:
      raise NotComputable("needs each head's median sieve bias (the analyses' scores)")
    idx = [a.roles.index(r) for r in PAPER_ROLES if r in a.roles]
    means, medians, assigned = a.means[..., idx], a.medians[..., idx], a.assigned[..., idx]
    high = np.nan_to_num(means, nan=-np.inf) >= a.tau + FIG2_GAP
    low = np.nan_to_num(medians, nan=np.inf) <= a.tau - FIG2_GAP
    skewed += int((high & low & ~assigned).sum())
    flat += int((high & ~low & ~assigned).sum())
    m += int(high.sum())
  return skewed, skewed > 0, (f"{skewed} (task, head, role) means at least tau + {FIG2_GAP:g} "
                              f"with the median at most tau - {FIG2_GAP:g} and no significant "
                              f"test (Fig. 2's skew); {flat} more not significant with the "
                              f"median above tau - {FIG2_GAP:g}; of {m} means at least "
                              f"tau + {FIG2_GAP:g}")


def _fine_overlap(c, run, state, first, second):
  both = total = 0
  for a in _runs(run, c, state).values():
    x, y = a.role(first), a.role(second)
    if x is None or y is None:
      continue
    total += int(x.sum())
    both += int((x & y).sum())
  if total == 0:
    raise NotComputable(f"no {first} heads" + ("" if any(first in a.roles for a in
                                                        _runs(run, c, state).values())
                                              else " (not tested: no parse of the task text)"))
  return _pct(both / total), both / total > 0.5, f"{both} of {total} {first} heads are {second}"


def _delimiter_intersect(c, run, state):
  both = total = 0
  for a in _runs(run, c, state).values():
    coarse, names = a.coarse()
    if vocab.COARSE_DELIMITER not in names:
      continue
    others = [i for i, n in enumerate(names) if n != vocab.COARSE_DELIMITER]
    other = coarse[..., others].any(-1)
    total += int(other.sum())
    both += int((other & coarse[..., names.index(vocab.COARSE_DELIMITER)]).sum())
  if total == 0:
    raise NotComputable("no head with another coarse role")
  return _pct(both / total), both / total > 0.5, f"{both} of {total} heads with another coarse role"


def _multi_functional(c, run, state):
  vals = {t: float((a.coarse()[0].sum(-1) >= 2).mean()) for t, a in _runs(run, c, state).items()}
  v = float(np.mean(list(vals.values())))
  return _pct(v), v >= 0.25, "mean over " + ", ".join(f"{TASK_NAMES[t]} {_pct(x)}" for t, x in vals.items())


def _block_marginal(c, run, state):
  block_n = also = 0
  for a in _runs(run, c, state).values():
    block = a.role(vocab.COARSE_BLOCK)
    other = a.any_of((vocab.COARSE_LOCAL, vocab.COARSE_SYNTACTIC))
    if block is None or other is None:
      continue
    block_n += int(block.sum())
    also += int((block & other).sum())
  if block_n == 0:
    raise NotComputable("no block heads in the pair tasks")
  return _pct(also / block_n), also / block_n <= 0.25, f"{also} of {block_n} block heads"


def _per_layer_mean(counts: np.ndarray, layers) -> float:
  layers = list(layers)
  return float(counts[layers].mean()) if layers else float("nan")


def _multi_skilled_in(c, a, name: str):
  """Multi-skilled heads per layer of analysis ``a``: ``(layers, mean over the claim's layer range
  ``name``, mean over the other layers)``; NotComputable when the model's layers do not separate
  them."""
  per_layer = _multi_skilled(a).sum(1)
  inside = _layers(c, name, a.num_layers)
  rest = [l for l in range(a.num_layers) if l not in inside]
  if not inside or not rest:
    raise NotComputable(f"{a.num_layers} layers do not separate the {name} layers")
  return inside, _per_layer_mean(per_layer, inside), _per_layer_mean(per_layer, rest)


def _multi_skilled_middle(c, run, state):
  out, ok = [], True
  for t, a in _runs(run, c, state).items():
    mid, m, r = _multi_skilled_in(c, a, "middle")
    ok &= m > r
    out.append(f"{TASK_NAMES[t]} {m:.1f} vs {r:.1f}")
  return "; ".join(out), ok, ("multi-skilled heads per layer, middle layers "
                              f"{list(mid)}{_scaled(a.num_layers)} vs the others: " + "; ".join(out))


def _multi_skilled_qqp_early(c, run, state):
  a = _runs(run, c, state)["qqp"]
  init, i, r = _multi_skilled_in(c, a, "initial")
  return f"{i:.1f} vs {r:.1f}", i > r, (f"QQP multi-skilled heads per layer, layers {list(init)}"
                                        f"{_scaled(a.num_layers)} vs the others")


def _delimiter_all_layers(c, run, state):
  short = []
  for t, a in _runs(run, c, state).items():
    share = _need(a.any_of(FIG5_DELIMITER), "cls/sep").mean(1)
    short += [f"{TASK_NAMES[t]} layer {l} ({_pct(share[l])})" for l in range(1, a.num_layers)
              if share[l] < 0.25]
  return (f"{len(short)} layer(s) below a quarter", not short,
          "layers 1.. with under a quarter cls/sep heads: " + (", ".join(short) or "none"))


def _delimiter_only_last_three(c, run, state):
  only = skilled = 0
  for a in _runs(run, c, state).values():
    layers = list(_layers(c, "last three", a.num_layers))
    fig5 = _need(a.count_of(FIG5_ROLES), "the Fig. 5 roles")[layers]
    delim = _need(a.count_of(FIG5_DELIMITER), "cls/sep")[layers]
    skilled += int((fig5 > 0).sum())
    only += int(((fig5 > 0) & (fig5 == delim)).sum())
  if skilled == 0:
    raise NotComputable("no skilled head in the last layers")
  return _pct(only / skilled), only / skilled > 0.5, (f"{only} of {skilled} skilled heads in layers "
                                                f"{layers}{_scaled(a.num_layers)}")


def _delimiter_layer0_few(c, run, state):
  vals = {}
  for t, a in _runs(run, c, state).items():
    layers = list(_layers(c, "first", a.num_layers))
    if not layers:
      raise NotComputable(f"{a.num_layers} layers do not resolve BERT-base layer 0")
    vals[t] = float(_need(a.any_of(FIG5_DELIMITER), "cls/sep")[layers].mean())
  v = float(np.mean(list(vals.values())))
  return _pct(v), v <= 1 / 6, f"layers {layers}{_scaled(a.num_layers)}: " + ", ".join(
      f"{TASK_NAMES[t]} {_pct(x)}" for t, x in vals.items())


def _block_per_layer(a: Analysis) -> np.ndarray:
  return _need(a.role(vocab.COARSE_BLOCK), vocab.COARSE_BLOCK).sum(1)


def _block_layer0(c, run, state):
  ok, out = True, []
  for t, a in _runs(run, c, state).items():
    b = _block_per_layer(a)
    first = list(_layers(c, "zeroth", a.num_layers))
    if not first:
      raise NotComputable(f"{a.num_layers} layers do not resolve BERT-base layer 0")
    ok &= bool(b[first].max() > 0 and b[first].max() >= b.max())
    out.append(f"{TASK_NAMES[t]} {b.tolist()}")
  return "; ".join(out), ok, "block heads per layer: " + "; ".join(out)


def _block_layers_1_4(c, run, state):
  ok, out = True, []
  for t, a in _runs(run, c, state).items():
    b = _block_per_layer(a)
    zeroth = set(bert_base_layers(0, 0, a.num_layers))
    layers = [l for l in _layers(c, "1 to 4", a.num_layers) if l not in zeroth]
    if not layers:
      raise NotComputable(f"{a.num_layers} layers leave no layer for BERT-base layers 1-4 "
                          "besides the one standing for layer 0")
    ok &= bool((b[layers] > 0).all())
    out.append(f"{TASK_NAMES[t]} {b.tolist()}")
  return "; ".join(out), ok, (f"block heads per layer (layers {layers}"
                              f"{_scaled(a.num_layers)}): " + "; ".join(out))


def _block_qqp(c, run, state):
  a = _runs(run, c, state)["qqp"]
  b = _block_per_layer(a)
  mid = list(_layers(c, "middle", a.num_layers))
  if not mid:
    raise NotComputable(f"{a.num_layers} layers do not resolve BERT-base's middle layers")
  ok = bool(b[0] > 0 and b[-1] > 0 and (b[mid] == 0).all())
  return str(b.tolist()), ok, f"QQP block heads per layer (middle {mid}{_scaled(a.num_layers)})"


def _block_heads_sst2(c, run, state):
  _runs(run, c, state)
  raise NotComputable("holds by construction: the block sieve is not defined for single "
                      "sentences, so no SST-2 head can have the block role")


def _qnli_layer7(c, run, state):
  a = _runs(run, c, state)["qnli"]
  layers = list(_layers(c, "layer 7", a.num_layers))
  if not layers:
    raise NotComputable(f"{a.num_layers} layers do not resolve BERT-base layer 7")
  count = _need(a.count_of(FIG5_ROLES), "the Fig. 5 roles")[layers]
  _fig5_syntactic(a)      # eight roles need the syntactic relations
  most = int(count.max())
  return f"{most} roles", most >= 8, (f"most Fig. 5 roles of a head in layers {layers}"
                                      f"{_scaled(a.num_layers)}: {most}")


def _block_mrpc_all(c, run, state):
  b = _block_per_layer(_runs(run, c, state)["mrpc"])
  return str(b.tolist()), bool((b > 0).all()), "MRPC block heads per layer"


def _syntactic_every_layer(c, run, state):
  pairs, short = 0, []
  for t, a in _runs(run, c, state).items():
    per_layer = _fig5_syntactic(a).sum(1)
    pairs += len(per_layer)
    short += [f"{TASK_NAMES[t]} layer {l} ({n})" for l, n in enumerate(per_layer) if n < 3]
  v = len(short) / pairs
  return _pct(v), v <= 0.10, (f"{len(short)} of {pairs} (task, layer) pairs under 3: "
                        + (", ".join(short) or "none"))


def _syntactic_layers_6_8(c, run, state):
  total = None
  for a in _runs(run, c, state).values():
    n = _fig5_syntactic(a).sum(1)
    total = n if total is None else total + n
  layers = _layers(c, "6 to 8", len(total))
  best = int(np.argmax(total))
  return f"layer {best}", best in layers, (f"syntactic heads per layer {total.tolist()}; layers 6-8 are "
                                f"{list(layers)}{_scaled(len(total))}")


def _last_two_few(c, run, state):
  syn = multi = None
  for a in _runs(run, c, state).values():
    s, m = _fig5_syntactic(a).sum(1), _multi_skilled(a).sum(1)
    syn = s if syn is None else syn + s
    multi = m if multi is None else multi + m
  last = list(_layers(c, "last two", len(syn)))
  rest = [l for l in range(len(syn)) if l not in last]
  if not last or not rest:
    raise NotComputable(f"{len(syn)} layers do not separate the last two layers")
  pairs = [(_per_layer_mean(x, last), _per_layer_mean(x, rest)) for x in (syn, multi)]
  ok = all(l <= 0.5 * r for l, r in pairs)
  return (f"syntactic {pairs[0][0]:.1f} vs {pairs[0][1]:.1f}; multi-skilled {pairs[1][0]:.1f} vs "
          f"{pairs[1][1]:.1f}"), ok, f"per layer, layers {last}{_scaled(len(syn))} vs the others"


def _change(c, run) -> dict[str, tuple[Analysis, Analysis]]:
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


def _group_means(pair, role: str, group: str):
  """``(before, after)`` mean sieve bias ``[l', h]`` of ``role`` over the layer third ``group``,
  or None when either analysis lacks the role or the model has no such third."""
  before, after = pair
  if role not in before.roles or role not in after.roles:
    return None
  layers = roles_lib.layer_groups(after.num_layers).get(group)
  if layers is None:
    return None
  return (before.means[layers, :, before.roles.index(role)],
          after.means[layers, :, after.roles.index(role)])


def _group_change(pair, role: str, group: str) -> float | None:
  means = _group_means(pair, role, group)
  if means is None:
    return None
  b, a = means
  with np.errstate(invalid="ignore"):
    d = float(np.nanmean(a) - np.nanmean(b)) if np.isfinite(a).any() and np.isfinite(b).any() else None
  return d


def _head_changes(pair, role: str, group: str) -> np.ndarray | None:
  """Per head of a layer third, fine-tuned minus pre-trained mean sieve bias (finite only)."""
  means = _group_means(pair, role, group)
  if means is None:
    return None
  d = (means[1] - means[0]).ravel()
  return d[np.isfinite(d)]


def _finetune_final(c, run, state, role, sign):
  from scipy import stats as sp_stats
  out, good, n = [], 0, 0
  for t, p in _change(c, run).items():
    d = _head_changes(p, role, "final")
    if d is None or d.size < 2:
      continue
    n += 1
    alternative = "less" if sign == "-" else "greater"
    pv = float(sp_stats.ttest_1samp(d, 0.0, alternative=alternative).pvalue) if d.std() > 0 else (
        0.0 if (d.mean() < 0 if sign == "-" else d.mean() > 0) else 1.0)
    ok = (d.mean() < 0 if sign == "-" else d.mean() > 0) and pv < 0.05
    good += ok
    out.append(f"{TASK_NAMES[t]} {d.mean():+.2f} (p = {pv:.2g})")
  if n == 0:
    raise NotComputable(f"{role} not defined in the final layers")
  return (", ".join(out), good > n / 2,
          f"change of the mean {role} sieve bias over the heads of the final third of the layers "
          f"and a one-sided t-test of the {'fall' if sign == '-' else 'rise'}; {good} of {n} "
          "task(s) significant")


def _mass_change(pair, feature: str) -> float:
  """Fine-tuned minus pre-trained mean attention mass on ``feature`` (a distance feature: cls,
  sep) over the heads of the final third of the layers."""
  before, after = pair
  if before.features is None or after.features is None:
    raise NotComputable("needs the heads' attention masses (the distance features of the "
                        "clustering) of both models")
  layers = roles_lib.layer_groups(after.num_layers).get("final")
  if layers is None:
    raise NotComputable(f"{after.num_layers} layers have no final third")
  i = vocab.DISTANCE_FEATURES.index(feature)
  return float(after.features[layers, :, i].mean() - before.features[layers, :, i].mean())


def _finetune_sep_not_cls(c, run, state):
  good, out = 0, []
  pairs = _change(c, run)
  for t, p in pairs.items():
    sep, cls = _mass_change(p, "sep"), _mass_change(p, "cls")
    good += sep < 0 and abs(cls) <= 0.5 * abs(sep)
    out.append(f"{TASK_NAMES[t]} sep {sep:+.3f}, cls {cls:+.3f}")
  return "; ".join(out), good > len(pairs) / 2, (
      "change of the mean attention mass on [SEP] and [CLS] over the heads of the final third "
      "of the layers")


def _finetune_stable(c, run, state):
  per = {g: [] for g in ("initial", "middle", "final")}
  for p in _change(c, run).values():
    for g in per:
      for r in PAPER_ROLES:
        d = _group_change(p, r, g)
        if d is not None:
          per[g].append(abs(d))
  if not all(per.values()):
    raise NotComputable("the layer thirds need at least 3 layers")
  m = {g: float(np.mean(v)) for g, v in per.items()}
  return (", ".join(f"{g} {v:.3f}" for g, v in m.items()),
          m["initial"] <= 0.5 * m["final"] and m["middle"] <= 0.5 * m["final"],
          "mean |change| of the four roles' mean sieve bias per layer third; \"change little\": "
          "at most half the final third's")


def _finetune_delimiter_heads(c, run, state):
  good, out = 0, []
  pairs = _change(c, run)
  for t, (b, a) in pairs.items():
    final = roles_lib.layer_groups(a.num_layers).get("final")
    if final is None:
      raise NotComputable(f"{a.num_layers} layers have no final third")
    nb = int(_need(b.role(vocab.COARSE_DELIMITER), vocab.COARSE_DELIMITER)[final].sum())
    na = int(_need(a.role(vocab.COARSE_DELIMITER), vocab.COARSE_DELIMITER)[final].sum())
    good += nb > 0 and na <= nb * 2 / 3
    out.append(f"{TASK_NAMES[t]} {nb} -> {na}")
  return "; ".join(out), good > len(pairs) / 2, ("delimiter heads of the final third, before -> "
                                                 "after; \"sharply\": at least a third fewer")


def _finetune_at_par(c, run, state):
  out, ok, n = [], True, 0
  for t in c.tasks:
    dev = devlin_dev(t)
    best = run.finetune.get(t)
    if dev is None or dev.value is None or not best or best.get(dev.metric) is None:
      continue
    v = float(best[dev.metric])
    n += 1
    ok &= abs(v - dev.value) <= 0.05
    out.append(f"{TASK_NAMES[t]} {_pct(v)} vs {_pct(dev.value)}")
  if n == 0:
    raise NotComputable("no task with both a dev score here and a published one")
  return "; ".join(out), ok, "best dev score vs Devlin et al. BERT-base dev (" + "; ".join(out) + ")"


def _half(c, run, state, role, half):
  first = second = 0
  for a in _runs(run, c, state).values():
    x = _need(a.role(role), role).sum(1)
    mid = a.num_layers // 2
    first += int(x[:mid].sum())
    second += int(x[a.num_layers - mid:].sum())
  ok = first > second if half == "first" else second > first
  return f"{first} vs {second}", ok, f"{role} heads in the first vs the second half of the layers"


def _cluster_layers(c, run, state, name, where):
  ok, out = True, []
  per = _runs(run, c, state)
  _need_types(per, (name,))
  for t, a in per.items():
    num_layers = a.num_layers
    l, _ = np.nonzero(a.clusters == name)
    if where == "all":
      have = len(set(l.tolist()))
      ok &= have / num_layers >= 0.8
      out.append(f"{TASK_NAMES[t]} {have} of {num_layers} layers")
      continue
    if not l.size:
      ok = False
      out.append(f"{TASK_NAMES[t]} no {name} head")
      continue
    median = float(np.median(l))
    third = {"first": 0, "middle": 1, "last": 2}[where]
    bounds = np.array_split(np.arange(num_layers), 3)[third]
    if bounds.size == 0:
      raise NotComputable(f"{num_layers} layers have no {where} third")
    ok &= bool(bounds[0] - 0.5 <= median <= bounds[-1] + 0.5)
    out.append(f"{TASK_NAMES[t]} median layer {median:g} (the {where} third: layers "
               f"{bounds.tolist()})")
  what = ("layers with a " + name + " head" if where == "all" else "median layer of the "
          + name + " heads")
  return "; ".join(out), ok, f"per clustering, {what}: " + "; ".join(out)


def _stability_over_95(c, run, state):
  vals = [(s, t, a.stability) for s in ("pretrained", "finetuned")
          for t, a in run.analyses.get(s, {}).items() if a.stability is not None]
  if not vals:
    raise NotComputable("no clustering stability in the analyses")
  mean = float(np.mean([v for *_, v in vals]))
  return (_pct(mean), mean >= STABLE_BAR,
          f"mean stability over {len(vals)} clustering(s): " + ", ".join(
              f"{s} {TASK_NAMES.get(t, t)} {_pct(v)}" for s, t, v in vals))


def _cluster_similar(c, run, state):
  ok, out, worst = True, [], 0.0
  pairs = _change(c, run)
  for t, (b, a) in pairs.items():
    _need_types({t: b}, CLUSTER_TYPES)
    _need_types({t: a}, CLUSTER_TYPES)
    n = b.num_heads
    for name in CLUSTER_TYPES:
      before, after = float((b.clusters == name).mean()), float((a.clusters == name).mean())
      lo, hi = wilson_interval(before, n)
      inside = lo - 1e-12 <= after <= hi + 1e-12
      ok &= inside
      worst = max(worst, abs(after - before))
      if not inside:
        out.append(f"{TASK_NAMES.get(t, t)} {name} {_pct(before)} -> {_pct(after)} (interval "
                   f"{_pct(lo)} to {_pct(hi)})")
  return (f"{100 * worst:.1f} pp largest change", ok,
          "types whose fine-tuned share leaves the 95% interval of the pre-trained share: "
          + (", ".join(out) or "none") + "; tasks " + ", ".join(TASK_NAMES.get(t, t) for t in pairs))


def _cluster_kept(c, run, state):
  ok, out = True, []
  changed = {g: [] for g in ("initial", "middle", "final")}
  for t, (b, a) in _change(c, run).items():
    _need_types({t: b}, CLUSTER_TYPES)
    _need_types({t: a}, CLUSTER_TYPES)
    same = a.clusters == b.clusters
    ok &= bool(same.mean() > 0.5)
    out.append(f"{TASK_NAMES[t]} {_pct(same.mean())} kept")
    for g, layers in roles_lib.layer_groups(a.num_layers).items():
      changed[g].append(float((~same[layers]).mean()))
  share = {g: float(np.mean(v)) for g, v in changed.items() if v}
  if "final" not in share:
    raise NotComputable("the model's layers have no final third")
  ok &= share["final"] >= max(share.values())
  return ("; ".join(out), ok, "changed heads per layer third: "
          + ", ".join(f"{g} {_pct(v)}" for g, v in share.items()))


def _stable_3_5(c, run, state):
  from heads_jax.hoststats import clustering
  a = _runs(run, c, state)["squad"]
  if a.features is None or a.clusters is None:
    raise NotComputable("needs the SQuAD model's head features (clusters.csv)")
  info = a.cluster_info or {}
  x = a.features.reshape(-1, a.features.shape[-1])
  method, seed, n_init = info.get("method", "kmeans"), int(info.get("seed", 0)), int(info.get("n_init", 10))
  fits = int(info.get("stability_fits", 10)) or 10
  vals = {}
  for k in (3, 5):
    model, *_ = clustering.fit_types(x, k, method, seed, n_init)
    v = clustering.clustering_stability(x, model.predict(x), k, method, seed, fits, n_init)
    if v is None:
      raise NotComputable(f"{x.shape[0]} heads are too few for {k} clusters on halves")
    vals[k] = v
  return (", ".join(f"k = {k}: {_pct(v)}" for k, v in vals.items()),
          all(v >= STABLE_BAR for v in vals.values()),
          f"stability with 3 and 5 clusters ({method}, {fits} half-sample fits)")


def _one_sided_two_proportions(before: float, after: float, n: int) -> float:
  """p-value of a fall from ``before`` to ``after`` (shares of the same ``n`` questions; pooled
  two-proportion z-test, one-sided)."""
  from scipy import stats as sp_stats
  pooled = (before + after) / 2
  se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * 2 / n)
  return float(sp_stats.norm.sf((before - after) / se))


def _squad_rows(run) -> dict:
  if not run.squad or not run.squad.get("rows"):
    raise NotComputable(_SQUAD_REASON)
  return run.squad["rows"]


def _squad_row(c, run, state, row):
  rows = _squad_rows(run)
  r = rows.get(int(row))
  if r is None:
    raise NotComputable(f"the run's Tables 2-3 have no row {row}")
  if r.get("missing"):
    raise NotComputable(f"type {str(r['missing']).split(',')[0].strip()}: definition not met "
                        "(the row's heads could not be chosen)")
  n = run.squad.get("n")
  return (float(r["exact_match"]), None,
          f"EM {r['exact_match']:.2f} / F1 {r['f1']:.2f} on {n} questions", n)


def _squad_statement(c, run, state, key):
  rows = _squad_rows(run)
  em = {i: float(r["exact_match"]) for i, r in rows.items()}
  need = {"guan_prune_diagonal": (1, 2, 3, 4, 5), "guan_prune_vertical": (1, 5),
          "guan_keep_dense_vertical": (6, 7), "guan_uniform_dense": (1, 8),
          "guan_uniform_dense_vertical": (1, 8, 10), "guan_uniform_vertical": (11,),
          "guan_diagonal_intra": (1, 12, 13), "guan_dense_vertical_inter": (17, 19)}[key]
  missing = [i for i in need if i not in em]
  if missing:
    raise NotComputable(f"the run's Tables 2-3 lack rows {missing}")
  unnamed = [str(rows[i].get("missing")) for i in need if rows[i].get("missing")]
  if unnamed:
    raise NotComputable(f"type {unnamed[0].split(',')[0].strip()}: definition not met (the "
                        "rows' heads could not be chosen)")
  loss = {i: em[1] - em[i] for i in em} if 1 in em else {}
  if key == "guan_prune_diagonal":
    ok = em[3] <= 0.1 * em[1] and all(loss[3] > loss[i] for i in (2, 4, 5))
    value = (f"row 3 {em[3]:.2f} of row 1 {em[1]:.2f}; loss {loss[3]:.2f} vs "
             f"{max(loss[i] for i in (2, 4, 5)):.2f}")
  elif key == "guan_prune_vertical":
    ok, value = loss[5] < 1.5, f"loss {loss[5]:.2f}"
  elif key == "guan_keep_dense_vertical":
    ok, value = em[6] > em[7], f"row 6 {em[6]:.2f} vs row 7 {em[7]:.2f}"
  elif key == "guan_uniform_dense":
    ok, value = loss[8] < 10, f"loss {loss[8]:.2f}"
  elif key == "guan_uniform_dense_vertical":
    n = run.squad.get("n")
    if not n:
      raise NotComputable("\"significant\" needs the number of evaluated questions")
    p = _one_sided_two_proportions(em[1] / 100, em[10] / 100, int(n))
    ok = p < ALPHA and loss[10] > loss[8]
    value = f"loss {loss[10]:.2f} (p = {p:.2g}) vs {loss[8]:.2f}"
  elif key == "guan_uniform_vertical":
    ok, value = em[11] > 50, f"EM {em[11]:.2f}"
  elif key == "guan_diagonal_intra":
    ok = em[12] <= 0.5 * em[1] and loss[13] < 1.5
    value = f"row 12 {em[12]:.2f} of row 1 {em[1]:.2f}; row 13 loses {loss[13]:.2f}"
  else:
    ok, value = em[19] > em[17], f"row 19 {em[19]:.2f} vs row 17 {em[17]:.2f}"
  return value, ok, "EM (percent) of the rows " + ", ".join(f"{i}: {em[i]:.2f}" for i in need)


Evaluator = Callable[..., tuple]
# evaluators that take arguments from the check ("half:cls:first": _half(c, run, state, "cls", "first"))
_WITH_ARGUMENTS = {"fine_overlap": _fine_overlap, "finetune_final": _finetune_final, "half": _half,
                   "cluster_layers": _cluster_layers, "squad_row": _squad_row,
                   "squad_statement": _squad_statement}

EVALUATORS: dict[str, Evaluator] = {
    "average_vs_test": _average_vs_test,
    "delimiter_intersect": _delimiter_intersect,
    "multi_functional": _multi_functional,
    "block_marginal_overlap": _block_marginal,
    "multi_skilled_middle": _multi_skilled_middle,
    "multi_skilled_qqp_early": _multi_skilled_qqp_early,
    "delimiter_all_layers": _delimiter_all_layers,
    "delimiter_only_last_three": _delimiter_only_last_three,
    "delimiter_layer0_few": _delimiter_layer0_few,
    "block_layer0": _block_layer0,
    "block_layers_1_4": _block_layers_1_4,
    "block_qqp_first_last": _block_qqp,
    "block_mrpc_all_layers": _block_mrpc_all,
    "syntactic_every_layer": _syntactic_every_layer,
    "syntactic_layers_6_8": _syntactic_layers_6_8,
    "last_two_few_syntactic": _last_two_few,
    "finetune_sep_not_cls": _finetune_sep_not_cls,
    "finetune_initial_middle_stable": _finetune_stable,
    "finetune_delimiter_heads_drop": _finetune_delimiter_heads,
    "finetune_at_par": _finetune_at_par,
    "stability_over_95": _stability_over_95,
    "cluster_similar": _cluster_similar,
    "cluster_kept": _cluster_kept,
    "block_heads_sst2": _block_heads_sst2,
    "qnli_layer7": _qnli_layer7,
    "stable_3_5": _stable_3_5,
}


def _evaluator(c: Claim) -> Evaluator | None:
  if not c.check:
    return None
  name, *args = c.check.split(":")
  if name in _WITH_ARGUMENTS:
    evaluate = _WITH_ARGUMENTS[name]
    return lambda c, run, state: evaluate(c, run, state, *args)
  return EVALUATORS[name]


def _measure(c: Claim, run: RunFigures, state: str) -> tuple[object, bool | None, str, int | None]:
  """(value, holds or None for a number judged by tolerance / interval, detail, n: what a share
  is over, or None)."""
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
    fmt = (lambda x: f"{100 * x:.2f}") if c.kind == "score" else _pct
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
      if not _finite(value) or c.value is None:
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
  verdict = HOLDS if holds else FAILS
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


def evaluate_all(run: RunFigures, claims_: tuple[Claim, ...] = CLAIMS) -> list[tuple[Claim, Evaluation]]:
  """Every claim judged on ``run``, in `CLAIMS` order."""
  return [(c, evaluate(c, run)) for c in claims_]
