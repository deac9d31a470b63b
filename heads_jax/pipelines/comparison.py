"""The comparison of two analyses as stages compose it (`heads_jax.pipelines.stages`:
``comparison``, ``similarity``, ``compare_report``):

    host: two analysis directories -> compare_sieve_bias.csv (change of mean sieve bias per role
      over the initial, middle and final thirds of the layers; Pande et al. Fig. 6),
      compare_roles.csv (roles gained and lost per head), compare_clusters.csv, compare.json
      (`comparison_work`), then figures and report.html (`report_work`)
    device: the cosine similarity of every head's attention under the two models on the same
      inputs (Kovaleva et al. 2019; `attention_similarity`): attention_similarity.csv
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
from heads_jax.report.compare import similarity_section, write_compare_report

SIMILARITY = "attention_similarity"   # its table's stem
SIMILARITY_FILE = f"{SIMILARITY}.csv"
# The files of an analysis directory that the comparison and its report read.
ANALYSIS_FILES = (contract.SCORES_FILE, contract.TESTS_CSV, contract.SETTINGS_JSON,
                  contract.CLUSTERS_CSV, contract.SUMMARY_JSON)
# What `comparison_work` writes; what `report_work` writes.
COMPARISON_FILES = (contract.COMPARE_SIEVE_BIAS_CSV, contract.COMPARE_ROLES_CSV,
                    contract.COMPARE_CLUSTERS_CSV, contract.COMPARE_JSON)
REPORT_FILES = (contract.REPORT_HTML, "figures")


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
  t = pd.read_csv(Path(out) / SIMILARITY_FILE)
  return t.pivot(index="layer", columns="head", values="cosine").to_numpy(float)


def attention_similarity_section(before_model, after_model, out, *, data=None, after=None,
                                 max_examples=500, max_length=128, log=print) -> dict:
  """`attention_similarity` and its report section (figure drawn into ``out/figures``)."""
  data = similarity_data(data, after)
  info = attention_similarity(before_model, after_model, out, data=data,
                              max_examples=max_examples, max_length=max_length, log=log)
  return similarity_section(read_similarity(out), num_sequences=info["sequences"], data=data,
                            fig_dir=Path(out) / "figures")


def same_model(analysed, model) -> bool | None:
  """Whether an analysis's run-file model key ``analysed`` is the identity of ``model``
  (`runfiles.model_identity`); None when it cannot tell (a key of an older form)."""
  if isinstance(analysed, str):   # a URL
    analysed = {"url": analysed}
  elif isinstance(analysed, list):   # [[file, size, hash]] of a local model
    analysed = {"files": analysed}
  files = analysed.get("files") if isinstance(analysed, dict) else None
  if files and not all(isinstance(f, list) and len(f) == 3 and isinstance(f[2], str)
                       for f in files):
    return None   # size and mtime (before content keys): says nothing of another copy
  return runfiles.canonical(analysed) == runfiles.canonical(runfiles.model_identity(model))


def check_models(before, after, before_model, after_model) -> None:
  """Refuses (UserError) a ``before_model`` or ``after_model`` that is not the model its
  analysis (``before``, ``after``: their run files) analysed: the similarity of two models would
  be reported beside another model's role changes. Silent when an analysis does not record its
  model's content."""
  for flag, folder, model in (("--before-model", before, before_model),
                              ("--after-model", after, after_model)):
    try:
      run = contract.read_run(folder)
    except ValueError as e:
      raise UserError(str(e)) from None
    analysed = ((run or {}).get("inputs") or {}).get("model")
    if analysed is not None and same_model(analysed, model) is False:
      raise UserError(f"{flag} {model} is not the model the analysis {folder} analysed (the "
                      f"model files differ): pass the model of that analysis, or analyse {model}")


def comparison_work(before, after, out) -> list[str]:
  """Compares the analyses ``before`` and ``after`` into ``out`` (`COMPARISON_FILES`); returns
  the comparison's warnings."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # they come back in comparison.warnings
    try:
      result = compare_runs(before, after)
    except ValueError as e:
      raise UserError(str(e)) from None
  contract.write_comparison(result, out)
  return list(result.warnings)


def report_work(before, after, out, *, title=None, similarity: dict | None = None) -> Path:
  """report.html and its figures in ``out`` from the comparison there (and, with
  ``similarity``: `attention_similarity`'s result, its section)."""
  out = Path(out)
  result = contract.read_comparison(out)
  extra = []
  if similarity is not None:
    extra.append(similarity_section(read_similarity(out), num_sequences=similarity["sequences"],
                                    data=similarity["data"], fig_dir=out / "figures"))
  summaries = [getattr(contract.load_summary(d, missing_ok=True), "figures", None)
               for d in (before, after)]
  return write_compare_report(
      out, compare_df=result.sieve_bias, heads_df=result.roles,
      cluster_changes_df=result.clusters,
      title=title or f"Attention heads: {Path(before).name} vs {Path(after).name}",
      settings={"before": result.settings_before, "after": result.settings_after},
      summary_before=summaries[0], summary_after=summaries[1], warnings=result.warnings,
      extra_sections=extra)


def report_lines(out) -> list[str]:
  """The comparison in ``out`` for the console: the change of mean sieve bias by layer group,
  the heads that gained and lost a role."""
  result = contract.read_comparison(out)
  df = result.sieve_bias.copy()
  if "p_value" in df.columns:      # each change with its test over heads (hoststats.compare)
    df["cell"] = [("n/a" if not np.isfinite(d) else f"{d:+.3f}" + (
        f" (p {p:.2g})" if np.isfinite(p) else "")) for d, p in zip(df["delta"], df["p_value"])]
  else:
    df["cell"] = [("n/a" if not np.isfinite(d) else f"{d:+.3f}") for d in df["delta"]]
  table = df.pivot(index="role", columns="layer_group", values="cell")
  table = table[[c for c in ("initial", "middle", "final") if c in table.columns]]
  gained = (result.roles["gained"].fillna("") != "").sum()
  lost = (result.roles["lost"].fillna("") != "").sum()
  return ["change of mean sieve bias (after - before) by layer group, with the two-sided t-test "
          "of the heads' changes (p; the heads are the units, compare_sieve_bias.csv has the 95% "
          "intervals):\n" + table.to_string(na_rep="n/a"),
          f"heads that gained a role: {gained}, lost a role: {lost}"]
