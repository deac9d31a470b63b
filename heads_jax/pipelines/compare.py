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

from pathlib import Path

from heads_jax import contract, runfiles
from heads_jax.errors import UserError
from heads_jax.pipelines import engine, names, stages
from heads_jax.pipelines.comparison import (  # noqa: F401 (the comparison's names, as before)
    ANALYSIS_FILES, COMPARISON_FILES, REPORT_FILES, SIMILARITY, SIMILARITY_FILE,
    attention_similarity, attention_similarity_section, read_similarity, similarity_data)

STAGES = names.COMPARE


def _check(before, after, out, before_model, after_model) -> None:
  """Every check before the work: the analyses exist, both models or none, --out."""
  for d in (before, after):
    if not (Path(d) / contract.SCORES_FILE).is_file():
      raise UserError(f"{d} is not an analysis output directory (no {contract.SCORES_FILE}); "
                      f"run `heads-jax analyze --out {d}` first")
  if bool(before_model) != bool(after_model):
    raise UserError("the attention similarity needs both --before-model and --after-model")
  # a file, or another job's directory (an analysis: its report.html would be replaced)
  runfiles.check_dir(out, "comparison", flag="--out")
  for d in (before, after):
    if Path(out).resolve() == Path(d).resolve():
      raise UserError(f"--out {out} is one of the analyses compared; choose another --out")


def _analysis_key(ctx: engine.Context, folder) -> dict:
  folder = Path(folder)
  return {name: ctx.files(folder / name) for name in ANALYSIS_FILES if (folder / name).is_file()}


def run_compare(before, after, out, *, title=None, log=print, before_model=None, after_model=None,
                data=None, max_examples=500, max_length=128, redo: str | None = None,
                progress: bool = True) -> Path:
  """Compares two analysis directories; returns the path of the report. With ``before_model``
  and ``after_model``, adds the per-head attention similarity of the two models on ``data``
  (default: the first data set of the ``after`` analysis). ``redo``: a stage (``comparison``,
  ``similarity``, ``report``) to rerun with what reads it, or ``"all"``. ``progress=False``: no
  line per stage."""
  _check(before, after, out, before_model, after_model)
  out = Path(out)
  with_models = bool(before_model and after_model)
  if with_models:
    data = similarity_data(data, after)

  def comparison(ctx):
    return stages.comparison(ctx, "comparison", "comparison", before, after, out, inputs={
        "before": _analysis_key(ctx, before), "after": _analysis_key(ctx, after)})

  def similarity(ctx):
    return stages.similarity(ctx, "similarity", "similarity", out, before_model=before_model,
                             after_model=after_model, data=data, max_examples=max_examples,
                             max_length=max_length, inputs={
                                 "before_model": ctx.model(before_model),
                                 "after_model": ctx.model(after_model)})

  def report(ctx):
    return stages.compare_report(
        ctx, "report", "report", before, after, ctx.results["comparison"], title=title,
        similarity=ctx.results.get("similarity"),
        inputs={"summaries": {"before": _analysis_key(ctx, before).get(contract.SUMMARY_JSON),
                              "after": _analysis_key(ctx, after).get(contract.SUMMARY_JSON)}})

  plan = [engine.Stage("comparison", "sieve bias, roles and clusters before vs after",
                       comparison, outputs=COMPARISON_FILES)]
  if with_models:
    plan.append(engine.Stage("similarity", "per-head attention similarity of the two models",
                             similarity, outputs=(SIMILARITY_FILE,)))
  plan.append(engine.Stage("report", "the report", report,
                           reads=tuple(s.name for s in plan), outputs=REPORT_FILES))
  claim = {"kind": "comparison", "flag": "--out",
           "model": [str(before_model), str(after_model)] if with_models else None,
           "data": [str(before), str(after)],
           "settings": {"data": data, "max_examples": max_examples, "max_length": max_length}}
  results = engine.run_pipeline(plan, out, redo=redo, log=log, what="a comparison", claim=claim,
                                progress=progress)
  return Path(results["report"].report)
