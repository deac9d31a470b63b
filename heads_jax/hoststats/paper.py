"""The published numbers a run is set beside: Pande et al. (AAAI 2021), Guan et al. (COLING 2020)
and Devlin et al. (NAACL 2019), each with its source.

`CLAIMS` holds every quantitative claim of the two analysis papers that the reproduction reports
(issue 14's list); `DEVLIN_DEV` the BERT-base GLUE scores the fine-tuned models are compared with.
A `Claim` says which summary figure of a run it is compared with (``summary_key``, a key of
``summary.json``, `heads_jax.hoststats.summary`), over which model and data (``model``,
``scope``), and how the paper's value is to be read (``kind``).

Provenance. The values of Pande et al. are the ones issue 14 quotes from the paper; offline only
the paper's abstract and introduction could be read back (arXiv 2101.09115), so the section of
each is given as the figure its discussion belongs to, and ``verified`` says what was checked.
Guan et al.'s cluster shares and clustering stability could not be recovered offline (only the
abstract and introduction of arXiv 2011.00943 were reachable): their ``value`` is None and the
``note`` says so, rather than a number made up. Devlin et al.'s scores were checked against
Table 5 (dev, BERT-base) and Table 1 (GLUE test) of arXiv 1810.04805 as quoted in several
independent public summaries.

Host-only module (no jax, no numpy needed).
"""

from __future__ import annotations

import dataclasses
import math

PANDE = "Pande et al. 2021 (AAAI; arXiv 2101.09115)"
GUAN = "Guan et al. 2020 (COLING; arXiv 2011.00943)"
DEVLIN = "Devlin et al. 2019 (NAACL; arXiv 1810.04805)"

TASKS = ("mrpc", "qqp", "sst2", "qnli")
TASK_NAMES = {"mrpc": "MRPC", "qqp": "QQP", "sst2": "SST-2", "qnli": "QNLI"}

# kind: how a value reads and how a difference is formed.
#   share    a fraction 0..1 (shown as %); difference = this run - paper, in percentage points
#   float    a number; difference = this run - paper
#   corr     a correlation coefficient; difference = this run - paper
#   count    a number of heads; difference = this run - paper
#   layer    a layer index (0-based) where something is most frequent; "holds" when equal
#   text     a statement without a number (value None); the report says whether it holds
KINDS = ("share", "float", "corr", "count", "layer", "text")

# model: which analysed model the claim is about. "pretrained": the pre-trained model analysed
# on each task's sequences; "finetuned": each task's fine-tuned model on its own task.
# scope: "pooled" (all tasks' scores / p-values together, Fig. 3), "mean_over_tasks" (the
# mean of the per-task values), "range_over_tasks" (min..max of the per-task values, with the
# mean), "task" (one task, ``task``), "all_models" (the cluster analysis of every model).


