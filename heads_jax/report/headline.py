"""The paper's headline figures of a run (the keys of ``summary.json``) and how they are shown.

`SUMMARY_FIELDS` lists each headline figure: its canonical key (as written by
`heads_jax.hoststats.summary`), label, kind (share | float | corr | p), accepted aliases, the
paper's value (BERT-base) (`paper_value`, from `heads_jax.hoststats.paper`; None where the paper gives none) and the reference value of DESIGN.md (MiniLM-L6 on the first 200 UD
EWT test sentences). `match_summary` finds them in any summary dict (nested dicts flattened
to ``outer.inner``); the analysis and the compare reports show them. No jax.
"""

from __future__ import annotations

import re

from heads_jax.hoststats import paper as paper_lib
from heads_jax.report.page import flatten


def paper_value(key: str) -> str | None:
  """The paper's value of a summary figure as the report prints it (`heads_jax.hoststats.paper`):
  one claim's value (with its range), several tasks' values as their range, or None where the
  paper gives none."""
  found = [c for c in paper_lib.claims(paper_lib.PANDE) if c.summary_key == key and c.value is not None]
  if not found:
    return None
  if len(found) == 1:
    c = found[0]
    text = paper_lib.format_paper_value(c)
    return text + (", mean over the four tasks" if c.scope in ("mean_over_tasks", "range_over_tasks") else "")
  values = sorted(c.value for c in found)
  kind = found[0].kind
  return (f"{paper_lib.format_value(kind, values[0])} to {paper_lib.format_value(kind, values[-1])} "
          f"(per task)")


SUMMARY_FIELDS = (
    ("share_delimiter", "Heads with a delimiter role ([CLS], [SEP] or both)", "share",
     ("delimiter", "shares_delimiter", "delimiter_share", "share_delimiter_heads"), None, None),
    ("share_local", "Heads with a local role (local, previous or next)", "share",
     ("local", "shares_local", "local_share", "share_local_heads"), None, None),
    ("share_syntactic", "Heads with a syntactic role (any of the four relations)", "share",
     ("syntactic", "shares_syntactic", "syntactic_share", "share_syntactic_heads"), None, None),
    ("share_block", "Heads with the block role", "share",
     ("block", "shares_block", "block_share", "share_block_heads"), None, None),
    ("share_unskilled", "Heads without any role (unskilled)", "share",
     ("unskilled", "shares_unskilled", "share_none", "share_no_role", "unskilled_share"), None, None),
    ("share_syntactic_also_local", "Syntactic heads that are also local", "share",
     ("syntactic_also_local", "share_syntactic_local", "overlap_syntactic_local",
      "syntactic_local_overlap"), None, None),
    ("spearman_local_syntactic", "Spearman rho, local vs syntactic sieve bias", "corr",
     ("spearman_rho", "spearman_local_syntactic_rho", "spearman"), None, None),
    ("spearman_p_value", "Spearman p-value", "p",
     ("spearman_p", "spearman_local_syntactic_p", "spearman_pvalue"), None, None),
    ("mean_sieve_score", "Mean of all sieve bias scores", "float",
     ("mean_score", "mean_sieve_bias", "mean_all_scores", "mean_of_all_sieve_scores",
      "mean_all_sieve_scores"), "2.8", "2.75"),
    ("share_p_between", "p-values in (0.05, 0.95)", "share",
     ("share_p_mid", "share_p_in_band", "share_p_005_095", "share_p_in_005_095",
      "share_pvalues_mid", "share_p_values_mid", "p_mid_share", "share_p_middle"), "1.8%", "2.5%"),
)


def _norm_key(key: str) -> str:
  return re.sub(r"[^a-z0-9]+", "_", str(key).lower()).strip("_")


def match_summary(summary: dict) -> tuple[dict[str, tuple[str, object]], list[tuple[str, object]]]:
  """Split a summary into the known headline fields and the rest.

  Returns ``({canonical key: (original key, value)}, [(key, value) of the other entries]))``.
  """
  items = flatten(summary or {})
  known, used = {}, set()
  normed = {_norm_key(k): (k, v) for k, v in items}
  for key, _label, _kind, aliases, _paper, _ref in SUMMARY_FIELDS:
    for cand in (key,) + tuple(aliases):
      if cand in normed and normed[cand][0] not in used:
        known[key] = normed[cand]
        used.add(normed[cand][0])
        break
  rest = [(k, v) for k, v in items if k not in used]
  return known, rest


def summary_value(summary: dict, key: str):
  """The value of a headline field (canonical ``key`` of ``SUMMARY_FIELDS``) or None."""
  known, _ = match_summary(summary)
  return known.get(key, (None, None))[1]

# The paper's values from heads_jax.hoststats.paper (one place for the published numbers).
SUMMARY_FIELDS = tuple((key, label, kind, aliases, paper_value(key) or paper, ref)
                       for key, label, kind, aliases, paper, ref in SUMMARY_FIELDS)
