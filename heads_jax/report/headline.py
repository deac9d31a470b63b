"""The paper's headline figures of a run (keys of ``summary.json``): ONE table of rows.

`ROWS` lists each headline figure once: its key in ``summary.json`` exactly as
`heads_jax.hoststats.summary.summary_figures` writes it (dotted for a nested value, e.g.
``by_rule.paper.share_block``), its label (reports), its short label (console), its kind (how
`heads_jax.report.page.format_value`, the one number formatter of the reports, shows it: share |
float | corr | p), the paper's value (BERT-base, from
`heads_jax.hoststats.claims`; None where the paper gives none). The reference column is heads_jax's
own figure on all-MiniLM-L6-v2 over the first 200 UD EWT test sentences, read from
``assets/reference.json``, which ``scripts/reference_values.py`` regenerates from the current code
(`reference_value`). No aliases: the file is ours.

Every view of the headline figures goes through this module:

* `headline_text(summary)`: one line for the console (pipelines' logs);
* `console_table(summaries)`: several runs side by side for the console, one aligned row per
  figure (the demo's closing summary);
* `headline_table(summaries)`: a DataFrame, one row per figure, one column per run (+ paper);
* `headline_html(summaries, ...)`: the same table as HTML (analysis, compare, demo front page).

No jax.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pandas as pd

from heads_jax.hoststats import claims as paper_lib
from heads_jax.hoststats import roles as roles_lib
from heads_jax.report.page import esc, flatten, format_value


@dataclasses.dataclass(frozen=True)
class Row:
  """One headline figure (see the module docstring)."""
  key: str
  label: str
  short: str
  kind: str
  paper: str | None = None
  optional: bool = False  # shown only when a summary has it (not "not reported")

  @property
  def coarse_role(self) -> str | None:
    """The coarse role a ``share_<role>`` row counts (None for the other rows)."""
    name = self.key.rpartition(".")[2]
    role = name[len("share_"):] if name.startswith("share_") else None
    return role if role in roles_lib.COARSE_ROLES else None


def paper_value(key: str) -> str | None:
  """The paper's value of a summary figure as the report prints it (`heads_jax.hoststats.claims`):
  one claim's value (with its range), several tasks' values as their range, or None where the
  paper gives none."""
  key = key.removeprefix(PAPER_RULE)
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


def _row(key, label, short, kind, paper=None, optional=False,
         compare=True) -> Row:
  return Row(key, label, short, kind, (paper_value(key) if compare else None) or paper,
             optional)


# The summary's prefix of the paper's rule's shares: the paper's values stand beside those only
# (the run's own rule, calibrated by default, is a heads_jax addition, not the paper's).
PAPER_RULE = "by_rule.paper."

# The paper's values come from heads_jax.hoststats.claims (one place for the published numbers);
# the literal paper values below are used only where it has no claim for the key. Coarse roles
# are the paper's four tests (hoststats.roles).
ROWS: tuple[Row, ...] = (
    _row("share_delimiter", "Heads with the delimiter role (its test rejects; the run's rule)",
         "delimiter heads", "share", compare=False),
    _row("by_rule.paper.share_delimiter", "... delimiter heads under the paper's rule",
         "delimiter (paper's rule)", "share", optional=True),
    _row("share_local", "Heads with the local role (|s - t| <= 2; the run's rule)", "local",
         "share", compare=False),
    _row("share_syntactic", "Heads with the syntactic role (the four relations' sieve; the run's "
         "rule)", "syntactic", "share", compare=False),
    _row("share_block", "Heads with the block role (the run's rule)", "block", "share",
         compare=False),
    _row("by_rule.paper.share_block", "... block heads under the paper's rule (tau only)",
         "block (paper's rule)", "share", optional=True),
    _row("share_near_uniform", "Heads with near-uniform attention (no role)", "near-uniform",
         "share", optional=True),
    _row("share_unskilled", "Heads without any role (unskilled; the run's rule)", "no role",
         "share", compare=False),
    _row("by_rule.paper.share_unskilled", "... unskilled heads under the paper's rule",
         "no role (paper's rule)", "share", optional=True),
    _row("share_syntactic_also_local", "Syntactic heads that are also local (the run's rule)",
         "syntactic heads also local", "share", compare=False),
    _row("by_rule.paper.share_syntactic_also_local", "... syntactic heads also local under the "
         "paper's rule", "syntactic also local (paper's rule)", "share", optional=True),
    _row("spearman_local_syntactic", "Spearman rho, local vs syntactic sieve bias",
         "Spearman(local, syntactic)", "corr"),
    _row("spearman_p_value", "Spearman p-value over heads (one value per head; the pairs are "
         "nested)", "its p (over heads)", "p"),
    _row("mean_sieve_score", "Mean of all sieve bias scores", "mean sieve score", "float",
         "2.8"),
    _row("share_p_between", "p-values in (0.05, 0.95)", "p-values in (0.05, 0.95)", "share",
         "1.8%"),
)
ROW_BY_KEY = {r.key: r for r in ROWS}

REFERENCE_FILE = Path(__file__).resolve().parent / "assets" / "reference.json"
REFERENCE_LABEL = "reference (MiniLM-L6, 200 EWT test sentences)"


@functools.cache
def reference() -> dict:
  """``assets/reference.json``: the setting, its command, the date and ``figures`` (summary key ->
  value) of the reference run (``scripts/reference_values.py``)."""
  return json.loads(REFERENCE_FILE.read_text())


def reference_value(row: Row) -> str:
  """A row's reference figure as the reports print it; "-" where the reference run has none."""
  ref = reference()
  if row.key not in ref["figures"]:
    return "-"
  why = not_computed(ref, row)
  return f"n/a ({why})" if why else format_value(ref["figures"][row.key], row.kind)


