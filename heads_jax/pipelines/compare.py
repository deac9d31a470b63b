"""The compare job: two analyses (a model before and after fine-tuning, or two models) on the same data.

Reads the output directories of two `heads-jax analyze` runs and writes into --out:
compare_sieve_bias.csv (change of mean sieve bias per role over the initial, middle and final
thirds of the layers; Pande et al. Fig. 6), compare_roles.csv (roles gained and lost per head),
compare_clusters.csv (cluster changes per head), compare.json, figures and report.html.
With --before-model and --after-model it also computes the cosine similarity of every head's
attention under the two models on the same inputs (Kovaleva et al. 2019):
attention_similarity.csv, a heatmap and a report section.

On the stage engine (`heads_jax.pipelines.engine`): ``comparison`` (keyed by the content of the
two analyses' files it reads), ``similarity`` (with the models: keyed by the models' and the
data's content and its settings) and ``report``; a rerun with the same inputs reuses every
stage, a changed analysis or model reruns what reads it, ``redo=STAGE`` (``--redo``) reruns one
and what reads it; --out is locked while the job runs and says what it is.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax import contract, runfiles
from heads_jax.ablation.similarity import similarity_on_spec, similarity_table
from heads_jax.errors import UserError
from heads_jax.hoststats.compare import compare_runs
from heads_jax.model.loading import load_model
from heads_jax.pipelines import engine
from heads_jax.pipelines.keys import unit_key
from heads_jax.report.compare import similarity_section, write_compare_report

SIMILARITY = "attention_similarity"   # its table's stem
# The files of an analysis directory that the comparison and its report read.
ANALYSIS_FILES = (contract.SCORES_FILE, contract.TESTS_CSV, contract.SETTINGS_JSON,
                  contract.CLUSTERS_CSV, contract.SUMMARY_JSON)


def similarity_data(data, after) -> str:
  """The inputs of the attention similarity: ``data``, else the first data set of the ``after``
  analysis (its run file)."""
  if data is None and after is not None:
    try:
      run = contract.read_run(after)
    except ValueError as e:
      raise UserError(str(e)) from None
    specs = ((run or {}).get("device") or {}).get("data") or []
    data = specs[0] if specs else None
  if data is None:
    raise UserError("the attention similarity needs inputs: pass --data SPEC")
  return data


def attention_similarity(before_model, after_model, out, *, data, max_examples=500,
                         max_length=128, log=print) -> dict:
  """Computes the per-head attention similarity of two models (Kovaleva et al. 2019) on
  ``data``, writes ``attention_similarity.csv`` into ``out``; returns ``{"sequences", "data",
  "mean", "layer_means"}``."""
  model_a, _ = load_model(before_model, with_tokenizer=False)
  model_b, tokenizer = load_model(after_model)
  sim, n = similarity_on_spec(model_a, model_b, tokenizer, data, max_examples=max_examples,
                              max_length=max_length)
  runfiles.write_table(out, SIMILARITY, similarity_table(sim))
  log(f"attention similarity before/after over {n} sequences of {data}: mean cosine "
      f"{sim.mean():.3f}; per layer " + ", ".join(f"{v:.3f}" for v in sim.mean(1)))
  return {"sequences": int(n), "data": data, "mean": float(sim.mean()),
          "layer_means": [float(v) for v in sim.mean(1)]}


def read_similarity(out) -> np.ndarray:
  """``[l, h]`` cosine similarity from ``out/attention_similarity.csv``."""
  t = pd.read_csv(Path(out) / f"{SIMILARITY}.csv")
  return t.pivot(index="layer", columns="head", values="cosine").to_numpy(float)


def attention_similarity_section(before_model, after_model, out, *, data=None, after=None,
                                 max_examples=500, max_length=128, log=print) -> dict:
  """`attention_similarity` and its report section (figure drawn into ``out/figures``)."""
  data = similarity_data(data, after)
  info = attention_similarity(before_model, after_model, out, data=data,
                              max_examples=max_examples, max_length=max_length, log=log)
  return similarity_section(read_similarity(out), num_sequences=info["sequences"], data=data,
                            fig_dir=Path(out) / "figures")


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
  line per stage (a comparison inside another job's stage)."""
  _check(before, after, out, before_model, after_model)
  out = Path(out)
  with_models = bool(before_model and after_model)
  if with_models:
    data = similarity_data(data, after)

  def comparison(ctx):
    key = unit_key({}, inputs={"before": _analysis_key(ctx, before),
                               "after": _analysis_key(ctx, after)})

    def fn():
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # they come back in comparison.warnings
        try:
          result = compare_runs(before, after)
        except ValueError as e:
          raise UserError(str(e)) from None
      contract.write_comparison(result, out)
      return {"warnings": list(result.warnings)}

    res = engine.run_unit(ctx, "comparison", "comparison", key, fn,
                          clean=[out / n for n in (contract.COMPARE_SIEVE_BIAS_CSV,
                                                   contract.COMPARE_ROLES_CSV,
                                                   contract.COMPARE_CLUSTERS_CSV,
                                                   contract.COMPARE_JSON)])
    for w in res.outputs["warnings"]:
      ctx.sub(f"warning: {w}")
    return res

  def similarity(ctx):
    key = unit_key({"max_examples": max_examples, "max_length": max_length}, inputs={
        "before_model": ctx.model(before_model), "after_model": ctx.model(after_model),
        "data": ctx.data(data)})
    return engine.run_unit(
        ctx, "similarity", "similarity", key,
        lambda: attention_similarity(before_model, after_model, out, data=data,
                                     max_examples=max_examples, max_length=max_length,
                                     log=ctx.sub),
        clean=[out / f"{SIMILARITY}.csv"])

  stages = [engine.Stage("comparison", "sieve bias, roles and clusters before vs after",
                         comparison, outputs=(contract.COMPARE_SIEVE_BIAS_CSV,
                                              contract.COMPARE_ROLES_CSV,
                                              contract.COMPARE_CLUSTERS_CSV, contract.COMPARE_JSON))]
  if with_models:
    stages.append(engine.Stage("similarity", "per-head attention similarity of the two models",
                               similarity, outputs=(f"{SIMILARITY}.csv",)))
  read = tuple(s.name for s in stages)

  def report(ctx):
    key = unit_key({}, inputs={
        "reads": {n: ctx.upstream(n, n).finished for n in read}, "title": title,
        "summaries": {"before": _analysis_key(ctx, before).get(contract.SUMMARY_JSON),
                      "after": _analysis_key(ctx, after).get(contract.SUMMARY_JSON)}})
    result = contract.read_comparison(out)

    def fn():
      extra = []
      if with_models:
        info = ctx.upstream("similarity", "similarity").outputs
        extra.append(similarity_section(read_similarity(out), num_sequences=info["sequences"],
                                        data=info["data"], fig_dir=out / "figures"))
      summaries = [getattr(contract.load_summary(d, missing_ok=True), "figures", None)
                   for d in (before, after)]
      path = write_compare_report(
          out, compare_df=result.sieve_bias, heads_df=result.roles,
          cluster_changes_df=result.clusters,
          title=title or f"Attention heads: {Path(before).name} vs {Path(after).name}",
          settings={"before": result.settings_before, "after": result.settings_after},
          summary_before=summaries[0], summary_after=summaries[1], warnings=result.warnings,
          extra_sections=extra)
      return {"report": str(path)}

    res = engine.run_unit(ctx, "report", "report", key, fn,
                          clean=[out / contract.REPORT_HTML, out / "figures"])
    table = result.sieve_bias.pivot(index="role", columns="layer_group", values="delta")
    table = table[[c for c in ("initial", "middle", "final") if c in table.columns]]
    ctx.sub("change of mean sieve bias (after - before) by layer group:\n"
            + table.round(3).to_string())
    gained = (result.roles["gained"].fillna("") != "").sum()
    lost = (result.roles["lost"].fillna("") != "").sum()
    ctx.sub(f"heads that gained a role: {gained}, lost a role: {lost}")
    ctx.sub(f"report: {res.outputs['report']}")
    return res

  stages.append(engine.Stage("report", "the report", report, reads=read,
                             outputs=(contract.REPORT_HTML, "figures")))
  claim = {"kind": "comparison", "flag": "--out",
           "model": [str(before_model), str(after_model)] if with_models else None,
           "data": [str(before), str(after)],
           "settings": {"data": data, "max_examples": max_examples, "max_length": max_length}}
  results = engine.run_pipeline(stages, out, redo=redo, log=log, what="a comparison", claim=claim,
                                progress=progress)
  return Path(results["report"].outputs["report"])
