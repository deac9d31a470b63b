"""The "Are the roles real?" section of the analysis report (issue 26), from the second pass's
files: roles under attention vs norm weights (tests.csv by ``weighting``), attention sinks and
no-op heads (robustness.npz, summary.json), heads as dependency parsers (parser.csv) and how
they agree with the sieve's syntactic roles. Each section is ``{"title", "html"}``; the analysis
report appends them. Tables come from ``heads_jax.hoststats`` (weighting, sinks, parsing); no jax.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from heads_jax import contract
from heads_jax.hoststats.parsing import best_heads, role_agreement
from heads_jax.hoststats.sinks import SINK_THRESHOLD, head_sinks
from heads_jax.hoststats.weighting import role_changes
from heads_jax.report import spec
from heads_jax.report.figures.common import DEFAULT_DPI
from heads_jax.report.figures.robustness import SECTION
from heads_jax.report.page import esc, table_html


def _activations_html(summary: dict) -> str:
  """The hidden-state norms at the sink positions per layer (summary's
  ``first_norm_ratio_by_layer``, ``sep_norm_ratio_by_layer``; `hoststats.sinks.activation_summary`):
  a pre-norm model's sink tokens can carry states many times the others' ("massive activations"),
  a post-LayerNorm BERT's stay near 1; "" when the run has none."""
  first = summary.get("first_norm_ratio_by_layer")
  if not first:
    return ""
  sep = summary.get("sep_norm_ratio_by_layer") or [None] * len(first)
  table = pd.DataFrame({"layer": ["embeddings"] + [str(i) for i in range(len(first) - 1)],
                        "first token / other tokens": first, "[SEP] / other tokens": sep})
  return ("<h3>Hidden-state norms at the sink positions</h3><p>" + esc(
      "The L2 norm of each layer's output at the first token and at [SEP], over the median norm "
      "of the other tokens (mean over the sequences). Attention sinks in pre-norm models such as "
      "ModernBERT come with states many times larger than the others' (massive activations); "
      "after a post-LayerNorm layer (BERT) the ratio stays near 1. Compare two models' tables "
      "to see which kind a model is.") + "</p>"
          + table_html(table, table_id="table-hidden-norms", float_format="{:.2f}"))


def robustness_sections(out_dir, *, dpi: int = DEFAULT_DPI) -> list[dict]:
  """``[]`` when ``out_dir`` holds no second pass; else the section with its figures (into
  ``out_dir/figures``) and tables."""
  out_dir = Path(out_dir)
  kept = contract.read_robustness(out_dir)
  tests, settings = contract.read_tests(out_dir)
  norm, _ = contract.read_tests(out_dir, weighting="norm")
  if kept is None or norm.empty:
    return []
  summary = contract.read_summary(out_dir) if (out_dir / contract.SUMMARY_JSON).is_file() else {}
  threshold = float(summary.get("sink_threshold", SINK_THRESHOLD))
  sinks = head_sinks(kept["first_attention"], kept["sep_attention"], kept["norm_ratio"], threshold)
  parser = contract.read_parser(out_dir)
  best = best_heads(parser) if parser is not None else None
  drawn = spec.draw("analysis", spec.Inputs(summary=summary, sinks=sinks, best_parsers=best,
                                            rule=settings.get("rule")),
                    out_dir / "figures", dpi=dpi, section=SECTION)
  figures = {name: spec.figures_html({name: path}) for name, path in drawn.items()}
  changes = role_changes(tests, norm, summary.get("not_computed") or {})  # n/a, never 0
  html = spec.section("analysis", SECTION).intro
  html += figures.get("robustness_weighting", "")
  html += "<h3>Heads per role under attention and norm weights</h3>" + table_html(
      changes, table_id="table-norm-roles")
  html += figures.get("robustness_sinks", "")
  rate = summary.get("sink_rate")
  if rate is not None:
    html += (f"<p>Sink rate: {100 * rate:.0f}% of the heads put more than {threshold:g} of their "
             f"attention on the first token on average (Gu et al.); mean norm ratio "
             f"{summary.get('mean_norm_ratio', float('nan')):.2f}.</p>")
  html += _activations_html(summary)
  if best is not None and len(best):
    html += figures.get("robustness_parsing", "")
    html += "<h3>Best head per relation and direction</h3>" + table_html(
        best, table_id="table-best-parsers", float_format="{:.3f}")
    agree = role_agreement(parser, tests)
    if len(agree):
      html += ("<h3>Syntactic roles and parsing heads</h3><p>" + esc(
          "Heads with the sieve's role against heads whose parsing interval lies above the best "
          "fixed offset (dependent -> head, the sieves' direction); Spearman: the role's mean "
          "sieve bias against the head's accuracy over all heads.") + "</p>"
               + table_html(agree, table_id="table-parser-agreement", float_format="{:.3f}"))
  return [{"title": SECTION, "html": html}]
