"""The compare job: two analyses (a model before and after fine-tuning, or two models) on the same data.

Reads the output directories of two `heads-jax analyze` runs and writes into --out:
compare_sieve_bias.csv (change of mean sieve bias per role over the initial, middle and final
thirds of the layers; Pande et al. Fig. 6), compare_roles.csv (roles gained and lost per head),
compare_clusters.csv (cluster changes per head), compare.json, figures and report.html.
With --before-model and --after-model it also computes the cosine similarity of every head's
attention under the two models on the same inputs (Kovaleva et al. 2019):
attention_similarity.csv, a heatmap and a report section.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from heads_jax import contract, runfiles
from heads_jax.ablation.similarity import similarity_on_spec, similarity_table
from heads_jax.errors import UserError
from heads_jax.hoststats.compare import compare_runs
from heads_jax.model.loading import load_model
from heads_jax.report.compare import similarity_section, write_compare_report
from heads_jax.report.figures.kovaleva import plot_similarity


def attention_similarity_section(before_model, after_model, out, *, data=None, after=None,
                                 max_examples=500, max_length=128, log=print) -> dict:
  """Computes the per-head attention similarity of two models (Kovaleva et al. 2019), writes
  ``attention_similarity.csv`` and its figure into ``out``, returns the report section."""
  run = contract.read_run(after) if data is None and after is not None else None
  if run is not None:
    specs = run.get("device", {}).get("data") or []
    data = specs[0] if specs else None
  if data is None:
    raise UserError("the attention similarity needs inputs: pass --data SPEC")
  model_a, _ = load_model(before_model, with_tokenizer=False)
  model_b, tokenizer = load_model(after_model)
  sim, n = similarity_on_spec(model_a, model_b, tokenizer, data, max_examples=max_examples,
                              max_length=max_length)
  out = Path(out)
  out.mkdir(parents=True, exist_ok=True)
  runfiles.write_table(out, "attention_similarity", similarity_table(sim))
  fig = plot_similarity(sim, out / "figures" / "attention_similarity.png")
  log(f"attention similarity before/after over {n} sequences of {data}: mean cosine "
      f"{sim.mean():.3f}; per layer " + ", ".join(f"{v:.3f}" for v in sim.mean(1)))
  return similarity_section(sim, fig, num_sequences=n, data=data)


def run_compare(before, after, out, *, title=None, log=print, before_model=None, after_model=None,
                data=None, max_examples=500, max_length=128) -> Path:
  """Compares two analysis directories; returns the path of the report. With ``before_model``
  and ``after_model``, adds the per-head attention similarity of the two models on ``data``
  (default: the first data set of the ``after`` analysis)."""
  for d in (before, after):
    if not (Path(d) / contract.SCORES_FILE).is_file():
      raise FileNotFoundError(f"{d} is not an analysis output directory (no scores.npz); "
                              f"run `heads-jax analyze --out {d}` first")
  if bool(before_model) != bool(after_model):  # before any work is done or written
    raise UserError("the attention similarity needs both --before-model and --after-model")
  # a file, or another job's directory (an analysis: its report.html would be replaced)
  runfiles.check_dir(out, "comparison", flag="--out")
  for d in (before, after):
    if Path(out).resolve() == Path(d).resolve():
      raise UserError(f"--out {out} is one of the analyses compared; choose another --out")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # they come back in comparison.warnings
    comparison = compare_runs(before, after)
  for w in comparison.warnings:
    log(f"warning: {w}")
  out = Path(out)
  runfiles.claim_dir(out, "comparison", model=[str(before_model), str(after_model)]
                     if before_model else None, data=[str(before), str(after)],
                     settings={"data": data, "max_examples": max_examples,
                               "max_length": max_length})
  contract.write_comparison(comparison, out)
  extra = []
  if before_model and after_model:
    extra.append(attention_similarity_section(before_model, after_model, out, data=data,
                                              after=after, max_examples=max_examples,
                                              max_length=max_length, log=log))
  summaries = [getattr(contract.load_summary(d, missing_ok=True), "figures", None)
               for d in (before, after)]
  report = write_compare_report(
      out, compare_df=comparison.sieve_bias, heads_df=comparison.roles,
      cluster_changes_df=comparison.clusters,
      title=title or f"Attention heads: {Path(before).name} vs {Path(after).name}",
      settings={"before": comparison.settings_before, "after": comparison.settings_after},
      summary_before=summaries[0], summary_after=summaries[1], warnings=comparison.warnings,
      extra_sections=extra)
  table = comparison.sieve_bias.pivot(index="role", columns="layer_group", values="delta")
  table = table[[c for c in ("initial", "middle", "final") if c in table.columns]]
  log("change of mean sieve bias (after - before) by layer group:\n" + table.round(3).to_string())
  gained = (comparison.roles["gained"].fillna("") != "").sum()
  lost = (comparison.roles["lost"].fillna("") != "").sum()
  log(f"heads that gained a role: {gained}, lost a role: {lost}")
  log(f"report: {report}")
  return report
