"""Compare two analyses (a model before and after fine-tuning, or two models) on the same data.

Reads the output directories of two `heads-jax analyze` runs and writes into --out:
compare_sieve_bias.csv (change of mean sieve bias per role over the initial, middle and final
thirds of the layers; Pande et al. Fig. 6), compare_roles.csv (roles gained and lost per head),
compare_clusters.csv (cluster changes per head), compare.json, figures and report.html.
"""

from __future__ import annotations

import warnings
from pathlib import Path


def add_args(p):
  p.add_argument("--before", required=True, help="analysis output directory of the first model (e.g. pre-trained)")
  p.add_argument("--after", required=True, help="analysis output directory of the second model (e.g. fine-tuned)")
  p.add_argument("--out", required=True, help="output directory")
  p.add_argument("--title", default=None, help="report title")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def run_compare(before, after, out, *, title=None, log=print) -> Path:
  """Compares two analysis directories; returns the path of the report."""
  from heads_jax.hoststats import io
  from heads_jax.hoststats.compare import compare_runs
  from heads_jax.report.html import write_compare_report
  for d in (before, after):
    if not (Path(d) / "scores.npz").is_file():
      raise FileNotFoundError(f"{d} is not an analysis output directory (no scores.npz); "
                              f"run `heads-jax analyze --out {d}` first")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # they come back in comparison.warnings
    comparison = compare_runs(before, after)
  for w in comparison.warnings:
    log(f"warning: {w}")
  out = Path(out)
  out.mkdir(parents=True, exist_ok=True)
  io.write_comparison(comparison, out)
  summaries = [io.read_summary(d) if (Path(d) / "summary.json").is_file() else None for d in (before, after)]
  report = write_compare_report(
      out, compare_df=comparison.sieve_bias, heads_df=comparison.roles,
      cluster_changes_df=comparison.clusters,
      title=title or f"Attention heads: {Path(before).name} vs {Path(after).name}",
      settings={"before": comparison.settings_before, "after": comparison.settings_after},
      summary_before=summaries[0], summary_after=summaries[1], warnings=comparison.warnings)
  table = comparison.sieve_bias.pivot(index="role", columns="layer_group", values="delta")
  table = table[[c for c in ("initial", "middle", "final") if c in table.columns]]
  log("change of mean sieve bias (after - before) by layer group:\n" + table.round(3).to_string())
  gained = (comparison.roles["gained"].fillna("") != "").sum()
  lost = (comparison.roles["lost"].fillna("") != "").sum()
  log(f"heads that gained a role: {gained}, lost a role: {lost}")
  log(f"report: {report}")
  return report


def main(args):
  run_compare(args.before, args.after, args.out, title=args.title)