def lookup(summary: dict | None, key: str):
  """The value of ``key`` (dotted for nested dicts) in a summary; None when absent."""
  value = summary or {}
  for part in key.split("."):
    value = value.get(part) if isinstance(value, dict) else None
  return value


def summary_value(summary: dict | None, key: str):
  """The value of a headline row's key in ``summary`` (None when absent)."""
  return lookup(summary, ROW_BY_KEY[key].key)


def present(summary: dict | None, key: str) -> bool:
  """Whether the summary has ``key`` (dotted for nested dicts), even with the value None."""
  value = summary or {}
  for part in key.split("."):
    if not isinstance(value, dict) or part not in value:
      return False
    value = value[part]
  return True


def not_computed(summary: dict | None, row: Row) -> str | None:
  """Why the run did not compute a coarse share row's role (the summary's ``not_computed``:
  not asked for, or its sieve empty on all the data), or None."""
  coarse = row.coarse_role
  reasons = (summary or {}).get("not_computed") or {}
  return reasons.get(coarse) if coarse is not None else None


def _shown(summary: dict | None, row: Row) -> str:
  """A present row's value as text: "n/a (why)" for a role the run did not compute, never 0."""
  why = not_computed(summary, row)
  return f"n/a ({why})" if why else format_value(lookup(summary, row.key), row.kind)


def _cell(summary: dict | None, row: Row, tested: list[str] | None) -> str:
  coarse = row.coarse_role
  if (tested is not None and coarse is not None
      and not any(r in tested for r in roles_lib.COARSE_ROLES[coarse])):
    return "not computed"
  if not present(summary, row.key):
    return "not reported"
  return _shown(summary, row)


def headline_text(summary: dict, rows: tuple[Row, ...] = ROWS) -> str:
  """The headline figures of one summary in one console line ("rule: label value; ...");
  figures the summary does not have are left out; a role the run did not compute reads
  "n/a (why)"."""
  parts = [f"{r.short} {_shown(summary, r)}" for r in rows if present(summary, r.key)]
  rule = f"{summary['rule']} rule: " if (summary or {}).get("rule") else ""
  return rule + "; ".join(parts)


def console_table(summaries: dict[str, dict], rows: tuple[Row, ...] = ROWS) -> str:
  """The headline figures of several runs (``{column: summary}``) as a fixed-width text table:
  a row per figure that some run has (the rule's rows first), a column per run; a role a run did
  not compute reads "n/a" (its reason is in that run's own line and report)."""
  shown = [r for r in rows if any(present(s, r.key) for s in summaries.values())]
  body = [[r.short] + [(("n/a" if not_computed(s, r) else format_value(lookup(s, r.key), r.kind))
                        if present(s, r.key) else "-") for s in summaries.values()]
          for r in shown]
  header = ["figure", *summaries]
  widths = [max(len(x) for x in col) for col in zip(header, *body)]
  line = lambda cells: "  ".join([cells[0].ljust(widths[0])] +    # noqa: E731
                                 [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])
  return "\n".join([line(header)] + [line(b) for b in body])


def headline_table(summaries: dict[str, dict], *, rows: tuple[Row, ...] = ROWS,
                   paper: bool = True, reference: bool = False,
                   tested: dict[str, list[str] | None] | None = None,
                   skip_absent: bool = False) -> pd.DataFrame:
  """One row per headline figure, one column per run (``{column name: summary}``), formatted.

  Args:
    paper / reference: add the paper's value / the reference run's value (`reference_value`).
    tested: per run, the roles it computed (a coarse share of a group with no computed role
      reads "not computed"); None: no check.
    skip_absent: leave out rows whose key no run's summary has (optional rows: always).
  Cells: `page.format_value` text; "not reported" for a top-level key the summary lacks.
  """
  records = []
  for row in rows:
    if ((skip_absent or row.optional)
        and not any(present(s, row.key) for s in summaries.values())):
      continue
    rec = {"figure": row.label}
    for name, s in summaries.items():
      rec[name] = _cell(s, row, (tested or {}).get(name))
    if paper:
      rec["paper (BERT-base)"] = row.paper or "-"
    if reference:
      rec[REFERENCE_LABEL] = reference_value(row)
    records.append(rec)
  columns = (["figure", *summaries] + (["paper (BERT-base)"] if paper else [])
             + ([REFERENCE_LABEL] if reference else []))
  return pd.DataFrame(records, columns=columns)


def headline_html(summaries: dict[str, dict], *, table_id: str = "table-summary",
                  label_header: str = "figure", **kwargs) -> str:
  """`headline_table` (``kwargs``) as an HTML table (escaped; value columns right-aligned);
  ``label_header`` heads the column of labels."""
  table = headline_table(summaries, **kwargs)
  head = "".join(f"<th>{esc(c)}</th>" for c in [label_header, *table.columns[1:]])
  body = []
  for rec in table.itertuples(index=False):
    cells = [f"<td>{esc(rec[0])}</td>"]
    for col, v in zip(table.columns[1:], rec[1:]):
      cls = "ref" if col.startswith(("paper", "reference")) else "num"
      cells.append(f'<td class="{cls}">{esc(v)}</td>')
    body.append(f"<tr>{''.join(cells)}</tr>")
  return (f'<div class="scroll"><table id="{esc(table_id)}"><thead><tr>{head}</tr></thead>'
          f"<tbody>{''.join(body)}</tbody></table></div>")


def other_entries(summary: dict) -> list[tuple[str, object]]:
  """The summary's entries that are not headline rows (nested dicts flattened to ``a.b``)."""
  keys = {r.key for r in ROWS}
  return [(k, v) for k, v in flatten(summary or {}) if k not in keys]