@dataclasses.dataclass(frozen=True)
class Claim:
  """One quantitative claim of a paper.

  key: stable identifier (used in tables, JSON and tests).
  paper: `PANDE`, `GUAN` or `DEVLIN`.
  text: the claim in words.
  value: the paper's number (a fraction for shares), None where it is not recoverable offline.
  kind: one of `KINDS`.
  summary_key: the ``summary.json`` key (or derived figure, see `heads_jax.report.reproduce`)
    this run's value comes from; None for claims computed otherwise.
  model, scope, task: what the value is computed over (see above).
  value_range: (low, high) for claims the paper states as a range.
  source: where in the paper.
  verified: what was checked offline against the paper's text.
  note: anything a reader must know (reading of an ambiguous sentence, missing figure).
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

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"claim {self.key}: kind {self.kind!r} is not one of {KINDS}")
    if self.model not in ("pretrained", "finetuned"):
      raise ValueError(f"claim {self.key}: model must be pretrained or finetuned")

  def as_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["value_range"] = list(self.value_range) if self.value_range else None
    return d


_ISSUE = ("value as issue 14 quotes the paper; offline only the abstract and introduction of "
          "the paper could be read back")
_MODEL_READING = ("our reading: the co-location and layer figures (Figs. 4-5) describe the "
                  "pre-trained BERT on each task's test sequences; the report also shows the "
                  "fine-tuned models' value")

CLAIMS: tuple[Claim, ...] = (
    Claim("mean_sieve_score", PANDE, "mean of all sieve bias scores", 2.8, "float",
          "mean_sieve_score", "pretrained", "pooled",
          "Pande et al. 2021, hypothesis-testing section (choice of tau; Fig. 3, CDF of the scores)",
          verified=_ISSUE,
          note="pooled over all sequences, heads and roles of the four tasks"),
    Claim("tau", PANDE, "threshold tau: the smallest integer larger than the mean of all "
          "sieve scores", 3.0, "float", "auto_tau", "pretrained", "pooled",
          "Pande et al. 2021, hypothesis-testing section", verified=_ISSUE,
          note="this run's value is the paper's rule applied to this run's pooled scores; the "
               "tests of this run use tau = 3 as the paper"),
    Claim("share_p_between", PANDE, "share of p-values in (0.05, 0.95)", 0.018, "share",
          "share_p_between", "pretrained", "pooled",
          "Pande et al. 2021, hypothesis-testing section (Fig. 3, histogram of the p-values)",
          verified=_ISSUE,
          note="pooled over all (layer, head, role) tests of the four tasks"),
    Claim("share_delimiter", PANDE, "share of delimiter heads, mean over the four tasks",
          0.7343, "share", "share_delimiter", "pretrained", "mean_over_tasks",
          "Pande et al. 2021, co-location of functional roles (Fig. 4)", verified=_ISSUE,
          note=_MODEL_READING),
    Claim("share_unskilled", PANDE, "share of heads without any role (unskilled)", 0.0937,
          "share", "share_unskilled", "pretrained", "mean_over_tasks",
          "Pande et al. 2021, co-location of functional roles (Fig. 4)", verified=_ISSUE,
          note=_MODEL_READING + "; the paper's sentence is read as a mean over the four tasks"),
    Claim("share_syntactic_also_local", PANDE, "share of syntactic heads that are also local "
          "(42.1% to 88.8% over the tasks, mean 70.9%)", 0.709, "share",
          "share_syntactic_also_local", "pretrained", "range_over_tasks",
          "Pande et al. 2021, co-location of functional roles (Fig. 4)",
          value_range=(0.421, 0.888), verified=_ISSUE, note=_MODEL_READING),
    *(Claim(f"spearman_{t}", PANDE, f"Spearman correlation of local and syntactic sieve bias, "
            f"{TASK_NAMES[t]}", v, "corr", "spearman_local_syntactic", "pretrained", "task",
            "Pande et al. 2021, co-location of functional roles (local vs syntactic)", task=t,
            verified=_ISSUE, note=_MODEL_READING)
      for t, v in (("qnli", 0.78), ("qqp", 0.81), ("mrpc", 0.85), ("sst2", 0.73))),
    Claim("block_heads_sst2", PANDE, "no block heads on SST-2", 0.0, "count", "block_heads",
          "pretrained", "task", "Pande et al. 2021, distribution over layers (Fig. 5)",
          task="sst2", verified=_ISSUE,
          note="SST-2 inputs are single sentences: the block sieve is undefined there, so this "
               "holds by construction (the block role is NaN for every sequence)"),
    Claim("block_layer", PANDE, "block heads are most frequent in layer 0", 0.0, "layer",
          "block_layer", "pretrained", "mean_over_tasks",
          "Pande et al. 2021, distribution over layers (Fig. 5)", verified=_ISSUE,
          note="this run: the layer with the most block heads, summed over the pair tasks "
               "(MRPC, QQP, QNLI); 0-based"),
    *(Claim(f"guan_share_{name.replace('+', '_')}", GUAN,
            f"share of heads in the {name} cluster", None, "share", f"cluster_share:{name}",
            "pretrained", "pooled", "Guan et al. 2020, clustering of BERT-base heads (Fig. 1)",
            verified="not recoverable offline",
            note="the paper's share of this cluster type could not be read back offline "
                 "(only the abstract and introduction were reachable); fill it from the paper")
      for name in ("dense", "diagonal", "dense+vertical", "vertical")),
    Claim("guan_stability", GUAN, "stability of the clustering (fraction of heads with the same "
          "cluster in every refit)", None, "share", "cluster_stability", "pretrained", "pooled",
          "Guan et al. 2020, clustering section", verified="not recoverable offline",
          note="not recoverable offline; DESIGN.md section 3 defines this run's measure (10 fits "
               "on random halves of the heads)"),
)


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
# MRPC, SST-2 accuracy on dev, "averaged over 5 random restarts" is said of Table 6); QQP dev is
# not given. Table 1 gives GLUE test scores (F1 for QQP and MRPC, accuracy otherwise).
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

# The paper's settings the reproduction follows (for the report's "setup" table).
PANDE_SETUP = {
    "model": "BERT-base (12 layers x 12 heads), pre-trained on Wikipedia + Gutenberg",
    "fine-tuning grid": "batch size {32, 128} x learning rate {1e-4, 2e-4}, LAMB, 10K warm-up steps",
    "batch size wording": "\"a batch size of 2K tokens\" (see configs/reproduce.py)",
    "analysed sequences": "the first 1000 test sequences of each task",
    "parser": "spaCy",
    "test": "one-sided, tau = 3, alpha = 0.05",
}


def claims(paper: str | None = None) -> tuple[Claim, ...]:
  """All claims, or those of one paper (`PANDE`, `GUAN`)."""
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


def _finite(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def difference(c: Claim, this_run) -> float | str | None:
  """This run's value minus the paper's (a share in percentage points), "holds"/"does not hold"
  for layer and text claims, or None when either side is missing."""
  if c.kind == "text":
    return None if this_run is None else ("holds" if this_run else "does not hold")
  if not _finite(this_run) or c.value is None:
    return None
  if c.kind == "layer":
    return "holds" if int(this_run) == int(c.value) else "does not hold"
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
  if kind == "corr":
    return f"{value:.2f}"
  if kind in ("count", "layer"):
    return f"{int(value)}"
  return f"{value:.2f}"


def format_paper_value(c: Claim) -> str:
  if c.value is None:
    return "not recoverable offline"
  text = format_value(c.kind, c.value)
  if c.value_range:
    lo, hi = c.value_range
    text += f" ({format_value(c.kind, lo)} to {format_value(c.kind, hi)})"
  return text


def format_difference(c: Claim, diff) -> str:
  if diff is None:
    return "n/a"
  if isinstance(diff, str):
    return diff
  if c.kind == "share":
    return f"{diff:+.1f} pp"
  return f"{diff:+.2f}"
