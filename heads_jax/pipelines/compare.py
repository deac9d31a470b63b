"""The compare job: two analyses (a model before and after fine-tuning, or two models) on the same data.

Reads the output directories of two `heads-jax analyze` runs and writes into --out:
compare_sieve_bias.csv (change of mean sieve bias per role over the initial, middle and final
thirds of the layers; Pande et al. Fig. 6), compare_roles.csv (roles gained and lost per head),
compare_clusters.csv (cluster changes per head), compare.json, figures and report.html.
With --before-model and --after-model it also computes the cosine similarity of every head's
attention under the two models on the same inputs (Kovaleva et al. 2019):
attention_similarity.csv, a heatmap and a report section.

The comparison's stages (`heads_jax.pipelines.comparison`, composed by
`heads_jax.pipelines.stages`) on the stage engine: ``comparison`` (host, keyed by the content
of the two analyses' files it reads), ``similarity`` (device, with the models: keyed by the
models' and the data's content and its settings) and ``report``; a rerun with the same inputs reuses every
stage, a changed analysis or model reruns what reads it, ``redo=STAGE`` (``--redo``) reruns one
and what reads it; --out is locked while the job runs and says what it is.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from heads_jax import contract, runfiles
from heads_jax.errors import UserError
from heads_jax.pipelines import engine, names, stages
from heads_jax.pipelines.comparison import (  # noqa: F401 (the comparison's names, as before)
    ANALYSIS_FILES, COMPARISON_FILES, REPORT_FILES, SIMILARITY, SIMILARITY_FILE,
    attention_similarity, attention_similarity_section, check_models, read_similarity,
    similarity_data)

STAGES = names.COMPARE


def _check(c: "CompareConfig") -> None:
  """Every check before the work: the analyses exist, both models or none, --out."""
  for d in (c.before, c.after):
    if not (Path(d) / contract.SCORES_FILE).is_file():
      raise UserError(f"{d} is not an analysis output directory (no {contract.SCORES_FILE}); "
                      f"run `heads-jax analyze --out {d}` first")
  if bool(c.before_model) != bool(c.after_model):
    raise UserError("the attention similarity needs both --before-model and --after-model")
  if c.with_models:
    check_models(c.before, c.after, c.before_model, c.after_model)
  # a file, or another job's directory (an analysis: its report.html would be replaced)
  runfiles.check_dir(c.out, "comparison", flag="--out")
  for d in (c.before, c.after):
    if Path(c.out).resolve() == Path(d).resolve():
      raise UserError(f"--out {c.out} is one of the analyses compared; choose another --out")


def _analysis_key(ctx: engine.Context, folder) -> dict:
  folder = Path(folder)
  return {name: ctx.files(folder / name) for name in ANALYSIS_FILES if (folder / name).is_file()}


@dataclasses.dataclass(frozen=True)
class CompareConfig:
  """Everything a comparison depends on (the engine's ``config``): the two analysis
  directories, ``out``, the report's title, and for the attention similarity its data (None:
  the first data set of ``after``), sizes and both models."""
  before: str
  after: str
  out: str
  title: str | None = None
  data: str | None = None
  max_examples: int = 500
  max_length: int = 128
  before_model: str | None = None
  after_model: str | None = None

  @property
  def with_models(self) -> bool:
    return bool(self.before_model and self.after_model)

  def claim(self) -> dict:
    """`runfiles.claim_dir`'s arguments for ``out``."""
    return {"kind": "comparison", "flag": "--out",
            "model": [self.before_model, self.after_model] if self.with_models else None,
            "data": [self.before, self.after],
            "settings": {"data": self.data, "max_examples": self.max_examples,
                         "max_length": self.max_length}}


def _comparison(ctx: engine.Context[CompareConfig]) -> stages.Comparison:
  c: CompareConfig = ctx.config
  return stages.comparison(ctx, "comparison", "comparison", c.before, c.after, Path(c.out),
                           inputs={"before": _analysis_key(ctx, c.before),
                                   "after": _analysis_key(ctx, c.after)})


def _similarity(ctx: engine.Context[CompareConfig]) -> stages.Similarity:
  c: CompareConfig = ctx.config
  return stages.similarity(ctx, "similarity", "similarity", Path(c.out),
                           before_model=c.before_model, after_model=c.after_model, data=c.data,
                           max_examples=c.max_examples, max_length=c.max_length,
                           inputs={"before_model": ctx.model(c.before_model),
                                   "after_model": ctx.model(c.after_model)})


def _report(ctx: engine.Context[CompareConfig]) -> stages.Comparison:
  c: CompareConfig = ctx.config
  return stages.compare_report(
      ctx, "report", "report", c.before, c.after, ctx.results["comparison"], title=c.title,
      similarity=ctx.results.get("similarity"),
      inputs={"summaries": {"before": _analysis_key(ctx, c.before).get(contract.SUMMARY_JSON),
                            "after": _analysis_key(ctx, c.after).get(contract.SUMMARY_JSON)}})


def compare_stages(c: CompareConfig) -> list[engine.Stage[CompareConfig]]:
  """``comparison`` (host), ``similarity`` (device; with both models) and ``report``."""
  plan = [engine.Stage("comparison", "sieve bias, roles and clusters before vs after",
                       _comparison, outputs=COMPARISON_FILES)]
  if c.with_models:
    plan.append(engine.Stage("similarity", "per-head attention similarity of the two models",
                             _similarity, outputs=(SIMILARITY_FILE,)))
  plan.append(engine.Stage("report", "the report", _report,
                           reads=tuple(s.name for s in plan), outputs=REPORT_FILES))
  return plan


def run_compare(before, after, out, *, log=print, redo: str | None = None,
                progress: bool = True, **settings) -> Path:
  """Compares two analysis directories; returns the path of the report. ``settings``: the
  other fields of `CompareConfig` (title; with ``before_model`` and ``after_model`` the per-head
  attention similarity of the two models on ``data``, default the first data set of the
  ``after`` analysis). ``redo``: a stage (``comparison``, ``similarity``, ``report``) to rerun
  with what reads it, or ``"all"``. ``progress=False``: no line per stage."""
  models = {k: str(settings[k]) if settings.get(k) else None
            for k in ("before_model", "after_model")}
  c = CompareConfig(before=str(before), after=str(after), out=str(out), **{**settings, **models})
  _check(c)
  if c.with_models:
    c = dataclasses.replace(c, data=similarity_data(c.data, c.after))
  results = engine.run_pipeline(compare_stages(c), c.out, config=c, redo=redo, log=log,
                                what="a comparison", claim=c.claim(), progress=progress)
  return Path(results["report"].report)
